// Balance over the window (window_balance.h): targeted layouts, and random
// windows checked for what the re-layout must keep (samples, budget, equal
// micro-step counts, no more micro-steps, never a costlier window).
#include "src/align/window_balance.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>
#include <set>

#include "src/align/planned_groups.h"
#include "src/grouping/budget.h"

namespace odb::align {
namespace {

WindowBalanceConfig Config(uint64_t max_tokens, double per_step = 0.0) {
  WindowBalanceConfig c;
  c.budget.model = grouping::CostModel::kPadded;
  c.budget.max_tokens = max_tokens;
  c.step_model.per_step = per_step;
  c.step_model.per_padded_token = 1.0;
  return c;
}

// A micro-step of one rank holding samples of these lengths (ids from `next`).
PlannedStep Step(std::initializer_list<uint32_t> lengths, int32_t owner, uint64_t& next) {
  std::vector<SampleMeta> metas;
  for (uint32_t len : lengths) {
    SampleMeta m;
    m.id = next++;
    m.owner_rank = owner;
    m.lengths.tokens = len;
    metas.push_back(m);
  }
  std::vector<size_t> members(metas.size());
  for (size_t i = 0; i < members.size(); ++i) members[i] = i;
  return MakeStep(grouping::CostModel::kPadded, metas, members, false);
}

std::multiset<std::pair<int32_t, uint64_t>> Keys(const std::vector<GlobalStep>& window) {
  std::multiset<std::pair<int32_t, uint64_t>> keys;
  for (const GlobalStep& g : window) {
    for (const PlannedStep& s : g) {
      for (const SampleMeta& m : s.samples) keys.insert({m.owner_rank, m.id});
    }
  }
  return keys;
}

void RequireWithinBudget(const WindowBalanceConfig& c, const std::vector<GlobalStep>& window) {
  for (const GlobalStep& g : window) {
    for (const PlannedStep& s : g) {
      std::vector<SampleLengths> lens;
      for (const SampleMeta& m : s.samples) lens.push_back(m.lengths);
      REQUIRE(s.idle == s.samples.empty());
      REQUIRE(FitsBudget(c.budget, lens));
      REQUIRE(s.real_tokens ==
              std::accumulate(lens.begin(), lens.end(), uint64_t{0},
                              [](uint64_t a, const SampleLengths& l) { return a + l.tokens; }));
      REQUIRE(s.padded_tokens == grouping::PaddedTokens(c.budget.model, lens));
    }
  }
}

// The next micro-step of `pool` from `next` on: as many samples as the
// budget holds, in order (the planner's layout of a rank's micro-step).
PlannedStep FillToBudget(const WindowBalanceConfig& c, const std::vector<SampleMeta>& pool, size_t& next) {
  std::vector<SampleMeta> run;
  std::vector<SampleLengths> lens;
  while (next < pool.size()) {
    lens.push_back(pool[next].lengths);
    if (!FitsBudget(c.budget, lens)) break;
    run.push_back(pool[next++]);
  }
  std::vector<size_t> members(run.size());
  std::iota(members.begin(), members.end(), size_t{0});
  return MakeStep(c.budget.model, run, members, false);
}

// The planner's layout of `pool` in arrival order: each rank's micro-steps
// filled to the budget in turn, `steps` a rank over `world` ranks; every
// sample placed.
std::vector<GlobalStep> FilledWindow(const WindowBalanceConfig& c, const std::vector<SampleMeta>& pool,
                                     size_t world, size_t steps) {
  std::vector<GlobalStep> window(steps, GlobalStep(world));
  size_t next = 0;
  for (size_t slot = 0; slot < steps * world && next < pool.size(); ++slot) {
    window[slot % steps][slot / steps] = FillToBudget(c, pool, next);
  }
  REQUIRE(next == pool.size());
  return window;
}

TEST_CASE("a window's samples are spread so that every rank's sum is even", "[window_balance]") {
  // The planner's layout: rank 0 runs two full micro-steps, rank 1 one and an IDLE one.
  uint64_t id = 0;
  std::vector<GlobalStep> window = {
      {Step({100, 100, 100, 100}, 0, id), Step({100, 100, 100, 100}, 1, id)},
      {Step({100, 100, 100, 100}, 0, id), PlannedStep{}},
  };
  const WindowBalanceConfig c = Config(512);
  REQUIRE(WindowCost(c, window) == 800.0);
  const auto keys = Keys(window);
  REQUIRE(BalanceWindow(c, window));
  REQUIRE(window.size() == 2);
  REQUIRE(WindowCost(c, window) == 600.0);
  REQUIRE(Keys(window) == keys);
  RequireWithinBudget(c, window);
  for (size_t r = 0; r < 2; ++r) {
    size_t n = 0;
    for (const GlobalStep& g : window) n += g[r].samples.size();
    REQUIRE(n == 6);
  }
}

TEST_CASE("a window takes fewer micro-steps when its samples fit them", "[window_balance]") {
  // Three micro-steps a rank where two hold everything: the fixed cost of a
  // micro-step makes the shorter window cheaper.
  uint64_t id = 0;
  std::vector<GlobalStep> window = {
      {Step({200, 200}, 0, id), Step({200}, 1, id)},
      {Step({200}, 0, id), Step({200}, 1, id)},
      {PlannedStep{}, Step({200}, 1, id)},
  };
  const WindowBalanceConfig c = Config(512, 50.0);
  REQUIRE(BalanceWindow(c, window));
  REQUIRE(window.size() == 2);
  // Each rank: a pair (50 + 400) and a single (50 + 200); before, 750 each.
  REQUIRE(WindowCost(c, window) == 700.0);
}

TEST_CASE("a padded window's samples are cut into length-sorted runs: fewer micro-steps",
          "[window_balance]") {
  // 12 samples of 1000 tokens, 24 of 500 and 32 of 250 over 4 ranks, budget
  // 4096: 32000 tokens, 8000 a rank. Sorted by length they make 8 full runs
  // (4 x 1000, 8 x 500, 16 x 250), two micro-steps a rank. Samples dealt
  // longest first to the least loaded rank's cheapest micro-step end with
  // three 1000s in one micro-step and six 500s in the other, where three
  // 250s a rank fit: no layout with two micro-steps, the planner's three
  // kept (8000 + 3 x 512 a rank).
  uint64_t id = 0;
  std::vector<GlobalStep> window(3);
  for (int32_t r = 0; r < 4; ++r) {
    window[0].push_back(Step({1000, 1000, 1000}, r, id));
    window[1].push_back(Step({500, 500, 500, 500, 500, 500}, r, id));
    window[2].push_back(Step({250, 250, 250, 250, 250, 250, 250, 250}, r, id));
  }
  const WindowBalanceConfig c = Config(4096, 512.0);
  REQUIRE(WindowCost(c, window) == 8000.0 + 3 * 512.0);
  REQUIRE(FewestMicroSteps(c.budget, 4, 32000, 68) == 2);
  const auto keys = Keys(window);
  REQUIRE(BalanceWindow(c, window));
  REQUIRE(Keys(window) == keys);
  REQUIRE(window.size() == 2);
  for (const GlobalStep& g : window) REQUIRE(g.size() == 4);
  RequireWithinBudget(c, window);
  REQUIRE(WindowCost(c, window) == 8000.0 + 2 * 512.0);
}

// A packed budget (collate.packed) and micro-steps of these lengths.
WindowBalanceConfig PackedConfig(uint64_t max_tokens, double per_step) {
  WindowBalanceConfig c = Config(max_tokens, per_step);
  c.budget.model = grouping::CostModel::kPacked;
  return c;
}

PlannedStep PackedStep(std::initializer_list<uint32_t> lengths, int32_t owner, uint64_t& next) {
  PlannedStep s = Step(lengths, owner, next);
  std::vector<size_t> members(s.samples.size());
  std::iota(members.begin(), members.end(), size_t{0});
  return MakeStep(grouping::CostModel::kPacked, s.samples, members, false);
}

TEST_CASE("packed windows of one budget a rank are laid best-fit where the greedy strands samples",
          "[window_balance]") {
  // 8 ranks, budget 4096, packed: each window's samples are 8 budgets cut
  // at random into three pieces (one micro-step a rank holds them exactly;
  // debian_docs-like lengths), less a few to leave 0.3% of the room,
  // planned as two micro-steps a rank (arrival order, filled to the
  // budget). Dealt longest first to the least loaded rank, the last samples
  // of most windows fit no micro-step and the window keeps two; best-fit
  // decreasing (each sample into the fullest micro-step that holds it) lays
  // more of them in one.
  const WindowBalanceConfig c = PackedConfig(4096, 512.0);
  const size_t world = 8;
  std::mt19937_64 rng(1);
  int one = 0;
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<SampleMeta> pool;
    for (size_t bin = 0; bin < world; ++bin) {
      std::vector<uint32_t> cuts = {0, 4096};
      std::uniform_int_distribution<uint32_t> at(1, 4095);
      for (int k = 0; k < 2; ++k) cuts.push_back(at(rng));
      std::sort(cuts.begin(), cuts.end());
      for (size_t k = 1; k < cuts.size(); ++k) {
        if (cuts[k] == cuts[k - 1]) continue;
        SampleMeta m;
        m.id = pool.size();
        m.owner_rank = static_cast<int32_t>(pool.size() % world);
        m.lengths.tokens = cuts[k] - cuts[k - 1];
        pool.push_back(m);
      }
    }
    std::shuffle(pool.begin(), pool.end(), rng);
    // 0.3% of the budget left over (the window's end lies under its target).
    uint64_t total = 0;
    for (const SampleMeta& m : pool) total += m.lengths.tokens;
    while (total > world * 4096 * 997 / 1000) {
      total -= pool.back().lengths.tokens;
      pool.pop_back();
    }
    std::vector<GlobalStep> window = FilledWindow(c, pool, world, 2);
    const auto keys = Keys(window);
    const double before = WindowCost(c, window);
    BalanceWindow(c, window);
    REQUIRE(Keys(window) == keys);
    RequireWithinBudget(c, window);
    REQUIRE(WindowCost(c, window) <= before);
    for (const GlobalStep& g : window) REQUIRE(g.size() == world);
    one += window.size() == 1;
  }
  INFO("windows laid in one micro-step: " << one << " of 40");
  // 35 with best-fit, 28 without.
  REQUIRE(one >= 33);
}

TEST_CASE("a rank's micro-steps of equal cost are split evenly, not one nearly empty", "[window_balance]") {
  // Each rank: 4, 4, 2, 2 packed into two micro-steps of budget 10 (three
  // as planned). Under a linear step model every cut into two runs costs the
  // same; the even one (8 | 4) is kept, not 10 | 2 (a micro-step of 2
  // tokens pays an accelerator's fixed floors for little work).
  uint64_t id = 0;
  std::vector<GlobalStep> window = {
      {PackedStep({4, 4}, 0, id), PackedStep({4, 4}, 1, id)},
      {PackedStep({2}, 0, id), PackedStep({2}, 1, id)},
      {PackedStep({2}, 0, id), PackedStep({2}, 1, id)},
  };
  const WindowBalanceConfig c = PackedConfig(10, 1.0);
  const auto keys = Keys(window);
  REQUIRE(BalanceWindow(c, window));
  REQUIRE(Keys(window) == keys);
  RequireWithinBudget(c, window);
  REQUIRE(window.size() == 2);
  REQUIRE(WindowCost(c, window) == 2.0 + 12.0);
  for (const GlobalStep& g : window) {
    for (const PlannedStep& s : g) {
      INFO("micro-step of " << s.real_tokens << " tokens");
      REQUIRE(s.real_tokens <= 8);
    }
  }
}

TEST_CASE("a rank whose samples fit fewer micro-steps splits them over the window's, not IDLE ones",
          "[window_balance]") {
  // Packed, attention-heavy (cost 1 + tokens + len^2 a micro-step): three
  // 9s and four 1s over three ranks of budget 10 need two micro-steps a
  // rank, and the even layout gives each rank a 9 and the 1s 2, 1, 1. Ranks
  // 1 and 2 could run {9, 1} and an IDLE micro-step or {9} and {1}: the
  // same cost (an IDLE micro-step costs per_step, as a micro-step's fixed
  // part does); the split is kept (the trainer runs a dummy step for IDLE).
  uint64_t id = 0;
  std::vector<GlobalStep> window = {
      {PackedStep({9, 1}, 0, id), PackedStep({9, 1}, 1, id), PackedStep({1}, 2, id)},
      {PackedStep({9}, 0, id), PackedStep({1}, 1, id), PlannedStep{}},
  };
  WindowBalanceConfig c = PackedConfig(10, 1.0);
  c.step_model.per_len_sq = 1.0;
  const auto keys = Keys(window);
  REQUIRE(WindowCost(c, window) == 2.0 + 19.0 + 163.0);
  REQUIRE(BalanceWindow(c, window));
  REQUIRE(Keys(window) == keys);
  RequireWithinBudget(c, window);
  REQUIRE(window.size() == 2);
  REQUIRE(WindowCost(c, window) == 2.0 + 11.0 + 83.0);
  for (const GlobalStep& g : window) {
    for (size_t r = 0; r < g.size(); ++r) {
      INFO("rank " << r);
      REQUIRE(!g[r].samples.empty());
    }
  }
}

TEST_CASE("a padded window's length-sorted runs are cut to even costs: even ranks", "[window_balance]") {
  // A window of batching_sim's image_text trace (W = 8, padded budget 4096,
  // 4m windows, default_tokens: 220 samples, four global micro-steps'
  // budget, five micro-steps a rank), planned here as six a rank. Its
  // lengths come in clusters of equal ones: the least-padding cut fills
  // most runs to the budget and leaves a few light, and a rank dealt a light
  // run sums far below one dealt only full ones; the moves then stop at a
  // local optimum. Runs cut to even costs (at a little more padding), moved
  // on their own budget, make the slowest rank ~4% cheaper.
  const std::vector<uint32_t> lengths = {
      1537, 1507, 1502, 1480, 1035, 1035, 1035, 1030, 1030, 1030, 1029, 1029, 1028, 1028, 1028, 1027, 1027,
      1022, 1017, 958,  957,  880,  880,  880,  879,  875,  874,  874,  873,  809,  808,  808,  808,  808,
      808,  808,  808,  808,  807,  807,  807,  807,  806,  806,  806,  806,  806,  806,  806,  803,  802,
      802,  802,  802,  766,  766,  763,  760,  760,  760,  704,  704,  704,  704,  704,  704,  704,  703,
      703,  703,  701,  701,  701,  701,  701,  700,  700,  700,  700,  700,  699,  699,  699,  699,  699,
      698,  698,  698,  698,  698,  675,  675,  675,  675,  675,  675,  674,  674,  674,  674,  674,  674,
      674,  674,  674,  674,  674,  674,  673,  673,  673,  673,  672,  672,  672,  672,  672,  672,  672,
      672,  672,  672,  672,  672,  672,  672,  672,  672,  672,  672,  671,  671,  670,  670,  670,  670,
      669,  669,  669,  669,  669,  669,  669,  669,  669,  669,  669,  669,  669,  669,  669,  669,  669,
      669,  668,  668,  637,  637,  636,  636,  636,  636,  636,  635,  635,  635,  635,  635,  634,  634,
      634,  633,  633,  62,   62,   62,   62,   62,   61,   61,   60,   60,   58,   58,   57,   56,   55,
      55,   54,   54,   53,   53,   53,   53,   53,   53,   52,   52,   52,   52,   52,   52,   52,   51,
      51,   51,   51,   50,   50,   49,   48,   47,   47,   46,   45,   43,   43,   43,   42,   41};
  const WindowBalanceConfig c = Config(4096, 512.0);
  const size_t world = 8;
  std::vector<SampleMeta> pool;
  for (uint32_t len : lengths) {
    SampleMeta m;
    m.id = pool.size();
    m.owner_rank = static_cast<int32_t>(pool.size() % world);
    m.lengths.tokens = len;
    pool.push_back(m);
  }
  std::vector<GlobalStep> window = FilledWindow(c, pool, world, 5);
  const auto keys = Keys(window);
  REQUIRE(BalanceWindow(c, window));
  REQUIRE(Keys(window) == keys);
  RequireWithinBudget(c, window);
  for (const GlobalStep& g : window) REQUIRE(g.size() == world);
  double sum = 0.0;
  for (size_t r = 0; r < world; ++r) {
    for (const GlobalStep& g : window) sum += MicroStepCost(c, g[r]);
  }
  const double mean = sum / static_cast<double>(world);
  INFO("micro-steps " << window.size() << ", slowest rank " << WindowCost(c, window) << ", mean " << mean);
  // 19514 over a mean of 19382 (1.007); without the even runs 20304 over 19306 (1.052).
  REQUIRE(WindowCost(c, window) <= 1.01 * mean);
}

// The planner's layout of a window: [micro-step][rank] -> lengths (padded; a
// rank's samples owned by it).
std::vector<GlobalStep> PlannerLayout(const std::vector<std::vector<std::vector<uint32_t>>>& steps) {
  uint64_t id = 0;
  std::vector<GlobalStep> window;
  for (const auto& ranks : steps) {
    GlobalStep g;
    for (size_t r = 0; r < ranks.size(); ++r) {
      std::vector<SampleMeta> metas;
      for (uint32_t len : ranks[r]) {
        SampleMeta m;
        m.id = id++;
        m.owner_rank = static_cast<int32_t>(r);
        m.lengths.tokens = len;
        metas.push_back(m);
      }
      std::vector<size_t> members(metas.size());
      std::iota(members.begin(), members.end(), size_t{0});
      g.push_back(MakeStep(grouping::CostModel::kPadded, metas, members, false));
    }
    window.push_back(std::move(g));
  }
  return window;
}

double MeanRank(const WindowBalanceConfig& c, const std::vector<GlobalStep>& window) {
  double sum = 0.0;
  for (const GlobalStep& g : window) {
    for (const PlannedStep& s : g) sum += MicroStepCost(c, s);
  }
  return sum / static_cast<double>(window.front().size());
}

TEST_CASE("a padded window of whole long samples: one sample for two where no move or exchange helps",
          "[window_balance]") {
  // A window of batching_sim's debian_docs trace (W = 8, padded budget 4096,
  // 4m windows, gpu_7b_h100's step model): 27 samples of 4096 tokens, each
  // alone in a micro-step, so three ranks run four of them; the others hold
  // the 3061 and ten of ~1577 (two a micro-step). The best layout leaves the
  // ranks with four 4096s nothing else (their fifth micro-step IDLE): single
  // moves and exchanges stop with a ~1577 on one of them; one sample for two
  // of another rank's (or two for one) gets there.
  WindowBalanceConfig c = Config(4096);
  c.step_model = {0.03626155, 7.435e-05, 1.59e-09};
  std::vector<GlobalStep> window = PlannerLayout({
      {{}, {3061}, {1577, 1573}, {1581, 1578}, {1577, 1577}, {1577, 1573}, {}, {1577, 1577}},
      {{4096}, {4096}, {4096}, {4096}, {4096}, {4096}, {4096}, {4096}},
      {{4096}, {4096}, {4096}, {4096}, {4096}, {4096}, {4096}, {4096}},
      {{4096}, {4096}, {4096}, {4096}, {4096}, {4096}, {4096}, {4096}},
      {{4096}, {4096}, {4096}, {}, {}, {}, {}, {}},
  });
  const auto keys = Keys(window);
  REQUIRE(BalanceWindow(c, window));
  REQUIRE(Keys(window) == keys);
  RequireWithinBudget(c, window);
  for (const GlobalStep& g : window) REQUIRE(g.size() == 8);
  uint64_t id = 0;
  const double four = 4 * MicroStepCost(c, Step({4096}, 0, id)) + c.step_model.per_step;
  INFO("micro-steps " << window.size() << ", slowest rank " << WindowCost(c, window) << ", four 4096s "
                      << four << ", mean " << MeanRank(c, window));
  // 1.50616 (four 4096s and an IDLE micro-step); 1.53793 without the group exchanges.
  REQUIRE(WindowCost(c, window) <= four * (1 + 1e-9));
}

TEST_CASE("a padded window of clustered lengths: equal lengths tried once, the moves reach further",
          "[window_balance]") {
  // A window of batching_sim's image_text trace (W = 8, padded budget 4096,
  // 4m windows, default_tokens: 188 samples in clusters of equal lengths,
  // five micro-steps a rank). Improve's moves end at the work bound here:
  // evaluating each length once per rank, and not packing receivers whose
  // cost bound already reaches the best move, lets them go further.
  const WindowBalanceConfig c = Config(4096, 512.0);
  std::vector<GlobalStep> window = PlannerLayout({
      {{1333, 1327}, {667, 667, 667}, {667, 667, 666}, {664}, {799, 798}, {664, 664, 664}, {}, {798, 798}},
      {{621, 621, 621, 617, 620, 620},
       {924, 923, 924, 924},
       {621, 621, 621, 621, 621, 617},
       {742, 742, 741, 741, 741},
       {617, 617, 617, 617, 617, 617},
       {742, 742, 741, 742, 742},
       {617, 617, 617, 617, 620, 620},
       {926, 925, 924, 923}},
      {{652, 654, 651, 651, 651, 654},
       {654, 651, 651, 651, 654, 654},
       {334, 356, 353, 341, 338, 356, 340, 342, 345, 342, 347},
       {782, 782, 782, 785, 781},
       {785, 785, 785, 785, 781},
       {654, 654, 654, 654, 654, 653},
       {652, 652, 654, 651, 651, 651},
       {1298, 1292, 1299}},
      {{757, 757, 757, 756, 756},
       {634, 634, 630, 630, 630, 630},
       {763, 763, 763, 763, 763},
       {630, 630, 630, 630, 630, 630},
       {756, 756, 756, 756, 756},
       {944, 945, 944, 944},
       {633, 633, 633, 633, 633, 633},
       {630, 630, 633, 633, 633, 633}},
      {{803, 803, 803, 803},
       {671, 673, 671, 673, 673, 670},
       {809, 809, 809, 810},
       {670, 673, 670, 670, 670},
       {673, 670, 673, 673, 673},
       {810, 810, 803, 809},
       {670, 676, 676, 676, 676},
       {670, 670, 670, 672, 672, 672}},
  });
  const auto keys = Keys(window);
  REQUIRE(BalanceWindow(c, window));
  REQUIRE(Keys(window) == keys);
  RequireWithinBudget(c, window);
  for (const GlobalStep& g : window) REQUIRE(g.size() == 8);
  const double mean = MeanRank(c, window);
  INFO("micro-steps " << window.size() << ", slowest rank " << WindowCost(c, window) << ", mean " << mean);
  // 19129 over a mean of 19081; 19338 over 19172 without the single evaluations and prunes.
  REQUIRE(WindowCost(c, window) <= 19200.0);
}

TEST_CASE("a padded exchange the receiver's packing rules out is not packed: the moves reach further",
          "[window_balance]") {
  // A window of batching_sim's chat_longtail trace (W = 8, padded budget
  // 4096, 4m windows, gpu_1b_h100's planner model: per micro-step 17.6 ms,
  // 13.7 us a padded token, 0.40 ns a squared length), five micro-steps a
  // rank after the search. Improve's moves end at the work bound. An
  // exchange of x for y costs the other rank at least its packing without y
  // (packed once per y) and x's own cost, so exchanges that cannot beat the
  // best found are skipped before their packings: 0.32459 s with every
  // exchange packed, 0.32259 s with the skips (the same moves while the
  // bound allows, so more of them before it).
  WindowBalanceConfig c;
  c.budget.model = grouping::CostModel::kPadded;
  c.budget.max_tokens = 4096;
  c.step_model.per_step = 0.01758304;
  c.step_model.per_padded_token = 1.368e-05;
  c.step_model.per_len_sq = 3.976e-10;
  std::vector<GlobalStep> window = PlannerLayout({
      {{984, 985, 984}, {1926, 1916}, {}, {237, 238, 238, 238, 238, 237, 236, 236, 237}, {403, 402, 402, 403, 402, 402}, {661, 664, 661, 663}, {147}, {336, 335, 336, 335, 335, 334, 336}},
      {{362, 361, 361, 362, 361, 362, 362, 362, 360, 361, 360}, {975, 977, 975, 971}, {3617}, {106, 105, 103, 105, 102, 103, 103, 102, 105, 103, 103, 105, 106, 105, 106, 102, 103, 106, 102, 104, 102, 106, 102, 103, 101, 102, 104, 101, 105, 105, 105, 102, 101, 104, 105, 104, 102, 103}, {655, 655, 652, 655, 652, 651}, {209, 209, 209, 210, 210, 209, 209, 210, 209, 209, 210, 210, 210, 208, 210, 208, 210, 208, 209}, {443, 443, 443, 443, 443, 442, 442, 443, 442}, {265, 264, 265, 264, 265, 264, 264, 264, 264, 264, 264, 264, 263, 264, 263}},
      {{2648}, {1365, 1371}, {2671}, {2652}, {1372, 1369}, {2622}, {1381, 1380}, {1376, 1375}},
      {{1932, 1937}, {161, 162, 160, 161, 159, 159, 159, 161, 160, 159, 161, 161, 159, 159, 159, 159, 160, 161, 159, 159, 159, 160, 161, 158, 160}, {364, 364, 364, 364, 363, 363, 363, 363, 363, 362, 363}, {211, 212, 213, 213, 211, 212, 211, 211, 211, 211, 212, 212, 211, 211, 212, 212, 211, 212, 212}, {400, 400, 400, 401, 400, 400, 400, 400, 400, 400}, {665, 666, 665, 666, 664, 665}, {65, 66, 65, 63, 66, 60, 69, 67, 69, 62, 67, 63, 60, 64, 60, 65, 68, 59, 63, 63, 64, 66, 68, 61, 62, 59, 64, 59, 64, 62, 61, 59, 67, 61, 61, 60, 68, 62, 59, 59, 64, 59, 63, 65, 60, 61, 68, 69, 63, 64, 65, 66, 64, 65, 60, 64, 59, 60, 62}, {798, 796, 796, 798, 798}},
      {{1797, 1797}, {1214, 1213, 1214}, {412, 412, 411, 412, 413, 413, 412, 410, 413}, {1210, 1210, 1209}, {733, 734, 739, 737, 737}, {735, 736, 740, 735, 735}, {1800, 1801}, {466, 464, 463, 462, 464, 465, 463, 463}},
      {{}, {}, {}, {}, {}, {165, 165}, {}, {}},
  });
  const auto keys = Keys(window);
  REQUIRE(BalanceWindow(c, window));
  REQUIRE(Keys(window) == keys);
  RequireWithinBudget(c, window);
  for (const GlobalStep& g : window) REQUIRE(g.size() == 8);
  INFO("micro-steps " << window.size() << ", slowest rank " << WindowCost(c, window) << ", mean "
                      << MeanRank(c, window));
  REQUIRE(window.size() == 5);
  REQUIRE(WindowCost(c, window) <= 0.3235);
}

TEST_CASE("a wide padded window's length-sorted runs fill the micro-steps: few IDLE ones",
          "[window_balance]") {
  // 64 ranks, one global micro-step's budget of long-tailed lengths (many
  // short samples of equal lengths), planned as three micro-steps a rank.
  // The least-padding cut into at most 128 runs keeps runs of equal lengths
  // whole and leaves slots over; unless the costliest runs are split into
  // them, ranks dealt one run run an IDLE micro-step.
  const WindowBalanceConfig c = Config(4096, 512.0);
  const size_t world = 64;
  std::mt19937_64 rng(11);
  std::lognormal_distribution<double> length(5.8, 1.0);
  std::vector<SampleMeta> pool;
  uint64_t tokens = 0;
  for (uint64_t id = 0; tokens < 230000; ++id) {
    SampleMeta m;
    m.id = id;
    m.owner_rank = static_cast<int32_t>(id % world);
    m.lengths.tokens = std::clamp<uint32_t>(static_cast<uint32_t>(length(rng)) / 16 * 16, 16, 4096);
    tokens += m.lengths.tokens;
    pool.push_back(m);
  }
  // The planner's layout: arrival order, each rank's micro-step filled to the budget, three a rank.
  std::vector<GlobalStep> window = FilledWindow(c, pool, world, 3);
  const auto keys = Keys(window);
  const double before = WindowCost(c, window);
  REQUIRE(BalanceWindow(c, window));
  REQUIRE(Keys(window) == keys);
  RequireWithinBudget(c, window);
  size_t idle = 0;
  for (const GlobalStep& g : window) {
    REQUIRE(g.size() == world);
    for (const PlannedStep& s : g) idle += s.samples.empty();
  }
  INFO("micro-steps " << window.size() << ", IDLE " << idle << ", cost " << before << " -> "
                      << WindowCost(c, window) << ", samples " << pool.size());
  REQUIRE(window.size() == 2);
  // At most 5% of the rank-steps IDLE (issue 35's mark; 3 here, 20 without the splits).
  REQUIRE(idle * 20 <= window.size() * world);
}

TEST_CASE("a window already even, or one with an over-budget step, is left as it is", "[window_balance]") {
  uint64_t id = 0;
  std::vector<GlobalStep> even = {{Step({256, 256}, 0, id), Step({256, 256}, 1, id)}};
  const std::vector<GlobalStep> before = even;
  REQUIRE_FALSE(BalanceWindow(Config(512), even));
  REQUIRE(Keys(even) == Keys(before));
  REQUIRE(even[0][0].samples[0].id == before[0][0].samples[0].id);

  std::vector<GlobalStep> over = {{Step({900}, 0, id), Step({100}, 1, id)},
                                  {PlannedStep{}, Step({100}, 1, id)}};
  over[0][0].over_budget = true;
  REQUIRE_FALSE(BalanceWindow(Config(512), over));
  REQUIRE(over.size() == 2);
  REQUIRE(over[1][1].samples.size() == 1);
}

TEST_CASE("samples of equal lengths stay on their owner's rank", "[window_balance]") {
  // Rank 0 runs three of the four samples, two of them rank 1's. The even
  // layout (two a rank) can keep every sample home: samples of equal lengths
  // are interchangeable, whatever order they were placed in.
  uint64_t id = 0;
  std::vector<GlobalStep> window = {{Step({100, 100}, 0, id), Step({100}, 1, id)}};
  const PlannedStep other = Step({100}, 1, id);
  window[0][0].samples.push_back(other.samples[0]);
  window[0][0].real_tokens += 100;
  window[0][0].padded_tokens += 100;
  REQUIRE(BalanceWindow(Config(512), window));
  for (const GlobalStep& g : window) {
    for (size_t r = 0; r < g.size(); ++r) {
      for (const SampleMeta& m : g[r].samples) REQUIRE(m.owner_rank == static_cast<int32_t>(r));
    }
  }
  REQUIRE(Keys(window).size() == 4);
}

TEST_CASE("single moves even a window the cut left with a long sample on one rank", "[window_balance]") {
  // The cut's first micro-step: rank 0 holds one long sample, rank 1 a short one.
  uint64_t id = 0;
  std::vector<GlobalStep> window = {
      {Step({500}, 0, id), Step({100}, 1, id)},
      {Step({100, 100, 100, 100}, 0, id), Step({100, 100, 100, 100}, 1, id)},
  };
  const WindowBalanceConfig c = Config(512);
  const auto keys = Keys(window);
  REQUIRE(WindowCost(c, window) == 900.0);
  REQUIRE(MoveSamples(c, window));
  REQUIRE(WindowCost(c, window) == 700.0);  // two short samples moved to rank 1
  REQUIRE(window.size() == 2);
  REQUIRE(Keys(window) == keys);
  RequireWithinBudget(c, window);
  // Even: nothing left to move.
  REQUIRE_FALSE(MoveSamples(c, window));
}

TEST_CASE("two sparse micro-steps that fit one are merged", "[window_balance]") {
  uint64_t id = 0;
  std::vector<GlobalStep> window = {
      {Step({200}, 0, id), Step({200}, 1, id)},
      {Step({100}, 0, id), PlannedStep{}},
      {PlannedStep{}, Step({100}, 1, id)},
  };
  const WindowBalanceConfig c = Config(512, 50.0);
  const auto keys = Keys(window);
  REQUIRE(WindowCost(c, window) == 450.0);
  REQUIRE(MergeMicroSteps(c, window));
  REQUIRE(window.size() == 2);  // merging the first with either would cost rank 0 or 1 more
  REQUIRE(WindowCost(c, window) == 400.0);
  REQUIRE(Keys(window) == keys);
  RequireWithinBudget(c, window);
  REQUIRE_FALSE(MergeMicroSteps(c, window));
}

// A large long-tailed padded window the layout search gives up on: 8 ranks,
// `steps` micro-steps of a padded 4096-token budget, lengths long-tailed
// (32..4096, lognormal from `seed`) and grouped as the planner groups them
// (runs of similar lengths, each as full as the budget allows), a micro-step
// of 8 of them after another (the planner balances each step) over steps - 1
// micro-steps; the last holds the first part of a step the cut split (a long
// sample on rank 0, a short one on rank 1). The search's greedy finds no
// layout within the micro-steps of such full groups.
std::vector<GlobalStep> LongTailedWindow(const WindowBalanceConfig& c, size_t steps, uint64_t seed,
                                         size_t* samples = nullptr) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> length(5.8, 1.0);
  const size_t world = 8;
  std::vector<SampleMeta> pool;
  for (uint64_t id = 0; id < 1100; ++id) {
    SampleMeta m;
    m.id = id;
    m.owner_rank = static_cast<int32_t>(id % world);
    m.lengths.tokens = std::clamp<uint32_t>(static_cast<uint32_t>(length(rng)), 32, 4096);
    pool.push_back(m);
  }
  std::sort(pool.begin(), pool.end(),
            [](const SampleMeta& a, const SampleMeta& b) { return a.lengths.tokens > b.lengths.tokens; });
  std::vector<GlobalStep> window(steps, GlobalStep(world));
  size_t next = 0, slot = 0;
  while (next < pool.size() && slot < (steps - 1) * world) {
    window[slot / world][slot % world] = FillToBudget(c, pool, next);
    ++slot;
  }
  uint64_t last = pool.size();
  window[steps - 1][0] = Step({3900}, 0, last);
  window[steps - 1][1] = Step({300}, 1, last);
  if (samples) *samples = next;
  return window;
}

