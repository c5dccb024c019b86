#ifndef ODB_BENCH_POLICIES_H_
#define ODB_BENCH_POLICIES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/bound.h"
#include "src/align/planner.h"
#include "src/align/window.h"
#include "src/common/sample.h"
#include "src/grouping/budget.h"

namespace odb::bench {

// What one rank computes in one step.
struct RankStep {
  bool idle = true;  // no samples: the rank runs a zero-weight step
  uint32_t samples = 0;
  uint64_t real_tokens = 0;
  uint64_t padded_tokens = 0;  // what the trainer computes on
  double sum_len_sq = 0.0;     // attention term of the real samples
  // Accumulation windows (SimConfig::window_tokens): whether the step is the
  // last micro-step of an optimizer step, and whether that window closed
  // short (the epoch's last one). The same on every rank of a step. Without
  // windows every step is its own window.
  bool closes_window = true;
  bool window_short = false;
};

// A policy's whole epoch: steps[k][r] is rank r's work in step k. Every
// policy gives every rank the same number of steps (DDP's invariant).
using Schedule = std::vector<std::vector<RankStep>>;

// The steps of one planned round as schedule rows, appended to *schedule;
// the lengths of every sample they emit are appended to *emitted if given.
// A plan cut into windows (ApplyRoundWindows) carries its window ends.
void AppendRoundSteps(const align::RoundPlan& plan, int world, Schedule* schedule,
                      std::vector<SampleLengths>* emitted = nullptr);

// The daemon's buffer after a round: emitted samples leave each rank's
// pending list, the kept ones stay in arrival order.
void KeepPending(const align::RoundPlan& plan, std::vector<std::vector<SampleMeta>>* pending);

// Accumulation windows on a round's plan, as align::Aligner applies them
// (src/align/aligner.cc, after the planner): before the epoch's first window
// a target below one sample is refused (align::CheckWindowTarget), then
// align::ApplyWindows splits steps at window ends, sets the window fields
// and loss weights and hands the samples of a window still open back
// through the ranks' keep_pending (KeepPending then keeps them for the next
// round). The window configuration is the Aligner's: the planner's budget
// and window, and balance over the window (align::BalanceWindow under the
// planner's budget and step model) when the planner moves samples
// (Planner::MovesSamples) and `balance` is set (false: the cut alone, as
// before balance existed, to compare). Nothing happens with
// `tokens_per_step` 0.
absl::Status ApplyRoundWindows(uint64_t tokens_per_step, const align::Planner& planner, bool balance,
                               const align::RoundState& state, align::RoundPlan& plan,
                               align::WindowState& windows);

// Accumulation windows on a partitioned round's plan (the global planner
// with partition_ranks), as align::Aligner's partitioned round applies them
// (src/align/aligner.cc, PartitionedWindowRound): a target below one sample
// is refused before the epoch's first window
// (align::CheckWindowTargetCounts), then align::PartitionedWindows cuts the
// windows from the world-wide per-step loss and real token totals (what the
// round's totals all-gather carries) and every rank's offers (the offers
// all-gather), and, when the planner moves samples and `balance` is set,
// align::BalanceBlockWindows evens each block's part of every closed window
// within its micro-steps (blocks of Planner::BlockRanks). One call stands for
// every rank's: a rank's cut depends on its own steps and the shared values
// only, so cutting ranks [0, W) at once is what all blocks cut. Nothing
// happens with `tokens_per_step` 0 or a round of no steps (the Aligner's
// round returns before the totals then). A planner whose block is the whole
// job (BlockRanks(W) >= W, or W = 1) runs no partitioned round in the
// Aligner: ApplyRoundWindows then.
absl::Status ApplyRoundPartitionedWindows(uint64_t tokens_per_step, const align::Planner& planner,
                                          bool balance, const align::RoundState& state,
                                          align::RoundPlan& plan, align::WindowState& windows);

struct SimConfig {
  int world = 8;
  grouping::Budget budget;  // padded, L_max = 4096 unless changed
  StepModel model;          // the simulator's step-time model (bench/bound.h)
  uint32_t window = 256;    // odb and reference specs without ":wN": samples per rank per round
  uint64_t seed = 1;
  // optimizer.tokens_per_step for the odb policies: loss tokens over all
  // ranks per optimizer step (0 = off). Their plans go through the daemon's
  // align::ApplyWindows each round, as align::Aligner calls it; the samples
  // of a window still open at the end of a round stay pending for the next
  // round. The other policies ignore it (each of their steps is a window).
  uint64_t window_tokens = 0;
  // Balance over the window (the daemon's default for the global planner);
  // false runs the cut alone (ApplyRoundWindows).
  bool window_balance = true;
  // optimizer.window_spread (micro-step-aware window ends; 0 = the nearest).
  double window_spread = align::PlannerConfig{}.window_spread;
  // Partitioned planning for the global odb policies (GlobalPlannerConfig::
  // partition_ranks, nodes of one rank: blocks of partition_ranks ranks; 0 =
  // one pool). The local planner ignores it.
  uint32_t partition_ranks = 0;
  // With partition_ranks and window_tokens: windows as the daemon cuts them
  // under partitioned planning (ApplyRoundPartitionedWindows) instead of
  // whole-job windows (ApplyRoundWindows over every block's plan at once,
  // which no partitioned daemon runs).
  bool partitioned_windows = false;
};

// A window target as given on a command line: loss tokens ("65536"), N
// samples' worth ("16s": N x the mean sample length of the trace; every
// token bears loss in the simulator) or N global micro-steps' token budget
// ("1m": N x W x L_max). "0" turns windows off.
struct WindowTarget {
  enum class Unit { kTokens, kSamples, kMicroSteps };
  double value = 0.0;
  Unit unit = Unit::kTokens;
  bool off() const { return value <= 0.0; }
  // The target in loss tokens for `samples` on `world` ranks with the
  // budget's L_max (at least 1 unless off).
  uint64_t Tokens(const std::vector<SampleLengths>& samples, int world, uint64_t max_tokens) const;
  std::string Spelling() const;  // "0", "65536", "16s", "1m"
};
absl::StatusOr<WindowTarget> ParseWindowTarget(const std::string& text);

// A policy is named by a spec: a base name, then options separated by ':'.
//   standard, standard_p99, sorted, length_grouped, packing,
//   sorted_greedy, offline_dp                     (no options)
//   reference_odb[:wN]                            window N per rank
//   bucketing, kk_balanced                        the peers of examples/peers.py
//   odb[:local|:global][:qN|:qinf][:wN][:paced|:pacedN][:det][:full][:packed][:mix|:mixsteps]   the daemon's
//   planners
// odb options: planner (alignment.planner, default local), qN = emit.queue_steps
// (free output slots a round sees; qinf = unbounded; default 32), wN =
// grouping.window (default SimConfig::window). Pacing: without it every round
// sees all N slots free (a trainer faster than the daemon drains the queue).
// :paced models a trainer slower than the daemon (any real accelerator job):
// the first round sees N free slots, and a round fires as soon as one slot is
// free (Daemon::RoundDue), so in steady state every round plans one step.
// :pacedR is the same with rounds held until R slots are free (a daemon change
// this simulator evaluates; the daemon has no such knob). :det runs the
// planner with alignment.deterministic (credit only delays a round; T is not
// limited by it). :full plans every group of the windows in each round
// (PlannerConfig::full_rounds, the daemon's default) without the in-order wait.
// :packed is odb's packed mode (collate.packed, grouping.cost_model: packed):
// a rank step is one variable-length row of at most L_max real tokens.
// bucketing: lhotse's DynamicBucketingSampler (30 equal-token buckets, the
// bucket drawn the same on every rank); kk_balanced: verl's seqlen_balancing
// (global batches of `window` samples per rank, Karmarkar-Karp over the ranks
// on the model's workload, packed rows under L_max, as many on every rank).
// Packed policies (packing, kk_balanced, odb ...:packed) are outside the
// padded bound; IsPackedPolicy names them.
struct PolicySpec {
  std::string base;
  bool global = false;
  uint32_t queue_steps = 32;  // 0 = unbounded
  uint32_t window = 0;        // 0 = SimConfig::window
  uint32_t paced = 0;         // 0 = not paced; R = a round fires once R slots are free
  bool deterministic =
      false;  // :det = alignment.deterministic (rounds plan `window` steps whatever the credit)
  bool full_rounds = false;  // :full = a round plans every group of its windows (PlannerConfig::full_rounds)
  bool packed = false;  // :packed = collate.packed with grouping.cost_model: packed (sum of lengths <= L_max)
  // :mix = grouping.mix_lengths true (groups of mixed lengths; the daemon's default with :packed),
  // :mixsteps = grouping.mix_lengths steps (length-sorted groups dealt across lengths; its default padded).
  bool mix_groups = false;
  bool mix_steps = false;
  // Canonical spelling, every option explicit for odb and reference_odb
  // (e.g. "odb:local:q32:w256").
  std::string Name(const SimConfig& config) const;
};
absl::StatusOr<PolicySpec> ParsePolicy(const std::string& spec);

// Whether a canonical policy name computes on packed rows (the padded bound
// does not hold for it).
bool IsPackedPolicy(const std::string& name);

// Whether a policy cuts accumulation windows (SimConfig::window_tokens):
// the odb policies, whose plans go through the daemon's ApplyWindows.
bool TakesWindows(const std::string& policy);

// The default policy list for a window W0: the baselines, the reference rule
// at its published default window 16 and at W0, odb with the daemon's
// defaults (local, queue 32) paced (what a trainer-bound job gets) and
// drained, with an unbounded queue, the same three for the global planner,
// then the offline policies.
std::vector<std::string> PolicyNames(uint32_t window = 256);

// The policies. `arrival` is the trace in arrival order (already shuffled).
// Batch-list policies (standard, standard_p99, sorted, length_grouped,
// packing, sorted_greedy, offline_dp) form one global list of batches; step k
// gives batches k*W .. k*W+W-1 to ranks 0..W-1 (the last step may leave ranks
// IDLE).
// members (odb policies only, else left empty): (*members)[k][r] = the
// lengths rank r computes in step k (empty: IDLE).
using StepMembers = std::vector<std::vector<std::vector<SampleLengths>>>;
absl::StatusOr<Schedule> RunPolicy(const std::string& policy, const std::vector<SampleLengths>& arrival,
                                   const SimConfig& config, StepMembers* members = nullptr);

// Standard/sorted fixed batch size: the largest that fits the longest sample
// (never over budget).
uint32_t FixedBatchSize(const std::vector<SampleLengths>& samples, const grouping::Budget& budget);
// The batch size a user would pick for the 99th-percentile length:
// floor(L_max / p99) (batches holding a longer sample exceed the budget).
uint32_t P99BatchSize(const std::vector<SampleLengths>& samples, const grouping::Budget& budget);

struct Metrics {
  uint64_t samples = 0;
  uint64_t steps = 0;
  uint64_t idle_rank_steps = 0;
  uint64_t rank_steps = 0;              // steps x W
  uint64_t over_budget_rank_steps = 0;  // padded tokens above L_max (an OOM on a real accelerator)
  uint64_t real_tokens = 0;
  uint64_t padded_tokens = 0;
  double time = 0.0;          // sum over steps of the slowest rank's cost
  double mean_rank_time = 0;  // sum over steps of the mean rank cost
  double samples_per_s() const { return time > 0 ? samples / time : 0.0; }
  double padding_fraction() const {
    return padded_tokens ? 1.0 - static_cast<double>(real_tokens) / padded_tokens : 0.0;
  }
  double max_over_mean() const { return mean_rank_time > 0 ? time / mean_rank_time : 1.0; }
  std::vector<double> step_costs;  // slowest rank's cost per step
  double idle_share() const { return rank_steps ? static_cast<double>(idle_rank_steps) / rank_steps : 0.0; }

