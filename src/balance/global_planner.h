#ifndef ODB_BALANCE_GLOBAL_PLANNER_H_
#define ODB_BALANCE_GLOBAL_PLANNER_H_

#include <cstdint>
#include <string>

#include "src/align/planner.h"
#include "src/balance/phase_plan.h"

namespace odb::balance {

// The encoder phases a step's composition accounts for (alignment.phase_plans
// with alignment.llm_cost_seconds > 0). After each step's encoder items are
// rebalanced across its ranks (EncoderStepPlanner), an encoder phase takes at
// least max(largest item, total / n) on n active ranks, whatever the LLM
// layout: a large item (a 1024-patch image) alone in a step leaves the other
// ranks idle in that phase, two in one step share it. With llm_seconds > 0 the
// planner composes steps to lower the sum over steps of
// llm_seconds x the step's LLM cost (the costliest group's step time) plus
// each encoder phase's bound, not the LLM cost alone (DealSteps).
struct StepPhaseCosts {
  // Seconds per unit of base.step_model (the LLM cost), so that LLM and
  // encoder costs (PhaseCost, seconds) add up. 0 (default): off, steps are
  // composed on the LLM cost only.
  double llm_seconds = 0.0;
  PhaseCost vision{0.0, 0.0, 0.0};  // of vision_patches; 0 for a sample without
  PhaseCost audio{0.0, 0.0, 0.0};   // of audio_frames; all 0: no audio phase
  bool enabled() const { return llm_seconds > 0.0; }
};

// Knobs of the global planner. Every rank must use the same values: Name()
// encodes the two balance fields, so the connect-time hello (which carries the
// planner name) refuses a mismatch.
struct GlobalPlannerConfig {
  // Budget, step-time model, epoch mode, seed, window and wait rules: the same
  // meaning as for LocalPlanner (window applies per rank; the pool is the
  // union of the W windows).
  align::PlannerConfig base;
  // Ranks per node: node(r) = r / local_world_size. 0 means "all ranks on one
  // node". Only steers which moves the planner prefers (intra- over inter-node).
  uint32_t local_world_size = 1;
  // Balance vs bytes moved, in [0, 1]. 0: fully global, every step is balanced
  // to the smallest capacity the dispatcher finds (C*), then groups are
  // permuted across ranks to keep as many bytes local as possible (free: it
  // does not change any rank's cost). In (0, 1): a step may cost up to
  // C* / (1 - locality) so that samples can stay on their owner rank (then
  // node). 1: exactly LocalPlanner (zero bytes moved). Default 0.
  double locality = 0.0;
  // Iterations of the binary search on a step's capacity. Default 14.
  uint32_t capacity_search_iters = 14;
  // Up to this many ranks each step's rank permutation is the exact
  // (Hungarian, O(W^3)) optimum of the locality weights; above it,
  // balance::SparseAssignment (near-optimal, O(W log W) for the few owners of
  // a group). Only bytes moved depend on it, never a step's cost. Not a YAML
  // field (benchmarks and tests compare the two); Name() carries it when it
  // is not the default. Default 64.
  uint32_t exact_assignment_max_world = 64;
  // Partitioned planning (issue 22): 0 (default) plans all W ranks as one
  // pool. Otherwise the ranks are cut into blocks of partition_ranks ranks
  // (rounded up to whole nodes of local_world_size; 0 local_world_size means
  // one node, so one block) and each block is planned on its own windows
  // only: a sample never leaves its block. T is the same for every block,
  // decided from a lower bound on each block's group count
  // (docs/balancing.md, "Partitioned planning"), and each block's step k is
  // its k-th costliest chunk, so the k-th steps of all blocks cost alike.
  // The work is then linear in W (W / partition_ranks independent plans),
  // and one block's plan (PlanBlockOf) needs only its block's metadata plus
  // the others' bounds. Name() carries it when non-zero.
  uint32_t partition_ranks = 0;
  // Multimodal step composition (see StepPhaseCosts); off by default. With
  // partition_ranks each block composes its own steps. Name() carries it
  // when on.
  StepPhaseCosts phase_costs;
};

// Cross-rank grouping + OrchMLLM-style post-balancing behind align::Planner.
//
// A pure function of (config, RoundState): the union of every rank's window
// is grouped once (grouping::FormGroups; when it holds far more than the
// credit can emit, only its oldest samples, taken depth by depth across the
// ranks: docs/balancing.md, "oldest-first cut"), the groups are dealt to (step, rank)
// slots minimising sum_k max_r StepTime (sorted chunking, optimal for fixed
// groups; with phase_costs, then exchanges of groups between steps that lower
// the sum of the steps' LLM and encoder-phase bounds), each step is then re-dispatched by a
// longest-processing-time greedy under a binary-searched capacity, and finally the W groups of each step are
// permuted across ranks by an assignment (exact Hungarian up to
// exact_assignment_max_world ranks, SparseAssignment above) that maximises
// bytes kept on their owner rank, then node. Protocol rules (end of epoch,
// bounded waits, credit, equal T, Join coverage, Non-Join closure) are those
// of LocalPlanner; see docs/balancing.md for T and the termination bound.
// With partition_ranks, all of this runs per block of ranks (samples stay in
// their block; one T for all blocks), and PlanBlockOf plans one rank's block.
class GlobalPlanner final : public align::Planner {
 public:
  explicit GlobalPlanner(GlobalPlannerConfig config);
  align::RoundPlan Plan(const align::RoundState& state) const override;
  // What rank `rank` needs of Plan(state) when every rank plans only its own
  // block (partition_ranks > 0): num_steps, epoch_finished, waiting and the
  // RankPlans of `rank`'s block are Plan's, except that loss weights are
  // normalised over the block only (Plan's need every step's loss tokens
  // summed over all blocks: T integers per block); the other ranks'
  // RankPlans are left empty. Without
  // partitioning, or for a gated round, it is Plan(state). It reads the other
  // blocks' windows only for their group bounds. A rank outside [0, W) gets
  // the round's frame (T, reason) and no block.
  align::RoundPlan PlanBlockOf(const align::RoundState& state, int32_t rank) const;
  // Partitioned planning behind align::Planner (the Aligner's partitioned
  // round): blocks of partition_ranks rounded up to whole nodes; a rank's
  // bound is GroupLowerBound of its window while its stream is open, and
  // the number of groups its window alone makes once the stream has finished
  // (what a draining round must plan); PlanBlock is PlanBlockOf's plan from
  // the block's rounds and every rank's summary.
  size_t BlockRanks(size_t world) const override;
  double GroupBound(const align::RankRound& round) const override;
  align::RoundPlan PlanBlock(const align::BlockRoundState& block) const override;
  const align::PlannerConfig& config() const override { return config_.base; }
  // "global(locality=<l>,local_world_size=<n>)", plus
  // ",exact_assignment_max_world=<m>" when that is not 64,
  // ",partition_ranks=<p>" when that is not 0 and ",phase_steps" when
  // phase_costs is on.
  std::string Name() const override;
  bool MovesSamples() const override { return true; }
  const GlobalPlannerConfig& global_config() const { return config_; }

