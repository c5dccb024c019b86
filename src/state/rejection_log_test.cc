#include "src/state/rejection_log.h"

#include <catch2/catch.hpp>

namespace odb {
namespace {

wire::Rejection Make(uint64_t id, size_t producer_bytes) {
  wire::Rejection r;
  r.set_code(wire::MALFORMED_HEADER);
  r.set_sample_id(id);
  r.set_has_sample_id(true);
  r.set_producer_id(std::string(producer_bytes, 'p'));
  r.set_message("sample " + std::to_string(id) + " is bad");
  return r;
}

TEST_CASE("a flood of rejections is counted exactly and kept bounded") {
  RejectionLog log(/*max_kept=*/10);
  for (uint64_t i = 0; i < 20000; ++i) log.Record(Make(i, 4096), 0);
  REQUIRE(log.Count(0) == 20000);
  auto unreported = log.TakeUnreported();
  REQUIRE(unreported.size() == 10);
  auto record = log.TakeEpoch(0);
  REQUIRE(record.count == 20000);
  REQUIRE(record.kept.size() == 10);
  // A 4 KiB producer id is cut to the bound (plus a short note).
  REQUIRE(record.kept[0].producer_id().size() < RejectionLog::kMaxProducerIdBytes + 32);
  REQUIRE(record.kept[0].sample_id() == 0);
  REQUIRE(log.Count(0) == 0);
}

TEST_CASE("unreported rejections are bounded even below the per-epoch bound") {
  RejectionLog log;
  for (uint64_t i = 0; i < RejectionLog::kMaxUnreported + 50; ++i) log.Record(Make(i, 8), 3);
  REQUIRE(log.TakeUnreported().size() == RejectionLog::kMaxUnreported);
  REQUIRE(log.TakeUnreported().empty());
  REQUIRE(log.TakeEpoch(3).kept.size() == RejectionLog::kMaxUnreported + 50);
}

}  // namespace
}  // namespace odb
