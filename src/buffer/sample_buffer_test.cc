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
  CHECK(b.NoteSeq(0, 1) == IdSet::Inserted::kNew);  // seq 1 was rejected: its place is taken, nothing waits for it
  CHECK(b.NoteSeq(0, 1) == IdSet::Inserted::kRepeat);
  CHECK(b.NoteSeq(0, 2) == IdSet::Inserted::kRepeat);
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
      // A seq that arrived long ago in this epoch is still a duplicate.
      Sample again = Make(arrival[i], 0, 1);
      again.seq = rng() % seq;
      auto r = b.Add(std::move(again));
      REQUIRE(r.has_value());
      CHECK(r->code() == wire::DUPLICATE_ID);
      ++duplicates;
    }
    most = std::max(most, b.BookkeepingEntries());
  }
  INFO("most entries " << most << ", seq runs at the end " << b.SeqRuns(0));
  CHECK(duplicates > 100);
  // Samples, their order and seq indexes: O(kLag); seqs counting up: one run.
  CHECK(most <= 4 * (kLag + 64) + 1);
  CHECK(b.SeqRuns(0) == 1);
  CHECK(b.SeenRuns(0) == 0);  // samples with a seq are not checked by id
}

// Samples without seq: known by their id, whose runs are one per producer
// when each one's ids count up.
TEST_CASE("without seq, ids counting up per producer keep one run each and a repeat is refused") {
  constexpr int kProducers = 8;
  constexpr uint64_t kPerProducer = 5000;
  std::mt19937_64 rng(5);
  SampleBuffer b(uint64_t{1} << 40, 1 << 20);
  std::vector<uint64_t> next(kProducers, 0);
  for (uint64_t n = 0; n < kProducers * kPerProducer;) {
    const int p = static_cast<int>(rng() % kProducers);
    if (next[p] == kPerProducer) continue;
    const uint64_t id = uint64_t(p) * 1'000'000'000'000 + next[p]++;
    REQUIRE_FALSE(b.Add(Make(id, 0, 1)).has_value());
    REQUIRE(b.TakeOne(0, id).has_value());
    ++n;
  }
  CHECK(b.SeenRuns(0) == kProducers);
  auto r = b.Add(Make(3 * 1'000'000'000'000 + 17, 0, 1));
  REQUIRE(r.has_value());
  CHECK(r->code() == wire::DUPLICATE_ID);
  CHECK_THAT(r->message(), Catch::Contains("without seq"));
}

// What OdbDataLoader sends: a shuffled dataset's indices as ids, their
// positions in the rank's list as seqs. The exactly-once check goes by seq,
// so its memory does not grow with the epoch (keyed by id it was one run per
// id that had no neighbour yet: tens of thousands here).
TEST_CASE("a shuffled epoch of 100,000 ids with seqs counting up keeps bounded bookkeeping") {
  constexpr uint64_t kSamples = 100'000;
  constexpr size_t kLag = 64;
  std::mt19937_64 rng(3);
  std::vector<uint64_t> ids(kSamples);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  SampleBuffer b(uint64_t{1} << 40, 1 << 20);
  std::deque<uint64_t> buffered;
  size_t most = 0, most_runs = 0;
  for (uint64_t seq = 0; seq < kSamples; ++seq) {
    Sample s = Make(ids[seq], 0, 1);
    s.seq = seq;
    REQUIRE_FALSE(b.Add(std::move(s)).has_value());
    buffered.push_back(ids[seq]);
    if (buffered.size() > kLag) {
      REQUIRE(b.TakeOne(0, buffered.front()).has_value());
      buffered.pop_front();
    }
    most = std::max(most, b.BookkeepingEntries());
    most_runs = std::max(most_runs, b.SeqRuns(0) + b.SeenRuns(0));
  }
  INFO("most entries " << most << ", most runs " << most_runs);
  CHECK(most_runs == 1);
  CHECK(most <= 4 * (kLag + 64) + 1);  // O(buffered), independent of kSamples
  CHECK(b.Frontier(0) == kSamples);
}

