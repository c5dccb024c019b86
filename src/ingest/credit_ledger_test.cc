// The credit ledger alone: no sockets, time from a FakeClock.
#include "src/ingest/credit_ledger.h"

#include <catch2/catch.hpp>

namespace odb::ingest {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

CreditRoom Plenty() { return CreditRoom{int64_t{1} << 40, int64_t{1} << 30, int64_t{1} << 40}; }

TEST_CASE("a fresh account is lent one sample and bytes for about one") {
  CreditLedger ledger(64 * kMiB, 1024);
  CreditAccount a;
  CreditRoom room = Plenty();
  const auto grant = ledger.TopUp(a, 1, room);
  REQUIRE(grant);
  CHECK(grant->samples == 1);
  CHECK(grant->bytes == 64 << 10);
  ledger.Grant(a, *grant, room);
  CHECK(ledger.outstanding_samples() == 1);
  CHECK(ledger.outstanding_bytes() == 64 << 10);
  CHECK(room.free_samples == Plenty().free_samples - 1);
  CHECK(CreditLedger::MaySend(a));
  // It holds its window: no top-up until it spends half of it.
  CHECK_FALSE(ledger.TopUp(a, 1, room));
}

TEST_CASE("a charge needs a sample and the bytes; what is charged leaves the totals") {
  FakeClock clock;
  CreditLedger ledger(64 * kMiB, 1024);
  CreditAccount a;
  CHECK_FALSE(ledger.Charge(a, 10, clock.Now()));  // no credit at all
  CreditRoom room = Plenty();
  ledger.Grant(a, *ledger.TopUp(a, 1, room), room);
  CHECK_FALSE(ledger.Charge(a, (64 << 10) + 1, clock.Now()));  // more bytes than held
  CHECK(ledger.outstanding_samples() == 1);
  clock.Advance(std::chrono::milliseconds(5));
  REQUIRE(ledger.Charge(a, 1000, clock.Now()));
  CHECK(a.samples == 0);
  CHECK(a.bytes == (64 << 10) - 1000);
  CHECK(a.largest_sample == 1000);
  CHECK(a.last_sample == clock.Now());
  CHECK(ledger.outstanding_samples() == 0);
  CHECK(ledger.outstanding_bytes() == (64 << 10) - 1000);
  CHECK_FALSE(CreditLedger::MaySend(a));
}

TEST_CASE("released credit returns to the buffer, also credit overdrawn by a too-large sample") {
  FakeClock clock;
  CreditLedger ledger(64 * kMiB, 1024);
  CreditAccount a, b;
  CreditRoom room = Plenty();
  ledger.Grant(a, *ledger.TopUp(a, 2, room), room);
  ledger.Grant(b, *ledger.TopUp(b, 2, room), room);
  CHECK(ledger.outstanding_samples() == 2);
  ledger.Release(a);
  CHECK(a.samples == 0);
  CHECK(a.bytes == 0);
  CHECK(ledger.outstanding_samples() == 1);
  CHECK(ledger.outstanding_bytes() == b.bytes);
  ledger.Release(b);
  CHECK(ledger.outstanding_bytes() == 0);
  CHECK(ledger.outstanding_samples() == 0);
}

TEST_CASE("a producer that sends has its window doubled; one idle for a second falls back to one sample") {
  FakeClock clock;
  CreditLedger ledger(64 * kMiB, 1024);
  CreditAccount a;
  CreditRoom room = Plenty();
  for (int round = 0; round < 4; ++round) {
    const auto grant = ledger.TopUp(a, 1, room);
    REQUIRE(grant);
    ledger.Grant(a, *grant, room);
    while (a.samples > 0) REQUIRE(ledger.Charge(a, 100, clock.Now()));
  }
  const auto grown = ledger.TopUp(a, 1, room);
  REQUIRE(grown);
  CHECK(grown->samples == 16);  // 1, 2, 4, 8 used in full: the window doubled each time
  ledger.Grant(a, *grown, room);
  CreditLedger::NoteIdle(a, clock.Now());
  CHECK(a.window.Samples(1024) == 16);  // not idle yet
  clock.Advance(std::chrono::milliseconds(1001));
  CreditLedger::NoteIdle(a, clock.Now());
  CHECK(a.window.Samples(1024) == 1);
}

TEST_CASE("a grant waits for room; ahead producers are bounded by their half of the buffer") {
  CreditLedger ledger(64 * kMiB, 1024);
  CreditAccount a;
  CreditRoom room{0, 0, 0};
  CHECK_FALSE(ledger.TopUp(a, 1, room));  // the buffer is full
  room = Plenty();
  a.ahead = true;
  room.ahead_bytes = 1000;
  CHECK_FALSE(ledger.TopUp(a, 1, room));
  room.ahead_bytes = 64 << 10;
  const auto grant = ledger.TopUp(a, 1, room);
  REQUIRE(grant);
  ledger.Grant(a, *grant, room);
  CHECK(room.ahead_bytes == 0);
}

TEST_CASE("a credit request for a larger sample is granted up to half the buffer, and then forgotten") {
  CreditLedger ledger(4 * kMiB, 1024);
  CreditAccount a;
  wire::CreditRequest request;
  request.set_bytes(100 * kMiB);
  ledger.NoteRequest(a, request);
  CHECK(a.wanted_bytes == 2 * kMiB);  // at most max_sample_bytes
  CHECK_FALSE(CreditLedger::MaySend(a));
  CreditRoom room = Plenty();
  const auto grant = ledger.TopUp(a, 1, room);
  REQUIRE(grant);
  CHECK(grant->bytes == static_cast<int64_t>(2 * kMiB));
  ledger.Grant(a, *grant, room);
  CHECK(a.wanted_bytes == 0);
  CHECK(CreditLedger::MaySend(a));

  wire::CreditRequest seq;
  seq.set_seq(40);
  seq.set_epoch(3);
  ledger.NoteRequest(a, seq);
  CHECK(a.wanted_seq == 40u);
  CHECK(a.wanted_seq_epoch == 3u);
  CHECK_FALSE(CreditLedger::MaySend(a));  // held at the seq limit
}

TEST_CASE("the byte window is half the buffer shared among producers, within [64 KiB, max sample]") {
  CreditLedger ledger(64 * kMiB, 1024);
  CHECK(ledger.max_sample_bytes() == 32 * kMiB);
  CHECK(ledger.WindowBytes(0) == 32 * kMiB);
  CHECK(ledger.WindowBytes(4) == 8 * kMiB);
  CHECK(ledger.WindowBytes(100000) == 64 << 10);
  CHECK(ledger.ShareSamples(1) == 256);  // buffer.max_samples / 4, capped by the half share (512)
  CHECK(ledger.ShareSamples(1000) == 1);
}

}  // namespace
}  // namespace odb::ingest
