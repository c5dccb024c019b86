#ifndef ODB_BALANCE_PHASE_PLAN_H_
#define ODB_BALANCE_PHASE_PLAN_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "src/align/planner.h"
#include "src/grouping/budget.h"

namespace odb::balance {

// Per-phase balancing for multimodal models (OrchMLLM's global orchestrator),
// as pure functions. A step's samples go through an encoder phase (cost from
// vision_patches) and an LLM phase (cost from tokens); each phase gets its own
// balanced rank assignment, and the trainer moves encoder outputs straight
// from the encoder layout to the LLM layout with ONE all-to-all whose routes
// are the composed permutation Pi_LLM o Pi_enc^-1 (instead of going back to
// the loader layout and out again: two exchanges).

// Cost of one sample in one phase: per_sample + per_unit * u + per_unit_sq * u^2
// (u = vision patches for the encoder, tokens for the LLM). Packed phases:
// a rank's phase cost is the sum over its samples.
struct PhaseCost {
  double per_sample = 0.0;
  double per_unit = 1.0;
  double per_unit_sq = 0.0;
  double Of(uint64_t units) const {
    const double u = static_cast<double>(units);
    return per_sample + per_unit * u + per_unit_sq * u * u;
  }
  // An encoder phase's cost of a sample: nothing without that input (0 units).
  double OfInput(uint64_t units) const { return units == 0 ? 0.0 : Of(units); }
};

// One sample of the step: where its payload is (home_rank) and its sizes.
struct PhaseSample {
  align::SampleKey key;
  int32_t home_rank = 0;
  SampleLengths lengths;
};

// A position in a phase's layout: the index-th item on `rank`.
struct Slot {
  int32_t rank = 0;
  uint32_t index = 0;
  friend bool operator==(const Slot&, const Slot&) = default;
};

// A balanced assignment of n items to W ranks.
struct PhaseAssignment {
  std::vector<std::vector<size_t>> order;  // per rank: item indices, in local order
  std::vector<double> load;                // per rank: sum of item costs
  double max_load = 0.0;
  // Item i's slot in this layout (size n).
  std::vector<Slot> slot_of;
};

// Minimax assignment of items (cost[i], home[i]) to `world` ranks: LPT, then a
// binary search on the capacity C with a home-first greedy (an item stays on
// its home rank when that keeps the rank within C, else goes to the
// least-loaded rank), then local improvement: while it lowers the most loaded
// rank, one of its items moves to another rank or is exchanged with a cheaper
// item of another (the change leaving the pair's larger load smallest; work
// bounded). With a few items per rank the greedy alone stops short: on the
// multimodal example's audio steps (about 10 clips over 4 ranks) it reached
// 0.93-0.96 of the bound max(largest item, mean), the moves 0.98.
// Deterministic; local order is by item index.
// Preconditions: world >= 1, home[i] in [0, world).
PhaseAssignment BalancePhase(std::span<const double> cost, std::span<const int32_t> home, int world,
                             uint32_t capacity_iters = 24);

// Memory-aware variant (the activation memory a phase's items hold until the
// step's backward): BalancePhase's minimax capacity C (times 1 + `slack`: the
// share of the phase's time this may spend on memory), then items by cost,
// descending, each on the rank holding the least memory (`rank_memory[r]`, what
// the rank already holds this step, plus this phase's items so far) among the
// ranks it keeps within C; ties prefer the home rank, an item of cost and
// memory 0 stays home; then BalancePhase's local improvement, each change
// allowed only if it raises no rank above the layout's peak memory. With
// slack 0 the time balance is at most BalancePhase's; if the greedy does not
// fit in C, or holds no less memory at its peak rank than BalancePhase's
// layout, BalancePhase's layout is returned.
// memory_cap > 0 (memory as a limit, time as the goal): BalancePhase's layout
// when its peak rank memory is within the cap; else, of the layouts within
// the cap, the fastest among: the most balanced layout the cap allows (items
// by cost, each on the least loaded rank it keeps within the cap, then the
// local improvement under the cap) when it takes at most 1 + slack times the
// minimax time, and the memory layouts at slack / 4, slack / 2 and slack;
// none within the cap: the one holding least at its peak rank. Adds the
// chosen layout's item memory to `rank_memory` (size world).
// max_time: no layout slower than this is taken for memory (the slack is cut
// to max_time / minimax time - 1, at least 0); BalancePhase's layout is never
// refused.
PhaseAssignment BalancePhaseMemory(std::span<const double> cost, std::span<const double> memory,
                                   std::span<const int32_t> home, int world, std::vector<double>& rank_memory,
                                   double slack = 0.0, double memory_cap = 0.0,
                                   double max_time = std::numeric_limits<double>::infinity());

// Lower bound of any assignment's max load: max(max item, sum / W).
double MinimaxLowerBound(std::span<const double> cost, int world);

// route[r][i] = where the item at slot (r, i) of `from` sits in `to`: the
// composition to o from^-1. Both assignments must cover the same n items.
std::vector<std::vector<Slot>> ComposeRoutes(const PhaseAssignment& from, const PhaseAssignment& to);

// Applies a route to per-rank data laid out as `from` (data[r][i]); returns
// the data laid out as `to`. Reference implementation of the all-to-all.
template <typename T>
std::vector<std::vector<T>> ApplyRoute(const std::vector<std::vector<Slot>>& route,
                                       const std::vector<std::vector<T>>& data, const std::vector<size_t>& to_sizes) {
  std::vector<std::vector<T>> out(to_sizes.size());
  for (size_t r = 0; r < to_sizes.size(); ++r) out[r].resize(to_sizes[r]);
  for (size_t r = 0; r < route.size(); ++r) {
    for (size_t i = 0; i < route[r].size(); ++i) out[route[r][i].rank][route[r][i].index] = data[r][i];
  }
  return out;
}

// The full multimodal plan of one step.
struct MultimodalPlan {
  PhaseAssignment encoder;  // vision; home = the sample's home_rank (payload location)
  PhaseAssignment llm;      // home = the sample's vision encoder rank (embedding location)
  // encoder layout -> LLM layout, one all-to-all (Pi_LLM o Pi_enc^-1).
  std::vector<std::vector<Slot>> encoder_to_llm;
  // send_counts[src][dst]: items rank src sends to rank dst in that all-to-all.
  std::vector<std::vector<uint32_t>> send_counts;
  // The audio encoder phase, balanced on its own cost (audio_frames); home =
  // the sample's home_rank. Without an audio cost every item stays home.
  PhaseAssignment audio;
  std::vector<std::vector<Slot>> audio_to_llm;  // Pi_LLM o Pi_audio^-1
  std::vector<std::vector<uint32_t>> audio_send_counts;
};

// Vision encoder and LLM (no audio phase: audio_frames ignored).
MultimodalPlan PlanPhases(std::span<const PhaseSample> samples, int world, const PhaseCost& encoder_cost,
                          const PhaseCost& llm_cost);

// Vision encoder, audio encoder and LLM, each balanced on its own cost. A
// sample without images (audio frames) costs nothing in that encoder phase.
MultimodalPlan PlanPhases(std::span<const PhaseSample> samples, int world, const PhaseCost& vision_cost,
                          const PhaseCost& audio_cost, const PhaseCost& llm_cost);

// The daemon's per-step encoder plans (alignment.phase_plans): the step's LLM
// layout is the aligned plan's; each encoder phase (vision, then audio) is
// balanced on its own cost, each item preferring the rank that runs its LLM
// part (no move) when that keeps the minimax capacity. With memory costs
// (alignment.*_memory) the placement is memory-aware: what each rank holds in
// the step (its LLM samples' activations, then each encoder phase's) is
// tracked, and memory is a limit, time the goal: an encoder phase keeps its
// time layout unless that raises a rank above the job's peak so far and above
// the step's bound (max of the mean and the largest single holding) plus
// memory_cap_margin (BalancePhaseMemory's memory_cap), or, with peak_ratio,
// unless it leaves the ranks' peaks over the run too uneven. Stateful (the
// job's and each rank's peak) and deterministic: every rank plans the same
// steps the same way.
struct EncoderPlanConfig {
  PhaseCost vision_cost;
  PhaseCost audio_cost;
  bool audio_phase = false;  // an audio encoder phase too
  PhaseCost vision_memory{0, 0, 0}, audio_memory{0, 0, 0}, llm_memory{0, 0, 0};
  bool llm_padded = false;  // a padded LLM batch holds every sample at the rank's longest length
  double memory_slack = 0.0;
  double memory_cap_margin = 0.05;
  // The memory-aware layouts' ranks relabeled (permutations: each phase's
  // time unchanged) so that the largest memory lands on the ranks whose peaks
  // over the run are lowest: evens the ranks' peaks, which a time layout
  // leaves wherever the large items' LLM parts happened to be.
  bool even_peaks = false;
  // even_peaks at W <= 8: the step's layouts relabeled once both phases are
  // planned, by the permutations RelabelForRunPeaks finds (the most even run
  // peaks within 1% of the least maximum); false (or W > 8): each phase's
  // greedily as it is planned (largest memory onto the lowest run peak, kept
  // when the step's peak does not rise).
  bool relabel_search = true;
  // > 0 (>= 1): the run's activation peaks kept within this max / mean over
  // the ranks where encoder time can buy it. When the step's layouts at the
  // margin cap (relabeled as above) would leave the ranks' run peaks more
  // uneven than this (and than before the step), the cap is lowered, by
  // bisection between the step's bound (or the job's peak, if higher) and the
  // margin cap, to the loosest one that keeps them within it (the fastest
  // such layouts, each phase still within 1 + memory_slack of its balanced
  // time); none does: the more even of the two ends. 0: the margin cap only.
  double peak_ratio = 0.0;
  // peak_ratio against a forecast of the ranks' final run peaks instead of
  // the run so far: each rank's peak raised to at least the larger of the
  // job's peak before the step and the step's second-largest holding. A step
  // that does not raise the job's peak is never capped, and a heavy step
  // (a large image) is judged by the level it brings the other ranks to, not
  // by the run's earlier, lighter steps, which later heavy steps raise anyway
  // (the myopic rule, false, evened the first such steps at the encoder time
  // the run then lacked).
  bool forecast_peaks = true;
  // peak_ratio over a round planned jointly (PlanRound): the round's steps
  // planned at their margin caps; while the ranks' run peaks after the round
  // are more uneven than peak_ratio (also when the run so far is more uneven
  // than that: a round holding the highest peak can still lower it), the step
  // where the highest rank reached its peak gets the loosest lower cap (by
  // bisection between its floor and its margin cap, the round re-planned for
  // each) that keeps them within it; kept at the floor where that alone does
  // not, the next highest then lowered too. No per-step ratio and no
  // forecast (forecast_peaks unused): exact for the round, the steps after
  // it unseen (the run so far at the round's end).
  bool round_joint = false;
  // In (0, 1): the time each encoder phase spends on memory is a budget kept
  // over the job: the phase's slowest rank summed over the steps planned so
  // far stays within (sum of the steps' bounds, max(largest item, mean)) /
  // time_floor, as far as the time layouts allow. A step's layouts may take
  // up to (1 + memory_slack) x their balanced time only while the budget
  // pays for it: what the earlier steps left, plus what the round's later
  // steps (PlanRound) leave at their time layouts; otherwise the step's
  // memory placement keeps its balanced time. Steps near their bounds save
  // budget for the heavy ones. 0: no budget, memory_slack per step.
  double time_floor = 0.0;
  // > 0 (round_joint with peak_ratio): the LLM's layout may serve memory too
  // (a large image's rank holds the image on top of a full LLM share, which
  // no encoder placement moves). Where the round's layouts at their margin
  // caps leave the ranks' run peaks more uneven than peak_ratio, first (the
  // LLM phase has time to spare where the encoders' memory trades are
  // rationed by time_floor) and again after the encoder caps, the LLM
  // samples of the step that set the highest run peak move off that rank,
  // one at a time: per receiving rank the sample whose move leaves the
  // pair's larger holding least, each such move tried by re-planning the
  // round, the one leaving the run peaks most even made (max / mean, then the
  // peaks from the highest down); moves go on while the round is above the
  // ratio, at most kLlmMovePatience past the most even round seen, which is
  // kept. A receiving rank keeps its samples within llm_budget and its LLM
  // time (llm_time) within (1 + llm_slack) x the step's slowest LLM rank
  // before any move; a rank keeps at least one sample; with time_floor the
  // LLM's slowest ranks summed over the job stay within its bounds' sum /
  // time_floor. The moved samples' ranks are EncoderStepPlan::llm_rank. 0:
  // the LLM layout is the round plan's.
  double llm_slack = 0.0;
  grouping::Budget llm_budget;       // the round plan's budget (its model: llm_padded)
  grouping::StepTimeModel llm_time;  // the LLM's step time (grouping.step_time)
  bool MemoryAware() const;
};

// The permutations EncoderStepPlanner's even_peaks applies to a step's
// encoder layouts (W <= 8): `base[r]` is what rank r holds before the encoder
// phases (its LLM samples), `buckets[p][r]` the memory of phase p's items on
// rank r, `run_peak[r]` the most rank r held in an earlier step. Returns per
// phase `to` (rank r's items go to rank to[r]): of the relabelings whose
// largest run peak after the step (max(run_peak, held)) is within
// kRelabelPeakTolerance of the least any gives, the one with the least
// max / mean of the ranks' run peaks (the lowest run peaks raised where that
// costs no maximum), then the least maximum, then the fewest ranks relabeled
// (ties keep the layout). Every combination of the phases' permutations when
// their product is at most kRelabelSearchMaxEvaluations (two phases: W <= 5;
// one: W <= 8), else one permutation for all phases (an encoder rank's items
// of every phase move together), and nullopt when W! is above it (W > 8).
// The tolerance: a strict least maximum would keep a layout 0.1% lower at
// its peak over one that evens the others' by 10% (the memory models are not
// that exact).
// Time is unchanged: each rank's load is one of the layout's.
inline constexpr size_t kRelabelSearchMaxEvaluations = 40320;  // 8!
inline constexpr double kRelabelPeakTolerance = 0.01;
// EncoderPlanConfig::peak_ratio: the cap's bisection steps.
inline constexpr int kPeakRatioBisections = 6;
// EncoderPlanConfig::llm_slack: LLM moves past the most even round seen
// before they stop.
inline constexpr size_t kLlmMovePatience = 4;
bool RelabelSearches(int world);  // W! <= kRelabelSearchMaxEvaluations
std::optional<std::vector<std::vector<int32_t>>> RelabelForRunPeaks(
    std::span<const double> base, std::span<const std::vector<double>> buckets,
    std::span<const double> run_peak);

// One sample of a step: the active rank (0..n-1) whose LLM runs it, in LLM order per rank.
struct EncoderItem {
  int32_t llm_rank = 0;
  SampleLengths lengths;
};

struct EncoderStepPlan {
  PhaseAssignment vision;  // over the items, ranks = active ranks
  PhaseAssignment audio;   // empty order without an audio phase
  // EncoderPlanConfig::llm_slack: per item, the active rank that runs its LLM
  // part once the memory moves are made (an item keeps its place among the
  // rank's own, moved ones follow in item order); empty: every item's
  // EncoderItem::llm_rank.
  std::vector<int32_t> llm_rank;
};

// One step of a round for EncoderStepPlanner::PlanRound: Plan's arguments.
struct EncoderRoundStep {
  std::span<const EncoderItem> items;
  std::span<const int32_t> ranks;
};

class EncoderStepPlanner {
 public:
  explicit EncoderStepPlanner(const EncoderPlanConfig& config)
      : config_(config), memory_aware_(config.MemoryAware()) {}
  // The plans of one step whose samples are `items` over its active ranks,
  // `ranks` (their world ranks, >= 1 of them; EncoderItem::llm_rank indexes it).
  EncoderStepPlan Plan(std::span<const EncoderItem> items, std::span<const int32_t> ranks) {
    return PlanStep(items, ranks, -1.0);
  }
  // A round's steps in order: as Plan would, one after the other, or with
  // round_joint (and peak_ratio, memory models) their caps chosen together.
  std::vector<EncoderStepPlan> PlanRound(std::span<const EncoderRoundStep> steps);
  // The most memory any rank held in a step's plans so far.
  double memory_peak() const { return memory_peak_; }

