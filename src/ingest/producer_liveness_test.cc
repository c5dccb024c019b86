// The ingest liveness timers on a FakeClock: no waiting.
#include "src/ingest/producer_liveness.h"

#include <catch2/catch.hpp>

namespace odb::ingest {
namespace {

using std::chrono::milliseconds;

TEST_CASE("producers are silent once nothing was heard for longer than the timeout") {
  FakeClock clock;
  ProducerLiveness l(clock, 500);
  CHECK_FALSE(l.Silent());
  clock.Advance(milliseconds(500));
  CHECK_FALSE(l.Silent());  // exactly the timeout is not past it
  clock.Advance(milliseconds(1));
  CHECK(l.Silent());
  l.NoteHeard();
  CHECK_FALSE(l.Silent());
}

TEST_CASE("a timeout of 0 never makes producers silent") {
  FakeClock clock;
  ProducerLiveness l(clock, 0);
  clock.Advance(milliseconds(1000000));
  CHECK_FALSE(l.Silent());
}

TEST_CASE("a stall is reported once it held for the grace without a break") {
  FakeClock clock;
  ProducerLiveness l(clock, 0);
  CHECK_FALSE(l.Stalled(true));
  clock.Advance(milliseconds(1999));
  CHECK_FALSE(l.Stalled(true));
  CHECK_FALSE(l.Stalled(false));  // a break: the count starts again
  clock.Advance(milliseconds(1));
  CHECK_FALSE(l.Stalled(true));
  clock.Advance(milliseconds(1999));
  CHECK_FALSE(l.Stalled(true));
  clock.Advance(milliseconds(1));
  CHECK(l.Stalled(true));
}

TEST_CASE("quiet connections are probed at most once a second") {
  FakeClock clock;
  ProducerLiveness l(clock, 0);
  CHECK(l.ProbeDue());
  CHECK_FALSE(l.ProbeDue());
  clock.Advance(milliseconds(1000));
  CHECK_FALSE(l.ProbeDue());
  clock.Advance(milliseconds(1));
  CHECK(l.ProbeDue());
  const auto heard = clock.Now();
  clock.Advance(milliseconds(1000));
  CHECK_FALSE(l.Quiet(heard));
  clock.Advance(milliseconds(1));
  CHECK(l.Quiet(heard));
}

TEST_CASE("the silence message names the epoch, the open streams, the silent producers and rejections") {
  SilenceReport r;
  r.timeout_ms = 500;
  r.epoch = 3;
  r.expected = 4;
  r.ended = 1;
  r.open = {"w0", "w1"};
  r.rejected = 7;
  const std::string m = DescribeSilence(r);
  CHECK_THAT(m, Catch::Contains("for 500 ms while epoch 3's input is incomplete: 1 of 4 expected"));
  CHECK_THAT(m, Catch::Contains("open streams (samples sent, no end_stream): w0, w1"));
  CHECK_THAT(m, Catch::Contains("; 1 expected producer(s) sent nothing of epoch 3"));
  CHECK_THAT(m, Catch::Contains("7 input(s) were rejected"));
  CHECK_THAT(m, Catch::Contains("emit.producer_timeout_ms"));
  r.open.clear();
  r.rejected = 0;
  CHECK_THAT(DescribeSilence(r), Catch::Contains("no stream is open; 3 expected"));
  CHECK_THAT(DescribeSilence(r), !Catch::Contains("rejected"));
}

TEST_CASE("the stall message names the seq waited for and the buffer's limits") {
  StallReport r;
  r.rank = 2;
  r.epoch = 1;
  r.frontier = 17;
  r.in_order = 3;
  r.window = 8;
  r.max_bytes = 1 << 20;
  const std::string m = DescribeStall(r);
  CHECK_THAT(
      m, Catch::Contains("rank 2 waits for epoch 1's sample seq 17 (it has 3 samples in order and needs 9)"));
  CHECK_THAT(m, Catch::Contains("buffer.max_bytes 1048576"));
}

}  // namespace
}  // namespace odb::ingest
