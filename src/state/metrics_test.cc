#include "src/state/metrics.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

namespace odb {
namespace {

TEST_CASE("metrics render in Prometheus text format with the rank label") {
  DaemonMetrics m;
  m.samples_received = 12;
  m.steps_emitted = 3;
  m.buffer_bytes = 4096;
  const std::string text = RenderPrometheus(m, 2);
  CHECK_THAT(text, Catch::Contains("# TYPE odb_samples_received_total counter\n"));
  CHECK_THAT(text, Catch::Contains("odb_samples_received_total{rank=\"2\"} 12\n"));
  CHECK_THAT(text, Catch::Contains("odb_steps_emitted_total{rank=\"2\"} 3\n"));
  CHECK_THAT(text, Catch::Contains("# TYPE odb_buffer_bytes gauge\nodb_buffer_bytes{rank=\"2\"} 4096\n"));
}

TEST_CASE("every series of the table is rendered once, from the member it names") {
  DaemonMetrics m;
  std::set<std::string> names;
  std::vector<std::atomic<uint64_t> DaemonMetrics::*> members;  // not ordered: a vector
  uint64_t value = 1;
  for (const MetricSpec& spec : MetricTable()) {
    INFO(spec.name);
    CHECK(names.insert(spec.name).second);
    CHECK(std::string(spec.name).rfind("odb_", 0) == 0);
    // Prometheus convention: counters, and only counters, end in _total.
    const std::string name(spec.name);
    const bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
    CHECK(total == (spec.type == MetricType::kCounter));
    CHECK((spec.member != nullptr) != (spec.read != nullptr));
    if (spec.member != nullptr) {
      CHECK(std::find(members.begin(), members.end(), spec.member) == members.end());  // exported once
      members.push_back(spec.member);
      m.*spec.member = ++value;
    }
  }
  const std::string text = RenderPrometheus(m, 0);
  for (const MetricSpec& spec : MetricTable()) {
    const std::string name(spec.name);
    INFO(name);
    CHECK(text.find("# HELP " + name + " ") != std::string::npos);
    if (spec.member != nullptr) {
      CHECK_THAT(text,
                 Catch::Contains(name + "{rank=\"0\"} " + std::to_string((m.*spec.member).load()) + "\n"));
    }
  }
}

}  // namespace
}  // namespace odb
