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

TEST_CASE("deterministic order: an unbroken prefix of seqs, a gap holds later samples back") {
  SampleBuffer b(1000, 100);
  auto with_seq = [](uint64_t id, uint64_t seq) {
    Sample s = Make(id, 0, 1);
    s.seq = seq;
    return s;
  };
  CHECK_FALSE(b.Add(with_seq(50, 2)).has_value());
  CHECK_FALSE(b.Add(with_seq(40, 0)).has_value());
  CHECK(b.Frontier(0) == 1);  // seq 1 has not arrived
  auto ids = [](const std::vector<SampleMeta>& v) {
    std::vector<uint64_t> out;
    for (const auto& m : v) out.push_back(m.id);
    return out;
  };
  CHECK(ids(b.PendingInOrder(0, 10, false)) == std::vector<uint64_t>{40});
  CHECK(ids(b.PendingInOrder(0, 10, true)) == std::vector<uint64_t>{40, 50});  // the stream ended: a gap
  CHECK(b.NoteSeq(0, 1));  // seq 1 was rejected: its place is taken, nothing waits for it
  CHECK_FALSE(b.NoteSeq(0, 1));
  CHECK_FALSE(b.NoteSeq(0, 2));
  CHECK(b.Frontier(0) == 3);
  CHECK(ids(b.PendingInOrder(0, 10, false)) == std::vector<uint64_t>{40, 50});
  CHECK(ids(b.PendingInOrder(0, 1, false)) == std::vector<uint64_t>{40});
  b.Take(0, {40});
  CHECK(ids(b.PendingInOrder(0, 10, false)) == std::vector<uint64_t>{50});
  CHECK(b.Frontier(0) == 3);  // taking does not move the frontier back
}

}  // namespace
}  // namespace odb::buffer