  // Accumulation windows (RankStep::closes_window; a schedule without them
  // has one window per step). Two time models:
  //   time        (a) every micro-step synchronises (FSDP / ZeRO-3: collectives
  //               in each micro-step): sum over micro-steps of the slowest rank;
  //   window_time (b) only a window's last micro-step synchronises (DDP under
  //               no_sync): sum over windows of the slowest rank's summed cost
  //               over the window's micro-steps. window_time <= time.
  double window_time = 0.0;
  uint64_t windows = 0;
  uint64_t short_windows = 0;  // closed short (the epoch's end)
  // Windows, short ones included, under 90% of the target (0 without one):
  // the epoch's remainder, plus whatever else ended low.
  uint64_t windows_under_90 = 0;
  // Loss tokens (real tokens: every token bears loss here) of each full
  // (not short) window over the target; 0 without a target.
  double mean_window_over_target = 0.0;
  double max_window_over_target = 0.0;
  // The standard deviation of the full windows' loss tokens over that of a
  // random batch of their mean sample count drawn from the run's samples
  // (sqrt(n) s, s the samples' length deviation): what a fixed-sample
  // optimizer step varies by. Below 1, odb's windows vary less than such a
  // batch (docs/config.md, "Window ends"); 0 without a target or with fewer
  // than two full windows.
  double window_sd_over_random = 0.0;
};

// Step cost of one rank under the model; an IDLE step costs a.
double RankCost(const StepModel& model, const RankStep& step);
// `max_tokens` (0 = none) only counts over-budget rank steps; `window_target`
// (loss tokens, 0 = none) is what the windows' sizes are compared to.
Metrics Evaluate(const Schedule& schedule, const StepModel& model, uint64_t max_tokens = 0,
                 uint64_t window_target = 0);

}  // namespace odb::bench

#endif  // ODB_BENCH_POLICIES_H_