// Time model (a): every micro-step waits for its slowest rank.
double SyncCost(const WindowBalanceConfig& c, const std::vector<GlobalStep>& window) {
  double total = 0.0;
  for (const GlobalStep& g : window) {
    double worst = 0.0;
    for (const PlannedStep& s : g) worst = std::max(worst, MicroStepCost(c, s));
    total += worst;
  }
  return total;
}

TEST_CASE("a large long-tailed padded window the layout search gives up on is still evened",
          "[window_balance]") {
  // The single moves bring the slowest rank to within 2% of the mean.
  const WindowBalanceConfig c = Config(4096, 512.0);
  const size_t world = 8, steps = 20;
  size_t next = 0;
  std::vector<GlobalStep> window = LongTailedWindow(c, steps, 7, &next);
  const auto keys = Keys(window);
  const double before = WindowCost(c, window);
  REQUIRE(BalanceWindow(c, window));
  REQUIRE(Keys(window) == keys);
  REQUIRE(window.size() <= steps);
  for (const GlobalStep& g : window) REQUIRE(g.size() == world);
  RequireWithinBudget(c, window);
  double sum = 0.0, worst = 0.0;
  for (size_t r = 0; r < world; ++r) {
    double rank = 0.0;
    for (const GlobalStep& g : window) rank += MicroStepCost(c, g[r]);
    sum += rank;
    worst = std::max(worst, rank);
  }
  INFO("before " << before << ", after " << worst << ", mean " << sum / world << ", samples " << next);
  REQUIRE(worst < before);
  REQUIRE(worst <= 1.02 * sum / world);
}

