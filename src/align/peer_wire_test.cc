#include "src/align/peer_wire.h"

#include <catch2/catch.hpp>
#include <string>

#include "proto/peer.pb.h"
#include "src/align/hello.h"
#include "src/align/meta_codec.h"

namespace odb::align {
namespace {

std::string Report() {
  peer::FailureReport r;
  r.set_timed_out(true);
  r.set_stopped_ms(4200);
  return EncodePeerMessage(r);
}

TEST_CASE("a peer message ends with its version and round-trips", "[peer_wire]") {
  const std::string bytes = Report();
  REQUIRE(bytes.size() >= 2);
  REQUIRE(bytes[bytes.size() - 2] == 0x78);
  REQUIRE(static_cast<uint8_t>(bytes.back()) == kPeerProtocolVersion);
  peer::FailureReport r;
  REQUIRE(ParsePeerMessage(bytes, "failure report", r).ok());
  REQUIRE(r.timed_out());
  REQUIRE(r.stopped_ms() == 4200);
}

TEST_CASE("the reader refuses truncation, trailing bytes, other versions and garbage, naming each",
          "[peer_wire]") {
  const std::string good = Report();
  peer::FailureReport r;
  const auto message = [&](std::string_view bytes) {
    return std::string(ParsePeerMessage(bytes, "failure report", r).message());
  };
  SECTION("every truncation") {
    for (size_t n = 0; n < good.size(); ++n) {
      const absl::Status s = ParsePeerMessage(good.substr(0, n), "failure report", r);
      REQUIRE(s.code() == absl::StatusCode::kDataLoss);
      REQUIRE(std::string(s.message()).find("failure report: ") == 0);
    }
    REQUIRE(message("").find("no protocol version at its end") != std::string::npos);
  }
  SECTION("bytes after the version") {
    REQUIRE(message(good + std::string("\x08\x01", 2)).find("do not end with its version") !=
            std::string::npos);
  }
  SECTION("another version names both") {
    std::string v9 = good;
    v9.back() = 9;
    const absl::Status s = ParsePeerMessage(v9, "failure report", r);
    REQUIRE(s.code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE(std::string(s.message())
                .find("peer protocol version 9, this build speaks " + std::to_string(kPeerProtocolVersion)) !=
            std::string::npos);
  }
  SECTION("fields this build does not know") {
    // Field 9 (varint 5) before the version: a newer build's message.
    const std::string newer =
        good.substr(0, good.size() - 2) + std::string("\x48\x05", 2) + good.substr(good.size() - 2);
    REQUIRE(message(newer).find("fields this build does not know") != std::string::npos);
  }
  SECTION("garbage") {
    for (std::string_view g : {std::string_view("GET / HTTP/1.1\r\n"), std::string_view("\xff\xff\xff", 3),
                               std::string_view("timeout 0")}) {
      REQUIRE(ParsePeerMessage(g, "failure report", r).code() == absl::StatusCode::kDataLoss);
    }
  }
  SECTION("what each format before peer.proto sent") {
    // The failure report's text, a split colour as 4 raw bytes, an
    // announcement "KEY tcp://...", a round summary's fixed-width fields.
    REQUIRE_FALSE(ParsePeerMessage("error 0", "failure report", r).ok());
    peer::SplitColor c;
    REQUIRE_FALSE(ParsePeerMessage(std::string("\x01\x00\x00\x00", 4), "split color", c).ok());
    peer::ExchangeAnnouncement a;
    REQUIRE_FALSE(ParsePeerMessage("rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7 tcp://10.0.0.1:5000",
                                   "payload-exchange announcement", a)
                      .ok());
    peer::RoundSummary sum;
    REQUIRE_FALSE(ParsePeerMessage(std::string(41, '\0'), "round summary", sum).ok());
  }
}

TEST_CASE("every truncation of every per-round message and split colour is refused, naming it",
          "[peer_wire]") {
  RankSummary summary;
  summary.pending = 512;
  summary.free_slots = 16;
  summary.group_bound = 37.5;
  const std::string sum = EncodeRoundSummary(1, 4321, 7, summary);
  const std::string tot = EncodeRankTotals(1, 4321, 7, {900, 1000}, {3000, 3100});
  peer::SplitColor color;
  color.set_color(3);
  const std::string col = EncodePeerMessage(color);
  uint32_t epoch = 0;
  uint64_t round = 0;
  int32_t rank = 0;
  REQUIRE(DecodeRoundSummary(sum, epoch, round, rank).ok());
  REQUIRE(DecodeRankTotals(tot).ok());
  for (size_t n = 0; n < sum.size(); ++n) {
    const absl::Status s = DecodeRoundSummary(sum.substr(0, n), epoch, round, rank).status();
    REQUIRE(s.code() == absl::StatusCode::kDataLoss);
    REQUIRE(std::string(s.message()).find("round summary") == 0);
  }
  for (size_t n = 0; n < tot.size(); ++n) {
    REQUIRE(std::string(DecodeRankTotals(tot.substr(0, n)).status().message()).find("token totals") == 0);
  }
  for (size_t n = 0; n < col.size(); ++n) {
    peer::SplitColor c;
    REQUIRE(ParsePeerMessage(col.substr(0, n), "split color", c).code() == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("a round message of the codec before peer.proto is refused", "[peer_wire]") {
  // Version 3 of the hand-written metadata codec: u8 3, varint header, one sample.
  const std::string old("\x03\x01\x02\x00\x10\x04\x00\x01\x02\x64\x00\x00\x80\x03\x00", 15);
  REQUIRE_FALSE(DecodeRankRound(old).ok());
}

}  // namespace
}  // namespace odb::align
