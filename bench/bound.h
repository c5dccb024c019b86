#ifndef ODB_BENCH_BOUND_H_
#define ODB_BENCH_BOUND_H_

#include <cstdint>
#include <vector>

#include "src/common/sample.h"
#include "src/grouping/budget.h"

namespace odb::bench {

// The simulator's step-time model (bench/step_models.yaml), per rank and step:
//
//   cost(rank step) = a + max(m, b * (padded + k)) + c * sum(len^2)
//   cost(IDLE rank step) = a
//
// a: per-step cost that compute cannot hide (optimizer, exposed collectives);
// b: compute time per token at full utilization; k: utilization half-point in
// tokens per step (compute runs at efficiency eff(p) = p / (p + k), so it takes
// b * p / eff(p) = b * (p + k)); m: a floor under the compute part (the
// communication overlapped with compute, or the weights' HBM traffic: a step
// never finishes before it); c: attention, per squared real sample length.
// g(p) = max(m, b * (p + k)) is non-decreasing and convex in p, which is all
// the bounds below rely on. With k = m = 0 this is the original
// a + b * padded + c * sum(len^2).
struct StepModel {
  double a = 512.0;
  double b = 1.0;
  double c = 0.0;
  double k = 0.0;
  double m = 0.0;

  // The compute part g(p) for p tokens computed on.
  double Compute(double padded_tokens) const;
  // Cost of a non-idle rank step.
  double Step(double padded_tokens, double sum_len_sq) const {
    return a + Compute(padded_tokens) + c * sum_len_sq;
  }
  // The linear model the daemon's planner is given (grouping.step_time): the
  // efficiency curve folded into the per-step term, the floor m left out
  // (a + b * (p + k) = (a + b * k) + b * p exactly; the floor only binds for
  // steps far below the budget).
  grouping::StepTimeModel PlannerModel() const;
};

// Lower bounds on the simulated time (sum over steps of the slowest rank's
// cost) of ANY schedule of `samples` on `world` ranks whose rank steps respect
// the token budget L = budget.max_tokens. docs/benchmarks.md, "The bound",
// has the proofs.
struct Bounds {
  // Exact minimum over all partitions of the samples into padded groups
  // (n * longest <= L, and max_group_size when set) of sum over groups of
  // a + g(n * longest) + c * sum(len^2), divided by W. No schedule of padded
  // batches beats it (standard, sorted, length-grouped, reference ODB, odb,
  // the offline policies).
  double padded = 0.0;
  uint64_t padded_groups = 0;  // groups of that optimum
  // Relaxation over every layout that computes on at least the real tokens of
  // a rank step holding at most L of them (padded, packed rows, varlen): with
  // G >= G_min rank steps (G_min: Martello-Toth L2 bin-packing bound),
  // min_G [G * a + G * g(total / G)] + c * sum(len^2), divided by W. No
  // schedule at all beats it, packing included. Always <= padded.
  double any_layout = 0.0;
  uint64_t min_rank_steps = 0;  // G_min
  // any_layout tightened by the step that holds the longest sample x1: that
  // step costs at least x1's rank step alone, a + g(l1) + c * l1^2, while its
  // other W - 1 rank steps cost at most (W - 1) * (a + g(L)) + c * Q (Q:
  // RowsSumSquaresBound of the other samples, W - 1 rows, L); every other
  // step costs at least its mean. So T >= any_layout + (1 - 1/W) *
  // cost(x1 alone) - (that maximum) / W. Never below any_layout; it binds
  // when one sample's attention outweighs what the other ranks can be given
  // in its step (docs/benchmarks.md).
  double largest_sample = 0.0;
  // The compute part of any_layout: min over G >= G_min rank steps of
  // G * g(total / G), plus c * sum(len^2), divided by W (no per-step a).
  double compute_floor = 0.0;
};

// Lower bounds on a schedule of the same samples cut into `windows`
// accumulation windows (optimizer steps; docs/benchmarks.md, "Accumulation
// windows in the simulator"). Windows only constrain a schedule, so every
// bound above still holds; and every window holds at least one micro-step,
// in which every rank runs (equal micro-step counts; an IDLE one costs a),
// and some rank runs a non-empty one (a + g(p) >= a + g(0)). So under both
//   synchronous (time model (a), the slowest rank per micro-step) and
//   per_window (time model (b), the slowest rank's sum per window):
//     T >= N a + max(N g(0), compute_floor)
// (per window: the slowest rank is at least the mean over ranks, and at
// least the rank with a non-empty micro-step). Each is the larger of that
// and the bounds above that hold for it (`padded`: the padded bound too; the
// largest-sample bound only for (a)).
struct WindowBounds {
  double synchronous = 0.0;
  double per_window = 0.0;
};
WindowBounds WindowedBounds(const Bounds& bounds, const StepModel& model, uint64_t windows, bool padded);

Bounds LowerBounds(const std::vector<SampleLengths>& samples, const grouping::Budget& budget,
                   const StepModel& model, int world);

// The groups of the exact padded optimum (samples by value, each group a run
// of the samples sorted by length), for the `offline_dp` policy.
std::vector<std::vector<SampleLengths>> OptimalPaddedGroups(const std::vector<SampleLengths>& samples,
                                                            const grouping::Budget& budget,
                                                            const StepModel& model);

// An upper bound on sum(len^2) over `rows` disjoint rank steps, each holding
// samples of `lengths` (each sample at most once) with sum(len) <= cap (0: no
// limit). The least of: (i) the sum over all samples; (ii) sum over the
// `rows` longest m of psi(m) = q m^2 + r^2, q = floor(cap / m), r = cap - q m
// (a row of reals in [0, m] summing to <= cap; <= cap * m); (iii) min over
// lambda >= 0 of lambda * rows * cap + the most sum len (len - lambda) over
// samples longer than lambda of which at most k * rows are longer than
// cap / (k + 1) for every k (at lambda = the length where the longest samples
// fill rows * cap tokens, and without the counts, this is the sum of squares
// of those samples, the last one fractional). docs/benchmarks.md, "The
// bounds", has the proof.
double RowsSumSquaresBound(std::vector<uint32_t> lengths, uint64_t rows, uint64_t cap);

// Martello-Toth L2 lower bound on the number of bins of capacity `capacity`
// holding items of the given sizes (each <= capacity).
uint64_t BinPackingLowerBound(std::vector<uint64_t> sizes, uint64_t capacity);

}  // namespace odb::bench

#endif  // ODB_BENCH_BOUND_H_
