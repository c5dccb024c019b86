#include "src/state/metrics.h"

#include <catch2/catch.hpp>

namespace odb {
namespace {

TEST_CASE("metrics render in Prometheus text format with the rank label") {
  DaemonMetrics m;
  m.samples_received = 12;
  m.steps_emitted = 3;
  DaemonGauges g;
  g.buffer_bytes = 4096;
  const std::string text = RenderPrometheus(m, g, 2);
  CHECK_THAT(text, Catch::Contains("# TYPE odb_samples_received_total counter\n"));
  CHECK_THAT(text, Catch::Contains("odb_samples_received_total{rank=\"2\"} 12\n"));
  CHECK_THAT(text, Catch::Contains("odb_steps_emitted_total{rank=\"2\"} 3\n"));
  CHECK_THAT(text, Catch::Contains("# TYPE odb_buffer_bytes gauge\nodb_buffer_bytes{rank=\"2\"} 4096\n"));
}

}  // namespace
}  // namespace odb
