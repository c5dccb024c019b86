#ifndef ODB_COMMON_STREAM_COPY_H_
#define ODB_COMMON_STREAM_COPY_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace odb {

// Copies below this size go through memcpy.
inline constexpr size_t kStreamCopyMinBytes = 32 << 10;

// memcpy for bytes that another process reads later, not this core soon: a
// producer's sample into its shared-memory arena, a collated step into the
// trainer's step arena. From kStreamCopyMinBytes up (on x86-64) the stores
// are non-temporal: they go to memory without first reading each destination
// line into the cache and without evicting what the cache holds. glibc's
// memcpy does that only for copies of several MiB; here a 1 MiB copy into a
// 256 MiB arena ran ~1.4x faster (docs/shm.md, "Benchmark"). Ends with a store
// fence, so the bytes are ordered before whatever publishes them (a
// descriptor sent over a socket). Any alignment, any size, n may be 0.
inline void StreamCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kStreamCopyMinBytes) {
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;  // up to 16-byte aligned stores
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, n - i);
    _mm_sfence();
    return;
  }
#endif
  if (n > 0) std::memcpy(dst, src, n);
}

}  // namespace odb

#endif  // ODB_COMMON_STREAM_COPY_H_
