// The global planner's partitioned rounds (partition.cc) and the
// unpartitioned plan they call on each block (global_planner.cc).
#ifndef ODB_BALANCE_PARTITION_H_
#define ODB_BALANCE_PARTITION_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "src/align/planner.h"
#include "src/balance/global_planner.h"

namespace odb::balance::internal {

// The unpartitioned planner on the ranks of `state`, after the round gates;
// with `fixed_steps`, T is given (a block of a partitioned round).
align::RoundPlan PlanRanks(const GlobalPlannerConfig& config, const align::RoundState& state,
                           uint32_t min_free, std::optional<size_t> fixed_steps);

// Ranks per block of a partitioned round: partition_ranks rounded up to whole
// nodes, or `world` when planning is not partitioned.
size_t BlockRanks(const GlobalPlannerConfig& config, size_t world);

// A lower bound on the number of groups grouping::FormGroups makes of the
// first `n` of `pending`.
double GroupLowerBound(const grouping::Budget& b, const std::vector<SampleMeta>& pending, size_t n);

// T of a partitioned round, from the blocks' windows alone; fills `plan`'s
// frame (ranks, T, reason), on T = 0 the holding-back plan. Returns T.
size_t PartitionedSteps(const GlobalPlannerConfig& config, std::span<const align::RankSummary> ranks,
                        size_t block, uint32_t min_free, align::RoundPlan& plan);

// Plans the block `ranks` (ranks begin.. of the world) on its own windows with
// T = t and writes its RankPlans into `plan`.
void PlanBlockInto(const GlobalPlannerConfig& config, uint32_t epoch, uint64_t round, uint64_t first_step,
                   std::span<const align::RankRound> ranks, size_t begin, size_t t, align::RoundPlan& plan);

}  // namespace odb::balance::internal

#endif  // ODB_BALANCE_PARTITION_H_
