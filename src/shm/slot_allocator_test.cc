#include "src/shm/slot_allocator.h"

#include <catch2/catch.hpp>
#include <random>
#include <vector>

namespace odb::shm {
namespace {

TEST_CASE("requests are rounded to the alignment and a 0-byte request takes one unit") {
  SlotAllocator a(4096, 64 * 10, 64);
  REQUIRE(a.Allocate(1) == 4096u);
  REQUIRE(a.Allocate(0) == 4096u + 64);
  REQUIRE(a.Allocate(65) == 4096u + 128);
  REQUIRE(a.free_bytes() == 64 * 10 - 64 * 4);
  REQUIRE_FALSE(a.Allocate(64 * 7).has_value());
  REQUIRE(a.Allocate(64 * 6).has_value());
  REQUIRE(a.free_bytes() == 0);
  REQUIRE_FALSE(a.Allocate(0).has_value());
}

TEST_CASE("frees in any order coalesce back to one range") {
  SlotAllocator a(0, 1 << 20, 64);
  std::mt19937_64 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  for (int round = 0; round < 2000; ++round) {
    const uint64_t bytes = 1 + rng() % 20000;
    if (auto off = a.Allocate(bytes)) {
      REQUIRE(*off % 64 == 0);
      live.emplace_back(*off, bytes);
    }
    if (!live.empty() && rng() % 3 == 0) {
      const size_t i = rng() % live.size();
      a.Free(live[i].first, live[i].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  // No two live ranges overlap.
  std::sort(live.begin(), live.end());
  for (size_t i = 1; i < live.size(); ++i) {
    REQUIRE(live[i - 1].first + a.RoundUp(live[i - 1].second) <= live[i].first);
  }
  std::shuffle(live.begin(), live.end(), rng);
  for (auto [off, bytes] : live) a.Free(off, bytes);
  REQUIRE(a.free_bytes() == (1u << 20));
  REQUIRE(a.free_ranges() == 1);
  REQUIRE(a.largest_free() == (1u << 20));
}

TEST_CASE("best fit picks the smallest range that fits, lowest address first") {
  SlotAllocator a(0, 64 * 16, 64);
  const uint64_t x = *a.Allocate(64 * 4);  // [0, 256)
  const uint64_t y = *a.Allocate(64);      // [256, 320)
  const uint64_t z = *a.Allocate(64 * 2);  // [320, 448)
  const uint64_t w = *a.Allocate(64);      // [448, 512)
  (void)y;
  (void)w;
  a.Free(x, 64 * 4);  // free: [0,256) and [512,1024) and [320,448) after next free
  a.Free(z, 64 * 2);
  REQUIRE(a.Allocate(64 * 2) == z);  // the 128-byte hole, not the first or the tail
  REQUIRE(a.Allocate(64 * 3) == x);  // the 256-byte hole beats the 512-byte tail
}

TEST_CASE("Reset frees everything") {
  SlotAllocator a(64, 64 * 8, 64);
  while (a.Allocate(64)) {
  }
  REQUIRE(a.free_bytes() == 0);
  a.Reset();
  REQUIRE(a.free_bytes() == 64 * 8);
  REQUIRE(a.Allocate(64 * 8) == 64u);
}

}  // namespace
}  // namespace odb::shm