TEST_CASE("a repeated seq is refused naming it; a repeated id at a new seq is admitted and keyed apart") {
  SampleBuffer b(1000, 100);
  auto at = [](uint64_t id, uint64_t seq) {
    Sample s = Make(id, 0, 1);
    s.seq = seq;
    s.producer_id = "w0";
    return s;
  };
  CHECK_FALSE(b.Add(at(7, 0)).has_value());
  auto r = b.Add(at(8, 0));
  REQUIRE(r.has_value());
  CHECK(r->code() == wire::DUPLICATE_ID);
  CHECK_THAT(r->message(), Catch::Contains("seq 0"));
  // Dataset index 7 again at position 1 (a sampler with replacement), while
  // the first one is still buffered: both are held, under distinct keys.
  CHECK_FALSE(b.Add(at(7, 1)).has_value());
  CHECK_FALSE(b.Add(at(7, 2)).has_value());
  CHECK(b.count() == 3);
  auto pending = b.Pending(0);
  REQUIRE(pending.size() == 3);
  std::set<uint64_t> keys;
  for (const auto& m : pending) {
    keys.insert(m.id);
    CHECK(b.UserIdOf(0, m.id) == std::optional<uint64_t>(7));
  }
  CHECK(keys.size() == 3);
  CHECK(keys.count(7) == 1);  // the first keeps its id as its key
  std::vector<uint64_t> all(keys.begin(), keys.end());
  auto taken = b.Take(0, all);
  REQUIRE(taken.size() == 3);
  for (const Sample& s : taken) CHECK(s.UserId() == 7);
  // Once taken, index 7 at a new position keys as 7 again; its seq is still refused.
  CHECK_FALSE(b.Add(at(7, 3)).has_value());
  // Listed once: the arrival order's stale entries of key 7 do not alias it.
  REQUIRE(b.Pending(0).size() == 1);
  CHECK(b.Pending(0)[0].id == 7);
  CHECK(b.Add(at(7, 1)).has_value());
  CHECK(b.CloseEpoch(0).size() == 1);
  CHECK(b.count() == 0);
}

TEST_CASE("a mixed epoch: samples with seq by seq, without by id, keys unique among those held") {
  SampleBuffer b(1000, 100);
  Sample with = Make(5, 0, 1);
  with.seq = 0;
  CHECK_FALSE(b.Add(std::move(with)).has_value());
  // No seq: id 5 is new among the ids of samples without seq.
  CHECK_FALSE(b.Add(Make(5, 0, 1)).has_value());
  auto r = b.Add(Make(5, 0, 1));  // the same id without seq again: a duplicate
  REQUIRE(r.has_value());
  CHECK(r->code() == wire::DUPLICATE_ID);
  // A new sample whose id is a rekeyed sample's key is keyed apart as well.
  std::set<uint64_t> keys;
  for (const auto& m : b.Pending(0)) keys.insert(m.id);
  REQUIRE(keys.size() == 2);
  const uint64_t rekeyed = *std::find_if(keys.begin(), keys.end(), [](uint64_t k) { return k != 5; });
  Sample clash = Make(rekeyed, 0, 1);
  clash.seq = 1;
  CHECK_FALSE(b.Add(std::move(clash)).has_value());
  keys.clear();
  for (const auto& m : b.Pending(0)) keys.insert(m.id);
  CHECK(keys.size() == 3);
  CHECK(b.UserIdOf(0, *keys.rbegin()).has_value());
}

}  // namespace
}  // namespace odb::buffer

