#ifndef ODB_GROUPING_SYNTHETIC_LENGTHS_H_
#define ODB_GROUPING_SYNTHETIC_LENGTHS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "src/common/sample.h"

namespace odb::grouping {

// Length distributions seen in LLM training data, for tests and benchmarks.
enum class LengthDistribution {
  kUniform,    // tokens uniform in [1, max_len]
  kLogNormal,  // long tail: median ~max_len/16, clipped to [1, max_len]
  kBimodal,    // 70% short chat turns, 30% long documents
  kShort,      // many short samples, uniform in [1, 64]: the DP's slowest case
  kImageText,  // batching_sim's image_text: 90% one 576-token image plus log-normal
               // text (median 120, sigma 0.8), 10% text only; clipped to max_len
};

const char* DistributionName(LengthDistribution dist);

// A deterministic window of `n` samples (same seed, same window) with tokens in
// [1, max_len]. When max_vision / max_audio are non-zero, about half of the
// samples also carry vision patches / audio frames in [1, max_vision / max_audio].
std::vector<SampleLengths> SyntheticWindow(LengthDistribution dist, size_t n, uint32_t max_len,
                                           uint64_t seed, uint32_t max_vision = 0,
                                           uint32_t max_audio = 0);

}  // namespace odb::grouping

#endif  // ODB_GROUPING_SYNTHETIC_LENGTHS_H_
