#include "src/exchange/payload_exchange.h"

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <zmq.hpp>

#include "src/exchange/peer_auth.h"

namespace odb::exchange {
namespace {

using Steady = std::chrono::steady_clock;

ExchangeOptions RankZeroOfTwo() {
  ExchangeOptions c;
  c.rank = 0;
  c.hostname = "127.0.0.1";
  c.connect_timeout_ms = 30000;
  return c;
}

// Reads the exchange until it reports an error or `done` holds (10 s at most).
absl::Status Pump(PayloadExchange& x, const std::function<bool()>& done) {
  const auto deadline = Steady::now() + std::chrono::seconds(10);
  while (!done() && Steady::now() < deadline) {
    zmq::pollitem_t item{x.socket().handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(20));
    if (absl::Status s = x.OnReadable(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The exchange's public key, as its announcement carries it.
std::string PublicKeyOf(const PayloadExchange& x) {
  auto announced = DecodeAnnouncements({x.Announcement()});
  REQUIRE(announced.ok());
  return (*announced)[0].public_key;
}

// A DEALER to the exchange at `endpoint` that says it is `routing_id` and
// authenticates with `keys` against the exchange's public key.
zmq::socket_t CurveDealer(zmq::context_t& ctx, const char* routing_id, const std::string& server_key,
                          const CurveKeypair& keys, const std::string& endpoint) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::routing_id, routing_id);
  s.set(zmq::sockopt::curve_serverkey, server_key);
  s.set(zmq::sockopt::curve_publickey, keys.public_key);
  s.set(zmq::sockopt::curve_secretkey, keys.secret_key);
  s.connect(endpoint);
  return s;
}

TEST_CASE("outsiders never reach the exchange; a peer's bad frame names the peer") {
  ExchangeOptions options = RankZeroOfTwo();
  DaemonState state(1 << 20, 64, 1);
  DaemonMetrics metrics;
  SteadyClock steady;
  PayloadExchange x(options, state, metrics, steady);
  REQUIRE(x.Bind().ok());
  auto rank1 = NewCurveKeypair();
  REQUIRE(rank1.ok());
  // The job's all-gather: rank 1 listens somewhere nobody answers (this test
  // only receives).
  REQUIRE(x.Connect({x.Announcement(), EncodeAnnouncement({"tcp://127.0.0.1:9", rank1->public_key})}).ok());
  const std::string server_key = PublicKeyOf(x);

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
  REQUIRE(stranger.ok());
  zmq::socket_t forged = CurveDealer(ctx, "1", server_key, *stranger, x.endpoint());
  REQUIRE(forged.send(zmq::str_buffer("garbage"), zmq::send_flags::none));
  REQUIRE(Pump(x, [&] { return x.RefusedConnections() >= 1; }).ok());
  CHECK(x.RefusedConnections() >= 1);

  // The real rank 1 sends a frame that is no sample: the error names rank 1.
  zmq::socket_t peer = CurveDealer(ctx, "1", server_key, *rank1, x.endpoint());
  REQUIRE(peer.send(zmq::str_buffer("not a sample"), zmq::send_flags::none));
  absl::Status s = Pump(x, [] { return false; });
  REQUIRE(!s.ok());
  CHECK(std::string(s.message()).find("rank 1 sent an unreadable sample payload") != std::string::npos);
}

// A dataset index sampled twice (with replacement) whose first copy already
// left its owner's buffer keys the same both times (the key is unique among
// the samples the owner holds): the receiver may hold both copies at once.
// Both are kept and handed out in the order they came (the plans' order);
// the second copy was dropped silently before (a map keyed once), and the
// step that needed it waited until collective_timeout_ms and failed.
TEST_CASE("two copies of one key from a peer are both kept and taken in the order they came") {
  ExchangeOptions options = RankZeroOfTwo();
  DaemonState state(1 << 20, 64, 1);
  DaemonMetrics metrics;
  FakeClock clock;
  PayloadExchange x(options, state, metrics, clock);
  REQUIRE(x.Bind().ok());
  auto rank1 = NewCurveKeypair();
  REQUIRE(rank1.ok());
  REQUIRE(x.Connect({x.Announcement(), EncodeAnnouncement({"tcp://127.0.0.1:9", rank1->public_key})}).ok());
  const std::string server_key = PublicKeyOf(x);
  zmq::context_t ctx(1);
  zmq::socket_t peer = CurveDealer(ctx, "1", server_key, *rank1, x.endpoint());
  // Sample 7 twice, told apart by their lengths (what the plan sized each by).
  for (uint32_t tokens : {3u, 5u}) {
    wire::ProducerMessage m;
    m.set_version(wire::PROTOCOL_VERSION_CURRENT);
    wire::SampleHeader* h = m.mutable_sample();
    h->set_producer_id("w0");
    h->set_sample_id(7);
    h->set_tokens(tokens);
    wire::TensorDesc* t = h->add_tensors();
    t->set_name("input_ids");
    t->set_dtype(wire::INT64);
    t->add_shape(tokens);
    t->set_frame(1);
    const std::vector<int64_t> ids(tokens, 1);
    const std::string header = m.SerializeAsString();
    REQUIRE(peer.send(zmq::buffer(header), zmq::send_flags::sndmore));
    REQUIRE(peer.send(zmq::buffer(ids)));
  }
  REQUIRE(Pump(x, [&] { return x.Parked() >= 2; }).ok());
  REQUIRE(x.Parked() == 2);
  const auto never = [] { return false; };
  for (uint32_t tokens : {3u, 5u}) {
    absl::StatusOr<Sample> s = x.Take(SampleKey{1, 7}, x.PayloadDeadline(), never);
    REQUIRE(s.ok());
    CHECK(s->meta.id == 7);
    CHECK(s->meta.lengths.tokens == tokens);
    CHECK(s->meta.owner_rank == 1);
  }
  CHECK(x.Parked() == 0);
}

// A sample that another rank emits keeps what its producer said about it:
// the trainer names each sample's copy by (owner rank, seq), and weighs its
// loss tokens. The seq (and loss_tokens) were dropped on the way before.
TEST_CASE("a moved sample keeps its seq and its loss tokens") {
  DaemonState state0(1 << 20, 64, 1), state1(1 << 20, 64, 1);
  DaemonMetrics metrics0, metrics1;
  SteadyClock steady;
  ExchangeOptions o0 = RankZeroOfTwo();
  ExchangeOptions o1 = RankZeroOfTwo();
  o1.rank = 1;
  PayloadExchange x0(o0, state0, metrics0, steady), x1(o1, state1, metrics1, steady);
  REQUIRE(x0.Bind().ok());
  REQUIRE(x1.Bind().ok());
  const std::vector<std::string> announcements = {x0.Announcement(), x1.Announcement()};
  REQUIRE(x0.Connect(announcements).ok());
  REQUIRE(x1.Connect(announcements).ok());
  // Rank 1 holds three samples: with a seq and counted loss tokens, a seq
  // only, and neither.
  auto sample = [](uint64_t id, std::optional<uint64_t> seq, uint32_t loss_tokens) {
    static std::vector<std::shared_ptr<std::vector<int64_t>>> keep;
    auto ids = std::make_shared<std::vector<int64_t>>(4, static_cast<int64_t>(id));
    keep.push_back(ids);
    Sample s;
    s.meta.id = id;
    s.meta.lengths.tokens = 4;
    s.meta.loss_tokens = loss_tokens;
    s.meta.payload_bytes = 32;
    s.seq = seq;
    s.producer_id = "w0";
    s.tensors.push_back({"input_ids", DType::kInt64, {4}, reinterpret_cast<const uint8_t*>(ids->data()), 32});
    return s;
  };
  REQUIRE(!state1.buffer.Add(sample(5, 37, 2)));
  REQUIRE(!state1.buffer.Add(sample(6, 0, kEveryTokenBearsLoss)));
  REQUIRE(!state1.buffer.Add(sample(7, std::nullopt, 3)));
  RoundOutcome outcome;
  outcome.outgoing = {{0, {5, 6, 7}}};
  REQUIRE(x1.SendOutgoing(0, outcome).ok());
  REQUIRE(Pump(x0, [&] { return x0.Parked() >= 3; }).ok());
  REQUIRE(x0.Parked() == 3);
  const auto never = [] { return false; };
  absl::StatusOr<Sample> a = x0.Take(SampleKey{1, 5}, x0.PayloadDeadline(), never);
  absl::StatusOr<Sample> b = x0.Take(SampleKey{1, 6}, x0.PayloadDeadline(), never);
  absl::StatusOr<Sample> c = x0.Take(SampleKey{1, 7}, x0.PayloadDeadline(), never);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  CHECK(a->seq == std::optional<uint64_t>(37));
  CHECK(a->meta.loss_tokens == 2);
  CHECK(a->meta.owner_rank == 1);
  CHECK(b->seq == std::optional<uint64_t>(0));
  CHECK(b->meta.loss_tokens == kEveryTokenBearsLoss);
  CHECK_FALSE(c->seq.has_value());
  CHECK(c->meta.loss_tokens == 3);
}

TEST_CASE("a payload that never comes times out when the injected clock passes collective_timeout_ms") {
  // Rank 1 never sends: only the fake clock's advance ends the wait, however
  // long the timeout (no real waiting, no socket needed).
  ExchangeOptions options = RankZeroOfTwo();
  options.collective_timeout_ms = 3600 * 1000;
  DaemonState state(1 << 20, 64, 1);
  DaemonMetrics metrics;
  FakeClock clock;
  PayloadExchange x(options, state, metrics, clock);
  const Clock::TimePoint deadline = x.PayloadDeadline();
  const SampleKey missing{1, 7};

  // One millisecond before the deadline it still waits: a Take that is told
  // to stop on its second look comes back cancelled, not timed out.
  clock.Advance(std::chrono::milliseconds(options.collective_timeout_ms - 1));
  int looks = 0;
  absl::StatusOr<Sample> early = x.Take(missing, deadline, [&] { return ++looks > 1; });
  REQUIRE(!early.ok());
  CHECK(early.status().code() == absl::StatusCode::kCancelled);

  std::atomic<bool> stop{false};
  auto taken = std::async(std::launch::async, [&] { return x.Take(missing, deadline, [&] { return stop.load(); }); });
  struct StopOnExit {  // a failed check must not leave the Take waiting an hour
    std::atomic<bool>& stop;
    PayloadExchange& x;
    ~StopOnExit() {
      stop.store(true);
      x.WakeAll();
    }
  } stop_on_exit{stop, x};
  clock.Advance(std::chrono::milliseconds(1));
  x.WakeAll();
  REQUIRE(taken.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  absl::StatusOr<Sample> late = taken.get();
  REQUIRE(!late.ok());
  CHECK(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(late.status().message()).find("sample 7 from rank 1 did not arrive within 3600000 ms") !=
        std::string::npos);
}

}  // namespace
}  // namespace odb::exchange
