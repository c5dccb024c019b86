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

#include <algorithm>
#include <deque>
#include <limits>
#include <numeric>
#include <random>
#include <set>

namespace odb::buffer {
namespace {

TEST_CASE("IdSet answers exactly like a set of every id, in any order") {
  std::mt19937_64 rng(7);
  IdSet ids;
  std::set<uint64_t> reference;
  // A shuffled 0..N-1 (a dataset's indices), with repeats, and ids at the ends of the range.
  std::vector<uint64_t> input(5000);
  std::iota(input.begin(), input.end(), 0);
  for (int i = 0; i < 500; ++i) input.push_back(rng() % 5000);  // repeats
  for (uint64_t edge : {uint64_t{0}, std::numeric_limits<uint64_t>::max(), std::numeric_limits<uint64_t>::max() - 1,
                        uint64_t{1} << 63, (uint64_t{1} << 63) - 1}) {
    input.push_back(edge);
  }
  for (int i = 0; i < 500; ++i) input.push_back(rng());  // sparse 64-bit ids
  std::shuffle(input.begin(), input.end(), rng);
  size_t most_runs = 0;
  for (uint64_t id : input) {
    REQUIRE(ids.Insert(id) == reference.insert(id).second);
    most_runs = std::max(most_runs, ids.Runs());
    const uint64_t probe = rng() % 5100;
    REQUIRE(ids.Contains(probe) == (reference.count(probe) > 0));
  }
  for (uint64_t id : reference) REQUIRE(ids.Contains(id));
  REQUIRE(ids.Count() == reference.size());
  // Every one of 0..4999 arrived: one run for them, and one per run of the others.
  size_t reference_runs = 0;
  uint64_t prev = 0;
  bool first = true;
  for (uint64_t id : reference) {
    if (first || id != prev + 1) ++reference_runs;
    prev = id;
    first = false;
  }
  CHECK(ids.Runs() == reference_runs);
  CHECK(ids.Contains(4999));
  CHECK(most_runs < 5000);  // runs merge as the gaps fill
}

// Many producers whose ids count up, arriving interleaved and somewhat out of
// order, each sample taken soon after it arrived: what the buffer keeps must
// stay bounded by what is buffered and out of order, not grow with the epoch.
TEST_CASE("bookkeeping stays bounded while an epoch's samples stream through") {
  constexpr int kProducers = 8;
  constexpr uint64_t kPerProducer = 25000;  // 200,000 samples in the epoch
  constexpr size_t kReorder = 16;           // a sample arrives at most this many places late
  constexpr size_t kLag = 32;               // samples buffered before they are taken
  std::mt19937_64 rng(11);
  // Arrival: producers interleaved at random, each one's ids in order, then shuffled within blocks of kReorder.
  std::vector<uint64_t> next(kProducers, 0);
  std::vector<uint64_t> arrival;
  arrival.reserve(kProducers * kPerProducer);
  while (arrival.size() < kProducers * kPerProducer) {
    const int p = static_cast<int>(rng() % kProducers);
    if (next[p] == kPerProducer) continue;
    arrival.push_back(uint64_t(p) * 1'000'000'000'000 + next[p]++);
  }
  for (size_t i = 0; i + kReorder <= arrival.size(); i += kReorder) {
    std::shuffle(arrival.begin() + i, arrival.begin() + i + kReorder, rng);
  }
  SampleBuffer b(uint64_t{1} << 40, 1 << 20);
  std::deque<uint64_t> buffered;
  size_t most = 0;
  uint64_t seq = 0;
  uint64_t duplicates = 0;
  for (size_t i = 0; i < arrival.size(); ++i) {
    Sample s = Make(arrival[i], 0, 1);
    s.seq = seq++;
    REQUIRE_FALSE(b.Add(std::move(s)).has_value());
    buffered.push_back(arrival[i]);
    if (buffered.size() > kLag) {
      REQUIRE(b.TakeOne(0, buffered.front()).has_value());
      buffered.pop_front();
    }
    if (i % 997 == 0) {
      // An id emitted long ago in this epoch is still a duplicate.
      const uint64_t old = arrival[rng() % (i + 1)];
      auto r = b.Add(Make(old, 0, 1));
      REQUIRE(r.has_value());
      CHECK(r->code() == wire::DUPLICATE_ID);
      ++duplicates;
    }
    most = std::max(most, b.BookkeepingEntries());
  }
  INFO("most entries " << most << ", runs at the end " << b.SeenRuns(0));
  CHECK(duplicates > 100);
  // Samples, their order and seq indexes: O(kLag); seqs ahead of the frontier: O(kReorder);
  // runs: one per producer plus the gaps of samples not yet arrived, O(kProducers * kReorder).
  CHECK(most <= 4 * (kLag + 64) + kReorder + kProducers * (kReorder + 1));
  CHECK(b.SeenRuns(0) == kProducers);
}

}  // namespace
}  // namespace odb::buffer
