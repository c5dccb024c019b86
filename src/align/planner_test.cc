// Randomized DGAP scenarios driving the planner directly (the same code every
// rank runs after the all-gather), plus targeted cases.
#include "src/align/planner.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>

#include "src/align/meta_codec.h"
#include "src/align/test_scenario.h"
#include "src/grouping/budget.h"

namespace odb::align {
namespace {

using testing::Arrival;
using testing::FakeEmitter;
using testing::MakeScenario;
using testing::Scenario;

struct Outcome {
  uint64_t rounds = 0;
  uint64_t steps = 0;
  std::set<SampleKey> emitted;
  std::set<SampleKey> not_emitted;  // reported by the closing round
  std::set<SampleKey> late;         // arrived after a Non-Join closure (daemon reports them)
};

// Runs one epoch of a scenario; every invariant is checked with REQUIRE.
Outcome RunScenario(const Scenario& sc) {
  LocalPlanner planner(sc.config);
  const int w = sc.world;
  std::vector<std::vector<SampleMeta>> pending(w);
  std::vector<size_t> next_arrival(w, 0);
  std::vector<FakeEmitter> emitters;
  for (int r = 0; r < w; ++r) emitters.emplace_back(sc.depth, sc.seed * 100 + r);
  Outcome out;
  uint32_t wait_rounds = 0;
  const uint64_t all_finished_round = *std::max_element(sc.finish_round.begin(), sc.finish_round.end());
  uint64_t eligible_after_finish = 0;
  size_t max_pending_at_finish = 0;
  bool finished = false;
  for (uint64_t round = 0; !finished; ++round) {
    INFO("seed " << sc.seed << " W=" << w << " mode=" << EpochModeName(sc.config.mode) << " round " << round);
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
      RankRound& rr = state.ranks[r];
      rr.pending = pending[r];
      rr.free_slots = emitters[r].FreeSlots();
      rr.stream_finished = round >= sc.finish_round[r];
      if (rr.stream_finished) REQUIRE(next_arrival[r] == sc.arrivals[r].size());
      rr.wait_rounds = wait_rounds;
      rr.wait_expired = (sc.seed + round + r) % 17 == 0;
      some_drained = some_drained || (rr.stream_finished && rr.pending.empty());
      // What travels is the encoded form: round-trip it like the Aligner does.
      RankRoundMessage msg{3, round, r, rr};
      auto decoded = DecodeRankRound(EncodeRankRound(msg));
      REQUIRE(decoded.ok());
      REQUIRE(decoded->data.pending.size() == rr.pending.size());
      rr = decoded->data;
    }
    if (round == all_finished_round) {
      for (int r = 0; r < w; ++r) max_pending_at_finish = std::max(max_pending_at_finish, pending[r].size());
    }
    const RoundPlan plan = planner.Plan(state);
    if (round % 7 == 0) {  // determinism: the same input gives the same plan
      const RoundPlan again = planner.Plan(state);
      REQUIRE(again.num_steps == plan.num_steps);
      for (int r = 0; r < w; ++r) {
        for (uint32_t k = 0; k < plan.num_steps; ++k) {
          REQUIRE(again.ranks[r].steps[k].samples.size() == plan.ranks[r].steps[k].samples.size());
          for (size_t i = 0; i < plan.ranks[r].steps[k].samples.size(); ++i) {
            REQUIRE(again.ranks[r].steps[k].samples[i].id == plan.ranks[r].steps[k].samples[i].id);
          }
        }
      }
    }
    REQUIRE(static_cast<int>(plan.ranks.size()) == w);
    // Alignment: the same T for every rank.
    for (int r = 0; r < w; ++r) REQUIRE(plan.ranks[r].steps.size() == plan.num_steps);
    // Non-Join closes at the FIRST round some rank is drained; Join never before all are.
    if (sc.config.mode == EpochMode::kNonJoin) REQUIRE(plan.epoch_finished == some_drained);
    // Waiting rounds are bounded.
    if (plan.waiting) {
      REQUIRE(plan.num_steps == 0);
      REQUIRE(wait_rounds < sc.config.max_wait_rounds);
      ++wait_rounds;
    } else {
      wait_rounds = 0;
    }
    if (round > all_finished_round) REQUIRE_FALSE(plan.waiting);
    if (round >= all_finished_round) {
      bool eligible = true;
      for (int r = 0; r < w; ++r) eligible = eligible && state.ranks[r].free_slots > 0;
      if (eligible) ++eligible_after_finish;
      // Termination bound (docs/alignment.md): max pending + 1 rounds with credit.
      REQUIRE(eligible_after_finish <= max_pending_at_finish + 1);
    }
    // Steps: loss weights, budgets, exactly-once.
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
          REQUIRE(m.owner_rank == r);
          REQUIRE(out.emitted.insert(KeyOf(m)).second);  // never twice
          tokens += m.lengths.tokens;
          lens.push_back(m.lengths);
        }
        REQUIRE(s.real_tokens == tokens);
        if (lens.size() > 1) REQUIRE(grouping::FitsBudget(sc.config.budget, lens));
        if (s.over_budget) REQUIRE(lens.size() == 1);
      }
      REQUIRE(any_real);
      REQUIRE(std::abs(wsum - w) < 1e-9);
    }
    // Accounting: emitted + kept + not emitted == pending, per rank.
    for (int r = 0; r < w; ++r) {
      std::set<SampleKey> accounted;
      for (const auto& s : plan.ranks[r].steps) {
        for (const auto& m : s.samples) accounted.insert(KeyOf(m));
      }
      for (const auto& k : plan.ranks[r].keep_pending) REQUIRE(accounted.insert(k).second);
      for (const auto& k : plan.ranks[r].not_emitted) {
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
    if (finished && sc.config.mode == EpochMode::kJoin) {
      for (int r = 0; r < w; ++r) REQUIRE(pending[r].empty());
    }
  }
  for (int r = 0; r < w; ++r) {
    for (size_t i = next_arrival[r]; i < sc.arrivals[r].size(); ++i) out.late.insert(KeyOf(sc.arrivals[r][i].meta));
  }
  return out;
}