TEST_CASE("within-step moves before the free ones even the micro-steps (time model (a))",
          "[window_balance]") {
  // Long-tailed windows the layout search gives up on: BalanceWindow is then
  // the free moves and merges on the window as cut, unless the within-step
  // moves before them leave both the slowest rank's sum (b) and the sum of
  // the micro-steps' slowest ranks (a) no higher and one lower. Measured
  // (before them BalanceWindow gave the free result): seed 1, 40 micro-steps,
  // (a) 96546 -> 95426, (b) 93827 -> 93533; seed 9, 40: (a) 89714 -> 87487;
  // seed 12, 20: (a) 79419 -> 78501; 5 of these 8 windows change.
  const WindowBalanceConfig c = Config(4096, 512.0);
  int evened = 0;
  for (uint64_t seed : {1, 5, 9, 12}) {
    for (size_t steps : {20, 40}) {
      INFO("seed " << seed << ", " << steps << " micro-steps");
      std::vector<GlobalStep> window = LongTailedWindow(c, steps, seed);
      const auto keys = Keys(window);
      std::vector<GlobalStep> free = window;
      MoveSamples(c, free);
      MergeMicroSteps(c, free);
      REQUIRE(BalanceWindow(c, window));
      REQUIRE(Keys(window) == keys);
      RequireWithinBudget(c, window);
      REQUIRE(WindowCost(c, window) <= WindowCost(c, free));
      REQUIRE(SyncCost(c, window) <= SyncCost(c, free));
      evened += SyncCost(c, window) < SyncCost(c, free);
    }
  }
  REQUIRE(evened >= 4);
}

