#ifndef ODB_FUZZ_FUZZ_UTIL_H_
#define ODB_FUZZ_FUZZ_UTIL_H_

// Helpers shared by the fuzz targets: splitting one fuzz input into the
// frames of a multipart message, and a check that crashes (so libFuzzer and
// the regression driver both see a failed invariant as a crash).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace odb::fuzz {

// Frame layout of a fuzz input:
//   byte 0: frame count n (n % 17, so 0..16 frames)
//   then n - 1 frames, each a u16 little-endian length (clamped to what is
//   left) followed by that many bytes; the last frame is the rest.
// Every byte string decodes to some frame list, so the mutator never wastes
// inputs; EncodeFrames is the inverse (for seed generators).
inline std::vector<std::string_view> SplitFrames(const uint8_t* data, size_t size) {
  std::vector<std::string_view> frames;
  if (size == 0) return frames;
  const size_t count = data[0] % 17;
  size_t pos = 1;
  for (size_t i = 0; i + 1 < count; ++i) {
    size_t len = 0;
    if (pos < size) len |= data[pos];
    if (pos + 1 < size) len |= static_cast<size_t>(data[pos + 1]) << 8;
    pos = pos + 2 < size ? pos + 2 : size;
    if (len > size - pos) len = size - pos;
    frames.emplace_back(reinterpret_cast<const char*>(data + pos), len);
    pos += len;
  }
  if (count > 0) frames.emplace_back(reinterpret_cast<const char*>(data + pos), size - pos);
  return frames;
}

inline std::string EncodeFrames(const std::vector<std::string>& frames) {
  std::string out(1, static_cast<char>(frames.size()));
  for (size_t i = 0; i < frames.size(); ++i) {
    if (i + 1 < frames.size()) {
      out.push_back(static_cast<char>(frames[i].size() & 0xff));
      out.push_back(static_cast<char>((frames[i].size() >> 8) & 0xff));
    }
    out += frames[i];
  }
  return out;
}

// Touches every byte of [p, p + n) so that ASan reports a view that points
// outside its buffer; returns a value the optimizer cannot drop.
inline uint8_t TouchBytes(const void* p, size_t n) {
  const volatile uint8_t* b = static_cast<const volatile uint8_t*>(p);
  uint8_t acc = 0;
  for (size_t i = 0; i < n; ++i) acc ^= b[i];
  return acc;
}

[[noreturn]] inline void Fail(const char* file, int line, const char* cond, const std::string& what) {
  std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s: %s\n", file, line, cond, what.c_str());
  std::abort();
}

}  // namespace odb::fuzz

#define FUZZ_CHECK(cond, what)                                          \
  do {                                                                  \
    if (!(cond)) ::odb::fuzz::Fail(__FILE__, __LINE__, #cond, (what)); \
  } while (0)

#endif  // ODB_FUZZ_FUZZ_UTIL_H_
