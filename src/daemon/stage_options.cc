#include "src/daemon/stage_options.h"

namespace odb {

ingest::IngestOptions IngestOptionsFor(const DaemonConfig& c) {
  ingest::IngestOptions o;
  o.rank = c.rank;
  o.endpoints = c.ingest_endpoints;
  o.hwm = c.ingest_hwm;
  o.buffer_max_bytes = c.buffer_max_bytes;
  o.buffer_max_samples = c.buffer_max_samples;
  o.window = c.window;
  o.deterministic = c.deterministic;
  o.reject_over_budget = c.over_budget == OverBudgetPolicy::kReject;
  o.budget = c.budget;
  o.collate = c.collate;
  o.phase_plans = c.phase_plans;
  o.producer_timeout_ms = c.producer_timeout_ms;
  return o;
}

emit::TrainerChannelOptions TrainerChannelOptionsFor(const DaemonConfig& c) {
  emit::TrainerChannelOptions o;
  o.rank = c.rank;
  o.endpoint = c.trainer_endpoint;
  o.outstanding_depth = c.outstanding_depth;
  o.step_arena = c.shm_step_arena != StepArenaMode::kOff;
  o.step_arena_required = c.shm_step_arena == StepArenaMode::kOn;
  o.step_arena_bytes = c.shm_step_arena_bytes;
  o.trainer_timeout_ms = c.trainer_timeout_ms;
  return o;
}

emit::StepBuilderOptions StepBuilderOptionsFor(const DaemonConfig& c) {
  emit::StepBuilderOptions o;
  o.rank = c.rank;
  o.collate = c.collate;
  o.phase_plans = c.phase_plans;
  o.encoder_fields = c.encoder_fields;
  o.audio_fields = c.audio_fields;
  o.deterministic = c.deterministic;
  o.rejections_are_errors = c.bad_input == BadInputPolicy::kError;
  // Per-phase plans route encoder outputs across ranks even with the local planner.
  o.samples_may_move = c.phase_plans || c.planner == PlannerKind::kGlobal;
  o.non_join = c.mode == align::EpochMode::kNonJoin;
  o.collective_timeout_ms = c.collective_timeout_ms;
  o.step_arena_wait_ms = c.shm_step_arena_wait_ms;
  return o;
}

exchange::ExchangeOptions ExchangeOptionsFor(const DaemonConfig& c) {
  exchange::ExchangeOptions o;
  o.rank = c.rank;
  o.hostname = c.gloo_hostname;
  o.connect_timeout_ms = c.connect_timeout_ms;
  o.collective_timeout_ms = c.collective_timeout_ms;
  return o;
}

}  // namespace odb
