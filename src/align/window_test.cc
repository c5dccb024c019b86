// Accumulation windows (window.h): the randomized epochs of test_scenario.h
// with windows, and targeted cases: sizes against the target, steps that end
// a window split, open windows handed back, short windows at the epoch's end.
#include "src/align/window.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "src/align/test_scenario.h"
#include "src/grouping/budget.h"

namespace odb::align {
namespace {

// LocalPlanner, then the Aligner's windows with their state carried from
// round to round. A repeated Plan of one round (the purity check of RunEpoch)
// starts from the state that round started from.
class WindowedPlanner final : public Planner {
 public:
  // `balance`: windows laid out again over the ranks (window_balance.h), as
  // the Aligner does for planners that move samples.
  // `spread`: micro-step-aware ends (WindowConfig::spread; 0: the nearest).
  explicit WindowedPlanner(PlannerConfig config, bool balance = false, double spread = 0.0)
      : inner_(std::move(config)), balance_(balance), spread_(spread) {}
  RoundPlan Plan(const RoundState& state) const override {
    auto it = before_.try_emplace(state.round, current_).first;
    RoundPlan plan = inner_.Plan(state);
    WindowState ws = it->second;
    WindowConfig wc{config().tokens_per_step, config().budget.model};
    if (balance_) wc.balance = WindowBalanceConfig{config().budget, config().step_model};
    wc.spread = spread_;
    ApplyWindows(wc, plan, ws, false);
    current_ = ws;
    return plan;
  }
  const PlannerConfig& config() const override { return inner_.config(); }
  std::string Name() const override { return "local+windows"; }

