// Accumulation windows under partitioned planning (window_partitioned.h),
// with every rank's block simulated in one process: the offers every rank
// would all-gather, the shared choice, and each block cutting its own steps.
#include "src/align/window_partitioned.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "src/grouping/budget.h"

namespace odb::align {
namespace {

// A round's plan of W ranks x T steps: each rank-step filled with samples of
// lognormal lengths up to `budget` tokens (packed); `idle_every`: every
// n-th rank-step is IDLE; `masked`: some samples carry fewer loss tokens
// than tokens (prompt-masked), a few none.
RoundPlan RandomPlan(std::mt19937_64& rng, size_t world, uint32_t steps, uint32_t budget, double mu,
                     uint32_t idle_every, bool masked, uint64_t& next_id) {
  RoundPlan plan;
  plan.num_steps = steps;
  plan.ranks.resize(world);
  std::lognormal_distribution<double> length(mu, 0.8);
  for (size_t r = 0; r < world; ++r) {
    for (uint32_t k = 0; k < steps; ++k) {
      PlannedStep s;
      if (idle_every == 0 || (r * steps + k) % idle_every != 1) {
        uint32_t used = 0;
        for (;;) {
          const auto n = std::clamp<uint32_t>(static_cast<uint32_t>(length(rng)), 1, budget);
          if (used + n > budget) break;
          SampleMeta m;
          m.id = next_id++;
          m.owner_rank = static_cast<int32_t>(r);
          m.lengths.tokens = n;
          if (masked) {
            const uint64_t roll = rng() % 10;
            m.loss_tokens = roll == 0 ? 0 : roll < 5 ? n / 2 : kEveryTokenBearsLoss;
          }
          s.samples.push_back(m);
          used += n;
        }
      }
      s.idle = s.samples.empty();
      std::vector<SampleLengths> lens;
      for (const SampleMeta& m : s.samples) {
        s.real_tokens += m.lengths.tokens;
        lens.push_back(m.lengths);
      }
      s.padded_tokens = s.idle ? 0 : grouping::PaddedTokens(grouping::CostModel::kPacked, lens);
      plan.ranks[r].steps.push_back(std::move(s));
    }
  }
  return plan;
}

struct RoundOutcome {
  RoundPlan plan;  // every block's ranks filled
  std::vector<uint64_t> global_real;
  std::vector<uint64_t> closed;  // the windows closed (world loss tokens)
  WindowState windows;
};

// One round as every block would run it: world-wide totals, every rank's
// offers, the choice on each block's first rank, Apply per block.
// `tol`: micro-step-aware ends (0: the nominal ends).
// `merge`: merged parts on (window_partitioned.h), with this budget and step
// model, samples moving within their block when `moves`; null: off.
RoundOutcome RunRound(const RoundPlan& in, uint64_t target, size_t block, const WindowState& before,
                      bool inputs_open, bool last_samples = false, uint64_t tol = 0,
                      const WindowBalanceConfig* merge = nullptr, bool moves = true,
                      size_t* merged = nullptr) {
  const size_t world = in.ranks.size();
  std::vector<uint64_t> loss(in.num_steps, 0), real(in.num_steps, 0);
  for (const RankPlan& rp : in.ranks) {
    for (uint32_t k = 0; k < in.num_steps; ++k) {
      for (const SampleMeta& m : rp.steps[k].samples) loss[k] += LossTokensOf(m);
      real[k] += rp.steps[k].real_tokens;
    }
  }
  RoundOutcome out;
  out.plan = in;
  for (RankPlan& rp : out.plan.ranks) rp.steps.clear();
  std::vector<std::vector<CutOffer>> offers(world);
  std::vector<std::vector<uint8_t>> fits;  // every rank's merge bits: its block's
  size_t inside = 0, moved = 0;
  {
    PartitionedWindows probe(target, loss, real, world, tol);
    for (size_t r = 0; r < world; ++r) offers[r] = probe.Offers(in.ranks[r].steps);
    inside = probe.inside_ends();
    moved = probe.moved_ends();
    if (merge != nullptr && inside > 0) {
      probe.EnableMerges(*merge, moves);
      fits.resize(world);
      for (size_t b = 0; b < world; b += block) {
        const std::vector<uint8_t> bits =
            probe.MergeFits(in, static_cast<int>(b), static_cast<int>(std::min(world, b + block)));
        for (size_t r = b; r < std::min(world, b + block); ++r) fits[r] = bits;
      }
    }
  }
  bool first = true;
  for (size_t b = 0; b < world; b += block) {
    PartitionedWindows cut(target, loss, real, world, tol);
    if (merge != nullptr) cut.EnableMerges(*merge, moves);
    // Every block moves the same ends and asks for the same offers.
    REQUIRE(cut.inside_ends() == inside);
    REQUIRE(cut.moved_ends() == moved);
    REQUIRE(cut.Decide(offers, fits).ok());
    RoundPlan mine = in;  // this block's view: only its ranks' steps
    for (size_t r = 0; r < world; ++r) {
      if (r < b || r >= b + block) mine.ranks[r].steps.clear();
    }
    WindowState ws = before;
    std::vector<uint64_t> global_real;
    cut.Apply(mine, static_cast<int>(b), static_cast<int>(std::min(world, b + block)),
              grouping::CostModel::kPacked, ws, inputs_open, last_samples, global_real);
    if (merged != nullptr) *merged = cut.merged();
    if (first) {
      out.windows = ws;
      out.global_real = global_real;
      out.closed = cut.closed_windows();
      out.plan.num_steps = mine.num_steps;
      first = false;
    }
    // Every block: the same window state, micro-steps and totals.
    REQUIRE(ws.next_window == out.windows.next_window);
    REQUIRE(ws.held_tokens == out.windows.held_tokens);
    REQUIRE(ws.held_rounds == out.windows.held_rounds);
    REQUIRE(mine.num_steps == out.plan.num_steps);
    REQUIRE(global_real == out.global_real);
    for (size_t r = b; r < std::min(world, b + block); ++r) out.plan.ranks[r] = std::move(mine.ranks[r]);
  }
  return out;
}

// Two micro-steps carry the same window fields (window id, its loss tokens,
// micro-step count, whether it closes there, whether it is short).
void RequireSameWindow(const PlannedStep& s, const PlannedStep& other) {
  REQUIRE(s.window == other.window);
  REQUIRE(s.window_loss_tokens == other.window_loss_tokens);
  REQUIRE(s.window_steps == other.window_steps);
  REQUIRE(s.closes_window == other.closes_window);
  REQUIRE(s.window_short == other.window_short);
}

// Over block [b, b + block) of a balanced round: each micro-step keeps its
// samples, real and loss tokens over the block, and the window fields, weights
// and idle flags of every rank's part are consistent; `each` checks more of a
// rank's balanced micro-step k (r, k), and adds its weight to `weight`.
template <typename Each>
void RequireBlockTotalsKept(const RoundPlan& before, const RoundPlan& after, size_t b, size_t block,
                            std::map<uint64_t, double>& weight, Each each) {
  for (uint32_t k = 0; k < before.num_steps; ++k) {
    std::multiset<uint64_t> ids_before, ids_after;
    uint64_t real_before = 0, real_after = 0, loss_before = 0, loss_after = 0;
    for (size_t r = b; r < b + block; ++r) {
      const PlannedStep& o = before.ranks[r].steps[k];
      const PlannedStep& s = after.ranks[r].steps[k];
      for (const SampleMeta& m : o.samples) ids_before.insert(m.id);
      for (const SampleMeta& m : s.samples) ids_after.insert(m.id);
      real_before += o.real_tokens;
      real_after += s.real_tokens;
      loss_before += o.loss_tokens;
      loss_after += s.loss_tokens;
      RequireSameWindow(s, o);
      REQUIRE(s.idle == s.samples.empty());
      weight[s.window] += s.loss_weight;
      each(s, r, k);
    }
    REQUIRE(ids_after == ids_before);
    REQUIRE(real_after == real_before);
    REQUIRE(loss_after == loss_before);
  }
}

// A window balance of `model` under a budget of `max_tokens`, each micro-step
// costing `per_step` plus one per padded token.
WindowBalanceConfig BalanceConfig(grouping::CostModel model, uint64_t max_tokens, double per_step) {
  WindowBalanceConfig config;
  config.budget.model = model;
  config.budget.max_tokens = max_tokens;
  config.step_model.per_step = per_step;
  config.step_model.per_padded_token = 1.0;
  return config;
}

// The block's slowest rank over each window (the sum of its micro-step
// costs), before and after: one pair per window of the round.
std::vector<std::pair<double, double>> BlockWindowWorst(const WindowBalanceConfig& config, const RoundPlan& before,
                                                        const RoundPlan& after, size_t b, size_t block) {
  std::vector<std::pair<double, double>> worst;
  const uint32_t t = before.num_steps;
  for (uint32_t first = 0; first < t;) {
    uint32_t last = first;
    while (last < t && after.ranks[b].steps[last].window == after.ranks[b].steps[first].window) ++last;
    double worst_before = 0.0, worst_after = 0.0;
    for (size_t r = b; r < b + block; ++r) {
      double sum_before = 0.0, sum_after = 0.0;
      for (uint32_t k = first; k < last; ++k) {
        sum_before += MicroStepCost(config, before.ranks[r].steps[k]);
        sum_after += MicroStepCost(config, after.ranks[r].steps[k]);
      }
      worst_before = std::max(worst_before, sum_before);
      worst_after = std::max(worst_after, sum_after);
    }
    worst.emplace_back(worst_before, worst_after);
    first = last;
  }
  return worst;
}

// The window invariants of one round's result: every rank the same micro-step
// count and window fields, weights summing to W per window, loss tokens to
// the window's total, real tokens to global_real; each rank's samples in
// order, once, across its parts and what went back; every part within budget.
void RequireRoundInvariants(const RoundPlan& in, const RoundOutcome& out, uint32_t budget) {
  const size_t world = in.ranks.size();
  const uint32_t t = out.plan.num_steps;
  REQUIRE(out.global_real.size() == t);
  std::map<uint64_t, double> weight;
  std::map<uint64_t, uint64_t> loss;
  for (size_t r = 0; r < world; ++r) REQUIRE(out.plan.ranks[r].steps.size() == t);
  for (uint32_t k = 0; k < t; ++k) {
    const PlannedStep& s0 = out.plan.ranks[0].steps[k];
    uint64_t real = 0;
    for (size_t r = 0; r < world; ++r) {
      const PlannedStep& s = out.plan.ranks[r].steps[k];
      RequireSameWindow(s, s0);
      REQUIRE(s.idle == s.samples.empty());
      REQUIRE((!s.idle || s.loss_weight == 0.0));
      REQUIRE(s.padded_tokens <= budget);
      real += s.real_tokens;
      weight[s.window] += s.loss_weight;
      loss[s.window] += s.loss_tokens;
    }
    REQUIRE(real == out.global_real[k]);
    REQUIRE(real > 0);
  }
  for (const auto& [w, sum] : weight) {
    const uint64_t total = out.plan.ranks[0].steps.empty() ? 0 : [&] {
      for (const PlannedStep& s : out.plan.ranks[0].steps) {
        if (s.window == w) return s.window_loss_tokens;
      }
      return uint64_t{0};
    }();
    REQUIRE(loss[w] == total);
    if (total > 0) REQUIRE(sum == Approx(static_cast<double>(world)).epsilon(1e-12));
  }
  // A window's micro-steps are consecutive and it closes at its last.
  for (uint32_t k = 0; k < t; ++k) {
    const PlannedStep& s = out.plan.ranks[0].steps[k];
    const bool last = k + 1 == t || out.plan.ranks[0].steps[k + 1].window != s.window;
    REQUIRE(s.closes_window == last);
  }
  // Each rank's samples: emitted in order across its parts, then kept.
  for (size_t r = 0; r < world; ++r) {
    std::vector<uint64_t> want, got;
    for (const PlannedStep& s : in.ranks[r].steps) {
      for (const SampleMeta& m : s.samples) want.push_back(m.id);
    }
    for (const PlannedStep& s : out.plan.ranks[r].steps) {
      for (const SampleMeta& m : s.samples) got.push_back(m.id);
    }
    std::set<uint64_t> kept;
    for (const RankPlan& rp : out.plan.ranks) {
      for (const SampleKey& key : rp.keep_pending) {
        if (key.owner_rank == static_cast<int32_t>(r)) kept.insert(key.id);
      }
    }
    REQUIRE(got.size() + kept.size() == want.size());
    REQUIRE(std::equal(got.begin(), got.end(), want.begin()));  // a prefix, in order
    for (size_t i = got.size(); i < want.size(); ++i) REQUIRE(kept.count(want[i]) == 1);
  }
}

TEST_CASE("partitioned windows smaller than a global micro-step: target held, exact weights",
          "[window][partition]") {
  // 64 ranks in blocks of 8, an 8k-token budget: a global micro-step holds
  // ~500k tokens; windows of a fifth of that (the at-scale shape: W = 2560
  // with an 8k budget and a 4M-token window) end inside every step.
  constexpr size_t kWorld = 64;
  constexpr uint32_t kBudget = 8192;
  for (bool masked : {false, true}) {
    std::mt19937_64 rng(masked ? 17 : 5);
    uint64_t next_id = 0;
    WindowState ws;
    std::vector<double> sizes;
    uint64_t target = 0;
    for (int round = 0; round < 25; ++round) {
      const RoundPlan in = RandomPlan(rng, kWorld, 6, kBudget, 6.0, 23, masked, next_id);
      if (target == 0) {
        uint64_t loss = 0;
        for (const RankPlan& rp : in.ranks) {
          for (const PlannedStep& s : rp.steps) {
            for (const SampleMeta& m : s.samples) loss += LossTokensOf(m);
          }
        }
        target = loss / 6 / 5 + 777;  // about a fifth of a global micro-step
      }
      INFO("masked " << masked << " round " << round << " target " << target);
      const RoundOutcome out = RunRound(in, target, 8, ws, true);
      RequireRoundInvariants(in, out, kBudget);
      REQUIRE(out.plan.num_steps > 6);  // steps were split
      for (uint64_t c : out.closed) sizes.push_back(static_cast<double>(c) / static_cast<double>(target));
      ws = out.windows;
      REQUIRE(ws.held_tokens > 0);  // the round's tail waits for the next round
    }
    double mean = 0, worst = 0;
    for (double s : sizes) {
      mean += s;
      worst = std::max(worst, s);
    }
    mean /= static_cast<double>(sizes.size());
    INFO("masked " << masked << ": " << sizes.size() << " windows, mean/target " << mean << ", max "
                   << worst);
    REQUIRE(sizes.size() > 600);
    REQUIRE(std::abs(mean - 1.0) <= 0.02);
    REQUIRE(worst <= 1.1);
  }
}

TEST_CASE("partitioned windows larger than a step: ends at step boundaries or split, aligned everywhere",
          "[window][partition]") {
  // 8 ranks in blocks of 2 and 4, small steps (budget 1024), windows of
  // ~1.5-3 global steps; IDLE rank-steps and prompt-masked samples.
  for (size_t block : {2u, 4u}) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      std::mt19937_64 rng(seed * 97 + block);
      uint64_t next_id = 0;
      WindowState ws;
      std::vector<double> sizes;
      const uint64_t target = 2500 + seed * 1000;
      for (int round = 0; round < 30; ++round) {
        const RoundPlan in =
            RandomPlan(rng, 8, 1 + static_cast<uint32_t>(rng() % 6), 1024, 4.5, 7, seed % 2 == 0, next_id);
        INFO("block " << block << " seed " << seed << " round " << round);
        const RoundOutcome out = RunRound(in, target, block, ws, true);
        RequireRoundInvariants(in, out, 1024);
        for (uint64_t c : out.closed) sizes.push_back(static_cast<double>(c) / static_cast<double>(target));
        ws = out.windows;
      }
      // Samples here reach 1024 tokens, up to 30% of a target: a window
      // may end over 10% when no end under it is left (as without
      // partitions), rarely, and never more than two samples over.
      double mean = 0;
      size_t over = 0;
      for (double s : sizes) {
        mean += s;
        over += s > 1.1 ? 1 : 0;
        REQUIRE(s <= 1.0 + 2048.0 / static_cast<double>(target));
      }
      mean /= static_cast<double>(sizes.size());
      INFO("block " << block << " seed " << seed << ": " << sizes.size() << " windows, mean/target " << mean
                    << ", over 10%: " << over);
      REQUIRE(sizes.size() >= 10);
      REQUIRE(over * 50 <= sizes.size());
      REQUIRE(std::abs(mean - 1.0) <= 0.02);
    }
  }
}

