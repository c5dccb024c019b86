#ifndef ODB_ALIGN_WINDOW_BALANCE_H_
#define ODB_ALIGN_WINDOW_BALANCE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "src/align/planner.h"
#include "src/grouping/budget.h"

namespace odb::align {

// Balance over the window (docs/alignment.md, "Balance over the window").
//
// A window is one optimizer step: under DDP its micro-steps but the last run
// under no_sync, so ranks meet once per window, and a window lasts as long as
// its slowest rank's sum over its micro-steps. The planner balances each
// micro-step on its own, and the window cut then splits steps where the
// target falls: a window of two micro-steps could hold a full step on one
// rank and a full plus a nearly empty one on the other. Once a window's
// samples are known (the cut decided them), they are laid out again over
// the window's ranks and micro-steps, for the objective below.
//
// Nothing a trainer sees changes but which rank computes which sample and in
// which micro-step: the window keeps its samples (so its optimizer step and
// its exact weights), every rank runs the same number of micro-steps (FSDP and
// ZeRO issue collectives every micro-step), never more than the planner's, and
// every micro-step stays within the budget.

// One aligned micro-step: index = rank.
using GlobalStep = std::vector<PlannedStep>;

struct WindowBalanceConfig {
  grouping::Budget budget;
  grouping::StepTimeModel step_model;
};

// The cost of one rank's micro-step under the step-time model: StepTime of its
// samples; an IDLE micro-step costs the fixed per_step (the trainer still runs
// it: a dummy forward and backward).
double MicroStepCost(const WindowBalanceConfig& config, const PlannedStep& step);

// The window's time as DDP runs it: the largest, over ranks, sum of the rank's
// micro-step costs.
double WindowCost(const WindowBalanceConfig& config, std::span<const GlobalStep> window);

// The fewest micro-steps per rank any layout of `tokens` real tokens in
// `samples` samples over `world` ranks needs within the budget (each rank's
// micro-step holds at most max_tokens real tokens, padded or packed, and at
// most max_group_size samples); at least 1. A lower bound on what
// BalanceWindow returns for a window without over-budget steps.
size_t FewestMicroSteps(const grouping::Budget& budget, size_t world, uint64_t tokens, uint64_t samples);

// Lays the samples of `window` (window[k][rank], one closed window) out again
// when that lowers WindowCost: for every micro-step count m from the fewest
// the budget allows up to the window's own, samples longest first go to the
// rank whose sum grows least (among the kCandidateRanks least loaded that can
// take them), into that rank's micro-step whose cost grows least and that
// keeps the budget; with a padded budget a second start cuts the window's
// samples, sorted by length, into at most world x m runs with the least
// padding (a padded micro-step of mixed lengths pays its longest on every
// row; the greedy above mixes them, and often finds no layout with fewer
// micro-steps) and deals the runs costliest first to the least loaded rank
// with fewer than m; with a packed budget, where the greedy strands a
// sample (micro-steps nearly as full as the budget allows: a window of one
// budget per rank), a best-fit start (longest first, each into the fullest
// micro-step that holds it) takes its place. Each rank's samples are packed
// the cheapest way into its m micro-steps (runs of its length-sorted list,
// dynamic programming; of cuts that cost the same, the one whose costliest
// run is cheapest, not one nearly empty micro-step, and of run counts that
// cost the same, the most: an IDLE micro-step costs per_step, as a
// micro-step's fixed part does, so with no other per-micro-step cost
// (packed budgets) a rank's samples fill its m micro-steps rather than
// leave IDLE ones, which the trainer runs as dummy steps); the start whose
// slowest rank is cheaper is kept (the greedy's on ties), and samples are
// moved off the costliest rank, or exchanged with another's (padded, where
// no single move or exchange helps: one of its samples for two of
// another's, or two for one), while that makes it cheaper. Padded, the
// length-sorted samples are also cut into runs of even cost (the least cap
// on a run's cost that needs at most world x m runs: the least-padding cut
// fills most micro-steps to the budget and leaves a few light, and a rank
// dealt one of those sums far below one dealt only full ones), dealt the
// same way; the moves run on them, and on the start not kept above, each on
// a work bound of its own (half of kMaxBalanceWork); the cheapest result is
// kept.
// The cheapest layout wins, the planner's kept on ties.
// Samples of equal lengths are then exchanged so that as many as possible stay
// on their owner (no payload move), and each rank's micro-steps are ordered
// costliest first (under FSDP every micro-step is a barrier: like costs meet);
// micro-steps no rank uses are dropped. A window with an over-budget step (a
// lone sample no budget holds) is left alone, and so is one whose greedy
// layouts alone would take more than kMaxBalanceWork placements; the moves
// stop at that bound.
// Then MoveSamples and MergeMicroSteps (below) refine the result, once with
// free moves alone and once with moves within micro-steps before them; the
// second is kept when it is no costlier than the first under both time
// models (WindowCost, and the sum over micro-steps of the slowest rank's
// cost: every micro-step a barrier, FSDP) and cheaper under one (or when
// the first changed nothing).
// Pure function of its input (sorting ties broken by sample key): every rank
// computes the same layout. Returns whether the window changed.
bool BalanceWindow(const WindowBalanceConfig& config, std::vector<GlobalStep>& window);

// The two refinements BalanceWindow runs after its layout search (on the
// search's layout, or on the window as given with its micro-steps ordered by
// their first sample's key); each is a pure function of its input's samples
// and order, and BalanceWindow keeps their result only when WindowCost fell.
//
// MoveSamples: moves single samples off the window's costliest rank into a
// micro-step of one of the kCandidateRanks least loaded other ranks that
// holds them within the budget, each time the move that leaves the larger of
// the two ranks' sums smallest, while that lowers the costliest rank's sum;
// then orders each rank's micro-steps costliest first and drops micro-steps
// no rank uses. The search repacks whole ranks and gives up on large windows
// (kMaxBalanceWork) or when its greedy finds no layout within the
// micro-steps (padded budgets with long-tailed lengths); a window cut inside
// planned steps then keeps what the cut made of its first and last
// micro-steps, where one rank may hold a long sample and the others little.
// Every rank keeps the window's micro-step count. At most kMaxBalanceWork
// evaluations; ties go to the first move found (micro-steps in order,
// members by key, receivers least loaded first, then by rank).
// `within_steps`: a sample moves only to another rank of its own micro-step,
// and the micro-steps keep their order and count, so every micro-step's
// totals over the window's ranks stay as they were (partitioned planning
// balances each block's part of a window this way: the world-wide per-step
// totals the blocks exchanged still hold).
bool MoveSamples(const WindowBalanceConfig& config, std::vector<GlobalStep>& window,
                 bool within_steps = false);

// MergeMicroSteps: merges two micro-steps into one wherever every rank's
// samples of both fit one micro-step within the budget and the window's
// slowest rank gets cheaper (each merge saves every rank a micro-step's
// fixed cost), the pair that saves most first (ties: the lowest indices),
// until no pair does; merged samples in key order.
bool MergeMicroSteps(const WindowBalanceConfig& config, std::vector<GlobalStep>& window);

// Bound on a window's layout search: samples x candidate ranks x micro-steps
// summed over the micro-step counts tried, and the packing steps of the moves.
inline constexpr uint64_t kMaxBalanceWork = uint64_t{1} << 21;

// A sample is offered to the least loaded ranks only, this many that can take
// it (all of them at W <= 16), and moves off the costliest rank go to the
// cheapest ranks only: the search grows with the window's samples, not with W.
inline constexpr size_t kCandidateRanks = 16;

}  // namespace odb::align

#endif  // ODB_ALIGN_WINDOW_BALANCE_H_