 private:
  // cap_fraction >= 0: the step's memory cap at floor + cap_fraction x
  // (margin cap - floor), no per-step peak ratio (round_joint); < 0: Plan.
  EncoderStepPlan PlanStep(std::span<const EncoderItem> items, std::span<const int32_t> ranks,
                           double cap_fraction);
  std::vector<EncoderStepPlan> PlanRoundJoint(std::span<const EncoderRoundStep> steps);
  // time_floor's view of a step without memory: per encoder phase its bound
  // and its time layout's slowest rank.
  struct PhaseTimes {
    double bound = 0.0, time = 0.0;
  };
  std::array<PhaseTimes, 2> TimeLayouts(const EncoderRoundStep& step) const;
  // Per step of a round: its later steps' TimeLayouts summed (all 0 without
  // time_floor).
  std::vector<std::array<PhaseTimes, 2>> RoundAhead(std::span<const EncoderRoundStep> steps) const;
  // Per active rank: its LLM samples' memory (what it holds before the
  // encoder phases), and with a step's encoder layouts.
  std::vector<double> LlmHeld(std::span<const EncoderItem> items, int active) const;
  std::vector<double> LlmTimes(std::span<const EncoderItem> items, int active) const;  // llm_time
  std::vector<double> Held(std::span<const EncoderItem> items, int active, const EncoderStepPlan& plan) const;
  // llm_slack's view of a round's LLM phase, per step: the most LLM time a
  // receiving rank may reach (1 + llm_slack of the slowest before), the
  // bound max(largest sample, mean rank) and the slowest rank now; and what
  // the round's slowest ranks may sum to (time_floor; +inf without).
  struct LlmRound {
    std::vector<double> cap, bound, time;
    double budget = std::numeric_limits<double>::infinity();
  };
  // llm_slack: PlanRoundJoint's LLM moves on `items` (the steps' own, which
  // `steps` view), `plans` re-planned by `plan_round` (which returns the
  // ratio and keeps `raised_at`: per world rank the step that set its run
  // peak), within `llm`'s caps and budget (its times kept). Returns the
  // ratio of the round it leaves planned.
  double MoveLlmForPeaks(std::vector<std::vector<EncoderItem>>& items,
                         std::span<const EncoderRoundStep> steps, const std::vector<EncoderStepPlan>& plans,
                         const std::function<double()>& plan_round, const std::vector<size_t>& raised_at,
                         LlmRound& llm, double ratio, double allowed);
  EncoderPlanConfig config_;
  bool memory_aware_;
  double memory_peak_ = 0.0;
  std::vector<double> rank_peak_;  // per world rank: the most it held in a step's plans
  // time_floor's budget, per encoder phase (vision, audio): the steps' bounds
  // and their slowest ranks' times, summed over the job.
  std::array<double, 2> bound_sum_{}, time_sum_{};
  // ... and the round's steps after the one being planned, at their time
  // layouts: their savings (or excess) count in its budget.
  std::array<PhaseTimes, 2> ahead_{};
  // time_floor with llm_slack: the LLM phase's bounds and slowest ranks
  // summed over the job's rounds.
  PhaseTimes llm_sum_{};
};

}  // namespace odb::balance

#endif  // ODB_BALANCE_PHASE_PLAN_H_
