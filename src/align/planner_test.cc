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

using testing::FakeEmitter;
using testing::MakeScenario;
using testing::Scenario;

// LocalPlanner on top of the shared epoch checks: samples never leave their
// owner; termination within max pending + 1 rounds with credit once every
// stream finished (docs/alignment.md).
testing::EpochOutcome RunScenario(const Scenario& sc) {
  LocalPlanner planner(sc.config);
  testing::EpochChecks checks;
  checks.on_plan = [](const RoundState&, const RoundPlan& plan) {
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      for (const PlannedStep& s : plan.ranks[r].steps) {
        for (const SampleMeta& m : s.samples) REQUIRE(m.owner_rank == static_cast<int>(r));
      }
    }
  };
  checks.termination_bound = [](const std::vector<std::vector<SampleMeta>>& pending) {
    size_t max_pending = 0;
    for (const auto& p : pending) max_pending = std::max(max_pending, p.size());
    return static_cast<uint64_t>(max_pending) + 1;
  };
  return testing::RunEpoch(sc, planner, checks);
}

TEST_CASE("randomized scenarios: alignment, coverage, quota, termination, weights", "[planner]") {
  int scenarios = 0;
  uint64_t total_steps = 0, waited_unstarted = 0;
  for (int world : {1, 2, 3, 4, 8}) {
    for (uint64_t i = 0; i < 240; ++i) {
      const uint64_t seed = world * 100000 + i;
      const EpochMode mode = i % 2 == 0 ? EpochMode::kJoin : EpochMode::kNonJoin;
      const Scenario sc = MakeScenario(seed, world, mode);
      const testing::EpochOutcome out = RunScenario(sc);
      INFO("seed " << seed);
      testing::RequireCoverage(sc, out);
      total_steps += out.steps;
      waited_unstarted += out.unstarted_wait_rounds;
      ++scenarios;
    }
  }
  REQUIRE(waited_unstarted > 100);  // late-starting ranks are exercised
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

TEST_CASE("under Join a finished rank's last samples do not cap T; they idle once spent", "[planner]") {
  // Rank 0: eight long samples (eight groups, stream open); rank 1: its last
  // two samples, stream finished. Capping T by rank 1's two samples planned
  // two steps of rank 0's eight, and the same two again next round when an
  // accumulation window held them back: a fixed point that cut the window
  // short mid-epoch (test_multi_rank's skewed windows, under load).
  PlannerConfig cfg;
  cfg.max_wait_rounds = 0;
  cfg.budget.max_tokens = 1000;
  RoundState st;
  st.ranks = {Rank({900, 900, 900, 900, 900, 900, 900, 900}, 0, 16, false), Rank({10, 20}, 1, 16, true)};
  RoundPlan plan = LocalPlanner(cfg).Plan(st);
  REQUIRE(plan.num_steps == 8);  // min(free=16, max groups=8); rank 1's stream is finished
  for (const auto& s : plan.ranks[0].steps) REQUIRE_FALSE(s.idle);
  for (size_t k = 0; k < plan.num_steps; ++k) {
    INFO("step " << k);
    REQUIRE(plan.ranks[1].steps[k].idle == (k >= 2));  // one sample a step first, then IDLE: done early
  }
  REQUIRE(plan.ranks[1].keep_pending.empty());
  // An open stream still caps T (more samples may come), and so does a
  // finished rank under Non-Join (the epoch ends with its last sample).
  st.ranks[1].stream_finished = false;
  REQUIRE(LocalPlanner(cfg).Plan(st).num_steps == 2);
  st.ranks[1].stream_finished = true;
  cfg.mode = EpochMode::kNonJoin;
  REQUIRE(LocalPlanner(cfg).Plan(st).num_steps == 2);
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

TEST_CASE("a rank whose stream has not started waits past max_wait_rounds, until it expires", "[planner]") {
  PlannerConfig cfg;
  cfg.window = 8;
  cfg.max_wait_rounds = 2;
  LocalPlanner planner(cfg);
  RoundState st;
  // Rank 1's workers are still starting: nothing of the epoch reached it yet.
  st.ranks = {Rank({10, 20, 30, 40, 50, 60, 70, 80, 90}, 0, 4, false), Rank({}, 1, 4, false)};
  st.ranks[1].stream_started = false;
  st.ranks[0].wait_rounds = st.ranks[1].wait_rounds = 50;  // far past max_wait_rounds
  RoundPlan plan = planner.Plan(st);
  REQUIRE(plan.waiting);
  REQUIRE(plan.ranks[1].waited);
  REQUIRE_FALSE(plan.ranks[0].waited);
  REQUIRE(plan.num_steps == 0);
  // Its (longer) wall-clock bound ends the wait: rank 1 is IDLE for the round.
  st.ranks[1].wait_expired = true;
  plan = planner.Plan(st);
  REQUIRE_FALSE(plan.waiting);
  REQUIRE(plan.num_steps > 0);
  for (const auto& s : plan.ranks[1].steps) REQUIRE(s.idle);
  // Once started, max_wait_rounds bounds it again.
  st.ranks[1].wait_expired = false;
  st.ranks[1].stream_started = true;
  REQUIRE_FALSE(planner.Plan(st).waiting);
  // max_wait_rounds 0 means never wait, started or not.
  cfg.max_wait_rounds = 0;
  st.ranks[1].stream_started = false;
  REQUIRE_FALSE(LocalPlanner(cfg).Plan(st).waiting);
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

TEST_CASE("rounds wait for min_free_slots, and full rounds plan every group whatever the credit", "[planner]") {
  PlannerConfig cfg;
  cfg.max_wait_rounds = 0;
  cfg.budget.max_tokens = 10;      // each 6-token sample is a group of its own
  cfg.budget.max_group_size = 1;
  cfg.min_free_slots = 3;
  RoundState st;
  st.ranks = {Rank({6, 6, 6, 6, 6}, 0, 2, false), Rank({6, 6, 6, 6, 6}, 1, 4, false)};
  RoundPlan plan = LocalPlanner(cfg).Plan(st);
  REQUIRE(plan.num_steps == 0);  // rank 0 has 2 < 3 free slots: the round waits
  REQUIRE(plan.reason.find("waits for 3") != std::string::npos);
  st.ranks[0].free_slots = 3;
  plan = LocalPlanner(cfg).Plan(st);
  REQUIRE(plan.num_steps == 3);  // T = the smallest free-slot count
  REQUIRE(plan.ranks[0].keep_pending.size() == 2);
  cfg.full_rounds = true;
  plan = LocalPlanner(cfg).Plan(st);
  REQUIRE(plan.num_steps == 5);  // every group of the windows, the credit only gated the round
  REQUIRE(plan.ranks[0].keep_pending.empty());
}

}  // namespace
}  // namespace odb::align