TEST_CASE("balance within a block's micro-steps keeps every world-wide total and evens the block",
          "[window][partition][balance]") {
  // 8 ranks in blocks of 4 (packed budget 1024): each round cut into windows
  // as the blocks cut them, then each block's windows evened with
  // BalanceBlockWindows. A step's samples over the block, its real and loss
  // tokens, the window fields and the weights' sum per window stay; no
  // block's slowest rank gets costlier in any window, and some get cheaper.
  WindowBalanceConfig config = BalanceConfig(grouping::CostModel::kPacked, 1024, 10.0);
  const size_t world = 8, block = 4;
  size_t improved = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    std::mt19937_64 rng(seed * 131);
    uint64_t next_id = 0;
    WindowState ws;
    for (int round = 0; round < 20; ++round) {
      const RoundPlan in =
          RandomPlan(rng, world, 2 + static_cast<uint32_t>(rng() % 5), 1024, 4.5, 9, seed % 2 == 0, next_id);
      const RoundOutcome out = RunRound(in, 2000 + seed * 700, block, ws, true);
      ws = out.windows;
      RoundPlan balanced = out.plan;
      for (size_t b = 0; b < world; b += block) {
        BalanceBlockWindows(config, balanced, static_cast<int>(b), static_cast<int>(b + block));
      }
      INFO("seed " << seed << " round " << round);
      std::map<uint64_t, double> weight;
      for (size_t b = 0; b < world; b += block) {
        RequireBlockTotalsKept(out.plan, balanced, b, block, weight, [&](const PlannedStep& s, size_t, uint32_t) {
          REQUIRE(s.padded_tokens <= 1024);
          uint64_t loss = 0;
          for (const SampleMeta& m : s.samples) loss += LossTokensOf(m);
          REQUIRE(s.loss_tokens == loss);
          REQUIRE(s.loss_weight == Approx(s.idle || s.window_loss_tokens == 0
                                              ? 0.0
                                              : static_cast<double>(world * loss) /
                                                    static_cast<double>(s.window_loss_tokens)));
        });
        for (const auto& [worst_before, worst_after] : BlockWindowWorst(config, out.plan, balanced, b, block)) {
          REQUIRE(worst_after <= worst_before);
          improved += worst_after < worst_before ? 1 : 0;
        }
      }
      for (const auto& [w, sum] : weight) {
        if (sum > 0) REQUIRE(sum == Approx(static_cast<double>(world)).epsilon(1e-12));
      }
    }
  }
  REQUIRE(improved >= 10);
}

