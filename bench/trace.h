#ifndef ODB_BENCH_TRACE_H_
#define ODB_BENCH_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/common/sample.h"

namespace odb::bench {

// A length trace: one entry per sample, in arrival order.
struct Trace {
  std::string name;
  std::string source;  // preset description or file path
  std::vector<SampleLengths> samples;
  size_t truncated = 0;  // samples clipped to max_tokens when loaded or generated
};

// Reads a trace file: one sample per line, "tokens [vision_patches [audio_frames]]",
// '#' starts a comment, blank lines are skipped. Samples longer than
// `max_tokens` are clipped to it (trainers truncate to max_seq_len); lines with
// 0 tokens are an error (the daemon rejects them at ingest).
absl::StatusOr<Trace> LoadTrace(const std::string& path, uint32_t max_tokens);

// Writes `trace` in the LoadTrace format.
absl::Status SaveTrace(const Trace& trace, const std::string& path);

// Named generator presets for the regimes of the ODB paper (documented with
// their target statistics in docs/benchmarks.md):
//   chat_longtail   chat text, log-normal long tail
//   image_text      image + text instruction data (576 visual tokens per image)
//   high_variance   exponential lengths, CV ~ 1.0
//   production_mix  many short samples plus a long tail of documents
std::vector<std::string> PresetNames();
bool IsPreset(const std::string& name);
absl::StatusOr<Trace> GenerateTrace(const std::string& preset, size_t n, uint32_t max_tokens,
                                    uint64_t seed);

// Measured statistics of a trace's LLM token lengths.
struct TraceStats {
  size_t n = 0;
  double mean = 0.0;
  double cv = 0.0;  // standard deviation / mean
  uint32_t p50 = 0, p90 = 0, p99 = 0, max = 0;
  double short_fraction = 0.0;  // share of samples with tokens < short_below
  double vision_fraction = 0.0;  // share of samples with vision patches
};

TraceStats MeasureTrace(const Trace& trace, uint32_t short_below);

}  // namespace odb::bench

#endif  // ODB_BENCH_TRACE_H_