 private:
  LocalPlanner inner_;
  bool balance_;
  double spread_;
  mutable std::map<uint64_t, WindowState> before_;
  mutable WindowState current_;
};

testing::EpochOutcome RunWindowed(const testing::Scenario& sc, bool balance = false, double spread = 0.0) {
  WindowedPlanner planner(sc.config, balance, spread);
  testing::EpochChecks checks;
  checks.on_plan = [balance](const RoundState&, const RoundPlan& plan) {
    if (balance) return;  // samples move between ranks
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      for (const PlannedStep& s : plan.ranks[r].steps) {
        for (const SampleMeta& m : s.samples) REQUIRE(m.owner_rank == static_cast<int>(r));
      }
    }
  };
  // A round may hand an open window back: allow one such round per round
  // that emits (the epoch still ends: a finished stream cannot grow).
  checks.termination_bound = [](const std::vector<std::vector<SampleMeta>>& pending) {
    size_t max_pending = 0;
    for (const auto& p : pending) max_pending = std::max(max_pending, p.size());
    return 2 * static_cast<uint64_t>(max_pending) + 2 + kMaxHeldRounds;
  };
  return testing::RunEpoch(sc, planner, checks);
}

TEST_CASE("randomized epochs with windows: coverage, aligned windows, weights sum to W per window", "[window]") {
  int windows = 0;
  for (int world : {1, 2, 3, 4}) {
    for (uint64_t i = 0; i < 60; ++i) {
      const uint64_t seed = 7000000 + world * 1000 + i;
      testing::Scenario sc = testing::MakeScenario(seed, world, i % 2 == 0 ? EpochMode::kJoin : EpochMode::kNonJoin);
      sc.config.tokens_per_step = std::vector<uint64_t>{300, 2000, 10000}[i % 3];
      // A split adds a step to a round (the daemon's rounds may exceed the
      // free slots, PlannerConfig::full_rounds): credit is not what is tested.
      sc.depth = 1u << 20;
      INFO("seed " << seed << " target " << sc.config.tokens_per_step);
      const testing::EpochOutcome out = RunWindowed(sc);
      testing::RequireCoverage(sc, out);
      // Window indices count up; only the epoch's last window may be short
      // unless a round could not grow (small planner windows here).
      windows += static_cast<int>(out.windows.size());
    }
  }
  REQUIRE(windows > 500);
}

TEST_CASE("randomized epochs with windows balanced over the ranks: the same guarantees", "[window]") {
  // RunEpoch checks coverage, equal step counts, the budget, weights summing to
  // W over every window and window fields alike on every rank.
  int windows = 0, moved = 0;
  for (int world : {2, 3, 4}) {
    for (uint64_t i = 0; i < 40; ++i) {
      const uint64_t seed = 7100000 + world * 1000 + i;
      testing::Scenario sc =
          testing::MakeScenario(seed, world, i % 2 == 0 ? EpochMode::kJoin : EpochMode::kNonJoin);
      sc.config.tokens_per_step = std::vector<uint64_t>{300, 2000, 10000}[i % 3];
      sc.depth = 1u << 20;
      // Half of them with micro-step-aware ends (the daemon's default).
      const double spread = i % 4 < 2 ? 1.0 : 0.0;
      INFO("seed " << seed << " target " << sc.config.tokens_per_step << " spread " << spread);
      const testing::EpochOutcome out = RunWindowed(sc, true, spread);
      testing::RequireCoverage(sc, out);
      windows += static_cast<int>(out.windows.size());
      moved += out.moved_samples;
    }
  }
  REQUIRE(windows > 300);
  REQUIRE(moved > 0);  // the layouts did change
}

// W ranks, each with `per_rank` samples of random lengths in [lo, hi], all
// there from the start; the planner window holds them all.
testing::Scenario UniformScenario(uint64_t seed, int world, int per_rank, uint32_t lo, uint32_t hi) {
  testing::Scenario sc;
  sc.seed = seed;
  sc.world = world;
  sc.config.budget.model = seed % 2 ? grouping::CostModel::kPacked : grouping::CostModel::kPadded;
  sc.config.budget.max_tokens = 4096;
  sc.config.window = static_cast<uint32_t>(per_rank) + 1;
  sc.config.full_rounds = true;
  sc.depth = 1u << 20;
  std::mt19937_64 rng(seed);
  sc.arrivals.resize(world);
  sc.finish_round.assign(world, 0);
  for (int r = 0; r < world; ++r) {
    for (int i = 0; i < per_rank; ++i) {
      testing::Arrival a;
      a.meta.id = static_cast<uint64_t>(i);
      a.meta.owner_rank = r;
      a.meta.lengths.tokens = std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
      a.meta.payload_bytes = a.meta.lengths.tokens * 4;
      sc.arrivals[r].push_back(a);
    }
  }
  return sc;
}

// Runs the epoch with windows and checks the sizes the recipe relies on: no
// window more than 10% over the target, only the epoch's last one short, and
// the mean of the full windows within 2% of the target.
void RequireWindowsHoldTarget(const testing::Scenario& sc, int min_full_windows) {
  const testing::EpochOutcome out = RunWindowed(sc);
  testing::RequireCoverage(sc, out);
  const double target = static_cast<double>(sc.config.tokens_per_step);
  double sum = 0;
  int full = 0;
  for (size_t i = 0; i < out.windows.size(); ++i) {
    const auto& w = out.windows[i];
    INFO("window " << i << " of " << out.windows.size() << ": " << w.loss_tokens);
    REQUIRE(static_cast<double>(w.loss_tokens) <= 1.1 * target);
    if (w.is_short) {
      REQUIRE(i + 1 == out.windows.size());  // only the epoch's last
      continue;
    }
    sum += static_cast<double>(w.loss_tokens);
    ++full;
  }
  INFO("mean window / target " << sum / full / target);
  REQUIRE(full >= min_full_windows);
  REQUIRE(std::abs(sum / full - target) <= 0.02 * target);
}

TEST_CASE("windows hold the target: mean within 2%, none more than 10% over, big micro-steps split", "[window]") {
  for (int world : {1, 2, 3, 8}) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      testing::Scenario sc = UniformScenario(seed * 31 + world, world, 1000, 20, 400);
      // A micro-step holds up to 4096 tokens per rank: windows of about
      // three micro-steps, where closing at the first step that crosses the
      // target would overshoot by ~15% on average.
      sc.config.tokens_per_step = static_cast<uint64_t>(world) * 4096 * 3 - 1500 * world;
      INFO("W=" << world << " seed " << seed << " target " << sc.config.tokens_per_step);
      RequireWindowsHoldTarget(sc, 10);
    }
  }
}

