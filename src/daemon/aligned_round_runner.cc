#include "src/daemon/aligned_round_runner.h"

#include "src/balance/global_planner.h"

namespace odb {

align::PlannerConfig PlannerConfigFrom(const DaemonConfig& config) {
  align::PlannerConfig p;
  p.budget = config.budget;
  p.step_model = config.step_time;
  p.mode = config.mode == AlignMode::kJoin ? align::EpochMode::kJoin : align::EpochMode::kNonJoin;
  p.seed = config.seed;
  p.window = config.window;
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
  return std::make_unique<balance::GlobalPlanner>(g);
}

namespace {

align::AlignerOptions AlignerOptionsFrom(const DaemonConfig& config) {
  align::AlignerOptions options;
  options.max_wait = std::chrono::milliseconds(config.max_wait_ms);
  return options;
}

}  // namespace

AlignedRoundRunner::AlignedRoundRunner(std::unique_ptr<align::PeerGroup> peers,
                                       const DaemonConfig& config)
    : peers_(std::move(peers)),
      aligner_(peers_.get(), MakePlanner(config), AlignerOptionsFrom(config)) {}

void AlignedRoundRunner::StartEpoch(uint32_t epoch) { start_status_ = aligner_.StartEpoch(epoch); }

absl::StatusOr<RoundOutcome> AlignedRoundRunner::Run(const RoundRequest& request) {
  if (!start_status_.ok()) return start_status_;
  align::RoundInput input;
  input.epoch = request.epoch;
  input.pending = request.pending;
  input.free_slots = request.free_slots;
  input.stream_finished = request.stream_finished;
  auto result = aligner_.RunRound(input);
  if (!result.ok()) return result.status();

  const align::RoundPlan& plan = aligner_.last_plan();
  RoundOutcome outcome;
  outcome.epoch_finished = result->epoch_finished;
  for (size_t k = 0; k < result->steps.size(); ++k) {
    const align::Step& s = result->steps[k];
    StepPlan step;
    step.step_index = s.step_index;
    step.idle = s.idle;
    step.real_tokens = s.real_tokens;
    step.padded_tokens = s.padded_tokens;
    step.loss_weight = s.loss_weight;
    step.over_budget = s.over_budget;
    for (const auto& meta : s.samples) {
      step.sample_ids.push_back(meta.id);
      step.sample_owners.push_back(meta.owner_rank);
    }
    for (const auto& rank_plan : plan.ranks) {
      if (k < rank_plan.steps.size()) step.global_real_tokens += rank_plan.steps[k].real_tokens;
    }
    outcome.steps.push_back(std::move(step));
  }
  for (const auto& key : result->not_emitted) outcome.not_emitted.push_back(key.id);
  // Payloads this rank holds that other ranks emit (a global planner moves samples).
  const int me = peers_->Rank();
  for (int r = 0; r < static_cast<int>(plan.ranks.size()); ++r) {
    if (r == me) continue;
    std::vector<uint64_t> ids;
    for (const auto& step : plan.ranks[r].steps) {
      for (const auto& meta : step.samples) {
        if (meta.owner_rank == me) ids.push_back(meta.id);
      }
    }
    if (!ids.empty()) outcome.outgoing.emplace_back(r, std::move(ids));
  }
  return outcome;
}

}  // namespace odb