// A block's micro-step of one window: rank r's samples `lens[r]` (owned
// by r), window 0 of one micro-step with its exact weights.
RoundPlan OneWindowPlan(const std::vector<std::vector<uint32_t>>& lens, grouping::CostModel model) {
  RoundPlan plan;
  plan.num_steps = 1;
  plan.ranks.resize(lens.size());
  uint64_t id = 0, total = 0;
  for (size_t r = 0; r < lens.size(); ++r) {
    PlannedStep s;
    std::vector<SampleLengths> ls;
    for (uint32_t n : lens[r]) {
      SampleMeta m;
      m.id = id++;
      m.owner_rank = static_cast<int32_t>(r);
      m.lengths.tokens = n;
      s.samples.push_back(m);
      s.real_tokens += n;
      ls.push_back(m.lengths);
      total += n;
    }
    s.idle = s.samples.empty();
    s.padded_tokens = s.idle ? 0 : grouping::PaddedTokens(model, ls);
    s.loss_tokens = s.real_tokens;
    plan.ranks[r].steps.push_back(std::move(s));
  }
  for (RankPlan& rp : plan.ranks) {
    PlannedStep& s = rp.steps[0];
    s.window = 0;
    s.window_steps = 1;
    s.window_loss_tokens = total;
    s.closes_window = true;
    s.loss_weight =
        s.idle ? 0.0 : static_cast<double>(lens.size() * s.loss_tokens) / static_cast<double>(total);
  }
  return plan;
}

TEST_CASE("balance within a block lays a window's micro-step out again where single moves stop",
          "[window][partition][balance]") {
  // Padded, one micro-step: rank 0 holds 1000 + 100 + 100 (3000 padded),
  // rank 1 900 + 100 (1800). Single moves off the slowest rank stop at 2700
  // (a 100 to rank 1, then nothing lowers it); the block's samples laid out
  // again in length-sorted runs hold 1000 + 900 on one rank and the 100s on
  // the other (2000 / 300).
  WindowBalanceConfig config = BalanceConfig(grouping::CostModel::kPadded, 4096, 10.0);
  const RoundPlan in = OneWindowPlan({{1000, 100, 100}, {900, 100}, {}, {}}, config.budget.model);
  RoundPlan plan = in;
  // Ranks [0, 2) are one block, [2, 4) another (empty: nothing changes).
  REQUIRE(BalanceBlockWindows(config, plan, 0, 2));
  REQUIRE_FALSE(BalanceBlockWindows(config, plan, 2, 4));
  double worst = 0.0, weight = 0.0;
  std::multiset<uint32_t> before, after;
  for (size_t r = 0; r < 2; ++r) {
    for (const SampleMeta& m : in.ranks[r].steps[0].samples) before.insert(m.lengths.tokens);
    const PlannedStep& s = plan.ranks[r].steps[0];
    for (const SampleMeta& m : s.samples) after.insert(m.lengths.tokens);
    worst = std::max(worst, MicroStepCost(config, s));
    REQUIRE(s.idle == s.samples.empty());
    REQUIRE(s.padded_tokens <= config.budget.max_tokens);
    REQUIRE(s.loss_tokens == s.real_tokens);
    RequireSameWindow(s, in.ranks[r].steps[0]);
    weight += s.loss_weight;
  }
  REQUIRE(after == before);
  REQUIRE(worst == Approx(10.0 + 2000.0));
  REQUIRE(weight == Approx(4.0));
  // The 1000 + 900 group goes to rank 0, which owns the 1000 (rank 1 owns the
  // 900 too: a tie, the lower rank); rank 1 gets the 100s. Deterministic:
  // again, the same layout.
  RoundPlan again = in;
  BalanceBlockWindows(config, again, 0, 2);
  for (size_t r = 0; r < 2; ++r) {
    REQUIRE(again.ranks[r].steps[0].samples.size() == plan.ranks[r].steps[0].samples.size());
    for (size_t i = 0; i < plan.ranks[r].steps[0].samples.size(); ++i)
      REQUIRE(KeyOf(again.ranks[r].steps[0].samples[i]) == KeyOf(plan.ranks[r].steps[0].samples[i]));
  }
  REQUIRE(plan.ranks[0].steps[0].samples.front().lengths.tokens == 1000);
}

