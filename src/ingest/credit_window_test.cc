#include "src/ingest/credit_window.h"

#include <catch2/catch.hpp>

namespace odb::ingest {
namespace {

TEST_CASE("a producer that has not sent is lent one sample; one that sends grows to the cap") {
  CreditWindow w;
  CHECK(w.Samples(1024) == 1);
  int64_t used = 0;
  while (w.Samples(1024) < 1024) {
    const int64_t before = w.Samples(1024);
    for (int64_t i = 0; i < before; ++i) w.OnSampleUsed();
    used += before;
    CHECK(w.Samples(1024) == std::min<int64_t>(2 * before, 1024));
  }
  CHECK(used == 1023);  // 1 + 2 + ... + 512: the full window after ten grants
  w.OnSampleUsed();
  CHECK(w.Samples(8) == 8);  // never above the cap
}

TEST_CASE("a producer that goes quiet is lent one sample again") {
  CreditWindow w;
  for (int i = 0; i < 100; ++i) w.OnSampleUsed();
  CHECK(w.Samples(1024) > 1);
  w.Quiet();
  CHECK(w.Samples(1024) == 1);
}

TEST_CASE("the samples share leaves half the buffer to whoever does not hold credit") {
  CHECK(CreditWindow::Share(4096, 8, 1024) == 256);
  CHECK(CreditWindow::Share(4096, 1, 1024) == 1024);
  CHECK(CreditWindow::Share(4096, 0, 1024) == 1024);
  CHECK(CreditWindow::Share(16, 100, 1024) == 1);  // never 0: every producer can send
  // However many producers said hello, together they are lent at most half of the buffer
  // (while each is lent at least one sample).
  for (uint64_t producers : {1u, 3u, 8u, 64u, 1000u}) {
    CHECK(static_cast<uint64_t>(CreditWindow::Share(65536, producers, 1024)) * producers <= 65536 / 2);
  }
}

}  // namespace
}  // namespace odb::ingest