// A plan of one round from per-rank steps given as lists of sample lengths.
RoundPlan PlanOf(const std::vector<std::vector<std::vector<uint32_t>>>& steps_by_rank) {
  RoundPlan plan;
  plan.num_steps = static_cast<uint32_t>(steps_by_rank[0].size());
  plan.ranks.resize(steps_by_rank.size());
  uint64_t id = 0;
  for (size_t r = 0; r < steps_by_rank.size(); ++r) {
    for (const auto& lens : steps_by_rank[r]) {
      PlannedStep s;
      s.idle = lens.empty();
      for (uint32_t n : lens) {
        SampleMeta m;
        m.id = id++;
        m.owner_rank = static_cast<int32_t>(r);
        m.lengths.tokens = n;
        s.samples.push_back(m);
        s.real_tokens += n;
      }
      plan.ranks[r].steps.push_back(s);
    }
  }
  AssignLossWeights(plan);
  return plan;
}

TEST_CASE("without a target every step is its own window with per-step weights", "[window]") {
  RoundPlan plan = PlanOf({{{10, 20}, {5}, {}}, {{30}, {}, {7, 7}}});
  const RoundPlan before = plan;
  WindowState ws;
  ApplyWindows(WindowConfig{}, plan, ws, false);
  REQUIRE(plan.num_steps == 3);
  for (uint32_t k = 0; k < 3; ++k) {
    for (size_t r = 0; r < 2; ++r) {
      const PlannedStep& s = plan.ranks[r].steps[k];
      REQUIRE(s.loss_weight == before.ranks[r].steps[k].loss_weight);
      REQUIRE(s.closes_window);
      REQUIRE(s.window_steps == 1);
      REQUIRE(s.window == k);
      REQUIRE_FALSE(s.window_short);
    }
  }
  REQUIRE(ws.next_window == 3);
}

TEST_CASE("an open window goes back to pending; the epoch's end closes it short", "[window]") {
  const WindowConfig config{1000, grouping::CostModel::kPacked};
  WindowState ws;
  RoundPlan plan = PlanOf({{{100, 100}, {50}}, {{100}, {100, 50}}});  // 500 loss tokens < 1000
  ApplyWindows(config, plan, ws, false);
  REQUIRE(plan.num_steps == 0);
  REQUIRE(plan.ranks[0].keep_pending.size() == 3);
  REQUIRE(plan.ranks[1].keep_pending.size() == 3);
  REQUIRE(ws.next_window == 0);

  RoundPlan last = PlanOf({{{100, 100}, {50}}, {{100}, {100, 50}}});
  last.epoch_finished = true;
  ApplyWindows(config, last, ws, false);
  REQUIRE(last.num_steps == 2);
  double sum = 0;
  for (const auto& rp : last.ranks) {
    REQUIRE_FALSE(rp.steps[0].closes_window);
    REQUIRE(rp.steps[1].closes_window);
    for (const auto& s : rp.steps) {
      REQUIRE(s.window_short);
      REQUIRE(s.window_steps == 2);
      REQUIRE(s.window_loss_tokens == 500);
      sum += s.loss_weight;
    }
  }
  REQUIRE(sum == Approx(2.0).epsilon(1e-12));
  // Exact weights: rank 0's first step holds 200 of the window's 500 tokens.
  REQUIRE(last.ranks[0].steps[0].loss_weight == Approx(2.0 * 200 / 500).epsilon(1e-12));
}

