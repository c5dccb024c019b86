#include "src/daemon/aligned_round_runner.h"

#include <algorithm>
#include <set>

#include "src/balance/global_planner.h"
#include "src/balance/phase_plan.h"

namespace odb {

balance::EncoderPlanConfig EncoderPlanConfigFrom(const DaemonConfig& config) {
  balance::EncoderPlanConfig e;
  e.vision_cost = config.vision_cost;
  e.audio_cost = config.audio_cost;
  e.audio_phase = !config.audio_fields.empty();
  e.vision_memory = config.vision_memory;
  e.audio_memory = config.audio_memory;
  e.llm_memory = config.llm_memory;
  e.llm_padded = config.budget.model == grouping::CostModel::kPadded;
  e.memory_slack = config.memory_slack;
  e.memory_cap_margin = config.memory_cap_margin;
  e.even_peaks = config.even_memory_peaks;
  e.peak_ratio = config.memory_peak_ratio;
  e.round_joint = config.memory_peak_round;
  e.time_floor = config.memory_time_floor;
  e.llm_slack = config.memory_llm_slack;
  e.llm_budget = config.budget;
  e.llm_time = config.step_time;
  return e;
}

align::PlannerConfig PlannerConfigFrom(const DaemonConfig& config) {
  align::PlannerConfig p;
  p.budget = config.budget;
  p.step_model = config.step_time;
  p.mode = config.mode;
  p.seed = config.seed;
  p.window = config.window;
  p.mix_lengths = MixesLengths(config);
  p.mix_steps = MixesSteps(config);
  p.deterministic = config.deterministic;
  p.tokens_per_step = config.tokens_per_step;
  p.window_spread = config.window_spread;
  // Rounds wait for half the output queue (docs/config.md, emit.queue_steps).
  p.min_free_slots = std::max<uint32_t>(1, config.queue_steps / 2);
  p.full_rounds = true;  // ... then plan every group the windows give (bench: `paced16:full`)
  return p;
}

std::unique_ptr<align::Planner> MakePlanner(const DaemonConfig& config) {
  if (config.planner == PlannerKind::kLocal) {
    return std::make_unique<align::LocalPlanner>(PlannerConfigFrom(config));
  }
  balance::GlobalPlannerConfig g;
  g.base = PlannerConfigFrom(config);
  g.local_world_size = static_cast<uint32_t>(config.local_world_size);
  g.locality = config.locality;
  g.partition_ranks = PartitionRanks(config, config.world_size);
  if (config.phase_plans && config.llm_cost_seconds > 0.0) {  // encoder-aware step composition
    g.phase_costs.llm_seconds = config.llm_cost_seconds;
    g.phase_costs.vision = config.vision_cost;
    if (!config.audio_fields.empty()) g.phase_costs.audio = config.audio_cost;
  }
  return std::make_unique<balance::GlobalPlanner>(g);
}

bool AlignedRoundRunner::AddPhasePlans(const align::RoundPlan& plan, RoundOutcome& outcome,
                                       align::RoundPlan& moved_plan) {
  const int world = static_cast<int>(plan.ranks.size());
  const int me = peers_->Rank();
  encoder_needs_.assign(world, {});
  // The round's steps are planned together (balance::EncoderStepPlanner::
  // PlanRound: with memory_peak_round their memory caps are chosen for the
  // ranks' peaks after the round); each step's LLM layout is the plan's, each
  // encoder layout (vision, then audio) balanced on its own cost.
  struct Item {
    SampleMeta meta;
    int32_t llm_rank;
    uint32_t llm_index;
  };
  struct Step {
    uint32_t k;
    std::vector<Item> items;
    std::vector<int32_t> active;
    std::vector<balance::EncoderItem> step_items;
  };
  std::vector<Step> steps;
  for (uint32_t k = 0; k < plan.num_steps; ++k) {
    Step step{k, {}, {}, {}};
    for (int r = 0; r < world; ++r) {
      const auto& samples = plan.ranks[r].steps[k].samples;
      for (uint32_t j = 0; j < samples.size(); ++j) step.items.push_back({samples[j], r, j});
    }
    if (step.items.empty()) continue;
    // Only ranks with LLM work in this step encode: an IDLE rank runs no real
    // forward pass (it may even have left the loop under the join policy).
    std::vector<int32_t> index_of(world, -1);
    for (int r = 0; r < world; ++r) {
      if (!plan.ranks[r].steps[k].samples.empty()) {
        index_of[r] = static_cast<int32_t>(step.active.size());
        step.active.push_back(r);
      }
    }
    step.step_items.reserve(step.items.size());
    for (const Item& item : step.items) step.step_items.push_back({index_of[item.llm_rank], item.meta.lengths});
    steps.push_back(std::move(step));
  }
  std::vector<balance::EncoderRoundStep> round;
  round.reserve(steps.size());
  for (const Step& step : steps) round.push_back({step.step_items, step.active});
  const std::vector<balance::EncoderStepPlan> step_plans = encoder_planner_.PlanRound(round);
  // Memory moves of LLM samples (alignment.memory_llm_slack), the same on
  // every rank: the step's samples laid out again over its active ranks (a
  // rank keeps its own in order, moved ones follow in item order), each
  // rank's planned figures recomputed (the step's and window's totals are
  // unchanged, so are the weights' denominators), this rank's step too.
  const double weight_world = static_cast<double>(world);
  bool moved = false;
  for (size_t k = 0; k < steps.size(); ++k) {
    Step& step = steps[k];
    const std::vector<int32_t>& to = step_plans[k].llm_rank;
    if (to.empty()) continue;
    if (!moved) moved_plan = plan;
    moved = true;
    std::vector<align::PlannedStep*> rank_steps;
    for (int32_t r : step.active) rank_steps.push_back(&moved_plan.ranks[r].steps[step.k]);
    std::vector<std::vector<size_t>> order(step.active.size());
    for (int pass = 0; pass < 2; ++pass) {  // the rank's own, then the moved ones
      for (size_t i = 0; i < step.items.size(); ++i) {
        const bool own = step.active[to[i]] == step.items[i].llm_rank;
        if (own == (pass == 0)) order[to[i]].push_back(i);
      }
    }
    for (size_t a = 0; a < step.active.size(); ++a) {
      align::PlannedStep& s = *rank_steps[a];
      s.samples.clear();
      s.real_tokens = s.loss_tokens = 0;
      std::vector<SampleLengths> lens;
      for (size_t i : order[a]) {
        Item& item = step.items[i];
        item.llm_rank = step.active[a];
        item.llm_index = static_cast<uint32_t>(s.samples.size());
        s.samples.push_back(item.meta);
        s.real_tokens += item.meta.lengths.tokens;
        s.loss_tokens += align::LossTokensOf(item.meta);
        lens.push_back(item.meta.lengths);
      }
      s.padded_tokens = grouping::PaddedTokens(budget_model_, lens);
      s.loss_weight = s.window_loss_tokens == 0 ? 0.0
                                                : weight_world * static_cast<double>(s.loss_tokens) /
                                                      static_cast<double>(s.window_loss_tokens);
      if (step.active[a] != me) continue;
      StepPlan& mine = outcome.steps[step.k];
      mine.real_tokens = s.real_tokens;
      mine.padded_tokens = s.padded_tokens;
      mine.loss_tokens = s.loss_tokens;
      mine.loss_weight = s.loss_weight;
      mine.sample_ids.clear();
      mine.sample_owners.clear();
      for (const SampleMeta& meta : s.samples) {
        mine.sample_ids.push_back(meta.id);
        mine.sample_owners.push_back(meta.owner_rank);
      }
    }
  }
  for (size_t s = 0; s < steps.size(); ++s) {
    const std::vector<Item>& items = steps[s].items;
    const std::vector<int32_t>& active = steps[s].active;
    const balance::EncoderStepPlan& step_plan = step_plans[s];
    StepPlan& mine = outcome.steps[steps[s].k];
    // One encoder phase: this rank's share of its layout (what it encodes and
    // where each output goes) and, for this rank's LLM samples, the rank that
    // encodes each.
    auto phase = [&](const balance::PhaseAssignment& enc, PhaseRoute& route) {
      route.src_rank.assign(mine.sample_ids.size(), me);
      for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].llm_rank == me) route.src_rank[items[i].llm_index] = active[enc.slot_of[i].rank];
      }
      for (size_t a = 0; a < active.size(); ++a) {
        const int r = active[a];
        for (size_t i : enc.order[a]) {
          encoder_needs_[r].emplace_back(items[i].meta.owner_rank, items[i].meta.id);
          if (r != me) continue;
          route.ids.push_back(items[i].meta.id);
          route.owners.push_back(items[i].meta.owner_rank);
          route.dest_rank.push_back(items[i].llm_rank);
          route.dest_index.push_back(items[i].llm_index);
        }
      }
    };
    phase(step_plan.vision, mine.phase(EncoderPhase::kVision));
    if (audio_phase_) phase(step_plan.audio, mine.phase(EncoderPhase::kAudio));
  }
  return moved;
}

