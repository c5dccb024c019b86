#ifndef ODB_ALIGN_TEST_SCENARIO_H_
#define ODB_ALIGN_TEST_SCENARIO_H_

#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "src/align/planner.h"

namespace odb::align::testing {

// A randomized epoch for W daemons: skewed per-rank sample counts (sometimes a
// rank with none at all), random arrival rounds and end-of-stream rounds
// (sometimes a rank that starts 20-40 rounds late), random emitter credit.
// Test-only.
struct Arrival {
  SampleMeta meta;
  uint64_t round = 0;  // first round in which the sample is pending
};

struct Scenario {
  uint64_t seed = 0;
  int world = 1;
  PlannerConfig config;
  std::vector<std::vector<Arrival>> arrivals;  // per rank, by round
  std::vector<uint64_t> finish_round;          // per rank: stream_finished from this round on
  uint32_t depth = 4;                          // emitter credit window
};

Scenario MakeScenario(uint64_t seed, int world, EpochMode mode);

// Every sample key the scenario ever delivers (all ranks, all arrival times).
std::set<SampleKey> AllKeys(const Scenario& sc);

// The emitter side of one rank: `depth` credits; the trainer consumes a
// random number of queued steps between rounds.
class FakeEmitter {
 public:
  FakeEmitter(uint32_t depth, uint64_t seed) : depth_(depth), rng_(seed) {}
  uint32_t FreeSlots() const { return depth_ - queued_; }
  void Push(uint32_t steps) { queued_ += steps; }
  void Drain() {
    if (queued_ == 0) return;
    queued_ -= std::uniform_int_distribution<uint32_t>(0, queued_)(rng_);
  }

 private:
  uint32_t depth_;
  uint32_t queued_ = 0;
  std::mt19937_64 rng_;
};

// One epoch of a scenario driven round by round through `planner`, the way
// every daemon runs it after the all-gather (metadata round-tripped through
// the codec). Checks with Catch2's REQUIRE, for any planner: the same T on
// every rank; Non-Join closes at the first drained rank, Join only when all
// are; waiting rounds bounded (max_wait_rounds once a stream started; before,
// by the rank's start_wait, 5-16 waiting rounds in the scenarios); the
// termination bound; per step: IDLE iff empty with weight 0, token counts,
// budget, weights summing to W over each accumulation window (every step
// closes its own without windows), window fields alike on every rank, some rank real; every sample emitted at most
// once; per owner: emitted + kept + not emitted == pending; credit never
// exceeded; the plan is a pure function.
struct EpochChecks {
  // Planner-specific checks of each round's plan.
  std::function<void(const RoundState&, const RoundPlan&)> on_plan;
  // Rounds with credit the epoch may take once every stream finished, from
  // what is pending per rank at that round (docs/alignment.md, balancing.md).
  std::function<uint64_t(const std::vector<std::vector<SampleMeta>>& pending)> termination_bound;
};

struct EpochOutcome {
  uint64_t rounds = 0;
  uint64_t steps = 0;
  std::set<SampleKey> emitted;
  uint64_t moved_samples = 0;       // emitted by a rank other than their owner
  std::set<SampleKey> not_emitted;  // reported by a Non-Join closing round
  std::set<SampleKey> late;         // arrived after a Non-Join closure (the daemon reports them)
  uint64_t unstarted_wait_rounds = 0;  // waiting rounds a not-yet-started rank asked for
  // Accumulation windows: every closed window's loss tokens (all ranks) and
  // whether it closed short; the open window's progress.
  struct Window {
    uint64_t loss_tokens = 0;
    bool is_short = false;
  };
  std::vector<Window> windows;
  double window_weight = 0;
  uint64_t window_tokens = 0;
  uint32_t window_steps_seen = 0;
};

EpochOutcome RunEpoch(const Scenario& sc, const Planner& planner, const EpochChecks& checks);

// Join: every key exactly once; Non-Join: emitted, reported and late are
// disjoint and together every key.
void RequireCoverage(const Scenario& sc, const EpochOutcome& out);

// Two plans are identical (step counts, members in order, kept samples).
void RequireSamePlan(const RoundPlan& a, const RoundPlan& b);

}  // namespace odb::align::testing

#endif  // ODB_ALIGN_TEST_SCENARIO_H_
