#include "src/exchange/peer_auth.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <thread>
#include <zmq.hpp>

namespace odb::exchange {
namespace {

using Steady = std::chrono::steady_clock;

// Polls `done` until it holds or 10 s pass (a loaded machine is slow, never wrong).
template <typename F>
bool Eventually(F done) {
  const auto deadline = Steady::now() + std::chrono::seconds(10);
  while (!done()) {
    if (Steady::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

std::string RawOf(const std::string& z85) {
  uint8_t raw[32];
  REQUIRE(zmq_z85_decode(raw, z85.c_str()) != nullptr);
  return std::string(reinterpret_cast<const char*>(raw), 32);
}

zmq::socket_t Client(zmq::context_t& ctx, const std::string& endpoint, const std::string& server_key,
                     const CurveKeypair* mine, const std::string& routing_id) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::routing_id, routing_id);
  if (mine != nullptr) {
    s.set(zmq::sockopt::curve_serverkey, server_key);
    s.set(zmq::sockopt::curve_publickey, mine->public_key);
    s.set(zmq::sockopt::curve_secretkey, mine->secret_key);
  }
  s.connect(endpoint);
  return s;
}

TEST_CASE("announcements round-trip and a bad one names its rank") {
  auto a = NewCurveKeypair();
  auto b = NewCurveKeypair();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->public_key != b->public_key);
  std::vector<std::string> gathered = {EncodeAnnouncement({"tcp://10.0.0.1:5000", a->public_key}),
                                       EncodeAnnouncement({"tcp://10.0.0.2:5001", b->public_key})};
  auto decoded = DecodeAnnouncements(gathered);
  REQUIRE(decoded.ok());
  CHECK((*decoded)[1].endpoint == "tcp://10.0.0.2:5001");
  CHECK((*decoded)[1].public_key == b->public_key);

  gathered[1] = "tcp://10.0.0.2:5001";  // an old daemon: no key
  auto old = DecodeAnnouncements(gathered);
  REQUIRE(!old.ok());
  CHECK(old.status().message().find("rank 1") != std::string_view::npos);

  // Every truncation of a good announcement is refused, naming the rank.
  const std::string good = EncodeAnnouncement({"tcp://10.0.0.2:5001", b->public_key});
  for (size_t n = 0; n < good.size(); ++n) {
    gathered[1] = good.substr(0, n);
    auto cut = DecodeAnnouncements(gathered);
    REQUIRE(!cut.ok());
    CHECK(cut.status().message().find("rank 1") != std::string_view::npos);
  }

  gathered[1] = EncodeAnnouncement({"tcp://10.0.0.2:5001", a->public_key});
  auto shared = DecodeAnnouncements(gathered);
  REQUIRE(!shared.ok());
  CHECK(shared.status().message().find("rank 1") != std::string_view::npos);
}

TEST_CASE("the keyring knows the job's peers, not itself, and waits for its keys") {
  auto self = NewCurveKeypair();
  auto peer = NewCurveKeypair();
  auto stranger = NewCurveKeypair();
  FakeClock clock;
  PeerKeyring ring;
  // Before the keys are installed, nobody is known (the deadline passes).
  CHECK(!ring.WaitRankOf(RawOf(peer->public_key), clock, clock.Now()).has_value());
  std::optional<int> waited;
  std::thread waiter([&] {
    waited = ring.WaitRankOf(RawOf(peer->public_key), clock, clock.Now() + std::chrono::seconds(30));
  });
  REQUIRE(ring.Install({self->public_key, peer->public_key}, 0).ok());
  waiter.join();
  CHECK(waited == 1);
  CHECK(!ring.WaitRankOf(RawOf(self->public_key), clock, clock.Now()).has_value());
  CHECK(!ring.WaitRankOf(RawOf(stranger->public_key), clock, clock.Now()).has_value());
  CHECK(!ring.Install({self->public_key, peer->public_key}, 0).ok());  // once only
}

TEST_CASE("a connection waiting for the job's keys gives up when the injected clock passes its deadline") {
  auto peer = NewCurveKeypair();
  FakeClock clock;
  PeerKeyring ring;
  // An hour on the fake clock: only the clock's advance can end the wait.
  const Clock::TimePoint deadline = clock.Now() + std::chrono::hours(1);
  auto waited =
      std::async(std::launch::async, [&] { return ring.WaitRankOf(RawOf(peer->public_key), clock, deadline); });
  struct CloseOnExit {  // a failed check must not leave the waiter an hour to go
    PeerKeyring& ring;
    ~CloseOnExit() { ring.Close(); }
  } close_on_exit{ring};
  clock.Advance(std::chrono::hours(1));
  // Woken by no event: the wait re-reads the clock within kClockRecheck.
  REQUIRE(waited.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(!waited.get().has_value());
}

TEST_CASE("only clients with a peer's key reach a CURVE server, and each carries its rank") {
  zmq::context_t ctx(1);
  auto server_keys = NewCurveKeypair();
  auto peer = NewCurveKeypair();
  auto stranger = NewCurveKeypair();
  PeerKeyring ring;
  SteadyClock steady;
  ZapAuthenticator zap(ctx, ring, "test-domain", std::chrono::seconds(30), steady);
  REQUIRE(zap.Start().ok());
  zmq::socket_t server(ctx, zmq::socket_type::router);
  server.set(zmq::sockopt::linger, 0);
  server.set(zmq::sockopt::curve_server, true);
  server.set(zmq::sockopt::curve_secretkey, server_keys->secret_key);
  server.set(zmq::sockopt::zap_domain, "test-domain");
  server.bind("tcp://127.0.0.1:*");
  const std::string endpoint = server.get(zmq::sockopt::last_endpoint);

  // The peer connects before the keys are known: it is held, then admitted.
  zmq::socket_t good = Client(ctx, endpoint, server_keys->public_key, &*peer, "2");
  REQUIRE(good.send(zmq::str_buffer("from the peer"), zmq::send_flags::none));
  // Strangers: a wrong key, and no CURVE at all (they claim to be rank 2).
  zmq::socket_t wrong = Client(ctx, endpoint, server_keys->public_key, &*stranger, "2");
  zmq::socket_t plain = Client(ctx, endpoint, "", nullptr, "2");
  REQUIRE(wrong.send(zmq::str_buffer("forged"), zmq::send_flags::none));
  REQUIRE(plain.send(zmq::str_buffer("garbage"), zmq::send_flags::none));
  auto rank1 = NewCurveKeypair();
  REQUIRE(ring.Install({server_keys->public_key, rank1->public_key, peer->public_key}, 0).ok());

  zmq::message_t id, body;
  server.set(zmq::sockopt::rcvtimeo, 10000);
  REQUIRE(server.recv(id));
  REQUIRE(server.recv(body));
  CHECK(body.to_string() == "from the peer");
  CHECK(std::string(body.gets("User-Id")) == "2");
  // The wrong key is refused by the authenticator (the plain client already
  // fails the CURVE greeting), and nothing of either ever arrives.
  REQUIRE(Eventually([&] { return zap.refused() >= 1; }));
  REQUIRE(good.send(zmq::str_buffer("second"), zmq::send_flags::none));
  REQUIRE(server.recv(id));
  REQUIRE(server.recv(body));
  CHECK(body.to_string() == "second");
  zmq::message_t extra;
  CHECK(!server.recv(extra, zmq::recv_flags::dontwait).has_value());
  server.close();
  good.close();
  wrong.close();
  plain.close();
  zap.Stop();
}

}  // namespace
}  // namespace odb::exchange
