#ifndef ODB_ALIGN_WINDOW_H_
#define ODB_ALIGN_WINDOW_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "src/align/planner.h"
#include "src/align/window_balance.h"

namespace odb::align {

// Accumulation windows (optimizer.tokens_per_step; docs/alignment.md,
// "Accumulation windows"): a round's aligned steps are grouped into windows of
// about `tokens_per_step` loss tokens over all ranks; each window is one
// optimizer step. Everything here is a pure function of the gathered plan and
// of the window state, which every rank updates identically: every rank cuts
// the same windows, so every rank runs the same number of micro-steps in each.
//
// The step that reaches a window's target ends it: the window closes before
// or after that step, or the step is split (on every rank at once: a
// micro-step never grows, so each stays within the memory budget) at the two
// cuts within one sample of the target, one under and one over. Of the
// nearest end under the target (L) and the nearest over it (H), H is taken
// with probability (target - L) / (H - L), drawn from a hash of the step's
// samples that every rank computes alike, so each window holds the target in
// expectation. An end more than 10% over the target is taken only when
// nothing else is possible (one sample per rank over it).
//
// Micro-step-aware ends (WindowConfig::spread > 0, optimizer.window_spread):
// a window's time is its micro-steps, and the nearest ends may need one
// more micro-step per rank than an end a little further from the goal (a
// target of 1.04 micro-steps per rank runs almost every window as 2, where
// windows of 1 and 2 mixed to the same mean need ~1.2). So L may also be the
// furthest end under the goal that needs fewer micro-steps than the nearest,
// and H the furthest over it that needs no more than the nearest, both
// within tol of the target; tol = spread x the standard deviation of the
// loss tokens of a random batch of target / mean samples (the round's
// samples' mean and spread), at most half the target. Of these pairs the one
// whose time (WindowCost of the window as it will run: laid out again first
// when the window is balanced; else its micro-steps) is least on average
// when L and H are taken in the proportions that hold the goal; then the
// end nearer the goal, no draw, unless it leaves the round's drift (its
// windows so far minus their targets) more than tol from 0 and the other end
// leaves it nearer. The goal makes up for the drift (within tol) spread over
// the windows the round has left (its loss tokens not yet in a closed
// window, divided by the target; at least 1), not by the next window alone: a window of one budget per
// rank that repaid a partial planner step's shortfall at once ran over the
// target, so two micro-steps, and was cut inside a step, and the windows
// after it, each one step's tail and the next's head, packed less tightly
// than the planner's full steps (batching_sim gpu_7b_h100, packed 1m
// windows: 35 of 301 windows ran two micro-steps; 4 with this). For the
// same reason an end inside a step gives way to the step's start or end
// (the nearer the goal) where that lies within tol of the target, keeps the
// drift within tol and runs no more micro-steps. Where no such boundary
// exists (a partial step left every boundary ahead more than tol from the
// target: batching_sim's debian_docs round, one step of 10,280 tokens
// against a 32,768 target and tol 7,060), the end gives way to one from
// which the fewest windows (at most 3), each within tol of the target,
// reach a step boundary after which whole steps make a window within tol;
// the round's drift after them may reach 2 tol where the round's remaining
// windows repay it by at most 1/128 of the target each (else within tol as
// before). Two windows 5k over the target each, then whole steps again,
// where every window after the partial step had been cut inside a step and
// one in a few ran two micro-steps (gpu_7b_h100, packed 1m windows: 220 ->
// 202 micro-steps, IDLE 5.6% -> 0.6%). Where the steps after that boundary
// are full (the next 8, one window each, within tol of the target, keeping
// the drift within the cap), the drift may reach half the target instead of
// 2 tol (a partial step of p leaves p or target - p to make up, the smaller
// at most half the target), and a boundary that leaves the drift no larger
// than it was qualifies too, so the windows stay on those steps (the drift
// is repaid by the round's last windows, the goal's shift): batching_sim's
// cpu_calibrated high_variance round, one step of 13,231 tokens against
// 32,768 and tol 4,816 (2.7 tol to make up), had cut every one of its 74
// later windows inside a step, each a step's tail and the next one's head
// (1.15x the planner's steps' time: a tail and a head mix two steps'
// lengths in proportions no layout evens), (b) / none 0.9725; 1.0003 with
// this. The round's windows hold
// the target on average up to two windows' tol, or half a window where the
// round has at least 64 windows left to repay it, and every window lies
// within tol of the target, so windows vary less than random batches of the
// same mean would. Windows of more than kSpreadMaxSampleRanks samples x ranks
// take the nearest ends (the search would cost the round more than it
// gains there). Windows
// depend on the round's plan alone (no state carried from earlier windows), so
// a reproducible epoch resumed at a round cuts the same windows again.
//
// Weights are exact over the window: rank r's weight at a micro-step is
// W * loss_tokens_r / window_loss_tokens (0 for IDLE), so the sum over the
// window's micro-steps and ranks is W, and with DDP's average over W the
// accumulated gradient is the mean over every loss token of the window.
// Hence a window's steps go out only once the window is complete: the steps
// of a window that is still open at the end of a round go back (their samples
// stay pending and are planned again next round, with whatever arrived since),
// unless the epoch ends with this round or the open window came back
// kMaxHeldRounds times without growing while no rank could bring it more
// samples (every rank's stream finished, its planner window full, or its
// buffer full: a planner window too small for the target): then it closes
// short and says so. While some rank may still receive samples the next
// round can plan, the window waits for them however many rounds that takes:
// how often rounds run depends on timing (max_wait_ms, a loaded machine), so
// counting them must not cut windows mid-epoch. A producer that stops sending
// is PRODUCER_TIMEOUT's to report, not a short window's.
// Held windows bound nothing new: their samples stay in the daemon's buffer.
struct WindowState {
  uint64_t next_window = 0;  // index in the epoch of the next window to close
  // The open window a round handed back: its loss tokens, and how many
  // consecutive rounds it came back without growing or closing a window.
  uint64_t held_tokens = 0;
  uint32_t held_rounds = 0;
};

// Rounds an open window may come back without growing before it closes short.
inline constexpr uint32_t kMaxHeldRounds = 4;

// Largest window whose ends are chosen by their micro-steps, in samples x
// ranks: the search runs BalanceWindow ~2 log2(tol) times per window, and
// above this it costs the round several times the cut for little (W = 64,
// windows of one global micro-step: 129 -> 797 ms of window CPU per round for
// 0.801 -> 0.802 of the bound; W = 8 with 16m windows, ~8,500, gains 0.2-0.7%).
inline constexpr size_t kSpreadMaxSampleRanks = 16384;

struct WindowConfig {
  WindowConfig() = default;
  WindowConfig(uint64_t tokens, grouping::CostModel model) : tokens_per_step(tokens), cost_model(model) {}

