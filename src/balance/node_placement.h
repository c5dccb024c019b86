#ifndef ODB_BALANCE_NODE_PLACEMENT_H_
#define ODB_BALANCE_NODE_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "src/common/sample.h"
#include "src/grouping/budget.h"

namespace odb::balance {

// Node-aware re-placement of one planned step (issue 22, item 4).
//
// The global planner balances a step first and only then decides where its
// groups run, so a group mixes samples of many owner nodes and a permutation
// of whole groups keeps few of them on their node. This pass re-splits the
// samples of the step between the ranks of two (or three) nodes at a time so that fewer
// payload bytes cross a node boundary, without raising the step time (the
// slowest rank's grouping::StepTime) and keeping every budget.
//
// It is exact where the step time and the budget of a group depend only on
// its size and its longest sample: the padded cost model with per_len_sq 0
// and no modality limit (the default budget). Then a group of longest length
// L can hold up to cap(L) samples (the most that keep both the budget and the
// step's time), cap is non-increasing in L, and a node's k ranks can run a
// set of samples iff, taken longest first, "fill the current group up to
// cap(its longest), then open the next" needs at most k groups (and the set
// has >= k samples, so that no rank idles). For a pair of nodes (A, B) a
// dynamic program over the pair's samples, longest first, with state
// (groups opened, room left in the open group, samples taken up to k; on A
// and on B), finds the split of the pair's samples between A and B with the
// fewest inter-node bytes; each node's share is then packed that way and its groups are
// permuted over its ranks to keep the most bytes on their owner rank.
// Other models are left alone (NodePlacementApplies is false).
//
// The same DP runs over three nodes at once (state per node as above, three
// choices per sample): moves around a cycle (A's sample leaves B for A, A's
// short ones leave for C, C's for B) that no pair can make.
//
// A pass takes the pairs by the bytes they exchange, largest first (ties:
// lower node ids), then (with `triples`) up to max_triples triples that hold
// an exchanging pair, by the bytes their three pairs exchange; at most
// `passes` passes while one improves. A set whose nodes have not changed
// since its search found nothing is skipped (the DP is a pure function of
// the set's samples). Cost: a set of c nodes and m samples costs
// O(c * m * beam) state expansions (at most `beam`, for triples
// `triple_beam`, states are kept per sample: exact while no layer has more,
// else the cheapest, a heuristic; either way the set's current placement is
// kept unless strictly beaten, so the result is never worse; a partial
// split whose bytes plus those the rest must cross anyway reach the set's
// current bytes is dropped, which changes no answer and saves its
// subtree's work for other sets). The whole
// step's DP work is capped at max(work_base, work_per_sample * n) state
// expansions for a step of n samples, and at least small_step_work when n <=
// small_step_samples (a set that would overrun it runs with a narrower beam,
// down to 8, or is skipped), so a step costs O(passes * n log n + its cap)
// whatever its size. Defaults: steps of > 256 samples (500-1000 in a block
// of 256 ranks of the scale benchmark) spend what they did with pairs alone,
// ~9% of the planner's CPU per step at W = 256 and 2560; steps of <= 256
// samples (a few nodes of few ranks) up to 2^18 expansions, a few ms of one
// core (docs/balancing.md).
// One rank per node (local_world_size 1, `one_rank_homes`): each rank runs
// one group, and the small-step allowance went mostly to searching exchange
// cycles between ranks (~1-1.7 ms of CPU a step at W = 32 with 128 samples, on
// every rank of an unpartitioned job). Instead, with every rank's longest
// sample held (its group may then hold up to cap(longest)), a flow keeps
// samples on their owner rank, most bytes first, while the samples left away
// can still be placed (Hall's condition over lengths: those of length >= x
// fit in the room of the ranks whose longest is >= x), and places the others
// longest first: every exchange cycle at once, of any length. Up to four such
// rounds (each on the longest the previous left), then pairs and triples
// (which may change a rank's longest) within max(work_base, work_per_sample
// * n) expansions, without the small-step allowance (docs/balancing.md,
// "The whole-job round at W = 32").
// Deterministic: a pure function of its inputs (integer byte costs, ties
// broken by state and sample keys), the same on every rank.
struct NodePlacementOptions {
  uint32_t beam = 64;
  uint32_t passes = 8;
  uint64_t work_base = 1u << 13;
  uint64_t work_per_sample = 2;
  uint64_t small_step_samples = 256;    // a step of at most this many samples ...
  uint64_t small_step_work = 1u << 18;  // ... may spend this much
  uint32_t triple_beam = 128;
  bool triples = true;        // after the pairs, re-split triples of nodes
  uint32_t max_triples = 64;  // triples tried per pass, best scored first
  // One rank per node (local_world_size 1): the home flow first, then pairs
  // only (see above).
  bool one_rank_homes = true;
};

struct NodePlacementStats {
  uint64_t inter_node_bytes_before = 0;
  uint64_t inter_node_bytes_after = 0;
  uint64_t pairs_tried = 0;
  uint64_t pairs_improved = 0;
  uint64_t triples_tried = 0;
  uint64_t triples_improved = 0;
  uint64_t work = 0;  // state expansions spent
  uint64_t home_rounds_improved = 0;  // one-rank nodes: home flows that lowered the bytes
};

// True when the pass is exact-feasible for this budget and step model (see
// above); PlaceOnNodes changes nothing otherwise.
bool NodePlacementApplies(const grouping::Budget& budget, const grouping::StepTimeModel& model);

// Re-places the samples of one step. groups[r] lists the indices (into
// `metas`) of the samples rank r runs in this step; node(r) =
// r / local_world_size (0: one node, nothing to do). Every group must be
// non-empty (a full step; a partial end-of-epoch step is left alone). On
// return every sample is in exactly one group, every group is non-empty,
// fits the budget (a group of one always does) and costs at most the
// step's time on entry, and the step's inter-node bytes (payload of samples
// whose rank is on another node than their owner) did not grow. A sample
// whose owner_rank is outside [0, groups.size()) counts as owned by no node
// (always inter-node).
NodePlacementStats PlaceOnNodes(const grouping::Budget& budget, const grouping::StepTimeModel& model,
                                const std::vector<SampleMeta>& metas,
                                std::vector<std::vector<size_t>>& groups, uint32_t local_world_size,
                                const NodePlacementOptions& options = {});

// Inter-node payload bytes of a step laid out as `groups` (same conventions).
uint64_t InterNodeBytes(const std::vector<SampleMeta>& metas, const std::vector<std::vector<size_t>>& groups,
                        uint32_t local_world_size);

}  // namespace odb::balance

#endif  // ODB_BALANCE_NODE_PLACEMENT_H_