namespace odb::buffer {
namespace {

Sample AtSeq(uint64_t id, uint32_t epoch, std::optional<uint64_t> seq) {
  Sample s = Make(id, epoch, 1);
  s.seq = seq;
  s.producer_id = "hostile";
  return s;
}

// A producer that spreads its seqs apart on purpose (every other position,
// far beyond anything granted, up to 2^64 - 1) makes one run per seq: the
// runs are capped (all epochs together), a seq that would start one more is
// refused (TOO_LARGE, naming the seq and the limit) without being noted, and
// a seq that extends or joins runs is still admitted (it costs nothing).
TEST_CASE("seqs spread apart on purpose reach the run cap: refused naming the seq, memory bounded") {
  constexpr size_t kMaxRuns = 1000;
  SampleBuffer b(uint64_t{1} << 40, 1 << 20, kMaxRuns);
  size_t admitted = 0;
  std::optional<wire::Rejection> first_refusal;
  uint64_t first_refused_seq = 0;
  for (uint64_t seq = 0; seq < 4 * kMaxRuns; seq += 2) {
    auto r = b.Add(AtSeq(seq, 0, seq));
    if (!r) {
      ++admitted;
      REQUIRE(b.TakeOne(0, seq).has_value());  // consumed: only the seq runs stay
      continue;
    }
    REQUIRE(r->code() == wire::TOO_LARGE);
    if (!first_refusal) {
      first_refusal = r;
      first_refused_seq = seq;
    }
  }
  CHECK(admitted == kMaxRuns);
  CHECK(b.SeqRuns(0) == kMaxRuns);
  REQUIRE(first_refusal.has_value());
  CHECK(first_refused_seq == 2 * kMaxRuns);
  CHECK(first_refusal->sample_id() == 2 * kMaxRuns);
  CHECK_THAT(first_refusal->message(), Catch::Contains("seq 2000 ") && Catch::Contains("1000 such separate runs") &&
                                           Catch::Contains("epoch 0") && Catch::Contains("not admitted"));
  // Not noted: the refused seq was not taken.
  CHECK(b.NoteSeq(0, 2 * kMaxRuns) == IdSet::Inserted::kNoRoom);
  // Filling a gap joins two runs: admitted, and it makes room for one more.
  CHECK_FALSE(b.Add(AtSeq(1, 0, 1)).has_value());
  CHECK(b.SeqRuns(0) == kMaxRuns - 1);
  CHECK(b.Frontier(0) == 3);
  // Extending a run never needs room.
  CHECK_FALSE(b.Add(AtSeq(2 * kMaxRuns - 1, 0, 2 * kMaxRuns - 1)).has_value());
  // The room is anyone's: here the largest seq there is.
  CHECK_FALSE(b.Add(AtSeq(7, 0, UINT64_MAX)).has_value());
  CHECK(b.SeqRuns(0) == kMaxRuns);
  // The cap counts every epoch's runs, and ids of samples without seq too.
  auto other = b.Add(AtSeq(9, 1, 5));
  REQUIRE(other.has_value());
  CHECK(other->code() == wire::TOO_LARGE);
  auto no_seq = b.Add(AtSeq(123456, 0, std::nullopt));
  REQUIRE(no_seq.has_value());
  CHECK(no_seq->code() == wire::TOO_LARGE);
  CHECK_THAT(no_seq->message(), Catch::Contains("id 123456") && Catch::Contains("seq=position"));
  // A repeat is still named as a repeat, also at the top of the range.
  auto again = b.Add(AtSeq(8, 0, UINT64_MAX));
  REQUIRE(again.has_value());
  CHECK(again->code() == wire::DUPLICATE_ID);
  CHECK_THAT(again->message(), Catch::Contains("seq 18446744073709551615"));
  CHECK(b.BookkeepingEntries() <= kMaxRuns + 64);
}

// The cap's edges: exactly max_runs separate runs are kept, the next one is
// refused naming its seq / id and the setting that holds the limit; the
// runs of all held epochs count together and a closed epoch's runs free, so
// a refused sample of the next epoch is admitted when sent again.
TEST_CASE("the run cap: exactly max_runs runs, the setting named, a closed epoch's runs free for a retry") {
  constexpr size_t kMaxRuns = 4;
  SampleBuffer b(uint64_t{1} << 40, 1 << 20, kMaxRuns);
  // Epoch 0: seqs 0, 2, 4 (three runs); epoch 1: seq 10 (the fourth, at the cap).
  for (uint64_t seq : {0, 2, 4}) REQUIRE_FALSE(b.Add(AtSeq(seq, 0, seq)).has_value());
  REQUIRE_FALSE(b.Add(AtSeq(10, 1, 10)).has_value());
  CHECK(b.SeqRuns(0) + b.SeqRuns(1) == kMaxRuns);
  // One more run in either epoch (or one more id without seq) is over.
  for (const auto& [epoch, seq] :
       std::vector<std::pair<uint32_t, std::optional<uint64_t>>>{{1, 20}, {0, 8}, {1, std::nullopt}}) {
    const uint64_t id = seq.value_or(777);
    auto r = b.Add(AtSeq(id, epoch, seq));
    INFO("epoch " << epoch << " id " << id);
    REQUIRE(r.has_value());
    CHECK(r->code() == wire::TOO_LARGE);
    CHECK(r->sample_id() == id);
    CHECK_THAT(r->message(), Catch::Contains(seq ? "seq " + std::to_string(*seq) + " " : "id 777 ") &&
                                 Catch::Contains("epoch " + std::to_string(epoch)) &&
                                 Catch::Contains("4 such separate runs") &&
                                 Catch::Contains("raise buffer.max_id_runs"));
  }
  // Extending a run at the cap is admitted: it starts none.
  CHECK_FALSE(b.Add(AtSeq(11, 1, 11)).has_value());
  CHECK(b.SeqRuns(1) == 1);
  // Epoch 0 ends: its three runs free, and epoch 1's refused seq 20 is
  // admitted when its producer sends it again, as are two more runs (cap 4).
  b.CloseEpoch(0);
  CHECK(b.SeqRuns(0) == 0);
  CHECK_FALSE(b.Add(AtSeq(20, 1, 20)).has_value());
  CHECK_FALSE(b.Add(AtSeq(30, 1, 30)).has_value());
  CHECK_FALSE(b.Add(AtSeq(40, 1, 40)).has_value());
  auto over = b.Add(AtSeq(50, 1, 50));
  REQUIRE(over.has_value());
  CHECK(over->code() == wire::TOO_LARGE);
  CHECK(b.SeqRuns(1) == kMaxRuns);
}

// Seqs at the edges of the integer types (2^32 - 1 / 2^32 / 2^32 + 1, 2^64 -
// 2 / 2^64 - 1) are positions like any other: each admitted once, runs merge
// across 2^32 and up to 2^64 - 1 without wrapping, and the frontier (the
// prefix from 0) is not moved by them.
TEST_CASE("seqs near 2^32 and 2^64 are admitted exactly once and merge into runs without wrapping") {
  SampleBuffer b(uint64_t{1} << 40, 1 << 20);
  const uint64_t two32 = uint64_t{1} << 32;
  const std::vector<uint64_t> seqs = {two32 + 1, two32 - 1, UINT64_MAX, two32, UINT64_MAX - 1, 0};
  uint64_t id = 100;
  for (uint64_t seq : seqs) REQUIRE_FALSE(b.Add(AtSeq(id++, 0, seq)).has_value());
  CHECK(b.SeqRuns(0) == 3);  // {0}, {2^32 - 1 .. 2^32 + 1}, {2^64 - 2, 2^64 - 1}
  CHECK(b.Frontier(0) == 1);
  for (uint64_t seq : seqs) {
    auto r = b.Add(AtSeq(id++, 0, seq));
    REQUIRE(r.has_value());
    CHECK(r->code() == wire::DUPLICATE_ID);
    CHECK_THAT(r->message(), Catch::Contains("seq " + std::to_string(seq) + ","));
  }
  // In seq order for a deterministic rank, the top of the range last.
  const auto in_order = b.PendingInOrder(0, SIZE_MAX, /*all_arrived=*/true);
  REQUIRE(in_order.size() == seqs.size());
  CHECK(in_order.front().id == 105);  // seq 0
  CHECK(in_order.back().id == 102);   // seq 2^64 - 1
}

}  // namespace
}  // namespace odb::buffer