  uint64_t tokens_per_step = 0;  // 0: every step is its own window (weights per step)
  grouping::CostModel cost_model = grouping::CostModel::kPadded;
  // Micro-step-aware ends (window.h, above): how far, in standard
  // deviations of the loss tokens of a random batch of the target's mean
  // size, a window's end may lie from its target when an end further out
  // runs in less time. 0: the nearest ends (within a sample, dithered).
  double spread = 0.0;
  // Balance over the window (window_balance.h): every window closed with a
  // target is laid out again over its ranks and micro-steps under this budget
  // and step-time model. Only for planners that move samples between ranks
  // (Planner::MovesSamples); nullopt keeps the planner's layout.
  std::optional<WindowBalanceConfig> balance;
};

// A sample's loss-bearing tokens: its labels not equal to the ignore index
// when the producer said so, else all its tokens.
uint64_t LossTokensOf(const SampleMeta& sample);

// The tolerance of micro-step-aware ends (above), from the round's samples:
// `n` samples carrying `sum` loss tokens, `sum_sq` the sum of their squares
// (saturating). spread x the standard deviation of the loss tokens of a
// random batch of target / mean samples, at most half the target; 0 without
// spread, with fewer than 2 samples, no loss tokens or no variance (a
// `sum_sq` under sum^2 / n, as 0 is). ApplyWindows takes it over the whole
// plan; partitioned windows (window_partitioned.h) over the world-wide counts
// of the round's totals all-gather: one definition, the same tol.
uint64_t SpreadTolerance(uint64_t n, uint64_t sum, uint64_t sum_sq, uint64_t target, double spread);

// a + b, or UINT64_MAX when that overflows (the sums of squares above; a
// sample's loss tokens are at most 2^32 - 1, so its square fits).
inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  uint64_t c = 0;
  return __builtin_add_overflow(a, b, &c) ? UINT64_MAX : c;
}

// A part [begin, end) of a step's samples, its counts recomputed (a subset of
// a step within the budget is within the budget); IDLE when empty. The window
// cuts split steps with it (unpartitioned and partitioned).
PlannedStep StepPart(const PlannedStep& step, size_t begin, size_t end, grouping::CostModel model);

// A micro-step of `samples` (moved in), its counts as StepPart sets them.
PlannedStep StepOf(std::vector<SampleMeta> samples, grouping::CostModel model);

// Cuts `plan` (as the planner made it, every rank's steps) into windows:
// splits steps that end windows, drops the steps of a window that must wait
// for the next round (their samples go to their owners' keep_pending), and
// sets every step's loss_tokens, loss_weight and window fields.
// `inputs_open`: some rank may still receive samples that a later round can
// plan (InputsOpen); an open window is then held without counting rounds.
void ApplyWindows(const WindowConfig& config, RoundPlan& plan, WindowState& windows, bool inputs_open);

// A target the windows cannot hold: below one sample (a plausible mistake: a
// number meant as samples, or 1). `plan` is a round's plan before
// ApplyWindows; the mean loss tokens of its samples stand for a sample. Every
// optimizer step would be one sample, not what the setting says. An error names the
// setting, the samples' mean and what to set (loss tokens over all ranks).
// OK when tokens_per_step is 0, the plan has no sample, or the target holds.
absl::Status CheckWindowTarget(uint64_t tokens_per_step, const RoundPlan& plan);

// Whether a later round may see more samples than this one: some rank's
// stream is open, its buffer has room (input_blocked false) and its planner
// window (`window` samples; 0 = unbounded) is not full.
bool InputsOpen(const RoundState& state, uint32_t window);

}  // namespace odb::align

#endif  // ODB_ALIGN_WINDOW_H_