TEST_CASE("an open window that stops growing closes short; one that grows is held", "[window]") {
  const WindowConfig config{1000, grouping::CostModel::kPacked};
  {
    WindowState ws;
    for (uint32_t round = 1; round <= 3 * kMaxHeldRounds; ++round) {
      RoundPlan plan = PlanOf({{std::vector<uint32_t>(round, 10)}, {{10}}});  // grows every round
      ApplyWindows(config, plan, ws, false);
      REQUIRE(plan.num_steps == 0);
    }
  }
  {
    WindowState ws;
    // Handed back once, then kMaxHeldRounds more times without growing.
    for (uint32_t round = 0; round <= kMaxHeldRounds; ++round) {
      RoundPlan plan = PlanOf({{{100}}, {{100}}});
      ApplyWindows(config, plan, ws, false);
      INFO("round " << round);
      REQUIRE(plan.num_steps == (round < kMaxHeldRounds ? 0u : 1u));
      if (plan.num_steps > 0) REQUIRE(plan.ranks[0].steps[0].window_short);
    }
  }
  {
    // The same tail while some rank may still receive samples (slow
    // producers, a loaded machine running rounds on max_wait_ms): held for
    // as many rounds as it takes, never cut short mid-epoch ...
    WindowState ws;
    for (uint32_t round = 0; round <= 5 * kMaxHeldRounds; ++round) {
      RoundPlan plan = PlanOf({{{100}}, {{100}}});
      ApplyWindows(config, plan, ws, true);
      INFO("round " << round);
      REQUIRE(plan.num_steps == 0);
    }
    // ... until the inputs close: then it closes after kMaxHeldRounds rounds
    // without growth (the held tail is already known, so each one counts).
    for (uint32_t round = 1; round <= kMaxHeldRounds; ++round) {
      RoundPlan plan = PlanOf({{{100}}, {{100}}});
      ApplyWindows(config, plan, ws, false);
      INFO("closed round " << round);
      REQUIRE(plan.num_steps == (round < kMaxHeldRounds ? 0u : 1u));
      if (plan.num_steps > 0) REQUIRE(plan.ranks[0].steps[0].window_short);
    }
  }
}

TEST_CASE("inputs are open while a rank with an open stream has buffer room and a window not full", "[window]") {
  RoundState state;
  state.ranks.resize(2);
  for (RankRound& rr : state.ranks) rr.pending.resize(4);
  state.ranks[0].stream_finished = true;
  state.ranks[1].stream_finished = false;
  REQUIRE(InputsOpen(state, 8));
  REQUIRE(InputsOpen(state, 0));         // an unbounded planner window is never full
  REQUIRE_FALSE(InputsOpen(state, 4));   // rank 1's planner window is full
  state.ranks[1].input_blocked = true;   // its buffer is full
  REQUIRE_FALSE(InputsOpen(state, 8));
  state.ranks[1].input_blocked = false;
  state.ranks[1].stream_finished = true;
  REQUIRE_FALSE(InputsOpen(state, 8));   // every stream ended
}

TEST_CASE("the step that would overshoot a window is split on every rank", "[window]") {
  // Two micro-steps of 2 x 600 tokens; a 2000-token window: closing after the
  // second would be 20% over, before it 40% under; the split lands at 2000.
  const WindowConfig config{2000, grouping::CostModel::kPadded};
  WindowState ws;
  std::vector<uint32_t> six(6, 100);
  RoundPlan plan = PlanOf({{six, six}, {six, six}});
  plan.epoch_finished = true;
  ApplyWindows(config, plan, ws, false);
  REQUIRE(plan.num_steps == 3);
  const PlannedStep& a0 = plan.ranks[0].steps[1];
  const PlannedStep& a1 = plan.ranks[1].steps[1];
  REQUIRE(a0.closes_window);
  REQUIRE(a0.window_loss_tokens == 2000);
  REQUIRE(a0.real_tokens + a1.real_tokens == 800);
  REQUIRE(a0.padded_tokens == a0.samples.size() * 100);
  REQUIRE(plan.ranks[0].steps[2].window_short);
  REQUIRE(plan.ranks[0].steps[2].window == 1);
}

TEST_CASE("weights and windows count loss tokens when samples carry them", "[window]") {
  RoundPlan plan = PlanOf({{{100, 100}}, {{100}}});
  plan.ranks[0].steps[0].samples[0].loss_tokens = 10;  // a prompt-masked sample: 10 label tokens
  plan.ranks[1].steps[0].samples[0].loss_tokens = 0;   // nothing to learn from
  plan.epoch_finished = true;
  WindowState ws;
  ApplyWindows(WindowConfig{1000, grouping::CostModel::kPadded}, plan, ws, false);
  const PlannedStep& a = plan.ranks[0].steps[0];
  const PlannedStep& b = plan.ranks[1].steps[0];
  REQUIRE(a.loss_tokens == 110);
  REQUIRE(b.loss_tokens == 0);
  REQUIRE(a.window_loss_tokens == 110);
  REQUIRE(a.loss_weight == Approx(2.0).epsilon(1e-12));
  REQUIRE(b.loss_weight == 0.0);
  REQUIRE(a.real_tokens == 200);  // the memory side still counts every token
}