TEST_CASE("balance within a block fills ranks a part left empty, padded, within the budget",
          "[window][partition][balance]") {
  // Four ranks, two of them empty in this micro-step (a window part that
  // fell short on them), the slowest a lone 1000-token sample: no move
  // lowers it, so single moves leave the two IDLE; the re-layout spreads the
  // 100s over the empty ranks at the same time (a) and (b), never over the
  // budget.
  WindowBalanceConfig config = BalanceConfig(grouping::CostModel::kPadded, 1024, 10.0);
  const RoundPlan in = OneWindowPlan({{1000}, {100, 100, 100, 100}, {}, {}}, config.budget.model);
  RoundPlan plan = in;
  REQUIRE(BalanceBlockWindows(config, plan, 0, 4));
  double worst = 0.0, weight = 0.0;
  size_t idle = 0;
  for (size_t r = 0; r < 4; ++r) {
    const PlannedStep& s = plan.ranks[r].steps[0];
    worst = std::max(worst, MicroStepCost(config, s));
    idle += s.idle ? 1 : 0;
    REQUIRE(s.idle == s.samples.empty());
    REQUIRE(s.padded_tokens <= config.budget.max_tokens);
    weight += s.loss_weight;
  }
  REQUIRE(worst == Approx(10.0 + 1000.0));
  REQUIRE(idle == 0);
  REQUIRE(weight == Approx(4.0));
  // The 1000 stays on its owner.
  REQUIRE(plan.ranks[0].steps[0].samples.size() == 1);
  REQUIRE(plan.ranks[0].steps[0].samples[0].lengths.tokens == 1000);
}

TEST_CASE("balance within a block, padded: random rounds keep every total, the budget and (b)",
          "[window][partition][balance]") {
  // The re-layout's padded runs on random rounds (blocks of 4 of 8 ranks):
  // every micro-step keeps its samples and tokens over the block, every
  // laid-out step stays within the budget (the largest the cut's parts
  // reach, so the cut itself fits), weights sum to W per window, no block's
  // slowest rank over a window gets costlier, and a rerun lays out the same.
  const size_t world = 8, block = 4;
  size_t improved = 0, windows = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    std::mt19937_64 rng(seed * 977);
    uint64_t next_id = 0;
    WindowState ws;
    for (int round = 0; round < 12; ++round) {
      const RoundPlan in =
          RandomPlan(rng, world, 2 + static_cast<uint32_t>(rng() % 4), 1024, 4.5, 7, seed % 2 == 0, next_id);
      const RoundOutcome out = RunRound(in, 1500 + seed * 500, block, ws, true);
      ws = out.windows;
      WindowBalanceConfig config = BalanceConfig(grouping::CostModel::kPadded, 1024, 50.0);
      const uint32_t t = out.plan.num_steps;
      for (const RankPlan& rp : out.plan.ranks) {
        for (uint32_t k = 0; k < t; ++k) {
          uint64_t longest = 0;
          for (const SampleMeta& m : rp.steps[k].samples)
            longest = std::max<uint64_t>(longest, m.lengths.tokens);
          config.budget.max_tokens =
              std::max<uint64_t>(config.budget.max_tokens, longest * rp.steps[k].samples.size());
        }
      }
      RoundPlan balanced = out.plan, again = out.plan;
      for (size_t b = 0; b < world; b += block) {
        BalanceBlockWindows(config, balanced, static_cast<int>(b), static_cast<int>(b + block));
        BalanceBlockWindows(config, again, static_cast<int>(b), static_cast<int>(b + block));
      }
      INFO("seed " << seed << " round " << round);
      std::map<uint64_t, double> weight;
      for (size_t b = 0; b < world; b += block) {
        RequireBlockTotalsKept(out.plan, balanced, b, block, weight, [&](const PlannedStep& s, size_t r, uint32_t k) {
          uint64_t longest = 0;
          for (const SampleMeta& m : s.samples) longest = std::max<uint64_t>(longest, m.lengths.tokens);
          REQUIRE(longest * s.samples.size() <= config.budget.max_tokens);
          const PlannedStep& a = again.ranks[r].steps[k];
          REQUIRE(a.samples.size() == s.samples.size());
          for (size_t i = 0; i < s.samples.size(); ++i) REQUIRE(KeyOf(a.samples[i]) == KeyOf(s.samples[i]));
        });
        for (const auto& [worst_before, worst_after] : BlockWindowWorst(config, out.plan, balanced, b, block)) {
          REQUIRE(worst_after <= worst_before + 1e-9);
          improved += worst_after < worst_before ? 1 : 0;
          ++windows;
        }
      }
      for (const auto& [w, sum] : weight) {
        if (sum > 0) REQUIRE(sum == Approx(static_cast<double>(world)).epsilon(1e-12));
      }
    }
  }
  INFO(improved << " of " << windows << " block windows cheaper");
  REQUIRE(improved >= 10);
}

TEST_CASE("a partitioned open window goes back, stops growing and closes short, or closes at the epoch's end",
          "[window][partition]") {
  std::mt19937_64 rng(3);
  uint64_t next_id = 0;
  const RoundPlan in = RandomPlan(rng, 4, 2, 512, 4.0, 0, false, next_id);
  uint64_t loss = 0;
  for (const RankPlan& rp : in.ranks) {
    for (const PlannedStep& s : rp.steps) loss += s.real_tokens;
  }
  const uint64_t target = loss * 10;  // never reached
  WindowState ws;
  // The first round grows the window (from nothing); the next ones count.
  for (uint32_t held = 0; held < kMaxHeldRounds; ++held) {
    const RoundOutcome out = RunRound(in, target, 2, ws, false);
    REQUIRE(out.plan.num_steps == 0);
    REQUIRE(out.windows.held_rounds == held);
    REQUIRE(out.windows.held_tokens == loss);
    size_t kept = 0;
    for (const RankPlan& rp : out.plan.ranks) kept += rp.keep_pending.size();
    REQUIRE(kept > 0);
    ws = out.windows;
  }
  // Inputs open: held without counting.
  REQUIRE(RunRound(in, target, 2, ws, true).windows.held_rounds == 0);
  const RoundOutcome last = RunRound(in, target, 2, ws, false);
  RequireRoundInvariants(in, last, 512);
  REQUIRE(last.plan.num_steps == 2);
  REQUIRE(last.plan.ranks[0].steps.back().window_short);
  REQUIRE(last.plan.ranks[0].steps.back().closes_window);
  REQUIRE(last.windows.next_window == 1);
  RoundPlan ending = in;
  ending.epoch_finished = true;
  const RoundOutcome end = RunRound(ending, target, 2, WindowState{}, true);
  REQUIRE(end.plan.num_steps == 2);
  REQUIRE(end.plan.ranks[3].steps.back().window_short);
  // A round that planned every sample the epoch has left: closed short at once.
  const RoundOutcome drained = RunRound(in, target, 2, WindowState{}, false, true);
  REQUIRE(drained.plan.num_steps == 2);
  REQUIRE(drained.plan.ranks[1].steps.back().window_short);
  REQUIRE(drained.windows.next_window == 1);
}

