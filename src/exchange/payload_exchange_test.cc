#include "src/exchange/payload_exchange.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <zmq.hpp>

#include "src/exchange/peer_auth.h"

namespace odb::exchange {
namespace {

using Clock = std::chrono::steady_clock;

ExchangeOptions RankZeroOfTwo() {
  ExchangeOptions c;
  c.rank = 0;
  c.hostname = "127.0.0.1";
  c.connect_timeout_ms = 30000;
  return c;
}

// Reads the exchange until it reports an error or `done` holds (10 s at most).
absl::Status Pump(PayloadExchange& x, const std::function<bool()>& done) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!done() && Clock::now() < deadline) {
    zmq::pollitem_t item{x.socket().handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(20));
    if (absl::Status s = x.OnReadable(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

TEST_CASE("outsiders never reach the exchange; a peer's bad frame names the peer") {
  ExchangeOptions options = RankZeroOfTwo();
  DaemonState state(1 << 20, 64, 1);
  DaemonMetrics metrics;
  PayloadExchange x(options, state, metrics);
  REQUIRE(x.Bind().ok());
  auto rank1 = NewCurveKeypair();
  REQUIRE(rank1.ok());
  // The job's all-gather: rank 1 listens somewhere nobody answers (this test
  // only receives).
  REQUIRE(x.Connect({x.Announcement(), EncodeAnnouncement({"tcp://127.0.0.1:9", rank1->public_key})}).ok());
  const std::string server_key = x.Announcement().substr(0, 40);

  zmq::context_t ctx(1);
  // An outsider without a key, claiming to be rank 0 and rank 1, sends garbage.
  for (const char* claimed : {"0", "1"}) {
    zmq::socket_t outsider(ctx, zmq::socket_type::dealer);
    outsider.set(zmq::sockopt::linger, 0);
    outsider.set(zmq::sockopt::routing_id, claimed);
    outsider.connect(x.endpoint());
    for (int i = 0; i < 20; ++i) REQUIRE(outsider.send(zmq::str_buffer("garbage"), zmq::send_flags::none));
  }
  // An outsider with a key of its own (not announced) sends garbage too.
  auto stranger = NewCurveKeypair();
  zmq::socket_t forged(ctx, zmq::socket_type::dealer);
  forged.set(zmq::sockopt::linger, 0);
  forged.set(zmq::sockopt::routing_id, "1");
  forged.set(zmq::sockopt::curve_serverkey, server_key);
  forged.set(zmq::sockopt::curve_publickey, stranger->public_key);
  forged.set(zmq::sockopt::curve_secretkey, stranger->secret_key);
  forged.connect(x.endpoint());
  REQUIRE(forged.send(zmq::str_buffer("garbage"), zmq::send_flags::none));
  REQUIRE(Pump(x, [&] { return x.RefusedConnections() >= 1; }).ok());
  CHECK(x.RefusedConnections() >= 1);

  // The real rank 1 sends a frame that is no sample: the error names rank 1.
  zmq::socket_t peer(ctx, zmq::socket_type::dealer);
  peer.set(zmq::sockopt::linger, 0);
  peer.set(zmq::sockopt::routing_id, "1");
  peer.set(zmq::sockopt::curve_serverkey, server_key);
  peer.set(zmq::sockopt::curve_publickey, rank1->public_key);
  peer.set(zmq::sockopt::curve_secretkey, rank1->secret_key);
  peer.connect(x.endpoint());
  REQUIRE(peer.send(zmq::str_buffer("not a sample"), zmq::send_flags::none));
  absl::Status s = Pump(x, [] { return false; });
  REQUIRE(!s.ok());
  CHECK(std::string(s.message()).find("rank 1 sent an unreadable sample payload") != std::string::npos);
}

}  // namespace
}  // namespace odb::exchange