namespace {

align::AlignerOptions AlignerOptionsFrom(const DaemonConfig& config, const Clock* clock) {
  align::AlignerOptions options;
  // The round's waits (max_wait_ms, start_wait_ms) are decided on the
  // daemon's clock, like when a round is due (Daemon::RoundDue).
  if (clock != nullptr) options.now = [clock] { return clock->Now(); };
  options.max_wait = std::chrono::milliseconds(config.max_wait_ms);
  options.start_wait = std::chrono::milliseconds(config.start_wait_ms == 0 ? config.max_wait_ms
                                                                           : config.start_wait_ms);
  return options;
}

}  // namespace

AlignedRoundRunner::AlignedRoundRunner(std::unique_ptr<align::PeerGroup> peers, const DaemonConfig& config,
                                       const Clock* clock)
    : peers_(std::move(peers)),
      aligner_(peers_.get(), MakePlanner(config), AlignerOptionsFrom(config, clock)),
      phase_plans_(config.phase_plans),
      budget_model_(config.budget.model),
      audio_phase_(!config.audio_fields.empty()),
      encoder_planner_(EncoderPlanConfigFrom(config)) {}

void AlignedRoundRunner::StartEpoch(uint32_t epoch, uint64_t first_round, uint64_t first_step) {
  start_status_ = aligner_.StartEpoch(epoch, first_round, first_step);
}