// A plan of whole-token-loss samples: lengths[r][k] are rank r's samples in
// step k (packed; an empty list is IDLE).
RoundPlan PlanOf(const std::vector<std::vector<std::vector<uint32_t>>>& lengths) {
  RoundPlan plan;
  plan.ranks.resize(lengths.size());
  plan.num_steps = static_cast<uint32_t>(lengths[0].size());
  uint64_t id = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    for (const std::vector<uint32_t>& step : lengths[r]) {
      PlannedStep s;
      std::vector<SampleLengths> lens;
      for (uint32_t n : step) {
        SampleMeta m;
        m.id = id++;
        m.owner_rank = static_cast<int32_t>(r);
        m.lengths.tokens = n;
        s.samples.push_back(m);
        s.real_tokens += n;
        lens.push_back(m.lengths);
      }
      s.idle = s.samples.empty();
      s.padded_tokens = s.idle ? 0 : grouping::PaddedTokens(grouping::CostModel::kPacked, lens);
      plan.ranks[r].steps.push_back(std::move(s));
    }
  }
  return plan;
}

// Two ranks, every step's loss tokens `totals[k]` (each a multiple of 20) in
// samples of 10 tokens, half on each rank.
RoundPlan TwoRankPlan(const std::vector<uint32_t>& totals) {
  std::vector<std::vector<std::vector<uint32_t>>> lengths(2);
  for (uint32_t t : totals) {
    for (auto& rank : lengths) rank.emplace_back(t / 20, 10u);
  }
  return PlanOf(lengths);
}

// The world-wide tol as every rank of a partitioned round takes it: each
// rank's planned samples and the sum of the squares of their loss tokens (the
// totals all-gather's extra entry; 0 from the ranks in `silent`, as a rank
// without spread sends), added up, and SpreadTolerance on them.
uint64_t WorldTol(const RoundPlan& plan, uint64_t target, double spread,
                  const std::set<size_t>& silent = {}) {
  uint64_t n = 0, sum = 0, sum_sq = 0;
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    for (const PlannedStep& s : plan.ranks[r].steps) {
      n += s.samples.size();
      for (const SampleMeta& m : s.samples) sum += LossTokensOf(m);
    }
    if (silent.count(r) == 0) sum_sq = SaturatingAdd(sum_sq, SquaredLossTokens(plan.ranks[r].steps));
  }
  return SpreadTolerance(n, sum, sum_sq, target, spread);
}

TEST_CASE("the spread tolerance from world-wide counts", "[window][partition]") {
  // Samples of 100 and 300 loss tokens: mean 200, sd 100; a target of 2000
  // is a batch of 10, sd 100 x sqrt(10) = 316.2.
  REQUIRE(SpreadTolerance(2, 400, 100000, 2000, 1.0) == 316);
  REQUIRE(SpreadTolerance(2, 400, 100000, 2000, 2.0) == 632);
  REQUIRE(SpreadTolerance(2, 400, 100000, 800, 3.0) == 400);  // at most half the target
  REQUIRE(SpreadTolerance(2, 400, 100000, 2000, 0.0) == 0);
  REQUIRE(SpreadTolerance(2, 400, 0, 2000, 1.0) == 0);  // no squares sent: no spread
  REQUIRE(SpreadTolerance(1, 400, 160000, 2000, 1.0) == 0);
  REQUIRE(SpreadTolerance(2, 0, 0, 2000, 1.0) == 0);
  REQUIRE(SpreadTolerance(2, 400, 100000, 0, 1.0) == 0);
  REQUIRE(SaturatingAdd(UINT64_MAX - 1, 5) == UINT64_MAX);
  REQUIRE(SaturatingAdd(7, 5) == 12);
  // Over a plan: the per-rank entries add up to the squares of every sample.
  const RoundPlan plan = PlanOf({{{100, 300}, {}}, {{300}, {100, 100, 300}}});
  REQUIRE(SquaredLossTokens(plan.ranks[0].steps) == 100000);
  REQUIRE(SquaredLossTokens(plan.ranks[1].steps) == 200000);
  REQUIRE(WorldTol(plan, 2000, 1.0) == SpreadTolerance(6, 1200, 300000, 2000, 1.0));
  REQUIRE(WorldTol(plan, 2000, 1.0) == 316);
  REQUIRE(WorldTol(plan, 2000, 1.0, {1}) == 0);  // a rank that sent 0: less spread, here none
}

TEST_CASE("micro-step-aware partitioned ends move to the nearer step boundary within tol, in the band",
          "[window][partition]") {
  struct Case {
    std::vector<uint32_t> totals;
    uint64_t target, tol;
    size_t moved, inside;
    std::vector<uint64_t> ends;  // where each closed window ends (0: a split, within a sample of j x target)
    uint32_t micro_steps;        // kept this round (the open tail goes back)
  };
  const std::vector<Case> cases = {
      // Ends at 1050 and 2100 lie 50 and 100 into steps 1 and 2: both move
      // back to the steps' starts (windows of 1000, in [950, 1150]); 3150 is
      // 150 into step 3 and 850 before its end: a split.
      {{1000, 1000, 1000, 1000}, 1050, 100, 2, 1, {1000, 2000, 0}, 4},
      {{1000, 1000, 1000, 1000}, 1050, 0, 0, 3, {0, 0, 0}, 6},
      {{1000, 1000, 1000, 1000}, 1050, 49, 0, 3, {0, 0, 0}, 6},
      {{1000, 1000, 1000, 1000}, 1050, 50, 1, 2, {1000, 0, 0}, 5},
      // 1500 halfway through step 1: a tie goes to the boundary before.
      {{1000, 1000}, 1500, 600, 1, 0, {1000}, 1},
      // The nearer boundary: 1400 is 400 after step 1's start, 1600 400
      // before its end (the round's every sample then closes).
      {{1000, 1000}, 1400, 600, 1, 0, {1000}, 1},
      {{1000, 1000}, 1600, 600, 1, 0, {2000}, 2},
      // The band: 1000 moves to 1080 (the end of step 0); 2000 lies 40 past
      // step 2's start, but that window would be 880, under 1000 - 100: a
      // split; 3000 moves to 3060, a window of 1060 from the split's
      // nominal position. With tol 130, 880 is in the band: 2000 moves too.
      {{1080, 880, 500, 600}, 1000, 100, 2, 1, {1080, 0, 3060}, 5},
      {{1080, 880, 500, 600}, 1000, 130, 3, 0, {1080, 1960, 3060}, 4},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    INFO("case " << i << " target " << c.target << " tol " << c.tol);
    const RoundPlan in = TwoRankPlan(c.totals);
    std::vector<uint64_t> loss(c.totals.begin(), c.totals.end());
    const PartitionedWindows probe(c.target, loss, loss, 2, c.tol);
    REQUIRE(probe.moved_ends() == c.moved);
    REQUIRE(probe.inside_ends() == c.inside);
    const RoundOutcome out = RunRound(in, c.target, 1, WindowState{}, true, false, c.tol);
    RequireRoundInvariants(in, out, 1u << 20);
    REQUIRE(out.plan.num_steps == c.micro_steps);
    REQUIRE(out.closed.size() == c.ends.size());
    uint64_t pos = 0;
    for (size_t j = 0; j < c.ends.size(); ++j) {
      pos += out.closed[j];
      if (c.ends[j] != 0) {
        REQUIRE(pos == c.ends[j]);
      } else {  // a split: within one sample (10 tokens) of the nominal end
        REQUIRE(pos + 10 >= (j + 1) * c.target);
        REQUIRE(pos <= (j + 1) * c.target + 10);
      }
    }
  }
}

