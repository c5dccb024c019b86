#include "src/align/hello.h"

#include <catch2/catch.hpp>
#include <thread>

#include "src/align/fake_peer_group.h"

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
  std::string v2 = EncodeHello(1, 2, f);
  v2[4] = 2;  // protocol version byte
  REQUIRE(std::string(CheckHellos({EncodeHello(0, 2, f), v2}).message()).find("protocol 2") != std::string::npos);
  REQUIRE(std::string(CheckHellos({EncodeHello(0, 2, f), EncodeHello(1, 3, f)}).message())
              .find("rank 1 has world_size=3") != std::string::npos);
  REQUIRE(std::string(CheckHellos({EncodeHello(0, 2, f), "GET / HTTP/1.1"}).message()).find("no odb hello") !=
          std::string::npos);
}

}  // namespace
}  // namespace odb::align
