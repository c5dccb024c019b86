#include "src/state/stream_tracker.h"

#include <catch2/catch.hpp>

namespace odb {
namespace {

TEST_CASE("stream ends when every expected producer ended with matching counts") {
  StreamTracker t;
  t.OnHello("a");
  t.OnHello("b");
  CHECK_FALSE(t.OnSample("a", 0, 1).has_value());
  CHECK_FALSE(t.OnSample("b", 0, 2).has_value());
  CHECK_FALSE(t.OnEndStream("a", 0, 1).has_value());
  CHECK_FALSE(t.StreamFinished(0, 2));
  CHECK_FALSE(t.OnEndStream("b", 0, 1).has_value());
  CHECK(t.StreamFinished(0, 2));
  CHECK(t.Received(0) == 2);
}

TEST_CASE("tracker rejects unknown producers, closed epochs and bad counts") {
  StreamTracker t;
  auto r = t.OnSample("ghost", 0, 5);
  REQUIRE(r.has_value());
  CHECK(r->code() == wire::UNKNOWN_PRODUCER);
  CHECK(r->sample_id() == 5);
  t.OnHello("a");
  CHECK_FALSE(t.OnSample("a", 0, 1).has_value());
  auto count = t.OnEndStream("a", 0, 3);
  REQUIRE(count.has_value());
  CHECK(count->code() == wire::COUNT_MISMATCH);
  auto late = t.OnSample("a", 0, 9);
  REQUIRE(late.has_value());
  CHECK(late->code() == wire::WRONG_EPOCH);
  t.CloseEpoch(0);
  auto closed = t.OnSample("a", 0, 10);
  REQUIRE(closed.has_value());
  CHECK(closed->code() == wire::WRONG_EPOCH);
  CHECK_FALSE(t.OnSample("a", 1, 10).has_value());
}

}  // namespace
}  // namespace odb

namespace odb {
namespace {

TEST_CASE("after a Non-Join quota closure late samples are reported as late, not as errors") {
  StreamTracker t;
  t.OnHello("a");
  CHECK_FALSE(t.OnSample("a", 0, 1).has_value());
  t.CloseEpoch(0, /*quota_closed=*/true);
  auto late = t.OnSample("a", 0, 2);
  REQUIRE(late.has_value());
  CHECK(late->code() == wire::LATE_FOR_CLOSED_EPOCH);
  CHECK(late->sample_id() == 2);
  CHECK_FALSE(t.OnEndStream("a", 0, 2).has_value());
}

}  // namespace
}  // namespace odb

namespace odb {
namespace {

TEST_CASE("refused samples count as sent in their stream, within a bound") {
  StreamTracker t;
  t.OnHello("a");
  CHECK_FALSE(t.OnSample("a", 7, 1).has_value());
  t.NoteRefused("a", 7);
  t.NoteRefused("a", 7);
  CHECK(t.Refused("a", 7) == 2);
  CHECK(t.Received(7) == 1);  // refused samples are not received ones
  CHECK_FALSE(t.OnEndStream("a", 7, 3).has_value());
  CHECK(t.Refused("a", 7) == 0);  // the end of stream settled them

  for (size_t i = 0; i < StreamTracker::kMaxRefusedStreams + 10; ++i)
    t.NoteRefused("p" + std::to_string(i), 9);
  CHECK(t.Refused("p0", 9) == 1);
  CHECK(t.Refused("p" + std::to_string(StreamTracker::kMaxRefusedStreams + 5), 9) == 0);
  t.CloseEpoch(9);
  CHECK(t.Refused("p0", 9) == 0);  // closing the epoch forgets its refusals
}

TEST_CASE("the open epoch range covers the epochs anything arrived for") {
  StreamTracker t;
  t.OnHello("a");
  CHECK_FALSE(t.OpenEpochRange().has_value());
  CHECK_FALSE(t.OnSample("a", 5, 1).has_value());
  CHECK(t.OnEndStream("b", 3, 0).has_value());  // unknown producer: rejected, opens nothing
  CHECK_FALSE(t.OnEndStream("a", 8, 0).has_value());
  REQUIRE(t.OpenEpochRange().has_value());
  CHECK(t.OpenEpochRange()->first == 5);
  CHECK(t.OpenEpochRange()->second == 8);
  CHECK(t.OpenEpochsBefore(8) == std::vector<uint32_t>{5});
  t.CloseEpoch(5);
  CHECK(t.OpenEpochRange()->first == 8);
  CHECK(t.OpenEpochsBefore(8).empty());
}

}  // namespace
}  // namespace odb