TEST_CASE(
    "micro-step-aware partitioned ends: within tol of the nominal ends, in the band, the target on average",
    "[window][partition]") {
  // 8 ranks in blocks of 2 and 4, small steps (budget 1024), windows of
  // ~0.7-3 global steps, the tol of spread 1 and 3 from the world-wide
  // counts (one rank sending no squares in some rounds). Every round, as the
  // blocks cut it with tol and without: a realised end at a step boundary
  // lies within tol of its nominal end j x target, a split within one sample
  // of it; a window between two step boundaries lies in [target - tol,
  // target + tol]; the round's windows sum to their targets up to the last
  // end's error (nothing accumulates); and fewer micro-steps and IDLE
  // rank-steps than the nominal ends.
  size_t moved = 0, rounds = 0, steps_tol = 0, steps_nominal = 0, idle_tol = 0, idle_nominal = 0;
  double sum = 0.0;
  size_t windows = 0;
  for (size_t block : {2u, 4u}) {
    for (double spread : {1.0, 3.0}) {
      for (uint64_t seed = 1; seed <= 4; ++seed) {
        std::mt19937_64 rng(seed * 1009 + block * 7 + static_cast<uint64_t>(spread));
        uint64_t next_id = 0;
        WindowState ws, ws_nominal;
        for (int round = 0; round < 40; ++round) {
          const RoundPlan in =
              RandomPlan(rng, 8, 1 + static_cast<uint32_t>(rng() % 6), 1024, 4.5, 7, seed % 2 == 0, next_id);
          uint64_t round_loss = 0, largest = 0;
          std::set<uint64_t> boundaries{0};
          for (uint32_t k = 0; k < in.num_steps; ++k) {
            for (const RankPlan& rp : in.ranks) {
              for (const SampleMeta& m : rp.steps[k].samples) {
                round_loss += LossTokensOf(m);
                largest = std::max(largest, LossTokensOf(m));
              }
            }
            boundaries.insert(round_loss);
          }
          const uint64_t step_loss = round_loss / in.num_steps;
          const uint64_t target = std::max<uint64_t>(2 * largest + 1, step_loss * (7 + rng() % 24) / 10);
          const uint64_t tol =
              WorldTol(in, target, spread, round % 5 == 4 ? std::set<size_t>{3} : std::set<size_t>{});
          INFO("block " << block << " spread " << spread << " seed " << seed << " round " << round
                        << " target " << target << " tol " << tol);
          REQUIRE(tol <= target / 2);
          const RoundOutcome out = RunRound(in, target, block, ws, true, false, tol);
          RequireRoundInvariants(in, out, 1024);
          const RoundOutcome nominal = RunRound(in, target, block, ws_nominal, true);
          ws = out.windows;
          ws_nominal = nominal.windows;
          uint64_t pos = 0;
          bool from_boundary = true;
          for (size_t j = 0; j < out.closed.size(); ++j) {
            pos += out.closed[j];
            const uint64_t x = (j + 1) * target;
            const uint64_t err = pos > x ? pos - x : x - pos;
            const bool at_boundary = boundaries.count(pos) > 0;
            REQUIRE(err <= (at_boundary ? tol : largest));
            if (at_boundary && from_boundary) {
              REQUIRE(out.closed[j] + tol >= target);
              REQUIRE(out.closed[j] <= target + tol);
            }
            moved += at_boundary && pos != x ? 1 : 0;
            from_boundary = at_boundary;
            sum += static_cast<double>(out.closed[j]) / static_cast<double>(target);
            ++windows;
          }
          ++rounds;
          steps_tol += out.plan.num_steps;
          steps_nominal += nominal.plan.num_steps;
          for (const RankPlan& rp : out.plan.ranks) {
            for (const PlannedStep& s : rp.steps) idle_tol += s.idle ? 1 : 0;
          }
          for (const RankPlan& rp : nominal.plan.ranks) {
            for (const PlannedStep& s : rp.steps) idle_nominal += s.idle ? 1 : 0;
          }
        }
      }
    }
  }
  const double mean = sum / static_cast<double>(windows);
  INFO(rounds << " rounds, " << windows << " windows, mean/target " << mean << ", " << moved
              << " ends moved; micro-steps " << steps_tol << " (nominal ends " << steps_nominal
              << "), IDLE rank-steps " << idle_tol << " (" << idle_nominal << ")");
  REQUIRE(moved * 5 >= windows);
  REQUIRE(std::abs(mean - 1.0) <= 0.01);
  REQUIRE(steps_tol < steps_nominal);
  REQUIRE(idle_tol < idle_nominal);
}

// FNV-1a over 64-bit words.
struct Fnv {
  uint64_t h = 1469598103934665603ULL;
  void Add(uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ULL;
    }
  }
};

// splitmix64: a generator whose numbers do not depend on the standard library.
uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

TEST_CASE("partitioned windows without spread cut exactly as before micro-step-aware ends",
          "[window][partition]") {
  // 60 rounds of 8 ranks (1-6 steps, packed budget 1024, long-tailed lengths,
  // some prompt-masked, some IDLE rank-steps), targets of 0.3-3 global
  // steps, cut with tol 0 (the constructor's default, what spread 0 gives):
  // every rank's micro-steps, samples, window fields and weights hash to what
  // the cut gave before micro-step-aware ends (main 83fa21c).
  uint64_t state = 42;
  Fnv fp;
  WindowState ws;
  uint64_t id = 0;
  for (int round = 0; round < 60; ++round) {
    const size_t world = 8;
    const uint32_t steps = 1 + static_cast<uint32_t>(SplitMix(state) % 6);
    std::vector<std::vector<std::vector<uint32_t>>> lengths(world);
    std::vector<std::vector<std::vector<uint64_t>>> losses(world);
    RoundPlan in;
    in.num_steps = steps;
    in.ranks.resize(world);
    uint64_t total = 0;
    for (size_t r = 0; r < world; ++r) {
      for (uint32_t k = 0; k < steps; ++k) {
        PlannedStep s;
        if (SplitMix(state) % 9 != 0) {
          uint32_t used = 0;
          for (;;) {
            const uint64_t u = SplitMix(state);
            const auto n = static_cast<uint32_t>(1 + (u % 64) * ((u >> 8) % 16) + (u >> 20) % 8);
            if (used + n > 1024) break;
            SampleMeta m;
            m.id = id++;
            m.owner_rank = static_cast<int32_t>(r);
            m.lengths.tokens = n;
            const uint64_t roll = (u >> 32) % 10;
            m.loss_tokens = roll == 0 ? 0 : roll < 4 ? n / 2 : kEveryTokenBearsLoss;
            s.samples.push_back(m);
            s.real_tokens += n;
            total += LossTokensOf(m);
            used += n;
          }
        }
        s.idle = s.samples.empty();
        std::vector<SampleLengths> lens;
        for (const SampleMeta& m : s.samples) lens.push_back(m.lengths);
        s.padded_tokens = s.idle ? 0 : grouping::PaddedTokens(grouping::CostModel::kPacked, lens);
        in.ranks[r].steps.push_back(std::move(s));
      }
    }
    std::vector<uint64_t> loss(steps, 0), real(steps, 0);
    for (const RankPlan& rp : in.ranks) {
      for (uint32_t k = 0; k < steps; ++k) {
        for (const SampleMeta& m : rp.steps[k].samples) loss[k] += LossTokensOf(m);
        real[k] += rp.steps[k].real_tokens;
      }
    }
    const uint64_t target = std::max<uint64_t>(1, total / steps * (3 + SplitMix(state) % 28) / 10);
    PartitionedWindows cut(target, loss, real, world);
    std::vector<std::vector<CutOffer>> offers(world);
    for (size_t r = 0; r < world; ++r) offers[r] = cut.Offers(in.ranks[r].steps);
    REQUIRE(cut.Decide(offers).ok());
    RoundPlan out = in;
    std::vector<uint64_t> global_real;
    cut.Apply(out, 0, static_cast<int>(world), grouping::CostModel::kPacked, ws, round % 7 != 6, false,
              global_real);
    fp.Add(out.num_steps);
    for (const RankPlan& rp : out.ranks) {
      for (const PlannedStep& s : rp.steps) {
        fp.Add(s.samples.size());
        for (const SampleMeta& m : s.samples) fp.Add(m.id);
        fp.Add(s.real_tokens);
        fp.Add(s.padded_tokens);
        fp.Add(s.loss_tokens);
        fp.Add(s.window);
        fp.Add(s.window_steps);
        fp.Add(s.window_loss_tokens);
        fp.Add(s.closes_window);
        fp.Add(s.window_short);
        uint64_t bits = 0;
        std::memcpy(&bits, &s.loss_weight, sizeof bits);
        fp.Add(bits);
      }
      for (const SampleKey& k : rp.keep_pending) fp.Add(k.id);
    }
    for (uint64_t g : global_real) fp.Add(g);
    for (uint64_t c : cut.closed_windows()) fp.Add(c);
    fp.Add(ws.next_window);
    fp.Add(ws.held_tokens);
    fp.Add(ws.held_rounds);
  }
  INFO("fingerprint 0x" << std::hex << fp.h);
  REQUIRE(fp.h == 0x54f69aee20a9ee84ULL);
}

