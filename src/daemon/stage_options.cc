#include "src/daemon/stage_options.h"

namespace odb {

// Only "derived" fields are assigned below: a stage's own knobs come with the
// copy of its member (tools/check_stage_options.py keeps it so).

ingest::IngestOptions IngestOptionsFor(const DaemonConfig& c) {
  ingest::IngestOptions o = c.ingest;
  o.rank = c.rank;
  o.buffer_max_bytes = c.buffer_max_bytes;
  o.buffer_max_samples = c.buffer_max_samples;
  o.window = c.window;
  o.deterministic = c.deterministic;
  o.budget = c.budget;
  o.collate = c.collate;
  o.phase_plans = c.phase_plans;
  return o;
}

emit::TrainerChannelOptions TrainerChannelOptionsFor(const DaemonConfig& c) {
  emit::TrainerChannelOptions o = c.trainer;
  o.rank = c.rank;
  o.window_target = c.tokens_per_step;
  o.collate = c.collate;
  return o;
}

emit::StepBuilderOptions StepBuilderOptionsFor(const DaemonConfig& c) {
  emit::StepBuilderOptions o = c.steps;
  o.rank = c.rank;
  o.collate = c.collate;
  o.phase_plans = c.phase_plans;
  o.audio_fields = c.audio_fields;
  o.deterministic = c.deterministic;
  // Per-phase plans route encoder outputs across ranks even with the local planner.
  o.samples_may_move = c.phase_plans || c.planner == PlannerKind::kGlobal;
  o.non_join = c.mode == align::EpochMode::kNonJoin;
  return o;
}

exchange::ExchangeOptions ExchangeOptionsFor(const DaemonConfig& c) {
  exchange::ExchangeOptions o = c.exchange;
  o.rank = c.rank;
  o.hostname = c.gloo_hostname;
  o.connect_timeout_ms = c.connect_timeout_ms;
  o.collective_timeout_ms = c.collective_timeout_ms;
  return o;
}

}  // namespace odb
