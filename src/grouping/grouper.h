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
