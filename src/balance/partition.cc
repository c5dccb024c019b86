// Partitioned planning (alignment.partition_ranks, docs/balancing.md
// "Partitioned planning"): blocks of whole nodes, each planned on its own
// windows with a T every block can fill, so that a rank plans its block, not
// the whole job.
#include "src/balance/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "src/align/planned_groups.h"
#include "src/grouping/budget.h"

namespace odb::balance {
namespace internal {

using align::KeyOf;
using align::PlannedStep;
using align::RankPlan;
using align::RankRound;
using align::RoundPlan;
using align::RoundState;
using align::SampleKey;

// Ranks per block of a partitioned round: partition_ranks rounded up to whole
// nodes (a block never splits a node, so node-local moves stay possible), or
// `world` when planning is not partitioned.
size_t BlockRanks(const GlobalPlannerConfig& config, size_t world) {
  if (config.partition_ranks == 0 || config.local_world_size == 0) return world;
  const size_t lws = config.local_world_size;
  const size_t block = (config.partition_ranks + lws - 1) / lws * lws;
  return std::min(block, world);
}

// A lower bound on the number of groups grouping::FormGroups makes of
// `samples`, from the samples alone: a group of >= 2 members fits the budget,
// and the sum of its members' effective lengths is at most its budget cost
// (equal when packed; padded charges every member the longest's), so at most
// max_tokens; it has at most max_group_size members; a sample that fits no
// budget is a group of its own (its share is capped at 1). Hence
// groups >= max(sum of token shares, sum of size shares).
double GroupLowerBound(const grouping::Budget& b, const std::vector<SampleMeta>& pending, size_t n) {
  if (n == 0) return 0.0;
  if (b.max_tokens == 0 && b.max_group_size == 0) return 1.0;
  double tokens = 0.0;
  if (b.max_tokens != 0) {
    const double max_tokens = static_cast<double>(b.max_tokens);
    for (size_t i = 0; i < n; ++i) {
      tokens += std::min(1.0, grouping::EffectiveLength(b, pending[i].lengths.tokens) / max_tokens);
    }
  }
  const double size =
      b.max_group_size == 0 ? 0.0 : static_cast<double>(n) / static_cast<double>(b.max_group_size);
  return std::max(tokens, size);
}

// T of a partitioned round, from the ranks' group bounds alone (no grouping
// of a block): the largest T that every block with an open stream can fill
// with whole steps, min(free, min over such blocks of floor(bound / ranks));
// once every stream has finished (or in deterministic mode, where holding
// back would wait for ever), the smallest T that drains the fullest block's
// bound. Grouping every block to count its groups would cost every rank the
// whole job's grouping; a rank's bound (GlobalPlanner::GroupBound: the lower
// bound while its stream is open, its own window's group count once it has
// finished) costs it one pass or one grouping of its own window, and travels
// in its round summary. Fills `plan`'s frame (ranks, T, reason); on T = 0,
// the holding-back plan. Returns T.
size_t PartitionedSteps(const GlobalPlannerConfig& config, std::span<const align::RankSummary> ranks,
                        size_t block, uint32_t min_free, RoundPlan& plan) {
  const align::PlannerConfig& cfg = config.base;
  const size_t world = ranks.size();
  size_t open_t = std::numeric_limits<size_t>::max(), drain_t = 0, tightest = 0;
  bool any_open = false;
  for (size_t begin = 0; begin < world; begin += block) {
    const size_t end = std::min(world, begin + block);
    double bound = 0.0;
    bool open = false;
    for (size_t r = begin; r < end; ++r) {
      bound += ranks[r].group_bound;
      open = open || !ranks[r].stream_finished;
    }
    const double ranks = static_cast<double>(end - begin);
    drain_t = std::max(drain_t, static_cast<size_t>(std::ceil(bound / ranks)));
    if (open) {
      any_open = true;
      const auto t = static_cast<size_t>(std::floor(bound / ranks));
      if (t < open_t) {
        open_t = t;
        tightest = begin;
      }
    }
  }
  size_t t = any_open ? open_t : drain_t;
  if (t == 0 && cfg.deterministic) t = drain_t;
  t = std::min<size_t>(t, min_free);
  plan.ranks.assign(world, RankPlan{});
  const std::string frame = "partitioned into blocks of " + std::to_string(block) + " ranks: ";
  if (t == 0) {
    plan.reason = frame + "holding back: the windows of ranks " + std::to_string(tightest) + ".." +
                  std::to_string(std::min(world, tightest + block) - 1) +
                  " hold fewer sure groups than ranks and some stream there is open";
    return 0;
  }
  plan.num_steps = static_cast<uint32_t>(t);
  plan.reason = frame + "T=min(free=" + std::to_string(min_free) + ", " +
                (any_open ? "min over open blocks of floor" : "max over blocks of ceil") +
                "(group bound / ranks))";
  return t;
}

// Plans `ranks` (ranks begin.. of the world) on their own windows (samples
// never leave the block) with T = t, as PlanRanks on the block renumbered
// from rank 0 (`begin` is a node boundary, so nodes are unchanged), and
// writes their RankPlans into `plan`.
void PlanBlockInto(const GlobalPlannerConfig& config, uint32_t epoch, uint64_t round, uint64_t first_step,
                   std::span<const RankRound> ranks, size_t begin, size_t t, RoundPlan& plan) {
  const size_t end = begin + ranks.size();
  const size_t window_cap = config.base.window == 0 ? std::numeric_limits<size_t>::max() : config.base.window;
  const auto shift = static_cast<int32_t>(begin);
  RoundState sub;
  sub.epoch = epoch;
  sub.round = round;
  sub.first_step = first_step;
  sub.ranks.resize(end - begin);
  for (size_t r = begin; r < end; ++r) {
    const RankRound& in = ranks[r - begin];
    RankRound& out = sub.ranks[r - begin];
    out.free_slots = in.free_slots;
    out.stream_finished = in.stream_finished;
    out.stream_started = in.stream_started;
    out.wait_rounds = in.wait_rounds;
    out.wait_expired = in.wait_expired;
    out.input_blocked = in.input_blocked;
    // Only the window is planned; the rest stays pending, untouched.
    const size_t n = std::min(in.pending.size(), window_cap);
    out.pending.assign(in.pending.begin(), in.pending.begin() + static_cast<std::ptrdiff_t>(n));
    for (SampleMeta& m : out.pending) m.owner_rank -= shift;
    for (size_t i = n; i < in.pending.size(); ++i) plan.ranks[r].keep_pending.push_back(KeyOf(in.pending[i]));
  }
  RoundPlan part = PlanRanks(config, sub, static_cast<uint32_t>(t), t);
  for (size_t r = begin; r < end; ++r) {
    RankPlan& from = part.ranks[r - begin];
    RankPlan& to = plan.ranks[r];
    // An empty block window plans no step: its ranks run T IDLE steps.
    if (from.steps.size() != t) from.steps.assign(t, PlannedStep{});
    to.steps = std::move(from.steps);
    for (PlannedStep& s : to.steps) {
      for (SampleMeta& m : s.samples) m.owner_rank += shift;
    }
    for (SampleKey k : from.keep_pending) to.keep_pending.push_back({k.owner_rank + shift, k.id});
  }
}

}  // namespace internal

using align::RankPlan;
using align::RankRound;
using align::RoundPlan;
using align::RoundState;
using internal::PartitionedSteps;
using internal::PlanBlockInto;

size_t GlobalPlanner::BlockRanks(size_t world) const {
  if (config_.locality >= 1.0) return world;  // LocalPlanner: nothing moves, nothing to partition
  return internal::BlockRanks(config_, world);
}

double GlobalPlanner::GroupBound(const RankRound& round) const {
  const size_t window_cap =
      config_.base.window == 0 ? std::numeric_limits<size_t>::max() : config_.base.window;
  const size_t n = std::min(round.pending.size(), window_cap);
  const double lower = internal::GroupLowerBound(config_.base.budget, round.pending, n);
  if (!round.stream_finished || n == 0) return lower;
  // A rank whose stream has finished holds all it will ever plan: its count
  // is what T must drain, not what T can fill for sure. Its own window's
  // groups (the planner's grouping of its samples alone; a block's pooled
  // grouping makes about as many, rarely more) instead of the lower bound,
  // which the padded budget undercuts by up to half on long-tailed lengths:
  // a draining T of the bound planned about half of what was left, the
  // epoch's last samples took several rounds, and an accumulation window
  // open at their end closed short after kMaxHeldRounds rounds, once per
  // such round (docs/alignment.md, invariant 5). The cost: one grouping of
  // this rank's window per round, only once its stream has finished (at most
  // 1/ranks of the block's grouping its planning rounds already run).
  std::vector<SampleLengths> lens;
  lens.reserve(n);
  for (size_t i = 0; i < n; ++i) lens.push_back(round.pending[i].lengths);
  const size_t groups = align::PlannerGroups(config_.base, lens, 0, 0, 0).size();
  return std::max(lower, static_cast<double>(groups));
}

RoundPlan GlobalPlanner::PlanBlock(const align::BlockRoundState& bs) const {
  const size_t world = bs.summaries.size();
  const size_t block = BlockRanks(world);
  if (block >= world) return Planner::PlanBlock(bs);
  uint32_t min_free = 0;
  if (auto gated = align::ApplyRoundGates(config_.base, bs.summaries, min_free)) {
    align::FillGatedLists(config_.base, bs.ranks, bs.begin, *gated);
    return std::move(*gated);
  }
  RoundPlan plan;
  const size_t t = PartitionedSteps(config_, bs.summaries, block, min_free, plan);
  if (t == 0) {
    align::FillGatedLists(config_.base, bs.ranks, bs.begin, plan);
    return plan;
  }
  PlanBlockInto(config_, bs.epoch, bs.round, bs.first_step, bs.ranks, static_cast<size_t>(bs.begin), t, plan);
  return plan;
}

RoundPlan GlobalPlanner::PlanBlockOf(const RoundState& state, int32_t rank) const {
  if (config_.locality >= 1.0) return local_.Plan(state);
  const size_t world = state.ranks.size();
  const size_t block = BlockRanks(world);
  if (block >= world) return Plan(state);
  align::BlockRoundState bs;
  bs.epoch = state.epoch;
  bs.round = state.round;
  bs.first_step = state.first_step;
  bs.summaries.reserve(world);
  for (const RankRound& rr : state.ranks) bs.summaries.push_back(align::SummaryOf(rr, GroupBound(rr)));
  if (rank < 0 || static_cast<size_t>(rank) >= world) {
    // No such rank: the round's frame (T, reason), no block.
    bs.begin = 0;
    RoundPlan plan = PlanBlock(bs);
    for (RankPlan& rp : plan.ranks) rp = RankPlan{};
    return plan;
  }
  const size_t begin = static_cast<size_t>(rank) / block * block;
  bs.begin = static_cast<int32_t>(begin);
  bs.ranks.assign(state.ranks.begin() + static_cast<std::ptrdiff_t>(begin),
                  state.ranks.begin() + static_cast<std::ptrdiff_t>(std::min(world, begin + block)));
  RoundPlan plan = PlanBlock(bs);
  // A round without steps (gated or holding back) is Plan's, lists of every rank included.
  if (plan.num_steps == 0) return Plan(state);
  return plan;
}

}  // namespace odb::balance
