#ifndef ODB_BENCH_BATCHING_SIM_UNEQ_H_
#define ODB_BENCH_BATCHING_SIM_UNEQ_H_

// Unequal micro-step counts in a window (issue 35 item 3; simulator only, the
// daemon has no such mode). Under DDP with no_sync only a window's last
// micro-step synchronises (time model (b)), so ranks could run different
// numbers of micro-steps in a window, as long as every rank runs the closing
// one (its all-reduce needs every rank). This re-evaluates each closed window
// of an odb schedule, after the daemon's own window balance, two ways:
//
//   own counts: each rank keeps its samples of the window and packs them into
//     as few micro-steps as its budget needs, the cheapest way under the step
//     model (align::BalanceWindow on a one-rank window: the window balance's
//     own per-rank packing, micro-step counts from the budget's fewest up to
//     the rank's own), without IDLE micro-steps; a rank with no samples in the
//     window runs one IDLE micro-step (the closing all-reduce).
//   re-dealt: the window's samples dealt again over the ranks, longest
//     processing time first (samples, or length-sorted runs of them), then
//     packed per rank as above, or own counts refined by single moves off
//     the slowest rank (see Redealt); per window the cheapest of these and
//     own counts is kept.
//
// Neither changes which samples a window holds (its optimizer step and exact
// weights), only which rank computes them and in how many micro-steps, and
// each rank's sum is never above its equal-count sum (the packing is kept
// only when it is no costlier under the simulator's model; an IDLE-only
// rank's k >= 1 micro-steps become one), so T_b never rises.
//
// The bounds of docs/benchmarks.md still hold under (b): T_b >= (1/W) x the
// cost of all rank steps >= the padded (any-layout) bound, whatever the
// counts; the window bound too, as every rank runs >= 1 micro-step per window.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/policies.h"
#include "src/grouping/budget.h"

namespace odb::bench {

// A schedule with the samples of every rank step: members[k][r] are the
// lengths rank r computes in step k (empty: IDLE).
struct TracedSchedule {
  Schedule schedule;
  StepMembers members;
};

// RunPolicy for an odb policy, with each rank step's samples (RunPolicy's
// members). Partitioned windows are not supported.
absl::StatusOr<TracedSchedule> RunOdbTraced(const std::string& policy,
                                            const std::vector<SampleLengths>& arrival,
                                            const SimConfig& config);

// One window: layout[r][i] = the lengths rank r computes in its i-th
// micro-step (empty: IDLE).
using WindowLayout = std::vector<std::vector<std::vector<SampleLengths>>>;

struct UnequalConfig {
  StepModel model;          // the simulator's cost
  grouping::Budget budget;  // the policy's (padded or packed)
};

// A micro-step's cost under the simulator's model (RankCost of its RankStep;
// an IDLE one costs a).
double MicroCost(const UnequalConfig& config, const std::vector<SampleLengths>& members);
// Rank r's summed cost over the window.
double RankSum(const UnequalConfig& config, const std::vector<std::vector<SampleLengths>>& micro_steps);
// (b): the slowest rank's sum.
double WindowTimeB(const UnequalConfig& config, const WindowLayout& window);

// Own counts (see above): each rank's samples packed into its own number of
// micro-steps, at least one.
WindowLayout OwnCounts(const UnequalConfig& config, const WindowLayout& window);
// The window's samples dealt again over the ranks, then packed per rank
// (PackRank: the window balance's packing, own counts): kSamples deals the
// samples longest first to the rank with the least summed weight (b t +
// c t^2, LPT), each rank's samples then cut into length-sorted runs within
// the budget; kSteps cuts the window's samples, sorted by length, into runs
// within the budget (padded micro-steps of like lengths, as the planner
// fills them) and deals the runs LPT by their cost; kMoves starts from
// OwnCounts and moves single samples off the slowest rank to another rank's
// micro-step (or a new one) while that lowers the slowest rank's sum, each
// changed rank packed again; kBest keeps the cheapest under (b) of these
// and OwnCounts.
enum class RedealMode { kBest, kSamples, kSteps, kMoves };
WindowLayout Redealt(const UnequalConfig& config, const WindowLayout& window,
                     RedealMode mode = RedealMode::kBest);

struct UnequalMetrics {
  uint64_t windows = 0;
  double equal_time = 0.0;    // T_b of the schedule as planned (equal counts): Evaluate's window_time
  double own_time = 0.0;      // T_b with own counts
  double redealt_time = 0.0;  // T_b re-dealt (the cheaper of LPT and own counts per window)
  double lpt_time = 0.0;      // T_b with the cheaper LPT deal alone (samples or runs), without own counts
  double moves_time = 0.0;    // T_b with own counts and single moves off the slowest rank
  // Sum over windows of the largest of the padded bound (any-layout for a
  // packed budget) of the window's own samples on W ranks, ceil(G_min / W) x
  // a (G_min: the bin-packing bound on its rank-steps; some rank runs that
  // many) and the two-micro-step bound (EvaluateUnequal):
  // no schedule of these windows, with any micro-step counts, is faster
  // under (b).
  double per_window_bound = 0.0;
  // Sum over windows of the larger of that and the equal-counts bound
  // (bench/window_bound.h): no layout of these windows with EQUAL micro-step
  // counts per rank (as the daemon runs them) is faster under (b).
  double equal_counts_bound = 0.0;
  // Windows whose equal-count layout as planned beats that bound (never, if
  // the bound holds: batching_sim fails on it).
  uint64_t equal_counts_violations = 0;
  uint64_t own_differ = 0;  // windows whose ranks' micro-step counts differ
  uint64_t redealt_differ = 0;
  uint64_t equal_rank_steps = 0, own_rank_steps = 0, redealt_rank_steps = 0;
  uint64_t own_idle_rank_steps = 0, redealt_idle_rank_steps = 0;
  // What the layouts hold, to check every sample is kept once.
  uint64_t samples[3] = {0, 0, 0};  // equal, own, re-dealt
  uint64_t tokens[3] = {0, 0, 0};
  double sum_sq[3] = {0, 0, 0};
};

UnequalMetrics EvaluateUnequal(const TracedSchedule& traced, const UnequalConfig& config);

}  // namespace odb::bench

#endif  // ODB_BENCH_BATCHING_SIM_UNEQ_H_
