#ifndef ODB_BENCH_POLICIES_H_
#define ODB_BENCH_POLICIES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/common/sample.h"
#include "src/grouping/budget.h"

namespace odb::bench {

// What one rank computes in one step.
struct RankStep {
  bool idle = true;  // no samples: the rank runs a zero-weight step
  uint32_t samples = 0;
  uint64_t real_tokens = 0;
  uint64_t padded_tokens = 0;  // what the trainer computes on
  double sum_len_sq = 0.0;     // attention term of the real samples
};

// A policy's whole epoch: steps[k][r] is rank r's work in step k. Every
// policy gives every rank the same number of steps (DDP's invariant).
using Schedule = std::vector<std::vector<RankStep>>;

struct SimConfig {
  int world = 8;
  grouping::Budget budget;           // padded, L_max = 4096 unless changed
  grouping::StepTimeModel model;     // the simulator's step-time model
  uint32_t window = 256;             // odb and reference: samples per rank per round
  uint32_t free_slots = 1u << 20;    // odb: emitter credit seen by the planner
  uint64_t seed = 1;
};

// The policies. `arrival` is the trace in arrival order (already shuffled).
// Batch-list policies (standard, sorted, length_grouped, oracle, oracle_dp,
// packing) form one global list of batches; step k gives batches
// k*W .. k*W+W-1 to ranks 0..W-1 (the last step may leave ranks IDLE).
std::vector<std::string> PolicyNames();
absl::StatusOr<Schedule> RunPolicy(const std::string& policy, const std::vector<SampleLengths>& arrival,
                                   const SimConfig& config);

// Standard/sorted fixed batch size: the largest that fits the longest sample.
uint32_t FixedBatchSize(const std::vector<SampleLengths>& samples, const grouping::Budget& budget);

struct Metrics {
  uint64_t samples = 0;
  uint64_t steps = 0;
  uint64_t idle_rank_steps = 0;
  uint64_t real_tokens = 0;
  uint64_t padded_tokens = 0;
  double time = 0.0;          // sum over steps of the slowest rank's cost
  double mean_rank_time = 0;  // sum over steps of the mean rank cost
  double samples_per_s() const { return time > 0 ? samples / time : 0.0; }
  double padding_fraction() const {
    return padded_tokens ? 1.0 - static_cast<double>(real_tokens) / padded_tokens : 0.0;
  }
  double max_over_mean() const { return mean_rank_time > 0 ? time / mean_rank_time : 1.0; }
  std::vector<double> step_costs;  // slowest rank's cost per step
};

// Step cost of one rank: a + b * padded + c * sum(len^2); an IDLE step costs a.
double RankCost(const grouping::StepTimeModel& model, const RankStep& step);
Metrics Evaluate(const Schedule& schedule, const grouping::StepTimeModel& model);

}  // namespace odb::bench

#endif  // ODB_BENCH_POLICIES_H_
