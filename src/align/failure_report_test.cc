#include "src/align/failure_report.h"

#include <catch2/catch.hpp>
#include <string>

namespace odb::align {
namespace {

TEST_CASE("a failure report round-trips; its text form from before peer.proto is refused",
          "[failure_report]") {
  const std::string bytes = EncodeFailureReport(FailureReport{true, std::chrono::milliseconds(4200)});
  auto report = DecodeFailureReport(bytes);
  REQUIRE(report.ok());
  REQUIRE(report->timed_out);
  REQUIRE(report->stopped == std::chrono::milliseconds(4200));
  auto idle = DecodeFailureReport(EncodeFailureReport(FailureReport{}));
  REQUIRE(idle.ok());
  REQUIRE_FALSE(idle->timed_out);
  REQUIRE(idle->stopped.count() == 0);
  // "<timeout|error> <ms>": what a daemon wrote before (read with atoll, so
  // anything passed as an "error" report).
  for (std::string_view old : {"timeout 4200", "error 0", ""}) {
    auto s = DecodeFailureReport(old).status();
    REQUIRE(s.code() == absl::StatusCode::kDataLoss);
    REQUIRE(std::string(s.message()).find("failure report: ") == 0);
  }
  for (size_t n = 0; n < bytes.size(); ++n) REQUIRE_FALSE(DecodeFailureReport(bytes.substr(0, n)).ok());
}

TEST_CASE("a failure cause round-trips any text; truncation is refused", "[failure_report]") {
  const std::string cause = "rank 3: epoch 2 round 7: a sample of 0 tokens\n\xff";
  const std::string bytes = EncodeFailureCause(cause);
  auto got = DecodeFailureCause(bytes);
  REQUIRE(got.ok());
  REQUIRE(*got == cause);
  for (size_t n = 0; n < bytes.size(); ++n) REQUIRE_FALSE(DecodeFailureCause(bytes.substr(0, n)).ok());
  REQUIRE_FALSE(DecodeFailureCause(cause).ok());  // the raw text a daemon stored before
}

}  // namespace
}  // namespace odb::align