// The invariants of a round whose merged micro-steps may hold samples of
// other ranks of the block: RequireRoundInvariants without the per-rank
// order, plus every sample emitted once, in its owner's block.
void RequireMergedInvariants(const RoundPlan& in, const RoundOutcome& out, uint32_t budget, size_t block) {
  const size_t world = in.ranks.size();
  const uint32_t t = out.plan.num_steps;
  REQUIRE(out.global_real.size() == t);
  std::map<uint64_t, double> weight;
  std::map<uint64_t, uint64_t> loss;
  for (size_t r = 0; r < world; ++r) REQUIRE(out.plan.ranks[r].steps.size() == t);
  std::multiset<std::pair<int32_t, uint64_t>> want, got;
  for (size_t r = 0; r < world; ++r) {
    for (const PlannedStep& s : in.ranks[r].steps) {
      for (const SampleMeta& m : s.samples) want.emplace(m.owner_rank, m.id);
    }
    for (const SampleKey& key : out.plan.ranks[r].keep_pending) got.emplace(key.owner_rank, key.id);
  }
  for (uint32_t k = 0; k < t; ++k) {
    const PlannedStep& s0 = out.plan.ranks[0].steps[k];
    uint64_t real = 0;
    for (size_t r = 0; r < world; ++r) {
      const PlannedStep& s = out.plan.ranks[r].steps[k];
      RequireSameWindow(s, s0);
      REQUIRE(s.idle == s.samples.empty());
      REQUIRE((!s.idle || s.loss_weight == 0.0));
      REQUIRE(s.padded_tokens <= budget);
      uint64_t own_loss = 0, own_real = 0;
      for (const SampleMeta& m : s.samples) {
        own_loss += LossTokensOf(m);
        own_real += m.lengths.tokens;
        REQUIRE(static_cast<size_t>(m.owner_rank) / block == r / block);  // stays in its block
        got.emplace(m.owner_rank, m.id);
      }
      REQUIRE(own_loss == s.loss_tokens);
      REQUIRE(own_real == s.real_tokens);
      real += s.real_tokens;
      weight[s.window] += s.loss_weight;
      loss[s.window] += s.loss_tokens;
    }
    REQUIRE(real == out.global_real[k]);
    const bool last = k + 1 == t || out.plan.ranks[0].steps[k + 1].window != s0.window;
    REQUIRE(s0.closes_window == last);
  }
  REQUIRE(got == want);  // every sample once: emitted or kept
  for (const auto& [w, sum] : weight) {
    uint64_t total = 0;
    for (const PlannedStep& s : out.plan.ranks[0].steps) {
      if (s.window == w) total = s.window_loss_tokens;
    }
    REQUIRE(loss[w] == total);
    if (total > 0) REQUIRE(sum == Approx(static_cast<double>(world)).epsilon(1e-12));
  }
}

// A round of `steps` steps on `world` ranks, every rank-step `per_step`
// samples of `tokens` tokens (packed), ids in rank-step order.
RoundPlan EvenPlan(size_t world, uint32_t steps, uint32_t per_step, uint32_t tokens, uint64_t& next_id) {
  RoundPlan plan;
  plan.num_steps = steps;
  plan.ranks.resize(world);
  for (size_t r = 0; r < world; ++r) {
    for (uint32_t k = 0; k < steps; ++k) {
      PlannedStep s;
      for (uint32_t i = 0; i < per_step; ++i) {
        SampleMeta m;
        m.id = next_id++;
        m.owner_rank = static_cast<int32_t>(r);
        m.lengths.tokens = tokens;
        s.samples.push_back(m);
        s.real_tokens += tokens;
      }
      s.idle = s.samples.empty();
      s.padded_tokens = s.real_tokens;
      plan.ranks[r].steps.push_back(std::move(s));
    }
  }
  return plan;
}