absl::StatusOr<RoundOutcome> AlignedRoundRunner::Run(const RoundRequest& request) {
  if (!start_status_.ok()) return start_status_;
  align::RoundInput input;
  input.epoch = request.epoch;
  input.pending = request.pending;
  input.free_slots = request.free_slots;
  input.stream_finished = request.stream_finished;
  input.stream_started = request.stream_started;
  input.input_blocked = request.input_blocked;
  auto result = aligner_.RunRound(input);
  if (!result.ok()) return result.status();

  const align::RoundPlan* plan = &aligner_.last_plan();
  align::RoundPlan moved;  // the plan with the phase plans' LLM moves, if any
  RoundOutcome outcome;
  outcome.epoch_finished = result->epoch_finished;
  outcome.waiting = result->waiting;
  outcome.reason = result->reason;
  for (size_t k = 0; k < result->steps.size(); ++k) {
    const align::PlannedStep& s = result->steps[k];
    StepPlan step;
    static_cast<StepHeader&>(step) = s;
    for (const auto& meta : s.samples) {
      step.sample_ids.push_back(meta.id);
      step.sample_owners.push_back(meta.owner_rank);
    }
    outcome.steps.push_back(std::move(step));
  }
  for (const auto& key : result->not_emitted) outcome.not_emitted.push_back(key.id);
  encoder_needs_.clear();
  if (phase_plans_) {
    // A partitioned round fills only this rank's block: the other blocks'
    // ranks count as IDLE here, so the encoder phase balances within the
    // block (their samples never reach this rank).
    bool partial = false;
    for (const auto& rp : plan->ranks) partial = partial || rp.steps.size() != plan->num_steps;
    align::RoundPlan filled;
    if (partial) {
      filled = *plan;
      for (auto& rp : filled.ranks) {
        if (rp.steps.size() != plan->num_steps) rp.steps.assign(plan->num_steps, align::PlannedStep{});
      }
    }
    if (AddPhasePlans(partial ? filled : *plan, outcome, moved)) plan = &moved;
  }
  // Payloads this rank holds that other ranks need: samples another rank emits
  // (a global planner moves them) or encodes (per-phase plans).
  const int me = peers_->Rank();
  for (int r = 0; r < static_cast<int>(plan->ranks.size()); ++r) {
    if (r == me) continue;
    std::set<uint64_t> ids;
    for (const auto& step : plan->ranks[r].steps) {
      for (const auto& meta : step.samples) {
        if (meta.owner_rank == me) ids.insert(meta.id);
      }
    }
    if (static_cast<size_t>(r) < encoder_needs_.size()) {
      for (const auto& [owner, id] : encoder_needs_[r]) {
        if (owner == me) ids.insert(id);
      }
    }
    if (!ids.empty()) outcome.outgoing.emplace_back(r, std::vector<uint64_t>(ids.begin(), ids.end()));
  }
  return outcome;
}

}  // namespace odb
