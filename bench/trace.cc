#include "bench/trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/status/status.h"

namespace odb::bench {

absl::StatusOr<Trace> LoadTrace(const std::string& path, uint32_t max_tokens) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot open trace file " + path);
  Trace trace;
  trace.source = path;
  std::string name = path.substr(path.find_last_of('/') + 1);
  trace.name = name.substr(0, name.find('.'));
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    uint64_t tokens = 0, vision = 0, audio = 0;
    if (!(fields >> tokens)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      return absl::InvalidArgumentError(path + ":" + std::to_string(line_no) +
                                        ": expected 'tokens [vision_patches [audio_frames]]', got '" + line + "'");
    }
    fields >> vision >> audio;
    if (tokens == 0) {
      return absl::InvalidArgumentError(path + ":" + std::to_string(line_no) +
                                        ": a sample of 0 tokens (the daemon rejects these at ingest)");
    }
    if (tokens > max_tokens) {
      tokens = max_tokens;
      ++trace.truncated;
    }
    trace.samples.push_back(SampleLengths{static_cast<uint32_t>(tokens), static_cast<uint32_t>(vision),
                                          static_cast<uint32_t>(audio)});
  }
  if (trace.samples.empty()) return absl::InvalidArgumentError("trace file " + path + " has no samples");
  return trace;
}

absl::Status SaveTrace(const Trace& trace, const std::string& path) {
  std::ofstream out(path);
  if (!out) return absl::InternalError("cannot write " + path);
  out << "# " << trace.name << ": " << trace.source << "\n# tokens vision_patches audio_frames\n";
  for (const SampleLengths& s : trace.samples) {
    out << s.tokens << ' ' << s.vision_patches << ' ' << s.audio_frames << '\n';
  }
  return out ? absl::OkStatus() : absl::InternalError("short write to " + path);
}

namespace {

struct Preset {
  const char* name;
  const char* description;
};

constexpr Preset kPresets[] = {
    {"chat_longtail", "chat text: log-normal, median 350 tokens, sigma 1.0, clipped to [8, L_max]"},
    {"image_text",
     "image+text instructions: 90% one image (576 visual tokens) + log-normal text (median 120, sigma 0.8); "
     "10% text only"},
    {"high_variance", "exponential lengths, mean 700 tokens (CV ~ 1.0), clipped to [1, L_max]"},
    {"production_mix",
     "70% short (uniform 16..255), 25% documents (log-normal median 800, sigma 0.6), 5% long (uniform "
     "2048..L_max)"},
};

uint32_t Clip(double v, uint32_t lo, uint32_t hi, size_t& truncated) {
  if (v > hi) {
    ++truncated;
    return hi;
  }
  return static_cast<uint32_t>(std::max<double>(std::round(v), lo));
}

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

bool IsPreset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return true;
  }
  return false;
}

absl::StatusOr<Trace> GenerateTrace(const std::string& preset, size_t n, uint32_t max_tokens, uint64_t seed) {
  const Preset* found = nullptr;
  for (const Preset& p : kPresets) {
    if (preset == p.name) found = &p;
  }
  if (found == nullptr) return absl::InvalidArgumentError("unknown trace preset '" + preset + "'");
  Trace trace;
  trace.name = found->name;
  trace.source = found->description;
  trace.samples.reserve(n);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const std::string p = preset;
  for (size_t i = 0; i < n; ++i) {
    SampleLengths s;
    if (p == "chat_longtail") {
      std::lognormal_distribution<double> d(std::log(350.0), 1.0);
      s.tokens = Clip(d(rng), 8, max_tokens, trace.truncated);
    } else if (p == "image_text") {
      std::lognormal_distribution<double> text(std::log(120.0), 0.8);
      const bool image = unit(rng) < 0.9;
      s.vision_patches = image ? 576 : 0;
      s.tokens = Clip(text(rng) + s.vision_patches, 4, max_tokens, trace.truncated);
    } else if (p == "high_variance") {
      std::exponential_distribution<double> d(1.0 / 700.0);
      s.tokens = Clip(d(rng), 1, max_tokens, trace.truncated);
    } else {  // production_mix
      const double u = unit(rng);
      if (u < 0.70) {
        s.tokens = std::uniform_int_distribution<uint32_t>(16, 255)(rng);
      } else if (u < 0.95) {
        std::lognormal_distribution<double> d(std::log(800.0), 0.6);
        s.tokens = Clip(d(rng), 1, max_tokens, trace.truncated);
      } else {
        s.tokens = std::uniform_int_distribution<uint32_t>(std::min<uint32_t>(2048, max_tokens), max_tokens)(rng);
      }
    }
    trace.samples.push_back(s);
  }
  return trace;
}

TraceStats MeasureTrace(const Trace& trace, uint32_t short_below) {
  TraceStats st;
  st.n = trace.samples.size();
  if (st.n == 0) return st;
  std::vector<uint32_t> lens;
  lens.reserve(st.n);
  double sum = 0.0, sum_sq = 0.0;
  size_t short_count = 0, vision = 0;
  for (const SampleLengths& s : trace.samples) {
    lens.push_back(s.tokens);
    sum += s.tokens;
    sum_sq += static_cast<double>(s.tokens) * s.tokens;
    short_count += s.tokens < short_below;
    vision += s.vision_patches > 0;
  }
  std::sort(lens.begin(), lens.end());
  st.mean = sum / st.n;
  const double var = std::max(0.0, sum_sq / st.n - st.mean * st.mean);
  st.cv = st.mean > 0 ? std::sqrt(var) / st.mean : 0.0;
  auto q = [&](double f) { return lens[std::min(st.n - 1, static_cast<size_t>(f * st.n))]; };
  st.p50 = q(0.5);
  st.p90 = q(0.9);
  st.p99 = q(0.99);
  st.max = lens.back();
  st.short_fraction = static_cast<double>(short_count) / st.n;
  st.vision_fraction = static_cast<double>(vision) / st.n;
  return st;
}

}  // namespace odb::bench
