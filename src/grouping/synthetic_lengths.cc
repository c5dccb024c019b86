#include "src/grouping/synthetic_lengths.h"

#include <algorithm>
#include <cmath>

namespace odb::grouping {
namespace {

// splitmix64; tests need reproducible windows, not std:: distributions whose
// output differs between standard libraries.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint32_t Between(uint32_t lo, uint32_t hi) {  // [lo, hi]
    return lo + static_cast<uint32_t>(Next() % (static_cast<uint64_t>(hi) - lo + 1));
  }
  double Normal() {  // Box-Muller
    const double u = 1.0 - Uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * Uniform());
  }

 private:
  uint64_t state_;
};

uint32_t Clip(double x, uint32_t max_len) {
  return static_cast<uint32_t>(std::clamp(std::llround(x), 1LL, static_cast<long long>(max_len)));
}

}  // namespace

const char* DistributionName(LengthDistribution dist) {
  switch (dist) {
    case LengthDistribution::kUniform:
      return "uniform";
    case LengthDistribution::kLogNormal:
      return "lognormal";
    case LengthDistribution::kBimodal:
      return "bimodal";
    case LengthDistribution::kShort:
      return "short";
    case LengthDistribution::kImageText:
      return "image_text";
  }
  return "unknown";
}

std::vector<SampleLengths> SyntheticWindow(LengthDistribution dist, size_t n, uint32_t max_len,
                                           uint64_t seed, uint32_t max_vision,
                                           uint32_t max_audio) {
  Rng rng(seed);
  std::vector<SampleLengths> window(n);
  const double l = static_cast<double>(max_len);
  for (SampleLengths& s : window) {
    switch (dist) {
      case LengthDistribution::kUniform:
        s.tokens = rng.Between(1, max_len);
        break;
      case LengthDistribution::kLogNormal:
        s.tokens = Clip(std::exp(std::log(l / 16.0) + 1.0 * rng.Normal()), max_len);
        break;
      case LengthDistribution::kBimodal:
        s.tokens = rng.Uniform() < 0.7 ? Clip(l * (0.02 + 0.04 * rng.Uniform()), max_len)
                                       : Clip(l * (0.4 + 0.6 * rng.Uniform()), max_len);
        break;
      case LengthDistribution::kShort:
        s.tokens = rng.Between(1, std::min<uint32_t>(64, max_len));
        break;
      case LengthDistribution::kImageText: {
        const double image = rng.Uniform() < 0.9 ? 576.0 : 0.0;
        s.tokens = Clip(std::exp(std::log(120.0) + 0.8 * rng.Normal()) + image, max_len);
        break;
      }
    }
    if (max_vision != 0 && rng.Uniform() < 0.5) s.vision_patches = rng.Between(1, max_vision);
    if (max_audio != 0 && rng.Uniform() < 0.5) s.audio_frames = rng.Between(1, max_audio);
  }
  return window;
}

}  // namespace odb::grouping