// Windows of ~16 samples while samples stream in a few per round (the main
// job's shape): a micro-step of 1024 padded tokens per rank holds more than a
// window, so nearly every window ends inside a step, and a window may end
// under or over its goal by up to one sample. Always ending at the nearest
// point, with ends >10% over refused, left the mean window 3% under its
// target (W=2, seed 4: 0.970), i.e. 3% more optimizer steps than the recipe.
TEST_CASE("windows hold the target when samples stream in and a micro-step is bigger than a window", "[window]") {
  // sigma 0.7: the main job's kind of lengths; 1.2: a long tail (a window of
  // 16 samples often meets one sample over 10% of it).
  for (double sigma : {0.7, 1.2})
  for (int world : {2, 4}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      testing::Scenario sc;
      sc.seed = seed;
      sc.world = world;
      sc.config.budget.model = grouping::CostModel::kPadded;
      sc.config.budget.max_tokens = 1024;
      sc.config.window = 32;
      sc.depth = 1u << 20;  // splits add steps to a round: credit is not what is tested
      std::mt19937_64 rng(seed);
      std::lognormal_distribution<double> length(4.0, sigma);
      sc.arrivals.resize(world);
      sc.finish_round.assign(world, 1500 / 8 + 1);
      uint64_t epoch_tokens = 0;
      for (int r = 0; r < world; ++r) {
        for (int i = 0; i < 1500; ++i) {
          testing::Arrival a;
          a.meta.id = static_cast<uint64_t>(i);
          a.meta.owner_rank = r;
          a.meta.lengths.tokens = std::clamp<uint32_t>(static_cast<uint32_t>(length(rng)), 2, 512);
          a.meta.payload_bytes = a.meta.lengths.tokens * 4;
          a.round = static_cast<uint64_t>(i / 8);  // 8 samples per rank per round
          epoch_tokens += a.meta.lengths.tokens;
          sc.arrivals[r].push_back(a);
        }
      }
      sc.config.tokens_per_step = 16 * epoch_tokens / (1500 * static_cast<uint64_t>(world));
      INFO("sigma " << sigma << " W=" << world << " seed " << seed << " target " << sc.config.tokens_per_step);
      RequireWindowsHoldTarget(sc, 150);
    }
  }
}

// A target below one sample (tokens_per_step: 1, or 16 meant as 16 samples)
// made every optimizer step one sample, silently (issue 31).
TEST_CASE("a window target below one sample is refused, naming the setting and what to set", "[window]") {
  const RoundPlan plan = PlanOf({{{100, 120}, {80}}, {{100}, {90, 110}}});  // 6 samples, mean 100
  for (uint64_t target : {1, 16, 99}) {
    INFO("target " << target);
    const absl::Status s = CheckWindowTarget(target, plan);
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    const std::string m(s.message());
    REQUIRE(m.find("optimizer.tokens_per_step " + std::to_string(target)) != std::string::npos);
    REQUIRE(m.find("100 loss tokens on average") != std::string::npos);
    REQUIRE(m.find("16 samples: 1600") != std::string::npos);
  }
  // One sample or more is a window; below one sample per rank too (a large world).
  for (uint64_t target : {0, 100, 150, 1000}) {
    INFO("target " << target);
    REQUIRE(CheckWindowTarget(target, plan).ok());
  }
  REQUIRE(CheckWindowTarget(1, PlanOf({{{}}, {{}}})).ok());  // nothing to judge by yet
}

// Micro-step-aware ends (window.h): W = 2, each rank's micro-steps filled to
// a packed budget of 512 tokens, a target of 1.04 micro-steps: the nearest
// ends run almost every window as two micro-steps per rank.
struct SpreadRun {
  double micro_steps_per_window = 0.0;
  double mean_window = 0.0;
  double sd_window = 0.0;
  double random_batch_sd = 0.0;  // sd of the loss tokens of a random batch of the target's mean
};

