#include "src/common/buffer_pool.h"

#include <catch2/catch.hpp>

#include <thread>

namespace odb {

TEST_CASE("a released buffer is handed out again, empty, without a new allocation") {
  BufferPool pool(/*min_bytes=*/1024, /*max_free_buffers=*/4, /*max_free_bytes=*/1 << 20);
  std::vector<uint8_t> a = pool.Acquire(4096);
  REQUIRE(a.empty());
  REQUIRE(a.capacity() >= 4096);
  a.assign(4096, 7);
  const uint8_t* memory = a.data();
  pool.Release(std::move(a));
  REQUIRE(pool.free_buffers() == 1);
  std::vector<uint8_t> b = pool.Acquire(2000);
  REQUIRE(b.empty());
  REQUIRE(b.data() == memory);
  REQUIRE(pool.free_buffers() == 0);
  REQUIRE(pool.free_bytes() == 0);
}

TEST_CASE("acquire takes the smallest idle buffer that fits and allocates when none does") {
  BufferPool pool(1024, 4, 1 << 20);
  std::vector<uint8_t> small = pool.Acquire(2048), big = pool.Acquire(65536);
  const uint8_t* small_memory = small.data();
  const uint8_t* big_memory = big.data();
  pool.Release(std::move(big));
  pool.Release(std::move(small));
  REQUIRE(pool.Acquire(1500).data() == small_memory);
  std::vector<uint8_t> huge = pool.Acquire(200000);  // nothing fits: a new one
  REQUIRE(huge.capacity() >= 200000);
  REQUIRE(huge.data() != big_memory);
  REQUIRE(pool.free_buffers() == 1);
}

TEST_CASE("small buffers are not pooled and idle memory stays bounded") {
  BufferPool pool(1024, 2, 100000);
  pool.Release(pool.Acquire(100));  // under min_bytes: dropped
  REQUIRE(pool.free_buffers() == 0);
  for (size_t n : {2000, 3000, 4000}) pool.Release(pool.Acquire(n));
  REQUIRE(pool.free_buffers() == 2);  // the smallest went
  REQUIRE(pool.Acquire(1500).capacity() >= 3000);
  pool.Release(pool.Acquire(200000));  // larger than every bound: dropped
  REQUIRE(pool.free_bytes() <= 100000);
}

TEST_CASE("release from another thread, as ZeroMQ's free callback does") {
  BufferPool pool(1024, 8, 1 << 24);
  std::vector<std::vector<uint8_t>> buffers;
  for (int i = 0; i < 8; ++i) buffers.push_back(pool.Acquire(4096));
  std::thread releaser([&] {
    for (auto& b : buffers) pool.Release(std::move(b));
  });
  for (int i = 0; i < 100; ++i) pool.Release(pool.Acquire(4096));
  releaser.join();
  REQUIRE(pool.free_buffers() <= 8);
}

}  // namespace odb
