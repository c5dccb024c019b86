#ifndef ODB_ALIGN_TEST_SCENARIO_H_
#define ODB_ALIGN_TEST_SCENARIO_H_

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "src/align/planner.h"

namespace odb::align::testing {

// A randomized epoch for W daemons: skewed per-rank sample counts (sometimes a
// rank with none at all), random arrival rounds and end-of-stream rounds,
// random emitter credit. Test-only.
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

}  // namespace odb::align::testing

#endif  // ODB_ALIGN_TEST_SCENARIO_H_