TEST_CASE("a window's parts either side of a split step's boundary run as one micro-step where they fit",
          "[window][partition][merge]") {
  // 4 ranks in blocks of 2, 3 steps of 4 x 400 tokens per rank (6,400 loss
  // tokens a step), budget 4096 packed, target 9,600: the first window ends
  // in the middle of step 1, the second at step 2's end. Cut alone: step 0,
  // step 1's head | step 1's tail, step 2 (4 micro-steps, 2 of them parts
  // of a split step). Merged: each window one micro-step on every rank.
  constexpr uint32_t kBudget = 4096;
  const WindowBalanceConfig config =
      BalanceConfig(grouping::CostModel::kPacked, kBudget, 512.0);  // per_step: the default
  for (bool moves : {true, false}) {
    INFO("moves " << moves);
    uint64_t next_id = 0;
    const RoundPlan in = EvenPlan(4, 3, 4, 400, next_id);
    const RoundOutcome cut = RunRound(in, 9600, 2, WindowState{}, true);
    REQUIRE(cut.plan.num_steps == 4);
    size_t merged = 0;
    const RoundOutcome out = RunRound(in, 9600, 2, WindowState{}, true, false, 0, &config, moves, &merged);
    REQUIRE(merged == 2);
    REQUIRE(out.plan.num_steps == 2);
    REQUIRE(out.closed == cut.closed);
    REQUIRE(out.windows.next_window == cut.windows.next_window);
    REQUIRE(out.plan.ranks[0].steps[0].window_steps == 1);
    REQUIRE(out.plan.ranks[0].steps[0].window_loss_tokens == 9600);
    if (moves) {
      RequireMergedInvariants(in, out, kBudget, 2);
    } else {
      RequireRoundInvariants(in, out, kBudget);  // each rank keeps its own samples, in order
    }
    // The same round again: the same micro-steps.
    const RoundOutcome again = RunRound(in, 9600, 2, WindowState{}, true, false, 0, &config, moves);
    for (size_t r = 0; r < 4; ++r) {
      for (uint32_t k = 0; k < out.plan.num_steps; ++k) {
        REQUIRE(again.plan.ranks[r].steps[k].samples.size() == out.plan.ranks[r].steps[k].samples.size());
        for (size_t i = 0; i < out.plan.ranks[r].steps[k].samples.size(); ++i)
          REQUIRE(again.plan.ranks[r].steps[k].samples[i].id == out.plan.ranks[r].steps[k].samples[i].id);
      }
    }
  }
  // One rank that cannot hold its parts together (4 x 700 tokens in each of
  // its steps: a step and half the next are 4,900 > 4,096): without moves no
  // boundary merges; with moves its block spreads them, so both merge.
  {
    uint64_t next_id = 0;
    RoundPlan in = EvenPlan(4, 3, 4, 400, next_id);
    for (PlannedStep& s : in.ranks[3].steps) {
      s.real_tokens = 0;
      for (SampleMeta& m : s.samples) {
        m.lengths.tokens = 700;
        s.real_tokens += 700;
      }
      s.padded_tokens = s.real_tokens;
    }
    uint64_t loss = 0;
    for (const RankPlan& rp : in.ranks) {
      for (const PlannedStep& s : rp.steps) loss += s.real_tokens;
    }
    const uint64_t target = loss / 2;  // one end inside step 1, one at the round's end
    size_t merged = 0;
    RoundOutcome out = RunRound(in, target, 2, WindowState{}, true, false, 0, &config, false, &merged);
    RequireRoundInvariants(in, out, kBudget);
    REQUIRE(merged == 0);
    REQUIRE(out.plan.num_steps == 4);
    out = RunRound(in, target, 2, WindowState{}, true, false, 0, &config, true, &merged);
    RequireMergedInvariants(in, out, kBudget, 2);
    REQUIRE(merged == 2);
    REQUIRE(out.plan.num_steps == 2);
  }
  // A budget no merged part fits: the cut as it is.
  {
    WindowBalanceConfig tight = config;
    tight.budget.max_tokens = 1600;
    uint64_t next_id = 0;
    const RoundPlan in = EvenPlan(4, 3, 4, 400, next_id);
    size_t merged = 0;
    const RoundOutcome out = RunRound(in, 9600, 2, WindowState{}, true, false, 0, &tight, true, &merged);
    REQUIRE(merged == 0);
    REQUIRE(out.plan.num_steps == 4);
  }
}

TEST_CASE("merged partitioned parts: random rounds keep every window invariant and the budget",
          "[window][partition][merge]") {
  // 8 ranks in blocks of 4 (and 2), windows of a third to two steps, IDLE
  // rank-steps and prompt-masked samples; merges on, with and without moves.
  constexpr uint32_t kBudget = 2048;
  const WindowBalanceConfig config =
      BalanceConfig(grouping::CostModel::kPacked, kBudget, 512.0);  // per_step: the default
  size_t merged_total = 0, steps_total = 0, cut_total = 0;
  for (size_t block : {2u, 4u}) {
    for (bool moves : {true, false}) {
      for (uint64_t seed = 1; seed <= 4; ++seed) {
        std::mt19937_64 rng(seed * 31 + block + (moves ? 7 : 0));
        uint64_t next_id = 0;
        WindowState ws, ws_cut;
        const uint64_t target = 2000 + seed * 2500;
        for (int round = 0; round < 20; ++round) {
          const RoundPlan in = RandomPlan(rng, 8, 1 + static_cast<uint32_t>(rng() % 6), kBudget, 5.0, 9,
                                          seed % 2 == 0, next_id);
          INFO("block " << block << " moves " << moves << " seed " << seed << " round " << round);
          size_t merged = 0;
          const RoundOutcome out = RunRound(in, target, block, ws, true, false, 0, &config, moves, &merged);
          const RoundOutcome cut = RunRound(in, target, block, ws, true);
          if (moves) {
            RequireMergedInvariants(in, out, kBudget, block);
          } else {
            RequireRoundInvariants(in, out, kBudget);
          }
          // Merges change micro-steps only: the same windows and state.
          REQUIRE(out.closed == cut.closed);
          REQUIRE(out.windows.next_window == cut.windows.next_window);
          REQUIRE(out.windows.held_tokens == cut.windows.held_tokens);
          REQUIRE(out.plan.num_steps + merged == cut.plan.num_steps);
          merged_total += merged;
          steps_total += out.plan.num_steps;
          cut_total += cut.plan.num_steps;
          ws = out.windows;
        }
      }
    }
  }
  INFO(merged_total << " merges, " << steps_total << " micro-steps (cut alone " << cut_total << ")");
  REQUIRE(merged_total > 0);
}

TEST_CASE("merge bits travel 32 to an entry of each list and are read back", "[window][partition][merge]") {
  for (size_t n : {0u, 1u, 31u, 32u, 33u, 64u, 65u, 200u}) {
    std::vector<uint8_t> bits(n);
    for (size_t i = 0; i < n; ++i) bits[i] = static_cast<uint8_t>((i * 7 + n) % 3 == 0);
    std::vector<uint64_t> loss{5, 6}, real{7, 8};
    AppendMergeBits(bits, loss, real);
    REQUIRE(loss.size() == 2 + MergeBitEntries(n));
    REQUIRE(real.size() == loss.size());
    auto back = ReadMergeBits(loss, real, 2, n);
    REQUIRE(back.ok());
    REQUIRE(*back == bits);
  }
  std::vector<uint64_t> loss{uint64_t{1} << 40}, real{0};
  REQUIRE(!ReadMergeBits(loss, real, 0, 10).ok());
}

TEST_CASE("partitioned window offers that contradict the totals are refused", "[window][partition]") {
  std::mt19937_64 rng(9);
  uint64_t next_id = 0;
  const RoundPlan in = RandomPlan(rng, 2, 1, 1024, 5.0, 0, false, next_id);
  std::vector<uint64_t> loss(1, 0), real(1, 0);
  for (const RankPlan& rp : in.ranks) {
    loss[0] += rp.steps[0].real_tokens;
    real[0] += rp.steps[0].real_tokens;
  }
  PartitionedWindows cut(loss[0] / 2, loss, real, 2);
  REQUIRE(cut.inside_ends() == 1);
  std::vector<std::vector<CutOffer>> offers{cut.Offers(in.ranks[0].steps), cut.Offers(in.ranks[1].steps)};
  REQUIRE(cut.Decide(offers).ok());
  offers[1][0] = CutOffer{};  // a peer that cut nothing
  REQUIRE(cut.Decide(offers).code() == absl::StatusCode::kInvalidArgument);
  offers.pop_back();
  REQUIRE(cut.Decide(offers).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a partitioned window target below one sample is refused as without partitions",
          "[window][partition]") {
  REQUIRE(CheckWindowTargetCounts(0, 10, 1000, 4).ok());
  REQUIRE(CheckWindowTargetCounts(100, 10, 1000, 4).ok());
  const absl::Status s = CheckWindowTargetCounts(16, 10, 1000, 4);
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(s.message()), Catch::Contains("optimizer.tokens_per_step 16") &&
                                             Catch::Contains("4 rank(s)") && Catch::Contains("1600"));
}

}  // namespace
}  // namespace odb::align
