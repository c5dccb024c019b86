#ifndef ODB_GROUPING_GROUPER_H_
#define ODB_GROUPING_GROUPER_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "src/common/sample.h"
#include "src/grouping/budget.h"

namespace odb::grouping {

// A group of samples, as indices into the window passed to the grouper.
struct Group {
  std::vector<size_t> members;
  // Set when the group is a single sample that fits no budget (policy decides
  // whether it is emitted alone or rejected). Never set on multi-sample groups.
  bool over_budget = false;
};

// Forms groups from a window of samples, minimising the step-time model's
// total cost (steps and padded work) subject to the budget. Every input index
// appears in exactly one group. Groups are returned in ascending order of
// their longest member; callers shuffle (see ShuffleGroups).
std::vector<Group> FormGroups(std::span<const SampleLengths> window, const Budget& budget,
                              const StepTimeModel& model);

// Groups of length-mixed samples (grouping.mix_lengths, docs/config.md): the
// samples that fit alone, in a random order drawn from `seed`, each go to the
// first of the most recently opened groups (at most kMixOpenGroups of them)
// that can still take it, else open a new group (next-k-fit bin packing, the
// oldest open group closing when a new one would exceed k). Every group
// respects the budget; over-budget samples are flagged singletons as in
// FormGroups. Groups then hold samples of every length instead of runs of the
// length order, so the steps and accumulation windows made of them are not
// length-correlated. Packed budgets lose little to it (padding is sum(len)
// whatever the grouping; only the group count may grow); padded budgets pay
// padding. Same output for the same window and seed; canonical order as
// FormGroups'.
inline constexpr size_t kMixOpenGroups = 8;
std::vector<Group> FormMixedGroups(std::span<const SampleLengths> window, const Budget& budget,
                                   uint64_t seed);

// The reference ODB 0.1.x rule (DESIGN.md): window sorted by length, walked
// longest first, target size max(floor(L_max / L), 1). Kept for tests and the
// simulator as the baseline to beat.
std::vector<Group> ReferenceOdbGroups(std::span<const SampleLengths> window,
                                      const Budget& budget);

// Fewest-steps greedy: longest first, fill each group to the budget.
std::vector<Group> GreedyFewestSteps(std::span<const SampleLengths> window,
                                     const Budget& budget);

// Total step time of a grouping of `window`.
double TotalStepTime(std::span<const SampleLengths> window, const std::vector<Group>& groups,
                     const StepTimeModel& model, CostModel cost_model);

// Deterministic shuffle of group order from a seed (same seed, same order on
// every rank); never leaves groups in length order by construction.
void ShuffleGroups(std::vector<Group>& groups, uint64_t seed);

}  // namespace odb::grouping

#endif  // ODB_GROUPING_GROUPER_H_
