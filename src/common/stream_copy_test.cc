// StreamCopy writes exactly the source bytes, whatever the size and the
// alignment of either side (the non-temporal path has an unaligned head and
// a tail), and nothing around the destination.
#include "src/common/stream_copy.h"

#include <catch2/catch.hpp>
#include <random>
#include <vector>

namespace odb {
namespace {

TEST_CASE("StreamCopy copies every byte at every size and alignment, and nothing else") {
  std::mt19937 rng(5);
  const std::vector<size_t> sizes = {0, 1, 15, 16, 63, 64, kStreamCopyMinBytes - 1, kStreamCopyMinBytes,
                                     kStreamCopyMinBytes + 1, kStreamCopyMinBytes + 63, 1 << 20, (1 << 20) + 77};
  for (size_t n : sizes) {
    for (size_t src_off : {0, 1, 7, 16, 33}) {
      for (size_t dst_off : {0, 3, 8, 15, 48}) {
        INFO("n " << n << " src+" << src_off << " dst+" << dst_off);
        std::vector<uint8_t> src(n + 64), dst(n + 128, 0xEE);
        for (auto& b : src) b = static_cast<uint8_t>(rng());
        StreamCopy(dst.data() + dst_off, src.data() + src_off, n);
        REQUIRE(std::equal(src.begin() + static_cast<long>(src_off), src.begin() + static_cast<long>(src_off + n),
                           dst.begin() + static_cast<long>(dst_off)));
        for (size_t k = 0; k < dst_off; ++k) REQUIRE(dst[k] == 0xEE);
        for (size_t k = dst_off + n; k < dst.size(); ++k) REQUIRE(dst[k] == 0xEE);
      }
    }
  }
}

}  // namespace
}  // namespace odb
