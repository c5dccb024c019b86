// The global planner's locality passes: which rank runs which group of a
// step, and moves and swaps that bring samples to the rank (or node) that
// owns their payload, within the budget and the step's capacity. Used by
// global_planner.cc; the objective weighs inter-node bytes kNodeWeight times.
#ifndef ODB_BALANCE_LOCALITY_H_
#define ODB_BALANCE_LOCALITY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "src/align/planner.h"
#include "src/balance/global_planner.h"
#include "src/balance/planner_pool.h"

namespace odb::balance::internal {

// Assigns the step's groups `bins` to ranks maximising the locality gain
// (exact up to `exact_max_world` ranks, else greedy); the rank of each bin
// in `rank_of_bin`. Returns the gain.
int64_t LocalityGain(const Pool& pool, const std::vector<Members>& bins, int world, uint32_t lws,
                     uint32_t exact_max_world, std::vector<int>* rank_of_bin);
// Local search on an assignment (pairwise exchanges), at most `passes` passes.
void ImproveAssignment(const Pool& pool, const std::vector<Members>& bins, int world, uint32_t lws,
                       uint32_t exact_max_world, std::vector<int>& rank_of_bin, int passes);
// Moves and swaps within a step that bring samples home, within the budget and
// `capacity`; true when any changed.
bool LocalitySwaps(const align::PlannerConfig& cfg, const Pool& pool, std::vector<Members>& bins,
                   const std::vector<int>& rank_of_bin, double capacity, uint32_t lws);
// Across steps: samples of two ranks owned by each other trade places; the
// number of swaps.
size_t CrossStepHomeSwaps(const align::PlannerConfig& cfg, const Pool& pool,
                          std::vector<std::vector<Members>>& steps, const std::vector<double>& capacity);
// A partial (end-of-epoch) step: fewer groups than ranks; only the permutation.
std::vector<Members> PlaceStep(const GlobalPlannerConfig& gcfg, const Pool& pool, std::vector<Members> bins,
                               int world);

}  // namespace odb::balance::internal

#endif  // ODB_BALANCE_LOCALITY_H_