TEST_CASE("randomized scenarios: alignment, coverage, quota, termination, weights", "[planner]") {
  int scenarios = 0;
  uint64_t total_steps = 0;
  for (int world : {1, 2, 3, 4, 8}) {
    for (uint64_t i = 0; i < 240; ++i) {
      const uint64_t seed = world * 100000 + i;
      const EpochMode mode = i % 2 == 0 ? EpochMode::kJoin : EpochMode::kNonJoin;
      const Scenario sc = MakeScenario(seed, world, mode);
      const Outcome out = RunScenario(sc);
      const std::set<SampleKey> all = AllKeys(sc);
      INFO("seed " << seed);
      if (mode == EpochMode::kJoin) {
        REQUIRE(out.emitted == all);  // identity coverage
        REQUIRE(out.not_emitted.empty());
        REQUIRE(out.late.empty());
      } else {
        // Quota closure: emitted, reported and late are disjoint and complete.
        std::set<SampleKey> u = out.emitted;
        for (const auto& k : out.not_emitted) REQUIRE(u.insert(k).second);
        for (const auto& k : out.late) REQUIRE(u.insert(k).second);
        REQUIRE(u == all);
      }
      total_steps += out.steps;
      ++scenarios;
    }
  }
  REQUIRE(scenarios == 1200);
  REQUIRE(total_steps > 1000);  // the scenarios do real work
}

RankRound Rank(std::vector<uint32_t> lengths, int owner, uint32_t free_slots, bool finished) {
  RankRound rr;
  for (size_t i = 0; i < lengths.size(); ++i) {
    SampleMeta m;
    m.id = i + 1;
    m.owner_rank = owner;
    m.lengths.tokens = lengths[i];
    rr.pending.push_back(m);
  }
  rr.free_slots = free_slots;
  rr.stream_finished = finished;
  return rr;
}

