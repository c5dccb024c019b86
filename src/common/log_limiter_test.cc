#include "src/common/log_limiter.h"

#include <catch2/catch.hpp>

namespace odb {
namespace {

TEST_CASE("each kind logs at most its lines per window; the rest are counted, and a new window logs again") {
  FakeClock clock;
  LogLimiter limiter(clock, /*kinds=*/2, "test socket", "odb_test_total", std::chrono::seconds(60),
                     /*lines=*/3);
  for (int i = 0; i < 3; ++i) CHECK(limiter.MayLog(0));
  CHECK_FALSE(limiter.MayLog(0));
  CHECK_FALSE(limiter.MayLog(0));
  CHECK(limiter.skipped(0) == 2);
  // Another kind has a budget of its own.
  CHECK(limiter.MayLog(1));
  CHECK(limiter.skipped(1) == 0);
  // Not yet a new window.
  clock.Advance(std::chrono::seconds(59));
  CHECK_FALSE(limiter.MayLog(0));
  CHECK(limiter.skipped(0) == 3);
  // A new window: the line goes (after the note of the 3 not logged), and the count starts over.
  clock.Advance(std::chrono::seconds(1));
  CHECK(limiter.MayLog(0));
  CHECK(limiter.skipped(0) == 0);
  CHECK(limiter.MayLog(0));
  CHECK(limiter.MayLog(0));
  CHECK_FALSE(limiter.MayLog(0));
}

}  // namespace
}  // namespace odb
