#ifndef ODB_BENCH_WINDOW_BOUND_H_
#define ODB_BENCH_WINDOW_BOUND_H_

// A per-window lower bound on T_b (time model (b): the slowest rank's sum of
// micro-step costs) for EQUAL micro-step counts ("ceiling, equal counts";
// issue 35; simulator only). The daemon runs the same number n of micro-steps
// on every rank of a window (FSDP/ZeRO need it), so no layout of a window's
// samples on W ranks with equal counts, within the budget, is faster than
// EqualCountsWindowBound. Under the simulator's model a micro-step costs
//   a + g(p) + c sum len^2,  g(p) = max(m, b (p + k)),  an IDLE one costs a,
// with p its padded tokens (padded: count x longest; packed: the sum).
//
// For a layout with n micro-steps per rank (proofs in window_bound.cc):
//   (A) the mean over ranks: T >= n a + (S_n + c Q) / W, where S_n is a lower
//       bound on the sum of g over the non-empty micro-steps given that there
//       are at most W n of them: padded, the exact least sum over partitions
//       of the samples into at most W n groups within the budget (it is
//       reached by runs of the length-sorted samples); packed, G g(R / G)
//       with G the bin-packing bound on the non-empty micro-steps (R real
//       tokens);
//   (B) pigeonhole: for t >= 0, some rank holds t + 1 of the t W + 1 longest
//       samples, so T >= n a + g(s_t) + c q_t, with s_t (q_t) the sum (of
//       squares) of the t + 1 shortest of them (t = 0: the longest alone);
//   (C) n >= the fewest micro-steps per rank the budget allows (padded: the
//       fewest runs / W; packed: the bin-packing bound / W; at least 1).
// LooseEqualCountsWindowBound (session 26) is min over n >= n_0 of
// max(A(n), B(n)). EqualCountsWindowBound (session 27) tightens (A): with J
// non-empty micro-steps in all (j_r <= n on rank r),
//   (A_J) T >= n a + (E(J) + c Q) / W, E(J) the least sum of g over EXACTLY J
//       groups (padded, exact, by runs; packed, J g(R / J)): every non-empty
//       micro-step pays its b k;
//   (D) a micro-step holds at most pmax real tokens (the largest padded group
//       the budget allows), so R_r <= j_r pmax, and T - n a >= b (R_r + k
//       j_r) + c l_min R_r on every rank; the even share of J is the best;
// and the bound is min over n >= n_0 of max(B(n), min over J <= W n of
// max(A_J, D(J))). It is never below the loose one.
#include <cstdint>
#include <vector>

#include "bench/bound.h"
#include "src/common/sample.h"
#include "src/grouping/budget.h"

namespace odb::bench {

// The least sum of g(count x longest) over partitions of `samples` into at
// most `groups` groups, each within the budget (count x longest <=
// max_tokens and count <= max_group_size when set) or a single sample;
// +infinity when no such partition exists. `out`, when given, receives the
// values for 1..groups groups (out[j - 1]: at most j groups).
double LeastPaddedCompute(const std::vector<SampleLengths>& samples, const grouping::Budget& budget,
                          const StepModel& model, uint64_t groups, std::vector<double>* out = nullptr);

// The least sum of g(count x longest) over partitions of `samples` into
// EXACTLY j groups within the budget (or single samples), for j = 1..groups
// (out[j - 1]; +infinity past the number of samples).
std::vector<double> LeastPaddedComputeExact(const std::vector<SampleLengths>& samples,
                                            const grouping::Budget& budget, const StepModel& model,
                                            uint64_t groups);

struct EqualCountsBound {
  double bound = 0.0;       // min over n of the bound for n
  uint64_t fewest = 0;      // n_0 of (C)
  uint64_t best_count = 0;  // the n where the minimum is reached
};

// The bound for one window's samples on `world` ranks with equal micro-step
// counts (budget.model: padded or packed).
EqualCountsBound EqualCountsWindowBound(const std::vector<SampleLengths>& samples,
                                        const grouping::Budget& budget, const StepModel& model, int world);

// Session 26's bound ((A) and (B) only), never above EqualCountsWindowBound;
// kept for the tests that show the tighter one is tighter.
EqualCountsBound LooseEqualCountsWindowBound(const std::vector<SampleLengths>& samples,
                                             const grouping::Budget& budget, const StepModel& model,
                                             int world);

}  // namespace odb::bench

#endif  // ODB_BENCH_WINDOW_BOUND_H_
