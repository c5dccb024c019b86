#ifndef ODB_ALIGN_PLANNER_H_
#define ODB_ALIGN_PLANNER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "proto/step_fields.h"
#include "src/common/sample.h"
#include "src/grouping/budget.h"
#include "src/grouping/grouper.h"

namespace odb::align {

// A sample's identity across the job: ids are unique per owner, not globally.
struct SampleKey {
  int32_t owner_rank = 0;
  uint64_t id = 0;

  friend bool operator==(const SampleKey&, const SampleKey&) = default;
  friend auto operator<=>(const SampleKey&, const SampleKey&) = default;
};

inline SampleKey KeyOf(const SampleMeta& m) { return SampleKey{m.owner_rank, m.id}; }

// How an epoch ends (docs/alignment.md, "End of epoch"): alignment.mode
// every_sample (kJoin) or first_dry (kNonJoin); the config reads the older
// names join / non_join too (not to be confused with the trainer's
// idle_policy "join", DDP's join()).
enum class EpochMode : uint8_t {
  // Identity coverage: every sample received in the epoch is emitted exactly
  // once; the epoch ends when every rank's stream finished and nothing is
  // pending anywhere.
  kJoin = 0,
  // Shortest-rank closure: the epoch ends at the first round in which some
  // rank's stream has finished and that rank holds nothing; everything still
  // pending elsewhere is reported as not emitted.
  kNonJoin = 1,
};

const char* EpochModeName(EpochMode mode);

// What every rank contributes to a round; the planner sees all W of them.
struct RankRound {
  // Samples this rank holds for the epoch that were never emitted, in the
  // daemon's stable order (arrival order). ALL of them, not a window: the
  // planner needs the full set for Join coverage and the Non-Join report.
  // Every entry has owner_rank == this rank and tokens > 0.
  std::vector<SampleMeta> pending;
  // Steps this rank's emitter can still accept (credit window minus queued).
  uint32_t free_slots = 0;
  // No sample of this epoch will arrive at this rank after this round.
  bool stream_finished = false;
  // Something of this epoch reached this rank (a sample, or the end of its
  // stream). A rank that has not started yet (its data workers are still
  // starting) may hold rounds back beyond max_wait_rounds, until its
  // wait_expired (the Aligner's start_wait): otherwise the other ranks would
  // run a burst of steps with this rank IDLE, only to idle at the epoch's end.
  bool stream_started = true;
  // Consecutive previous rounds of this epoch that were waiting rounds (kept
  // by every rank's Aligner; the same on all ranks). A rank stops asking to
  // wait once it reaches max_wait_rounds, which bounds any run of waiting
  // rounds to max_wait_rounds.
  uint32_t wait_rounds = 0;
  // The rank's wall-clock wait bound has passed: it no longer asks to wait.
  bool wait_expired = false;
  // The rank's buffer is full: it reads no more input until steps go out, so
  // its pending set cannot grow by waiting (accumulation windows, window.h).
  bool input_blocked = false;
};

// Everything a planner decides from: identical on every rank after the
// all-gather, so every rank computes the identical plan.
struct RoundState {
  uint32_t epoch = 0;
  uint64_t round = 0;       // 0-based round within the epoch
  uint64_t first_step = 0;  // epoch step index of this round's first step
  std::vector<RankRound> ranks;  // index = rank
};

// What the round gates (and a partitioned planner's T) need of a rank: its
// RankRound in a few bytes, so ranks outside one's block need not send their
// windows (partitioned planning, docs/balancing.md).
struct RankSummary {
  uint64_t pending = 0;  // RankRound::pending.size()
  uint32_t free_slots = 0;
  bool stream_finished = false;
  bool stream_started = true;
  uint32_t wait_rounds = 0;
  bool wait_expired = false;
  // RankRound::input_blocked: partitioned accumulation windows need it to
  // tell whether a held window can still grow (InputsOpen, window.h).
  bool input_blocked = false;
  // Planner::GroupBound of the rank's round: computed once, by the rank
  // itself, and sent as is, so every rank sums the very same doubles.
  double group_bound = 0.0;
};

RankSummary SummaryOf(const RankRound& round, double group_bound);

// A partitioned round as one block sees it: its own ranks' rounds in full,
// every rank's summary.
struct BlockRoundState {
  uint32_t epoch = 0;
  uint64_t round = 0;
  uint64_t first_step = 0;
  int32_t begin = 0;                   // first rank of the block
  std::vector<RankRound> ranks;        // index = rank - begin
  std::vector<RankSummary> summaries;  // index = rank (all W)
};

// One step of one rank: its samples and the step's header fields
// (proto/step_fields.h). A planner fills idle, samples, real_tokens,
// padded_tokens and over_budget; AssignLossWeights the weights; the Aligner
// the step index, round and window fields.
struct PlannedStep : StepHeader {
  PlannedStep() { idle = true; }   // no samples; the trainer runs a zero-weight step
  std::vector<SampleMeta> samples;  // empty iff idle; owner_rank may differ from the rank
};

struct RankPlan {
  std::vector<PlannedStep> steps;  // exactly RoundPlan::num_steps entries
  // Samples owned by this rank that stay pending (offered again next round).
  std::vector<SampleKey> keep_pending;
  // Non-Join closing round only: samples owned by this rank that the epoch
  // will never emit.
  std::vector<SampleKey> not_emitted;
  // This rank asked the round to wait (for more samples) and was granted it.
  bool waited = false;
};

struct RoundPlan {
  uint32_t num_steps = 0;       // T: identical for all ranks by construction
  bool epoch_finished = false;  // the epoch ends with this round (after its steps)
  bool waiting = false;         // T = 0 because at least one rank waits
  std::string reason;           // why T has its value, for logs
  std::vector<RankPlan> ranks;  // index = rank
};

// Knobs that change the plan; every rank must use the same values (they are
// part of the connect-time fingerprint, see hello.h).
struct PlannerConfig {
  grouping::Budget budget;
  grouping::StepTimeModel step_model;
  EpochMode mode = EpochMode::kJoin;
  // Shared seed of the group-order shuffle; mixed with epoch, round and rank.
  uint64_t seed = 0;
  // Most pending samples of one rank grouped per round (the first `window` in
  // pending order). Also the wait threshold: a rank with fewer pending
  // samples and an unfinished stream may ask the round to wait.
  uint32_t window = 512;
  // Consecutive rounds a rank may hold a round back by waiting, once its
  // stream started (before, only its wait_expired ends its wait); 0 = never
  // wait at all.
  uint32_t max_wait_rounds = 2;
  // A round plans only once every rank has at least this many free output
  // slots (>= 1). With a trainer slower than the daemon, planning whenever
  // one slot frees would make every round a one-step round that groups one
  // step's worth of samples; waiting for half the queue lets a round group
  // many steps at once (bench: the `paced` vs `pacedR` rows). Not a setting:
  // the daemon sets emit.queue_steps / 2 (src/daemon/aligned_round_runner.cc);
  // 1 is a bare planner's (tests, benches).
  uint32_t min_free_slots = 1;
  // A round that passes the gates plans every group its windows give, not
  // just as many steps as there are free slots: free slots only decide when
  // a round runs (the output queue may exceed its size by one round's steps,
  // bounded by the window). Holding groups back round after round piles the
  // worst-filled ones up in the window (bench: `:full`). Not a setting: the
  // daemon always plans full rounds; false is a bare planner's.
  bool full_rounds = false;
  // Reproducible rounds (alignment.deterministic). The Aligner hands the
  // planner only what does not depend on timing: each rank's first window+1
  // pending samples in list order, stream_finished only once the window holds
  // the rank's whole remainder, no wait budget, and state.round counts the
  // rounds that planned steps. The gates then wait while any rank holds at
  // most `window` samples of an open stream, and plan with a constant
  // `window` free slots once every rank has a free slot.
  bool deterministic = false;
  // Accumulation windows (optimizer.tokens_per_step, src/align/window.h): all
  // ranks' loss tokens per optimizer step; 0 = every step is its own window.
  uint64_t tokens_per_step = 0;
  // optimizer.window_spread: how far from its target a window may end to
  // run fewer micro-steps, in standard deviations of a random batch's loss
  // tokens (src/align/window.h, "Micro-step-aware ends"); 0 = the nearest ends.
  double window_spread = 1.0;
  // grouping.mix_lengths: groups are formed from a seeded random order
  // (grouping::FormMixedGroups) instead of by length (grouping::FormGroups),
  // so that the steps, and the accumulation windows cut from them, are not
  // length-correlated (docs/config.md; issue 35's loss gap).
  bool mix_lengths = false;
  // grouping.mix_lengths with padded budgets under `auto` (docs/config.md):
  // the groups stay length-sorted (their padding unchanged), and the global
  // planner deals them into steps across lengths within bands of near-equal
  // cost, so that a step, and a window cut from a few steps, holds long and
  // short groups (balance::internal::FoldByLength).
  bool mix_steps = false;
};

// The contract of a plan, independent of how it was made: `Plan` is a pure
// function of (config, state) — the same on every rank, no clock, no
// randomness beyond the seeded shuffle. Implementations: LocalPlanner (each
// rank groups its own samples); a later global planner (cross-rank grouping,
// OrchMLLM post-balancing) emits steps whose samples have other owners and
// plugs in behind the same interface.
class Planner {
 public:
  virtual ~Planner() = default;
  virtual RoundPlan Plan(const RoundState& state) const = 0;
  virtual const PlannerConfig& config() const = 0;
  virtual std::string Name() const = 0;
  // Whether the planner's steps may hold samples of other ranks (payloads
  // move through the data plane). Only then does the Aligner lay a window's
  // samples out again over the ranks (window_balance.h).
  virtual bool MovesSamples() const { return false; }

