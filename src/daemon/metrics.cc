#include "src/daemon/metrics.h"

#include <sstream>

namespace odb {
namespace {

void Series(std::ostringstream& out, const char* name, const char* type, const char* help, uint64_t value,
            int rank) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
      << name << "{rank=\"" << rank << "\"} " << value << '\n';
}

}  // namespace

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
  Series(out, "odb_buffer_full_polls_total", "counter", "I/O loop polls with ingest paused (buffer full).",
         m.buffer_full_stalls.load(), rank);
  Series(out, "odb_buffer_peak_bytes", "gauge", "Largest buffered payload seen.", m.peak_buffer_bytes.load(), rank);
  Series(out, "odb_buffer_bytes", "gauge", "Payload bytes buffered now.", g.buffer_bytes, rank);
  Series(out, "odb_buffer_samples", "gauge", "Samples buffered now.", g.buffer_samples, rank);
  Series(out, "odb_queued_steps", "gauge", "Collated steps waiting for trainer credit.", g.queued_steps, rank);
  return out.str();
}

}  // namespace odb