// `per_rank`: the target in budgets per rank (1.04: just over one
// micro-step). `partial_every`: every this many steps the planner's step is
// partial (each rank 300 of its 512 tokens, as a round's last steps are);
// 0: none. `partial_fill`: each rank's partial step stops at the first
// sample that reaches it, or (`exact`) holds exactly that many tokens.
SpreadRun RunSpread(uint64_t seed, double spread, double per_rank = 1.04, size_t partial_every = 0,
                    uint32_t partial_fill = 300, bool exact = false) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> len(3.8, 0.9);
  const size_t world = 2, steps = 400;
  const uint32_t budget = 512;
  std::vector<std::vector<std::vector<uint32_t>>> by_rank(world);
  double n = 0, sum = 0, sum_sq = 0;
  for (size_t k = 0; k < steps; ++k) {
    const bool partial = partial_every > 0 && k % partial_every == partial_every / 2;
    for (size_t r = 0; r < world; ++r) {
      std::vector<uint32_t> lens;
      uint32_t used = 0;
      for (;;) {
        if (partial && used >= partial_fill) break;
        uint32_t l = std::clamp<uint32_t>(static_cast<uint32_t>(len(rng)), 2, 256);
        if (used + l > budget) l = budget - used;  // the planner fills the budget: one sample that fits
        if (partial && exact && used + l > partial_fill) l = partial_fill - used;
        if (l < 2) break;
        lens.push_back(l);
        used += l;
        n += 1;
        sum += l;
        sum_sq += static_cast<double>(l) * l;
      }
      by_rank[r].push_back(lens);
    }
  }
  RoundPlan plan = PlanOf(by_rank);
  plan.epoch_finished = true;
  const double mean = sum / n;
  // Just over what one micro-step per rank holds (the main job: 16 samples
  // of 66 tokens at a 512-token budget).
  const uint64_t target = static_cast<uint64_t>(per_rank * static_cast<double>(world * budget));
  const double batch = static_cast<double>(target) / mean;  // samples of a random batch of the target
  WindowConfig wc{target, grouping::CostModel::kPacked};
  wc.spread = spread;
  WindowBalanceConfig bc;
  bc.budget.model = grouping::CostModel::kPacked;
  bc.budget.max_tokens = budget;
  bc.step_model.per_step = 100.0;
  bc.step_model.per_padded_token = 1.0;
  wc.balance = bc;
  WindowState ws;
  ApplyWindows(wc, plan, ws, false);
  std::map<uint64_t, uint64_t> totals;
  std::map<uint64_t, bool> shorts;
  for (const PlannedStep& s : plan.ranks[0].steps) {
    totals[s.window] = s.window_loss_tokens;
    shorts[s.window] = s.window_short;
  }
  SpreadRun out;
  double ws_sum = 0, ws_sq = 0, m = 0;
  for (const auto& [w, t] : totals) {
    if (shorts[w]) continue;
    m += 1;
    ws_sum += static_cast<double>(t);
    ws_sq += static_cast<double>(t) * t;
  }
  out.micro_steps_per_window = static_cast<double>(plan.num_steps) / static_cast<double>(totals.size());
  out.mean_window = ws_sum / m / static_cast<double>(target);
  out.sd_window = std::sqrt(std::max(0.0, ws_sq / m - (ws_sum / m) * (ws_sum / m)));
  out.random_batch_sd = std::sqrt(batch * (sum_sq / n - mean * mean));
  return out;
}

TEST_CASE("windows end where they run fewer micro-steps, holding the target on average", "[window]") {
  for (uint64_t seed : {1, 2, 3}) {
    const SpreadRun nearest = RunSpread(seed, 0.0), aware = RunSpread(seed, 1.0);
    INFO("seed " << seed << " micro-steps per window " << nearest.micro_steps_per_window << " -> "
                 << aware.micro_steps_per_window << ", mean window / target " << nearest.mean_window << " -> "
                 << aware.mean_window << ", sd " << nearest.sd_window << " -> " << aware.sd_window
                 << " (random batches " << aware.random_batch_sd << ")");
    CHECK(aware.micro_steps_per_window < 0.8 * nearest.micro_steps_per_window);
    CHECK(std::abs(aware.mean_window - 1.0) < 0.01);  // the round's drift made up for (0.99996 measured)
    CHECK(aware.sd_window <= aware.random_batch_sd);
  }
}