  // Partitioned planning: the ranks of a world of `world` are cut into
  // blocks of BlockRanks(world) consecutive ranks that plan on their own
  // windows only (a sample never leaves its block). `world` (the default)
  // means one pool: Plan is used and PlanBlock never is.
  virtual size_t BlockRanks(size_t world) const { return world; }
  // The RankSummary::group_bound this planner's PlanBlock needs of a rank.
  virtual double GroupBound(const RankRound& /*round*/) const { return 0.0; }
  // The block of `state` (block.ranks.size() ranks from block.begin): a plan
  // with one RankPlan per rank of the world (summaries.size()), those of the
  // block filled exactly as Plan(full state) fills them, except that loss
  // weights and window fields are normalised over the block only (the
  // Aligner exchanges each step's loss tokens to make them exact); the other
  // ranks' RankPlans are empty. num_steps, epoch_finished, waiting and
  // reason are Plan's. Only called when BlockRanks(world) < world.
  virtual RoundPlan PlanBlock(const BlockRoundState& block) const;
};

// Local grouping (FormGroups on each rank's own window) then alignment:
//   T = 0 when some rank waits or some rank has no free slot; else
//   T = min(min_r free_r, max_r G_r, min_{r: N_r>0, stream open*} N_r), where
//   N_r is the rank's window size and G_r its group count. Ranks with G_r > T
//   hold back their least-filled groups; ranks with G_r < T split their
//   largest groups (each split adds one step and keeps the budget) down to
//   single samples; ranks with N_r = 0, and a finished rank's steps past its
//   N_r samples, are IDLE (*Join; under Non-Join every rank with N_r > 0
//   caps T). See docs/alignment.md for the proofs.
class LocalPlanner final : public Planner {
 public:
  explicit LocalPlanner(PlannerConfig config) : config_(std::move(config)) {}
  RoundPlan Plan(const RoundState& state) const override;
  const PlannerConfig& config() const override { return config_; }
  std::string Name() const override { return "local"; }

