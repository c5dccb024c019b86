#include "src/state/metrics.h"

#include <sstream>

#include "src/common/fd_budget.h"

namespace odb {
namespace {

void Series(std::ostringstream& out, const char* name, const char* type, const char* help, uint64_t value,
            int rank) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
      << name << "{rank=\"" << rank << "\"} " << value << '\n';
}

}  // namespace

DaemonGauges PublishedGauges(const DaemonMetrics& m) {
  DaemonGauges g;
  g.buffer_bytes = m.buffer_bytes.load();
  g.buffer_samples = m.buffer_samples.load();
  g.queued_steps = m.queued_steps.load();
  g.ingest_credit_bytes = m.ingest_credit_bytes.load();
  g.ingest_credit_samples = m.ingest_credit_samples.load();
  g.producer_connections = m.producer_connections.load();
  g.producer_arenas = m.producer_arenas.load();
  g.producer_arenas_mapped = m.producer_arenas_mapped.load();
  g.arena_held_bytes = m.arena_held_bytes.load();
  g.arena_writers_waiting = m.arena_writers_waiting.load();
  return g;
}

std::string RenderPrometheus(const DaemonMetrics& m, const DaemonGauges& g, int rank) {
  std::ostringstream out;
  Series(out, "odb_samples_received_total", "counter", "Samples received (accepted or rejected).",
         m.samples_received.load(), rank);
  Series(out, "odb_samples_rejected_total", "counter", "Samples rejected as bad input.",
         m.samples_rejected.load(), rank);
  Series(out, "odb_samples_emitted_total", "counter", "Samples emitted in steps.", m.samples_emitted.load(), rank);
  Series(out, "odb_steps_emitted_total", "counter", "Steps emitted (real and IDLE).", m.steps_emitted.load(), rank);
  Series(out, "odb_idle_steps_total", "counter", "IDLE steps emitted.", m.idle_steps.load(), rank);
  Series(out, "odb_rounds_total", "counter", "Alignment rounds run.", m.rounds.load(), rank);
  Series(out, "odb_bad_trainer_messages_total", "counter", "Unreadable or multi-frame trainer messages ignored.",
         m.bad_trainer_messages.load(), rank);
  Series(out, "odb_refused_trainers_total", "counter", "Second trainers refused (one trainer per daemon).",
         m.refused_trainers.load(), rank);
  Series(out, "odb_trainer_disconnects_total", "counter", "Times the trainer session's connection closed.",
         m.trainer_disconnects.load(), rank);
  Series(out, "odb_real_tokens_total", "counter", "Tokens of the samples emitted.", m.real_tokens.load(), rank);
  Series(out, "odb_padded_tokens_total", "counter", "Tokens the trainer computes on (padding included).",
         m.padded_tokens.load(), rank);
  Series(out, "odb_exchange_bytes_sent_total", "counter", "Payload bytes sent to other daemons (global plans).",
         m.exchange_bytes_sent.load(), rank);
  Series(out, "odb_exchange_connections_refused_total", "counter",
         "Connections to the payload exchange refused (not a peer of this job).",
         m.exchange_connections_refused.load(), rank);
  Series(out, "odb_metrics_connections_dropped_total", "counter",
         "Metrics connections closed unanswered (too slow, displaced by newer ones, or not HTTP).",
         m.metrics_connections_dropped.load(), rank);
  Series(out, "odb_connections_refused_no_descriptors_total", "counter",
         "Connections (any listener) refused because file descriptors ran short.",
         ConnectionsRefusedForDescriptors(), rank);
  Series(out, "odb_round_p50_microseconds", "gauge", "Median alignment round time, last 256 rounds.",
         m.round_p50_us.load(), rank);
  Series(out, "odb_round_p99_microseconds", "gauge", "99th percentile alignment round time, last 256 rounds.",
         m.round_p99_us.load(), rank);
  Series(out, "odb_metrics_scrapes_total", "counter", "Metrics requests served.", m.metrics_scrapes.load(), rank);
  Series(out, "odb_buffer_peak_bytes", "gauge", "Largest buffered payload seen.", m.peak_buffer_bytes.load(), rank);
  Series(out, "odb_buffer_bytes", "gauge", "Payload bytes buffered now.", g.buffer_bytes, rank);
  Series(out, "odb_buffer_samples", "gauge", "Samples buffered now.", g.buffer_samples, rank);
  Series(out, "odb_queued_steps", "gauge", "Collated steps waiting for trainer credit.", g.queued_steps, rank);
  Series(out, "odb_ingest_credit_bytes", "gauge", "Payload bytes producers may still send (granted credit).",
         g.ingest_credit_bytes, rank);
  Series(out, "odb_ingest_credit_samples", "gauge", "Samples producers may still send (granted credit).",
         g.ingest_credit_samples, rank);
  Series(out, "odb_producer_connections", "gauge", "Producer connections known to the ingest channel.",
         g.producer_connections, rank);
  Series(out, "odb_producer_arenas", "gauge", "Producers' shared-memory arenas registered now.", g.producer_arenas,
         rank);
  Series(out, "odb_producer_arenas_mapped", "gauge",
         "Producer arenas mapped now (registered, or gone with samples still buffered).", g.producer_arenas_mapped,
         rank);
  Series(out, "odb_arena_held_bytes", "gauge", "Payload bytes of buffered samples that live in producer arenas.",
         g.arena_held_bytes, rank);
  Series(out, "odb_arena_writers_waiting", "gauge",
         "Producers waiting for a block of their full arena (the daemon holds its blocks).",
         g.arena_writers_waiting, rank);
  Series(out, "odb_arena_registrations_total", "counter", "Producer arenas registered.",
         m.arena_registrations.load(), rank);
  Series(out, "odb_arena_refusals_total", "counter", "Producer arena registrations refused.",
         m.arena_refusals.load(), rank);
  Series(out, "odb_step_arena_steps_total", "counter", "Steps sent to the trainer through the step arena.",
         m.step_arena_steps.load(), rank);
  Series(out, "odb_step_arena_frame_fallbacks_total", "counter",
         "Steps sent as frames although the session has a step arena (too large for it, reader gone).",
         m.step_arena_frame_fallbacks.load(), rank);
  Series(out, "odb_step_arena_held_steps", "gauge",
         "Step arena blocks not returned yet (queued, in flight, held by the trainer).",
         m.step_arena_held_steps.load(), rank);
  Series(out, "odb_step_arena_held_bytes", "gauge", "Bytes of the step arena blocks not returned yet.",
         m.step_arena_held_bytes.load(), rank);
  Series(out, "odb_step_arena_returns", "gauge", "Step arena blocks the current trainer session returned.",
         m.step_arena_returns.load(), rank);
  return out.str();
}

}  // namespace odb
