#include "src/buffer/sample_buffer.h"

#include <catch2/catch.hpp>

namespace odb::buffer {
namespace {

Sample Make(uint64_t id, uint32_t epoch, uint64_t bytes) {
  Sample s;
  s.meta.id = id;
  s.meta.payload_bytes = bytes;
  s.meta.lengths.tokens = 1;
  s.epoch = epoch;
  return s;
}

TEST_CASE("buffer is bounded by bytes and by count, and never evicts") {
  SampleBuffer b(100, 3);
  CHECK_FALSE(b.Add(Make(1, 0, 40)).has_value());
  CHECK_FALSE(b.Full());
  CHECK_FALSE(b.Add(Make(2, 0, 60)).has_value());
  CHECK(b.Full());  // 100 bytes
  CHECK(b.count() == 2);
  auto taken = b.Take(0, {2});
  REQUIRE(taken.size() == 1);
  CHECK(taken[0].meta.id == 2);
  CHECK_FALSE(b.Full());
  CHECK_FALSE(b.Add(Make(3, 0, 1)).has_value());
  CHECK_FALSE(b.Add(Make(4, 1, 1)).has_value());
  CHECK(b.Full());  // 3 samples
  CHECK(b.CountInEpoch(0) == 2);
}

TEST_CASE("duplicate ids are rejected within an epoch, even after being taken") {
  SampleBuffer b(1000, 10);
  CHECK_FALSE(b.Add(Make(7, 0, 1)).has_value());
  b.Take(0, {7});
  auto r = b.Add(Make(7, 0, 1));
  REQUIRE(r.has_value());
  CHECK(r->code() == wire::DUPLICATE_ID);
  CHECK(r->sample_id() == 7);
  CHECK_FALSE(b.Add(Make(7, 1, 1)).has_value());  // another epoch is fine
}

TEST_CASE("pending keeps arrival order and close returns what is left") {
  SampleBuffer b(1000, 100);
  for (uint64_t id : {5, 3, 9, 1}) b.Add(Make(id, 0, 2));
  b.Take(0, {3});
  auto pending = b.Pending(0);
  REQUIRE(pending.size() == 3);
  CHECK(pending[0].id == 5);
  CHECK(pending[1].id == 9);
  CHECK(pending[2].id == 1);
  auto rest = b.CloseEpoch(0);
  CHECK(rest.size() == 3);
  CHECK(b.count() == 0);
  CHECK(b.bytes() == 0);
}

}  // namespace
}  // namespace odb::buffer

namespace odb::buffer {
namespace {

TEST_CASE("pending can be limited to a prefix in arrival order") {
  SampleBuffer b(1000, 100);
  for (uint64_t id = 0; id < 10; ++id) b.Add(Make(id, 0, 1));
  auto head = b.Pending(0, 3);
  REQUIRE(head.size() == 3);
  CHECK(head[0].id == 0);
  CHECK(head[2].id == 2);
  CHECK(b.Pending(0).size() == 10);
}

}  // namespace
}  // namespace odb::buffer