 private:
  PlannerConfig config_;
};

// The round gates every planner applies first, in this order (docs/alignment.md):
// Non-Join closure, Join end, bounded wait, credit. Returns the decided plan
// (no steps) when a gate stops the round; otherwise nullopt, with `min_free`
// set to the smallest free-slot count of all ranks (>= 1).
std::optional<RoundPlan> ApplyRoundGates(const PlannerConfig& config, const RoundState& state,
                                         uint32_t& min_free);
// The same gates on summaries: the decided plan's frame (epoch_finished,
// waiting, waited, reason; one RankPlan per summary) without sample lists,
// which the caller fills from the samples it holds (Non-Join closure: every
// pending sample is not emitted; any other gate: every one stays pending).
std::optional<RoundPlan> ApplyRoundGates(const PlannerConfig& config, std::span<const RankSummary> ranks,
                                         uint32_t& min_free);
// Fills the sample lists of a gated plan for `ranks` (rank begin + i):
// not_emitted on a Non-Join closure, keep_pending otherwise.
void FillGatedLists(const PlannerConfig& config, std::span<const RankRound> ranks, int32_t begin,
                    RoundPlan& plan);

// Puts every pending sample of every rank back to pending.
void KeepEverything(const RoundState& state, RoundPlan& plan);

// Fills loss weights of a plan from its loss token counts (LossTokensOf, window.h): for
// every step k, w_r = W * t_r / sum_r t_r (0 for IDLE), each step its own window
// (loss_tokens, window_loss_tokens). Shared by every planner; the Aligner's
// accumulation windows (ApplyWindows) then set the weights over windows.
void AssignLossWeights(RoundPlan& plan);

// Deterministic 64-bit mix (splitmix64) used for shuffle seeds.
uint64_t MixSeed(uint64_t a, uint64_t b);

// The groups a planner forms of `lens`: grouping::FormGroups, or with
// config.mix_lengths grouping::FormMixedGroups, its order drawn from the
// config's seed, the epoch, the round and `salt` (the same on every rank that
// plans the same pool).
std::vector<grouping::Group> PlannerGroups(const PlannerConfig& config, std::span<const SampleLengths> lens,
                                           uint64_t epoch, uint64_t round, uint64_t salt);

}  // namespace odb::align

#endif  // ODB_ALIGN_PLANNER_H_
