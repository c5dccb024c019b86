#include "src/align/hello.h"

#include <catch2/catch.hpp>
#include <thread>

#include "src/align/fake_peer_group.h"
#include "src/align/peer_wire.h"

namespace odb::align {
namespace {

TEST_CASE("matching hellos pass on every rank", "[hello]") {
  FakeWorld world(3);
  LocalPlanner planner{PlannerConfig{}};
  std::vector<absl::Status> s(3);
  std::vector<std::thread> t;
  for (int r = 0; r < 3; ++r) {
    t.emplace_back([&, r] { s[r] = ExchangeHello(*world.Rank(r), AlignmentHelloFields(planner, 3)); });
  }
  for (auto& th : t) th.join();
  for (auto& st : s) REQUIRE(st.ok());
}

TEST_CASE("a mismatch names the rank and field on every rank", "[hello]") {
  PlannerConfig a, b;
  b.mode = EpochMode::kNonJoin;
  b.seed = 9;
  const HelloFields fa = AlignmentHelloFields(LocalPlanner(a), 2);
  const HelloFields fb = AlignmentHelloFields(LocalPlanner(b), 2);
  REQUIRE(HelloFingerprint(fa) != HelloFingerprint(fb));
  absl::Status s = CheckHellos({EncodeHello(0, 2, fa), EncodeHello(1, 2, fb)});
  REQUIRE(s.code() == absl::StatusCode::kFailedPrecondition);
  const std::string msg(s.message());
  REQUIRE(msg.find("rank 1 has mode=first_dry but rank 0 has mode=every_sample") != std::string::npos);
  REQUIRE(msg.find("rank 1 has seed=9 but rank 0 has seed=0") != std::string::npos);
}

TEST_CASE("protocol version, world size and garbage are refused", "[hello]") {
  const HelloFields f = AlignmentHelloFields(LocalPlanner(PlannerConfig{}), 2);
  std::string v9 = EncodeHello(1, 2, f);
  v9[4] = 9;  // the prefix's protocol version
  REQUIRE(std::string(CheckHellos({EncodeHello(0, 2, f), v9}).message())
              .find("speaks peer protocol 9, this rank " + std::to_string(kPeerProtocolVersion)) != std::string::npos);
  REQUIRE(std::string(CheckHellos({EncodeHello(0, 2, f), EncodeHello(1, 3, f)}).message())
              .find("rank 1 has world_size=3") != std::string::npos);
  REQUIRE(std::string(CheckHellos({EncodeHello(0, 2, f), "GET / HTTP/1.1"}).message()).find("no odb hello") !=
          std::string::npos);
}

TEST_CASE("a hello of the hand-written format before peer.proto names both versions", "[hello]") {
  // What odbd sent before proto/peer.proto: "ODBH", u32 version 1, u32 rank,
  // u32 world, u64 fingerprint, u32 field count, then the fields.
  std::string old("ODBH", 4);
  for (uint32_t v : {1u, 1u, 2u}) old += std::string(reinterpret_cast<const char*>(&v), 4);
  old += std::string(12, '\0');
  const HelloFields f = AlignmentHelloFields(LocalPlanner(PlannerConfig{}), 2);
  const std::string msg(CheckHellos({EncodeHello(0, 2, f), old}).message());
  REQUIRE(msg.find("daemons of different odb versions in one job") == 0);
  REQUIRE(msg.find("rank 1 speaks peer protocol 1, this rank " + std::to_string(kPeerProtocolVersion)) !=
          std::string::npos);
}

TEST_CASE("every truncation and every bit flip of a hello is refused or reads as a hello", "[hello]") {
  const HelloFields f = AlignmentHelloFields(LocalPlanner(PlannerConfig{}), 2);
  const std::string good = EncodeHello(1, 2, f);
  const std::string zero = EncodeHello(0, 2, f);
  REQUIRE(CheckHellos({zero, good}).ok());
  for (size_t n = 0; n < good.size(); ++n) {
    const absl::Status s = CheckHellos({zero, good.substr(0, n)});
    REQUIRE(s.code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE(std::string(s.message()).find("rank 1") != std::string::npos);
  }
  REQUIRE_FALSE(CheckHellos({zero, good + "x"}).ok());
  // A flipped bit lands in a value (a field that then differs from rank 0's:
  // refused, naming it) or breaks the message: never accepted.
  for (size_t i = 0; i < good.size() * 8; ++i) {
    std::string b = good;
    b[i / 8] = static_cast<char>(b[i / 8] ^ (1 << (i % 8)));
    INFO("bit " << i);
    REQUIRE_FALSE(CheckHellos({zero, b}).ok());
  }
}

}  // namespace
}  // namespace odb::align
