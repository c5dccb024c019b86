#ifndef ODB_ALIGN_PLANNED_GROUPS_H_
#define ODB_ALIGN_PLANNED_GROUPS_H_

// The rules both planners (LocalPlanner, balance::GlobalPlanner) apply to a
// group, said once. Both keep a group as indices (`members`) into a list of
// samples (a rank's window, or the union of the windows).

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "src/align/planner.h"
#include "src/common/sample.h"
#include "src/grouping/budget.h"

namespace odb::align {

// Smallest key of the members: a total tie-break, so that sorting groups never
// depends on the library's handling of equal elements. An empty group has the
// largest key.
SampleKey MinKey(std::span<const SampleMeta> samples, std::span<const size_t> members);

// Tokens the group's step computes under `model` (grouping::PaddedTokens,
// without copying the lengths out).
uint64_t PaddedOf(grouping::CostModel model, std::span<const SampleMeta> samples, std::span<const size_t> members);

// Indices of `groups` in the order "most worth emitting first": more samples,
// then more padded tokens (fuller), then smallest key. A round that has more
// groups than slots emits this order's head and keeps the tail pending, where
// it is regrouped with later arrivals.
std::vector<size_t> FillOrder(grouping::CostModel model, std::span<const SampleMeta> samples,
                              const std::vector<std::span<const size_t>>& groups);

// Reorders `groups` by FillOrder; members_of(group) gives a group's members.
template <typename Group, typename MembersOf>
void SortByFill(grouping::CostModel model, std::span<const SampleMeta> samples, std::vector<Group>& groups,
                MembersOf members_of) {
  std::vector<std::span<const size_t>> spans;
  spans.reserve(groups.size());
  for (const Group& g : groups) spans.push_back(members_of(g));
  const std::vector<size_t> order = FillOrder(model, samples, spans);
  std::vector<Group> sorted;
  sorted.reserve(groups.size());
  for (size_t i : order) sorted.push_back(std::move(groups[i]));
  groups = std::move(sorted);
}

// The planned step of a non-empty group: its samples in `members` order, real
// and padded token counts under `model`, and over_budget as given (the
// planner knows whether it is a lone sample that fits no budget). An empty
// group is an IDLE step.
PlannedStep MakeStep(grouping::CostModel model, std::span<const SampleMeta> samples,
                     std::span<const size_t> members, bool over_budget);

}  // namespace odb::align

#endif  // ODB_ALIGN_PLANNED_GROUPS_H_
