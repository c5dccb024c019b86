#include "src/state/metrics.h"

#include <sstream>

#include "src/common/fd_budget.h"

namespace odb {
namespace {

using M = DaemonMetrics;
constexpr MetricType kCounter = MetricType::kCounter;
constexpr MetricType kGauge = MetricType::kGauge;

}  // namespace

const std::vector<MetricSpec>& MetricTable() {
  static const std::vector<MetricSpec> table = {
      {"odb_samples_received_total", kCounter, "Samples received (accepted or rejected).",
       &M::samples_received},
      {"odb_samples_rejected_total", kCounter, "Samples rejected as bad input.", &M::samples_rejected},
      {"odb_samples_emitted_total", kCounter, "Samples emitted in steps.", &M::samples_emitted},
      {"odb_steps_emitted_total", kCounter, "Steps emitted (real and IDLE).", &M::steps_emitted},
      {"odb_idle_steps_total", kCounter, "IDLE steps emitted.", &M::idle_steps},
      {"odb_rounds_total", kCounter, "Alignment rounds run.", &M::rounds},
      {"odb_bad_trainer_messages_total", kCounter, "Unreadable or multi-frame trainer messages ignored.",
       &M::bad_trainer_messages},
      {"odb_refused_trainers_total", kCounter, "Second trainers refused (one trainer per daemon).",
       &M::refused_trainers},
      {"odb_trainer_disconnects_total", kCounter, "Times the trainer session's connection closed.",
       &M::trainer_disconnects},
      {"odb_late_trainer_messages_total", kCounter,
       "Trainer messages read after their connection had closed: never taken as a (re)connect; the "
       "session's own are applied, other peers' dropped.",
       &M::late_trainer_messages},
      {"odb_trainer_data_wait_microseconds_total", kCounter,
       "Time the trainer reported waiting for steps in next(loader): a data stall when it grows.",
       &M::trainer_data_wait_us},
      {"odb_real_tokens_total", kCounter, "Tokens of the samples emitted.", &M::real_tokens},
      {"odb_padded_tokens_total", kCounter, "Tokens the trainer computes on (padding included).",
       &M::padded_tokens},
      {"odb_exchange_bytes_sent_total", kCounter, "Payload bytes sent to other daemons (global plans).",
       &M::exchange_bytes_sent},
      {"odb_exchange_connections_refused_total", kCounter,
       "Connections to the payload exchange refused (not a peer of this job).",
       &M::exchange_connections_refused},
      {"odb_metrics_connections_dropped_total", kCounter,
       "Metrics connections closed unanswered (too slow, displaced by newer ones, or not HTTP).",
       &M::metrics_connections_dropped},
      {"odb_connections_refused_no_descriptors_total", kCounter,
       "Connections (any listener) refused because file descriptors ran short.", nullptr,
       &ConnectionsRefusedForDescriptors},
      {"odb_round_p50_microseconds", kGauge, "Median alignment round time, last 256 rounds.",
       &M::round_p50_us},
      {"odb_round_p99_microseconds", kGauge, "99th percentile alignment round time, last 256 rounds.",
       &M::round_p99_us},
      {"odb_metrics_scrapes_total", kCounter, "Metrics requests served.", &M::metrics_scrapes},
      {"odb_buffer_peak_bytes", kGauge, "Largest buffered payload seen.", &M::peak_buffer_bytes},
      {"odb_buffer_bytes", kGauge, "Payload bytes buffered now.", &M::buffer_bytes},
      {"odb_buffer_samples", kGauge, "Samples buffered now.", &M::buffer_samples},
      {"odb_queued_steps", kGauge, "Collated steps waiting for trainer credit.", &M::queued_steps},
      {"odb_ingest_credit_bytes", kGauge, "Payload bytes producers may still send (granted credit).",
       &M::ingest_credit_bytes},
      {"odb_ingest_credit_samples", kGauge, "Samples producers may still send (granted credit).",
       &M::ingest_credit_samples},
      {"odb_producer_connections", kGauge, "Producer connections known to the ingest channel.",
       &M::producer_connections},
      {"odb_producer_arenas", kGauge, "Producers' shared-memory arenas registered now.", &M::producer_arenas},
      {"odb_producer_arenas_mapped", kGauge,
       "Producer arenas mapped now (registered, or gone with samples still buffered).",
       &M::producer_arenas_mapped},
      {"odb_arena_held_bytes", kGauge, "Payload bytes of buffered samples that live in producer arenas.",
       &M::arena_held_bytes},
      {"odb_arena_writers_waiting", kGauge,
       "Producers waiting for a block of their full arena (the daemon holds its blocks).",
       &M::arena_writers_waiting},
      {"odb_arena_registrations_total", kCounter, "Producer arenas registered.", &M::arena_registrations},
      {"odb_arena_refusals_total", kCounter, "Producer arena registrations refused.", &M::arena_refusals},
      {"odb_step_arena_steps_total", kCounter, "Steps sent to the trainer through the step arena.",
       &M::step_arena_steps},
      {"odb_step_arena_frame_fallbacks_total", kCounter,
       "Steps sent as frames although the session has a step arena (too large for it, reader gone).",
       &M::step_arena_frame_fallbacks},
      {"odb_step_arena_held_steps", kGauge,
       "Step arena blocks not returned yet (queued, in flight, held by the trainer).",
       &M::step_arena_held_steps},
      {"odb_step_arena_held_bytes", kGauge, "Bytes of the step arena blocks not returned yet.",
       &M::step_arena_held_bytes},
      {"odb_step_arena_returns", kGauge, "Step arena blocks the current trainer session returned.",
       &M::step_arena_returns},
  };
  return table;
}

uint64_t MetricValue(const MetricSpec& spec, const DaemonMetrics& metrics) {
  return spec.member != nullptr ? (metrics.*spec.member).load() : spec.read();
}

std::string RenderPrometheus(const DaemonMetrics& metrics, int rank) {
  std::ostringstream out;
  for (const MetricSpec& spec : MetricTable()) {
    out << "# HELP " << spec.name << ' ' << spec.help << "\n# TYPE " << spec.name << ' '
        << (spec.type == MetricType::kCounter ? "counter" : "gauge") << '\n'
        << spec.name << "{rank=\"" << rank << "\"} " << MetricValue(spec, metrics) << '\n';
  }
  return out.str();
}

}  // namespace odb
