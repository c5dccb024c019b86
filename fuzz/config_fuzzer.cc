// Fuzz target: the config loader (odb::ParseConfig + FinalizeConfig,
// src/daemon/config.h): YAML from users, parsed once at start-up.
//
// Checks: no crash or uncaught exception on any text (yaml-cpp throws; the
// loader must turn that into a Status); an error names what is wrong; and a
// config that FinalizeConfig accepts really is sane: the invariants the rest
// of the daemon relies on (finite coefficients, rank < world, bounded
// strings, at least one ingest endpoint).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "fuzz/fuzz_util.h"
#include "src/daemon/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = odb::ParseConfig(text);
  if (!config.ok()) {
    FUZZ_CHECK(!config.status().message().empty(), "an error without a message");
    return 0;
  }
  const std::map<std::string, std::string> env = {{"RANK", "1"}, {"WORLD_SIZE", "4"}};
  const absl::Status s = odb::FinalizeConfig(*config, env);
  if (!s.ok()) {
    FUZZ_CHECK(s.message().find("config field") != std::string_view::npos ||
                   s.message().find("environment variable") != std::string_view::npos,
               "an error that names no field: " + std::string(s.message()));
    FUZZ_CHECK(s.message().size() < 2048, "an unbounded error message");
    return 0;
  }
  const odb::DaemonConfig& c = *config;
  FUZZ_CHECK(c.rank >= 0 && c.rank < c.world_size, "rank outside the world");
  FUZZ_CHECK(!c.ingest.endpoints.empty(), "no ingest endpoint");
  FUZZ_CHECK(std::isfinite(c.budget.quadratic_q) && c.budget.quadratic_q >= 0, "quadratic_q");
  FUZZ_CHECK(std::isfinite(c.step_time.per_step) && std::isfinite(c.step_time.per_padded_token) &&
                 std::isfinite(c.step_time.per_len_sq),
             "step_time not finite");
  FUZZ_CHECK(c.locality >= 0 && c.locality <= 1, "locality");
  FUZZ_CHECK(std::isfinite(c.encoder_cost_per_patch), "encoder_cost_per_patch");
  FUZZ_CHECK(c.job_id.size() <= 128 && !c.job_id.empty(), "job_id length");
  FUZZ_CHECK(c.window > 0 && c.window <= c.buffer_max_samples, "window");
  for (const auto& f : c.collate.fields) {
    FUZZ_CHECK(!std::isnan(f.pad_value), "NaN pad value accepted");
    FUZZ_CHECK(f.dtype.has_value() || f.pad_value == std::trunc(f.pad_value),
               "non-integer pad value without a dtype");
  }
  odb::DescribeConfig(c);
  return 0;
}