TEST_CASE("random windows: the same samples, within budget, equal counts, never costlier",
          "[window_balance]") {
  std::mt19937_64 rng(4242);
  int changed = 0, tight = 0;
  for (int trial = 0; trial < 400; ++trial) {
    // Every tenth window spans more ranks than a sample is offered to (kCandidateRanks).
    const size_t world = trial % 10 == 0 ? kCandidateRanks + 1 + rng() % 40 : 1 + rng() % 6;
    const size_t steps = 1 + rng() % 4;
    const uint64_t budget = 256 + rng() % 1024;
    WindowBalanceConfig c = Config(budget, static_cast<double>(rng() % 3) * 100.0);
    if (trial % 3 == 1) {
      c.budget.model = grouping::CostModel::kPacked;
      c.step_model.per_len_sq = 0.01;
    }
    if (trial % 5 == 2) c.budget.max_group_size = 4;
    uint64_t id = 0;
    std::vector<GlobalStep> window(steps, GlobalStep(world));
    for (size_t k = 0; k < steps; ++k) {
      for (size_t r = 0; r < world; ++r) {
        if (rng() % 4 == 0) continue;  // IDLE
        // A group the budget holds: similar lengths, until the next would not fit.
        std::vector<SampleMeta> metas;
        std::vector<SampleLengths> lens;
        const uint32_t base = 8 + static_cast<uint32_t>(rng() % (budget / 2));
        for (int n = 0; n < 12; ++n) {
          SampleMeta m;
          m.id = id++;
          m.owner_rank = static_cast<int32_t>(rng() % world);
          m.lengths.tokens = base + static_cast<uint32_t>(rng() % 16);
          lens.push_back(m.lengths);
          if (!FitsBudget(c.budget, lens)) break;
          metas.push_back(m);
        }
        if (metas.empty()) continue;
        std::vector<size_t> members(metas.size());
        for (size_t i = 0; i < members.size(); ++i) members[i] = i;
        window[k][r] = MakeStep(c.budget.model, metas, members, false);
      }
    }
    INFO("trial " << trial);
    const auto keys = Keys(window);
    const double before = WindowCost(c, window);
    std::vector<GlobalStep> balanced = window;
    const bool did = BalanceWindow(c, balanced);
    changed += did;
    REQUIRE(Keys(balanced) == keys);
    REQUIRE(!balanced.empty());
    REQUIRE(balanced.size() <= window.size());
    // FewestMicroSteps bounds the count from below (the window cut's search
    // skips balancing where the bounds settle a count), and is met by some.
    uint64_t tokens = 0, count = 0;
    for (const GlobalStep& g : window) {
      for (const PlannedStep& s : g) {
        count += s.samples.size();
        tokens += s.real_tokens;
      }
    }
    const size_t fewest = FewestMicroSteps(c.budget, world, tokens, count);
    REQUIRE(balanced.size() >= fewest);
    tight += balanced.size() == fewest && fewest > 1;
    for (const GlobalStep& g : balanced) REQUIRE(g.size() == world);
    RequireWithinBudget(c, balanced);
    if (did) {
      REQUIRE(WindowCost(c, balanced) < before);
    } else {
      REQUIRE(WindowCost(c, balanced) == before);
    }
    // A pure function of the samples: the window's steps in another order give the same layout.
    std::vector<GlobalStep> reversed(window.rbegin(), window.rend());
    BalanceWindow(c, reversed);
    if (did) {
      REQUIRE(reversed.size() == balanced.size());
      for (size_t k = 0; k < balanced.size(); ++k) {
        for (size_t r = 0; r < world; ++r) {
          REQUIRE(reversed[k][r].samples.size() == balanced[k][r].samples.size());
          for (size_t j = 0; j < balanced[k][r].samples.size(); ++j) {
            REQUIRE(KeyOf(reversed[k][r].samples[j]) == KeyOf(balanced[k][r].samples[j]));
          }
        }
      }
    }
  }
  REQUIRE(changed > 50);
  REQUIRE(tight > 10);
}

}  // namespace
}  // namespace odb::align
