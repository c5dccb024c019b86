#include "src/shm/completion_queue.h"

#include <catch2/catch.hpp>
#include <memory>
#include <thread>
#include <vector>

namespace odb::shm {
namespace {

struct Ring {
  explicit Ring(uint32_t capacity) : entries(capacity), cq(&header, entries.data(), capacity) {}
  ArenaHeader header{};
  std::vector<CompletionEntry> entries;
  CompletionQueue cq;
};

TEST_CASE("entries come out in order across many wrap-arounds; a full ring refuses") {
  Ring r(4);
  CompletionEntry e;
  REQUIRE(r.cq.TryPop(&e) == CompletionQueue::PopResult::kEmpty);
  uint64_t next_in = 0, next_out = 0;
  for (int round = 0; round < 100; ++round) {
    while (r.cq.TryPush({next_in * 64, next_in, 0, 0})) ++next_in;
    REQUIRE(r.cq.Pending() == 4);
    const int take = 1 + round % 4;
    for (int i = 0; i < take; ++i) {
      REQUIRE(r.cq.TryPop(&e) == CompletionQueue::PopResult::kEntry);
      REQUIRE(e.offset == next_out * 64);
      REQUIRE(e.length == next_out);
      ++next_out;
    }
  }
  r.cq.DiscardAll();
  REQUIRE(r.cq.Pending() == 0);
  REQUIRE(r.cq.TryPop(&e) == CompletionQueue::PopResult::kEmpty);
}

TEST_CASE("a tail behind the head or beyond the capacity is corrupt, nothing is read") {
  Ring r(8);
  CompletionEntry e;
  r.header.cq_head = 100;
  r.header.cq_tail = 99;
  REQUIRE(r.cq.TryPop(&e) == CompletionQueue::PopResult::kCorrupt);
  r.header.cq_tail = 109;
  REQUIRE(r.cq.TryPop(&e) == CompletionQueue::PopResult::kCorrupt);
  REQUIRE(r.header.cq_head == 100);
  r.header.cq_tail = 108;
  REQUIRE(r.cq.TryPop(&e) == CompletionQueue::PopResult::kEntry);
}

TEST_CASE("an empty queue waits out its timeout; the flag is cleared after") {
  Ring r(8);
  REQUIRE_FALSE(r.cq.WaitForEntries(absl::Milliseconds(5)));
  REQUIRE_FALSE(r.cq.writer_waiting());
  REQUIRE(r.cq.TryPush({64, 1, 0, 0}));
  REQUIRE(r.cq.WaitForEntries(absl::Hours(1)));  // pending: returns at once
}

TEST_CASE("a sleeping consumer is woken by every push: 50000 entries through a ring of 16, in order") {
  Ring r(16);
  constexpr uint64_t kCount = 50000;
  std::thread producer([&] {
    for (uint64_t i = 0; i < kCount;) {
      if (r.cq.TryPush({i, i, 7, 0})) ++i;
    }
  });
  uint64_t expected = 0;
  CompletionEntry e;
  while (expected < kCount) {
    const CompletionQueue::PopResult got = r.cq.TryPop(&e);
    if (got == CompletionQueue::PopResult::kEmpty) {
      // A lost wake-up would leave this asleep for the hour and the test
      // would time out.
      r.cq.WaitForEntries(absl::Hours(1));
      continue;
    }
    REQUIRE(got == CompletionQueue::PopResult::kEntry);
    REQUIRE(e.offset == expected);
    REQUIRE(e.epoch == 7);
    ++expected;
  }
  producer.join();
  REQUIRE(r.cq.Pending() == 0);
}

}  // namespace
}  // namespace odb::shm