// A target of exactly one budget per rank, the planner's steps full to the
// budget but for a partial one every 50 (batching_sim's packed 1m windows: a
// round's steps are 0.999 full, a few are not). A window of one planner step
// runs one micro-step per rank; one that ends inside a step leaves the next
// window the step's rest and the next step's head, which pack less tightly,
// and every window over the target runs two. The drift a partial step leaves
// is made up over the round's remaining windows (within tol), not by the next
// window, and ends at a step's boundary are preferred: nearly every window is
// one planner step: 1.08-1.13 micro-steps per window over seeds 1-3. (Before:
// the next window went over the target to repay it, cut inside a step, and
// the windows after it stayed cut inside steps: 1.18-1.23; the nearest ends
// 1.38-1.45.)
TEST_CASE("windows of one budget per rank stay on the planner's steps after a partial step", "[window]") {
  for (uint64_t seed : {1, 2, 3}) {
    const SpreadRun nearest = RunSpread(seed, 0.0, 1.0, 50), aware = RunSpread(seed, 1.0, 1.0, 50);
    INFO("seed " << seed << " micro-steps per window " << nearest.micro_steps_per_window << " -> "
                 << aware.micro_steps_per_window << ", mean window / target " << nearest.mean_window << " -> "
                 << aware.mean_window << ", sd " << nearest.sd_window << " -> " << aware.sd_window
                 << " (random batches " << aware.random_batch_sd << ")");
    CHECK(aware.micro_steps_per_window < 1.15);
    CHECK(std::abs(aware.mean_window - 1.0) < 0.01);
    CHECK(aware.sd_window <= aware.random_batch_sd);
  }
}

// One partial step in the middle of the round, holding 30% of the target (each
// rank 150 of its 512 tokens; batching_sim's debian_docs round: one step of
// 10,280 tokens against 32,768): the windows after it can get back onto the
// planner's steps only by one more window's worth than the target, or 30% more
// than it; both beyond tol (26% of the target here), so every window after it
// was cut inside a step (a step's tail and the next step's head) and one in a
// few ran over the target, two micro-steps (seeds 1-3: 1.13-1.21 micro-steps
// per window). Realigned (window.h): two windows of 15% over the target each,
// then whole steps again.
// Seeds 1-3 of the round with one partial step (150 of 512 tokens a rank) at
// `spread`: at most `max_micro_steps` micro-steps per window, the target held
// on average, windows varying no more than random batches.
void CheckRealigned(double spread, double max_micro_steps) {
  for (uint64_t seed : {1, 2, 3}) {
    const SpreadRun aware = RunSpread(seed, spread, 1.0, 400, 150, true);
    INFO("seed " << seed << " micro-steps per window " << aware.micro_steps_per_window
                 << ", mean window / target " << aware.mean_window << ", sd " << aware.sd_window
                 << " (random batches " << aware.random_batch_sd << ")");
    CHECK(aware.micro_steps_per_window < max_micro_steps);
    CHECK(std::abs(aware.mean_window - 1.0) < 0.01);
    CHECK(aware.sd_window <= aware.random_batch_sd);
  }
}

TEST_CASE("windows get back onto the planner's steps after a partial step beyond tol", "[window]") {
  CheckRealigned(1.0, 1.03);
}

// The same with a tol of about 11% of the target (window_spread 0.5): getting
// back onto the planner's steps after the partial step (29% of the target)
// leaves the round's drift 29% of the target over it (or 71% under), 2.7
// tols, beyond the two a realignment took on, so every window after the
// partial step was cut inside a step (a step's tail and the next one's head)
// and those over the target ran two micro-steps (batching_sim, cpu_calibrated,
// packed 1m windows, high_variance: one step of 13,231 tokens against 32,768
// and tol 4,816; the 74 windows after it cost 1.15x the planner's steps over
// the same samples). Now a realignment may take on up to half the target
// where the planner's steps after it are full and the round's remaining
// windows could repay it by 1/128 of the target each, and a boundary that
// leaves the drift no larger qualifies, so the windows stay on the full
// steps until the round's last windows repay the drift. Seeds 1-3:
// 1.0225, 1.0325, 1.01 micro-steps per window; 1.04, 1.04, 1.02 without the
// no-larger-drift rule; 1.15, 1.1525, 1.17 before both.
TEST_CASE("windows get back onto the planner's steps after a partial step beyond two tols", "[window]") {
  CheckRealigned(0.5, 1.035);
}

}  // namespace
}  // namespace odb::align
