#include "bench/policies.h"

#include <catch2/catch.hpp>

#include "bench/trace.h"

namespace odb::bench {
namespace {

std::vector<SampleLengths> Arrival(const std::string& preset, size_t n) {
  auto trace = GenerateTrace(preset, n, 4096, 7);
  REQUIRE(trace.ok());
  return trace->samples;
}

TEST_CASE("every policy covers every sample once and keeps the budget", "[policies]") {
  SimConfig cfg;
  cfg.world = 4;
  cfg.window = 64;
  const auto arrival = Arrival("production_mix", 1500);
  for (const std::string& p : PolicyNames()) {
    INFO(p);
    auto schedule = RunPolicy(p, arrival, cfg);
    REQUIRE(schedule.ok());
    uint64_t samples = 0;
    for (const auto& step : *schedule) {
      REQUIRE(step.size() == 4u);
      bool any = false;
      for (const RankStep& s : step) {
        samples += s.samples;
        any |= !s.idle;
        if (!s.idle) CHECK(s.padded_tokens <= cfg.budget.max_tokens);
      }
      CHECK(any);  // no step where every rank is idle
    }
    CHECK(samples == arrival.size());
  }
}

TEST_CASE("standard batch size fits the longest sample", "[policies]") {
  std::vector<SampleLengths> s = {{100, 0, 0}, {1000, 0, 0}, {30, 0, 0}};
  grouping::Budget b;
  b.max_tokens = 4096;
  CHECK(FixedBatchSize(s, b) == 4u);
}

TEST_CASE("evaluation charges the slowest rank per step", "[policies]") {
  grouping::StepTimeModel m{10.0, 1.0, 0.0};
  RankStep a;
  a.idle = false;
  a.samples = 1;
  a.padded_tokens = 100;
  RankStep idle;
  Schedule s = {{a, idle}};
  const Metrics metrics = Evaluate(s, m);
  CHECK(metrics.time == Approx(110.0));
  CHECK(metrics.max_over_mean() == Approx(110.0 / 60.0));
  CHECK(metrics.idle_rank_steps == 1u);
}

TEST_CASE("odb beats standard on a long-tail trace", "[policies]") {
  SimConfig cfg;
  cfg.world = 2;
  cfg.window = 128;
  const auto arrival = Arrival("chat_longtail", 2000);
  const double odb = Evaluate(*RunPolicy("odb", arrival, cfg), cfg.model).samples_per_s();
  const double standard = Evaluate(*RunPolicy("standard", arrival, cfg), cfg.model).samples_per_s();
  CHECK(odb > 1.5 * standard);  // 1.75x at the time of writing
}

TEST_CASE("generated presets match their documented statistics", "[trace]") {
  auto hv = GenerateTrace("high_variance", 20000, 4096, 3);
  REQUIRE(hv.ok());
  const TraceStats st = MeasureTrace(*hv, 256);
  CHECK(st.cv == Approx(1.0).margin(0.05));
  CHECK(st.mean == Approx(700).margin(30));
  CHECK_FALSE(GenerateTrace("nope", 10, 4096, 1).ok());
}

}  // namespace
}  // namespace odb::bench
