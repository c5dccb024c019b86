#include "src/align/test_scenario.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "src/align/meta_codec.h"
#include "src/grouping/budget.h"

namespace odb::align::testing {

Scenario MakeScenario(uint64_t seed, int world, EpochMode mode) {
  std::mt19937_64 rng(seed);
  auto uni = [&rng](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  Scenario s;
  s.seed = seed;
  s.world = world;
  s.config.mode = mode;
  s.config.seed = seed * 31 + 7;
  s.config.budget.model = uni(0, 1) ? grouping::CostModel::kPadded : grouping::CostModel::kPacked;
  s.config.budget.max_tokens = 1024;
  s.config.window = static_cast<uint32_t>(std::vector<uint64_t>{4, 8, 16, 32}[uni(0, 3)]);
  s.config.max_wait_rounds = static_cast<uint32_t>(uni(0, 3));
  s.depth = static_cast<uint32_t>(uni(1, 6));
  s.arrivals.resize(world);
  s.finish_round.resize(world);
  const int empty_rank = uni(0, 2) == 0 ? static_cast<int>(uni(0, world - 1)) : -1;
  // A rank whose workers start late: its first sample (or its end of stream)
  // comes long after the others', past any wait expiry.
  const int late_rank = uni(0, 3) == 0 ? static_cast<int>(uni(0, world - 1)) : -1;
  const uint64_t base = uni(0, 40);
  for (int r = 0; r < world; ++r) {
    // Skew: each rank gets base * factor in [0, 3] samples.
    uint64_t n = r == empty_rank ? 0 : base * uni(0, 30) / 10 + uni(0, 2);
    uint64_t round = r == late_rank ? uni(20, 40) : uni(0, 3);
    for (uint64_t i = 0; i < n; ++i) {
      round += uni(0, 2) == 0 ? uni(0, 3) : 0;  // random arrival delays
      Arrival a;
      a.meta.id = 1000 * static_cast<uint64_t>(r) + i * 3 + uni(0, 2);  // unique per owner, not sorted-dense
      a.meta.owner_rank = r;
      const uint64_t roll = uni(0, 99);
      a.meta.lengths.tokens = static_cast<uint32_t>(roll == 0 ? uni(1025, 3000) : roll < 70 ? uni(1, 200) : uni(1, 1024));
      a.meta.payload_bytes = a.meta.lengths.tokens * 4;
      a.round = round;
      s.arrivals[r].push_back(a);
    }
    s.finish_round[r] = round + uni(0, 5);
  }
  return s;
}

}  // namespace odb::align::testing

namespace odb::align::testing {

std::set<SampleKey> AllKeys(const Scenario& sc) {
  std::set<SampleKey> all;
  for (const auto& rank : sc.arrivals) {
    for (const Arrival& a : rank) all.insert(KeyOf(a.meta));
  }
  return all;
}

}  // namespace odb::align::testing

namespace odb::align::testing {

void RequireSamePlan(const RoundPlan& a, const RoundPlan& b) {
  REQUIRE(a.num_steps == b.num_steps);
  REQUIRE(a.epoch_finished == b.epoch_finished);
  REQUIRE(a.waiting == b.waiting);
  REQUIRE(a.ranks.size() == b.ranks.size());
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    REQUIRE(a.ranks[r].keep_pending == b.ranks[r].keep_pending);
    REQUIRE(a.ranks[r].not_emitted == b.ranks[r].not_emitted);
    for (uint32_t k = 0; k < a.num_steps; ++k) {
      const auto& x = a.ranks[r].steps[k].samples;
      const auto& y = b.ranks[r].steps[k].samples;
      REQUIRE(x.size() == y.size());
      for (size_t i = 0; i < x.size(); ++i) REQUIRE(KeyOf(x[i]) == KeyOf(y[i]));
    }
  }
}

void RequireCoverage(const Scenario& sc, const EpochOutcome& out) {
  const std::set<SampleKey> all = AllKeys(sc);
  if (sc.config.mode == EpochMode::kJoin) {
    REQUIRE(out.emitted == all);  // identity coverage
    REQUIRE(out.not_emitted.empty());
    REQUIRE(out.late.empty());
    return;
  }
  std::set<SampleKey> u = out.emitted;  // quota closure
  for (const auto& k : out.not_emitted) REQUIRE(u.insert(k).second);
  for (const auto& k : out.late) REQUIRE(u.insert(k).second);
  REQUIRE(u == all);
}

namespace {

// The scenario's stand-ins for the wall clock. A started rank's max_wait
// expires in about one round in 17. A rank that has not started waits out
// its start_wait, which (as the Aligner's clock does) counts from the first
// of the current run of waiting rounds: 5..16 rounds, per rank.
constexpr uint64_t kExpiryPeriod = 17;
constexpr uint32_t kMaxStartWaitRounds = 16;

uint32_t StartWaitRounds(uint64_t seed, int rank) {
  return 5 + static_cast<uint32_t>((seed * 7 + static_cast<uint64_t>(rank)) % (kMaxStartWaitRounds - 4));
}

void CheckSteps(const Scenario& sc, const RoundPlan& plan, EpochOutcome& out) {
  const int w = sc.world;
  for (uint32_t k = 0; k < plan.num_steps; ++k) {
    double wsum = 0;
    bool any_real = false;
    for (int r = 0; r < w; ++r) {
      const PlannedStep& s = plan.ranks[r].steps[k];
      REQUIRE(s.idle == s.samples.empty());
      if (s.idle) REQUIRE(s.loss_weight == 0.0);
      any_real = any_real || !s.idle;
      wsum += s.loss_weight;
      uint64_t tokens = 0;
      std::vector<SampleLengths> lens;
      for (const SampleMeta& m : s.samples) {
        REQUIRE(out.emitted.insert(KeyOf(m)).second);  // never twice, on any rank
        out.moved_samples += m.owner_rank != r;
        tokens += m.lengths.tokens;
        lens.push_back(m.lengths);
      }
      REQUIRE(s.real_tokens == tokens);
      REQUIRE(s.padded_tokens == grouping::PaddedTokens(sc.config.budget.model, lens));
      if (lens.size() > 1) REQUIRE(grouping::FitsBudget(sc.config.budget, lens));
      REQUIRE(s.over_budget == (lens.size() == 1 && !grouping::FitsAlone(sc.config.budget, lens[0])));
    }
    REQUIRE(any_real);
    // Accumulation windows (window.h): every rank's step k is in the same
    // window at the same position; weights sum to W over a window (one step
    // without windows), and only its last step closes it.
    const PlannedStep& first = plan.ranks[0].steps[k];
    for (int r = 0; r < w; ++r) {
      const PlannedStep& s = plan.ranks[r].steps[k];
      REQUIRE(s.window == first.window);
      REQUIRE(s.window_steps == first.window_steps);
      REQUIRE(s.closes_window == first.closes_window);
      REQUIRE(s.window_short == first.window_short);
      REQUIRE(s.window_loss_tokens == first.window_loss_tokens);
    }
    out.window_weight += wsum;
    out.window_tokens += [&] {
      uint64_t t = 0;
      for (int r = 0; r < w; ++r) t += plan.ranks[r].steps[k].loss_tokens;
      return t;
    }();
    ++out.window_steps_seen;
    if (first.closes_window) {
      REQUIRE(out.window_steps_seen == first.window_steps);
      REQUIRE(std::abs(out.window_weight - w) < 1e-9);
      REQUIRE(out.window_tokens == first.window_loss_tokens);
      out.windows.push_back({out.window_tokens, first.window_short});
      out.window_weight = 0;
      out.window_tokens = 0;
      out.window_steps_seen = 0;
    }
  }
}

}  // namespace

EpochOutcome RunEpoch(const Scenario& sc, const Planner& planner, const EpochChecks& checks) {
  const int w = sc.world;
  std::vector<std::vector<SampleMeta>> pending(w);
  std::vector<size_t> next_arrival(w, 0);
  std::vector<FakeEmitter> emitters;
  for (int r = 0; r < w; ++r) emitters.emplace_back(sc.depth, sc.seed * 100 + r);
  EpochOutcome out;
  uint32_t wait_rounds = 0;
  const uint64_t all_finished_round = *std::max_element(sc.finish_round.begin(), sc.finish_round.end());
  uint64_t eligible_after_finish = 0;
  uint64_t bound = 0;
  bool finished = false;
  for (uint64_t round = 0; !finished; ++round) {
    INFO("seed " << sc.seed << " W=" << w << " mode=" << EpochModeName(sc.config.mode) << " planner "
                 << planner.Name() << " round " << round);
    REQUIRE(round < 5000);
    RoundState state;
    state.epoch = 3;
    state.round = round;
    state.first_step = out.steps;
    state.ranks.resize(w);
    bool some_drained = false;
    for (int r = 0; r < w; ++r) {
      while (next_arrival[r] < sc.arrivals[r].size() && sc.arrivals[r][next_arrival[r]].round <= round) {
        pending[r].push_back(sc.arrivals[r][next_arrival[r]++].meta);
      }
      RankRound rr;
      rr.pending = pending[r];
      rr.free_slots = emitters[r].FreeSlots();
      rr.stream_finished = round >= sc.finish_round[r];
      if (rr.stream_finished) REQUIRE(next_arrival[r] == sc.arrivals[r].size());
      rr.stream_started = next_arrival[r] > 0 || rr.stream_finished;
      rr.wait_rounds = wait_rounds;
      rr.wait_expired = rr.stream_started ? (sc.seed + round + r) % kExpiryPeriod == 0
                                          : wait_rounds >= StartWaitRounds(sc.seed, r);
      rr.input_blocked = (sc.seed + round + 3 * r) % 7 == 0;  // travels in the flags
      some_drained = some_drained || (rr.stream_finished && rr.pending.empty());
      // What travels is the encoded form: round-trip it as the Aligner does.
      auto decoded = DecodeRankRound(EncodeRankRound(RankRoundMessage{3, round, r, rr}));
      REQUIRE(decoded.ok());
      REQUIRE(decoded->data.pending.size() == rr.pending.size());
      REQUIRE(decoded->data.stream_started == rr.stream_started);
      REQUIRE(decoded->data.input_blocked == rr.input_blocked);
      state.ranks[r] = std::move(decoded->data);
    }
    if (round == all_finished_round) bound = checks.termination_bound(pending);
    const RoundPlan plan = planner.Plan(state);
    if (round % 5 == 0) RequireSamePlan(plan, planner.Plan(state));  // a pure function
    REQUIRE(static_cast<int>(plan.ranks.size()) == w);
    for (int r = 0; r < w; ++r) REQUIRE(plan.ranks[r].steps.size() == plan.num_steps);  // one T
    if (sc.config.mode == EpochMode::kNonJoin) REQUIRE(plan.epoch_finished == some_drained);
    if (plan.waiting) {
      REQUIRE(plan.num_steps == 0);
      bool unstarted_waits = false;
      for (int r = 0; r < w; ++r) unstarted_waits |= plan.ranks[r].waited && !state.ranks[r].stream_started;
      REQUIRE((wait_rounds < sc.config.max_wait_rounds || unstarted_waits));
      REQUIRE(wait_rounds < std::max(sc.config.max_wait_rounds, kMaxStartWaitRounds));
      out.unstarted_wait_rounds += unstarted_waits ? 1 : 0;
      ++wait_rounds;
    } else {
      wait_rounds = 0;
    }
    if (round > all_finished_round) REQUIRE_FALSE(plan.waiting);
    if (round >= all_finished_round) {
      bool eligible = true;
      for (int r = 0; r < w; ++r) eligible = eligible && state.ranks[r].free_slots > 0;
      if (eligible) ++eligible_after_finish;
      REQUIRE(eligible_after_finish <= bound);
    }
    CheckSteps(sc, plan, out);
    if (checks.on_plan) checks.on_plan(state, plan);
    // Accounting per owner: emitted on any rank + kept + not emitted == pending.
    std::set<SampleKey> round_emitted;
    for (const RankPlan& rp : plan.ranks) {
      for (const PlannedStep& s : rp.steps) {
        for (const SampleMeta& m : s.samples) round_emitted.insert(KeyOf(m));
      }
    }
    for (int r = 0; r < w; ++r) {
      std::set<SampleKey> accounted;
      for (const SampleMeta& m : pending[r]) {
        if (round_emitted.count(KeyOf(m))) accounted.insert(KeyOf(m));
      }
      for (const auto& k : plan.ranks[r].keep_pending) {
        REQUIRE(k.owner_rank == r);
        REQUIRE(accounted.insert(k).second);
      }
      for (const auto& k : plan.ranks[r].not_emitted) {
        REQUIRE(k.owner_rank == r);
        REQUIRE(accounted.insert(k).second);
        out.not_emitted.insert(k);
      }
      REQUIRE(accounted.size() == pending[r].size());
      std::set<SampleKey> kept(plan.ranks[r].keep_pending.begin(), plan.ranks[r].keep_pending.end());
      std::erase_if(pending[r], [&](const SampleMeta& m) { return !kept.count(KeyOf(m)); });
      emitters[r].Push(plan.num_steps);
      REQUIRE(emitters[r].FreeSlots() <= sc.depth);
      emitters[r].Drain();
    }
    out.steps += plan.num_steps;
    out.rounds = round + 1;
    finished = plan.epoch_finished;
    if (finished) REQUIRE(out.window_steps_seen == 0);  // no window left open at the epoch's end
    if (finished && sc.config.mode == EpochMode::kJoin) {
      for (int r = 0; r < w; ++r) REQUIRE(pending[r].empty());
    }
  }
  for (int r = 0; r < w; ++r) {
    for (size_t i = next_arrival[r]; i < sc.arrivals[r].size(); ++i) out.late.insert(KeyOf(sc.arrivals[r][i].meta));
  }
  return out;
}

}  // namespace odb::align::testing