 private:
  GlobalPlannerConfig config_;
  align::LocalPlanner local_;  // locality >= 1
};

// Payload bytes a plan moves between daemons: a sample assigned to rank r with
// owner o != r moves payload_bytes from o to r, intra-node when
// node(o) == node(r). `stay` counts what is emitted on its owner.
struct BytesMoved {
  uint64_t stay_bytes = 0;
  uint64_t intra_node_bytes = 0;
  uint64_t inter_node_bytes = 0;
  uint64_t stay_samples = 0;
  uint64_t intra_node_samples = 0;
  uint64_t inter_node_samples = 0;

  uint64_t moved_bytes() const { return intra_node_bytes + inter_node_bytes; }
  uint64_t samples() const { return stay_samples + intra_node_samples + inter_node_samples; }
  BytesMoved& operator+=(const BytesMoved& o);
};

// local_world_size 0 = one node.
BytesMoved ComputeBytesMoved(const align::RoundPlan& plan, uint32_t local_world_size);

// Node of a rank under local_world_size (0 = one node).
inline int32_t NodeOf(int32_t rank, uint32_t local_world_size) {
  return local_world_size == 0 ? 0 : rank / static_cast<int32_t>(local_world_size);
}

}  // namespace odb::balance

#endif  // ODB_BALANCE_GLOBAL_PLANNER_H_