TEST_CASE("a rank with no samples takes part with IDLE steps", "[planner]") {
  PlannerConfig cfg;
  cfg.max_wait_rounds = 0;
  LocalPlanner planner(cfg);
  RoundState st;
  st.ranks = {Rank({100, 200, 300, 4000, 50}, 0, 8, true), Rank({}, 1, 8, false)};
  RoundPlan plan = planner.Plan(st);
  REQUIRE(plan.num_steps >= 1);
  REQUIRE(plan.ranks[1].steps.size() == plan.num_steps);
  for (const auto& s : plan.ranks[1].steps) {
    REQUIRE(s.idle);
    REQUIRE(s.loss_weight == 0.0);
  }
  for (const auto& s : plan.ranks[0].steps) REQUIRE(s.loss_weight == Approx(2.0));
}

TEST_CASE("splitting reaches T and holding back keeps the fullest groups", "[planner]") {
  PlannerConfig cfg;
  cfg.max_wait_rounds = 0;
  cfg.budget.max_tokens = 1000;
  LocalPlanner planner(cfg);
  RoundState st;
  // Rank 0: ten short samples (few groups); rank 1: six long ones (six groups).
  st.ranks = {Rank({10, 10, 10, 10, 10, 10, 10, 10, 10, 10}, 0, 8, false),
              Rank({900, 900, 900, 900, 900, 900}, 1, 4, false)};
  RoundPlan plan = planner.Plan(st);
  REQUIRE(plan.num_steps == 4);  // min(free=4, max groups=6, min samples=6)
  for (const auto& s : plan.ranks[0].steps) REQUIRE_FALSE(s.idle);
  REQUIRE(plan.ranks[1].keep_pending.size() == 2);
}

TEST_CASE("wait is granted, bounded and never after the stream ends", "[planner]") {
  PlannerConfig cfg;
  cfg.window = 8;
  cfg.max_wait_rounds = 2;
  LocalPlanner planner(cfg);
  RoundState st;
  st.ranks = {Rank({10, 20}, 0, 4, false), Rank({10, 20, 30, 40, 50, 60, 70, 80, 90}, 1, 4, false)};
  RoundPlan plan = planner.Plan(st);
  REQUIRE(plan.waiting);
  REQUIRE(plan.ranks[0].waited);
  REQUIRE(plan.num_steps == 0);
  st.ranks[0].wait_rounds = st.ranks[1].wait_rounds = 2;
  REQUIRE_FALSE(planner.Plan(st).waiting);
  st.ranks[0].wait_rounds = st.ranks[1].wait_rounds = 0;
  st.ranks[0].wait_expired = true;
  REQUIRE_FALSE(planner.Plan(st).waiting);
  st.ranks[0].wait_expired = false;
  st.ranks[0].stream_finished = true;
  REQUIRE_FALSE(planner.Plan(st).waiting);
}

TEST_CASE("non-join closes at the first drained rank and reports the rest", "[planner]") {
  PlannerConfig cfg;
  cfg.mode = EpochMode::kNonJoin;
  LocalPlanner planner(cfg);
  RoundState st;
  st.ranks = {Rank({}, 0, 4, true), Rank({5, 6, 7}, 1, 4, false)};
  RoundPlan plan = planner.Plan(st);
  REQUIRE(plan.epoch_finished);
  REQUIRE(plan.num_steps == 0);
  REQUIRE(plan.ranks[1].not_emitted.size() == 3);
  cfg.mode = EpochMode::kJoin;
  LocalPlanner join(cfg);
  plan = join.Plan(st);
  REQUIRE_FALSE(plan.epoch_finished);
}

TEST_CASE("no free slot on one rank stops the round for all", "[planner]") {
  PlannerConfig cfg;
  cfg.max_wait_rounds = 0;
  LocalPlanner planner(cfg);
  RoundState st;
  st.ranks = {Rank({5, 6, 7}, 0, 0, true), Rank({5, 6, 7}, 1, 4, true)};
  RoundPlan plan = planner.Plan(st);
  REQUIRE(plan.num_steps == 0);
  REQUIRE_FALSE(plan.epoch_finished);
  REQUIRE(plan.ranks[0].keep_pending.size() == 3);
}

}  // namespace
}  // namespace odb::align
