#include "src/align/meta_codec.h"

#include <catch2/catch.hpp>

#include "proto/peer.pb.h"
#include "src/align/peer_wire.h"

namespace odb::align {
namespace {

RankRoundMessage Sample() {
  RankRoundMessage msg;
  msg.epoch = 7;
  msg.round = 123456;
  msg.rank = 5;
  msg.data.free_slots = 3;
  msg.data.stream_finished = true;
  msg.data.wait_rounds = 2;
  for (uint64_t id : {10ull, 3ull, 1ull << 40, 11ull}) {
    SampleMeta m;
    m.id = id;
    m.owner_rank = 5;
    m.lengths = {static_cast<uint32_t>(id % 1000 + 1), 7, 0};
    m.payload_bytes = 4096;
    if (id % 2 == 0) m.loss_tokens = static_cast<uint32_t>(id % 3);  // prompt-masked; the others: unknown
    msg.data.pending.push_back(m);
  }
  return msg;
}

TEST_CASE("round trip keeps every field and the order", "[codec]") {
  const RankRoundMessage msg = Sample();
  const std::string bytes = EncodeRankRound(msg);
  auto got = DecodeRankRound(bytes);
  REQUIRE(got.ok());
  REQUIRE(got->epoch == 7);
  REQUIRE(got->round == 123456);
  REQUIRE(got->rank == 5);
  REQUIRE(got->data.free_slots == 3);
  REQUIRE(got->data.stream_finished);
  REQUIRE_FALSE(got->data.wait_expired);
  REQUIRE(got->data.stream_started);
  REQUIRE(got->data.wait_rounds == 2);
  REQUIRE(got->data.pending.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    REQUIRE(got->data.pending[i].id == msg.data.pending[i].id);
    REQUIRE(got->data.pending[i].owner_rank == 5);
    REQUIRE(got->data.pending[i].lengths.tokens == msg.data.pending[i].lengths.tokens);
    REQUIRE(got->data.pending[i].lengths.vision_patches == 7);
    REQUIRE(got->data.pending[i].payload_bytes == 4096);
    REQUIRE(got->data.pending[i].loss_tokens == msg.data.pending[i].loss_tokens);
  }
}

TEST_CASE("every flag travels on its own", "[codec]") {
  for (int bits = 0; bits < 16; ++bits) {
    RankRoundMessage msg = Sample();
    msg.data.stream_finished = (bits & 1) != 0;
    msg.data.wait_expired = (bits & 2) != 0;
    msg.data.stream_started = (bits & 4) != 0;
    msg.data.input_blocked = (bits & 8) != 0;
    auto got = DecodeRankRound(EncodeRankRound(msg));
    REQUIRE(got.ok());
    REQUIRE(got->data.stream_finished == msg.data.stream_finished);
    REQUIRE(got->data.wait_expired == msg.data.wait_expired);
    REQUIRE(got->data.stream_started == msg.data.stream_started);
    REQUIRE(got->data.input_blocked == msg.data.input_blocked);
  }
}

TEST_CASE("compact: a few bytes per sample", "[codec]") {
  RankRoundMessage msg;
  for (uint64_t i = 0; i < 1000; ++i) {
    SampleMeta m;
    m.id = 5000 + i;
    m.lengths.tokens = 100 + static_cast<uint32_t>(i % 4000);
    m.payload_bytes = 2 * m.lengths.tokens;
    msg.data.pending.push_back(m);
  }
  REQUIRE(EncodeRankRound(msg).size() < 1000 * 9);
}

TEST_CASE("decode rejects corrupt input with a specific error", "[codec]") {
  const std::string good = EncodeRankRound(Sample());
  SECTION("version") {
    std::string b = good;
    b.back() = 9;  // the version, the message's last field
    auto s = DecodeRankRound(b).status();
    REQUIRE(s.code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE(std::string(s.message()).find("version 9") != std::string::npos);
  }
  SECTION("every truncation") {
    for (size_t n = 0; n < good.size(); ++n) REQUIRE_FALSE(DecodeRankRound(good.substr(0, n)).ok());
  }
  SECTION("trailing bytes") { REQUIRE_FALSE(DecodeRankRound(good + "x").ok()); }
  SECTION("length 0") {
    RankRoundMessage msg = Sample();
    msg.data.pending[1].lengths.tokens = 0;
    auto s = DecodeRankRound(EncodeRankRound(msg)).status();
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(s.message()).find("sample id 3") != std::string::npos);
  }
  SECTION("duplicate ids") {
    RankRoundMessage msg = Sample();
    msg.data.pending[3].id = 10;
    auto s = DecodeRankRound(EncodeRankRound(msg)).status();
    REQUIRE(std::string(s.message()).find("duplicate sample id 10") != std::string::npos);
  }
  SECTION("columns of different lengths") {
    peer::RankRound p;
    p.add_id_delta(1);
    p.add_id_delta(1);
    p.add_tokens(5);  // one token count for two ids
    auto s = DecodeRankRound(EncodePeerMessage(p)).status();
    REQUIRE(s.code() == absl::StatusCode::kDataLoss);
    REQUIRE(std::string(s.message()).find("columns of different lengths") != std::string::npos);
  }
  SECTION("loss tokens over the tokens") {
    RankRoundMessage msg = Sample();
    msg.data.pending[0].loss_tokens = msg.data.pending[0].lengths.tokens + 1;
    REQUIRE(DecodeRankRound(EncodeRankRound(msg)).status().code() == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("a bit flip is refused or decodes to a message that keeps the invariants", "[codec]") {
  const std::string good = EncodeRankRound(Sample());
  int refused = 0;
  for (size_t i = 0; i < good.size() * 8; ++i) {
    std::string b = good;
    b[i / 8] = static_cast<char>(b[i / 8] ^ (1 << (i % 8)));
    auto got = DecodeRankRound(b);
    if (!got.ok()) {
      ++refused;
      continue;
    }
    // A flip inside a value: still a well-formed round of its rank.
    for (const SampleMeta& m : got->data.pending) {
      REQUIRE(m.owner_rank == got->rank);
      REQUIRE(m.lengths.tokens > 0);
      REQUIRE((m.loss_tokens == kEveryTokenBearsLoss || m.loss_tokens <= m.lengths.tokens));
    }
  }
  REQUIRE(refused > 0);
}

TEST_CASE("token totals round-trip; malformed ones are refused", "[codec]") {
  const std::string bytes = EncodeRankTotals(2, 77, 4, {10, 20, 30}, {100, 200, 300});
  auto t = DecodeRankTotals(bytes);
  REQUIRE(t.ok());
  REQUIRE(t->epoch == 2);
  REQUIRE(t->round == 77);
  REQUIRE(t->rank == 4);
  REQUIRE(t->loss == std::vector<uint64_t>{10, 20, 30});
  REQUIRE(t->real == std::vector<uint64_t>{100, 200, 300});
  REQUIRE(bytes.size() < 20 + 16 * 3);  // varints: smaller than the fixed-width format before peer.proto
  for (size_t n = 0; n < bytes.size(); ++n) REQUIRE_FALSE(DecodeRankTotals(bytes.substr(0, n)).ok());
  REQUIRE_FALSE(DecodeRankTotals(bytes + "x").ok());
  auto uneven = DecodeRankTotals(EncodeRankTotals(2, 77, 4, {10, 20}, {100}));
  REQUIRE(uneven.status().code() == absl::StatusCode::kDataLoss);
  REQUIRE(std::string(uneven.status().message()).find("2 loss counts but 1 real") != std::string::npos);
}

}  // namespace
}  // namespace odb::align
