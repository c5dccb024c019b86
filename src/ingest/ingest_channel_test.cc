// The ingest channel driven by hand over inproc sockets: an inproc send is in
// the channel's queue when it returns, so what one OnReadable burst holds is
// decided by the test, not by timing.
#include "src/ingest/ingest_channel.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <optional>
#include <string>
#include <vector>

namespace odb::ingest {
namespace {

// Refuses every block, naming the producer the channel attributed it to.
class NamingArenaSource : public ArenaBlockSource {
 public:
  absl::StatusOr<Acquired> Acquire(std::string_view producer_id, const wire::ArenaBlock& block) override {
    seen.emplace_back(producer_id);
    return absl::InvalidArgumentError("block of arena " + std::to_string(block.arena_id()) +
                                      " attributed to producer '" + std::string(producer_id) + "'");
  }
  std::vector<std::string> seen;
};

std::string Serialize(const wire::ProducerMessage& m) { return m.SerializeAsString(); }

wire::ProducerMessage Hello(const std::string& id) {
  wire::ProducerMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  m.mutable_hello()->set_producer_id(id);
  return m;
}

// A sample of 8 int64 tokens ("input_ids"); where its bytes are is the caller's.
wire::ProducerMessage TokensSample(const std::string& id, uint64_t sample_id, wire::TensorDesc** tokens) {
  wire::ProducerMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  wire::SampleHeader* s = m.mutable_sample();
  s->set_producer_id(id);
  s->set_sample_id(sample_id);
  s->set_tokens(8);
  *tokens = s->add_tensors();
  (*tokens)->set_name("input_ids");
  (*tokens)->set_dtype(wire::INT64);
  (*tokens)->add_shape(8);
  return m;
}

wire::ProducerMessage ArenaSample(const std::string& id, uint64_t sample_id) {
  wire::TensorDesc* t = nullptr;
  wire::ProducerMessage m = TokensSample(id, sample_id, &t);
  t->set_offset(1 << 20);
  t->set_length(64);
  m.mutable_sample()->mutable_arena()->set_arena_id(7);
  m.mutable_sample()->mutable_arena()->set_offset(1 << 20);
  m.mutable_sample()->mutable_arena()->set_length(64);
  return m;
}

TEST_CASE("a sample right behind its hello in one burst is decoded as that connection's producer") {
  zmq::context_t context;
  IngestOptions options;
  options.endpoints = {"inproc://ingest-channel-test"};
  options.buffer_max_bytes = 64 << 20;
  options.buffer_max_samples = 1024;
  DaemonState state(options.buffer_max_bytes, options.buffer_max_samples, 1);
  DaemonMetrics metrics;
  FakeClock clock;
  IngestChannel channel(context, options, state, metrics, clock);
  NamingArenaSource arenas;
  channel.SetArenaSource(&arenas);
  REQUIRE(channel.Bind().ok());

  zmq::socket_t producer(context, zmq::socket_type::dealer);
  producer.set(zmq::sockopt::linger, 0);
  producer.connect("inproc://ingest-channel-test");
  REQUIRE(producer.send(zmq::buffer(Serialize(Hello("p")))));
  REQUIRE(producer.send(zmq::buffer(Serialize(ArenaSample("p", 41)))));
  channel.OnReadable(0);  // both messages in one burst

  REQUIRE(arenas.seen == std::vector<std::string>{"p"});
  std::vector<wire::Rejection> rejections;
  {
    MutexLock lock(state.mu);
    rejections = state.rejections.TakeUnreported();
  }
  REQUIRE(rejections.size() == 1);
  CHECK(rejections[0].code() == wire::INVALID_ARENA_BLOCK);
  CHECK(rejections[0].message().find("attributed to producer 'p'") != std::string::npos);
}

// A frames sample: the header, and input_ids (8 int64) in frame 1.
void SendFramesSample(zmq::socket_t& producer, const std::string& id, uint64_t sample_id) {
  wire::TensorDesc* t = nullptr;
  wire::ProducerMessage m = TokensSample(id, sample_id, &t);
  t->set_frame(1);
  const std::vector<int64_t> tokens(8, static_cast<int64_t>(sample_id));
  REQUIRE(producer.send(zmq::buffer(Serialize(m)), zmq::send_flags::sndmore));
  REQUIRE(producer.send(zmq::buffer(tokens)));
}

// The credit grants waiting for the producer (samples granted in each).
std::vector<uint32_t> CreditsReceived(zmq::socket_t& producer) {
  std::vector<uint32_t> grants;
  zmq::message_t msg;
  while (producer.recv(msg, zmq::recv_flags::dontwait)) {
    wire::IngestReply reply;
    REQUIRE(reply.ParseFromArray(msg.data(), static_cast<int>(msg.size())));
    if (reply.has_credit() && reply.credit().samples() > 0) grants.push_back(reply.credit().samples());
  }
  return grants;
}

TEST_CASE("credit is lent as the producer sends, and topped up once half of it is spent") {
  zmq::context_t context;
  IngestOptions options;
  options.endpoints = {"inproc://ingest-credit-test"};
  options.buffer_max_bytes = 64 << 20;
  options.buffer_max_samples = 400;  // a full window of 100 samples of credit
  DaemonState state(options.buffer_max_bytes, options.buffer_max_samples, 1);
  DaemonMetrics metrics;
  FakeClock clock;
  IngestChannel channel(context, options, state, metrics, clock);
  REQUIRE(channel.Bind().ok());
  zmq::socket_t producer(context, zmq::socket_type::dealer);
  producer.set(zmq::sockopt::linger, 0);
  producer.connect("inproc://ingest-credit-test");
  REQUIRE(producer.send(zmq::buffer(Serialize(Hello("p")))));
  channel.OnReadable(0);
  // A producer that has not sent anything is lent one sample.
  REQUIRE(CreditsReceived(producer) == std::vector<uint32_t>{1});
  int64_t held = 1;
  uint64_t id = 0;
  // While it sends, its window doubles up to the full one (never more).
  while (held < 100) {
    REQUIRE(id < 400);
    SendFramesSample(producer, "p", ++id);
    --held;
    channel.OnReadable(0);
    for (uint32_t g : CreditsReceived(producer)) held += g;
    REQUIRE(held <= 100);
    REQUIRE(held > 0);
  }
  CHECK(id < 200);  // a few doublings, not one sample at a time
  // 49 samples, one burst each: half the window is not spent yet, no credit message.
  for (int i = 0; i < 49; ++i) {
    SendFramesSample(producer, "p", ++id);
    channel.OnReadable(0);
  }
  CHECK(CreditsReceived(producer).empty());
  // The 50th spends half: one grant brings the producer back to the full window.
  SendFramesSample(producer, "p", ++id);
  channel.OnReadable(0);
  CHECK(CreditsReceived(producer) == std::vector<uint32_t>{50});
}


// Exactly once per position, in the default (arrival-order) mode too: a
// sample with a seq is known by it, so a dataset index repeated at another
// position (a sampler with replacement) is admitted, a repeated seq refused.
TEST_CASE("samples with a seq are admitted once per seq, whatever their ids; without seq, once per id") {
  zmq::context_t context;
  IngestOptions options;
  options.endpoints = {"inproc://ingest-seq-test"};
  options.buffer_max_bytes = 64 << 20;
  options.buffer_max_samples = 400;
  DaemonState state(options.buffer_max_bytes, options.buffer_max_samples, 1);
  DaemonMetrics metrics;
  FakeClock clock;
  IngestChannel channel(context, options, state, metrics, clock);
  REQUIRE(channel.Bind().ok());
  zmq::socket_t producer(context, zmq::socket_type::dealer);
  producer.set(zmq::sockopt::linger, 0);
  producer.connect("inproc://ingest-seq-test");
  REQUIRE(producer.send(zmq::buffer(Serialize(Hello("p")))));
  channel.OnReadable(0);
  int64_t held = 0;
  for (uint32_t g : CreditsReceived(producer)) held += g;
  auto send = [&](uint64_t sample_id, std::optional<uint64_t> seq, std::optional<uint64_t> daemon_key) {
    REQUIRE(held > 0);
    wire::TensorDesc* t = nullptr;
    wire::ProducerMessage m = TokensSample("p", sample_id, &t);
    t->set_frame(1);
    if (seq) m.mutable_sample()->set_seq(*seq);
    if (daemon_key) m.mutable_sample()->set_daemon_key(*daemon_key);
    const std::vector<int64_t> tokens(8, 1);
    REQUIRE(producer.send(zmq::buffer(Serialize(m)), zmq::send_flags::sndmore));
    REQUIRE(producer.send(zmq::buffer(tokens)));
    --held;
    channel.OnReadable(0);
    for (uint32_t g : CreditsReceived(producer)) held += g;
  };
  send(3, 0, std::nullopt);
  send(3, 1, std::nullopt);  // index 3 again at position 1: admitted
  send(4, 1, std::nullopt);  // position 1 again: refused
  send(9, std::nullopt, std::nullopt);
  send(9, std::nullopt, std::nullopt);  // no seq: known by id, refused
  send(5, 2, 77);            // daemon_key is not a producer's to set
  std::vector<wire::Rejection> rejections;
  std::vector<uint64_t> user_ids;
  {
    MutexLock lock(state.mu);
    rejections = state.rejections.TakeUnreported();
    CHECK(state.buffer.CountInEpoch(0) == 3);
    for (const SampleMeta& m : state.buffer.Pending(0)) user_ids.push_back(*state.buffer.UserIdOf(0, m.id));
  }
  CHECK(user_ids == std::vector<uint64_t>{3, 3, 9});
  REQUIRE(rejections.size() == 3);
  CHECK(rejections[0].code() == wire::DUPLICATE_ID);
  CHECK(rejections[0].sample_id() == 4);
  CHECK_THAT(rejections[0].message(), Catch::Contains("seq 1"));
  CHECK(rejections[1].code() == wire::DUPLICATE_ID);
  CHECK(rejections[1].sample_id() == 9);
  CHECK(rejections[2].code() == wire::MALFORMED_HEADER);
  CHECK_THAT(rejections[2].message(), Catch::Contains("daemon_key"));
  CHECK(rejections[2].sample_id() == 5);
}

// Hands out a block of its own memory for any arena block, and counts the
// blocks handed back (their holders dropped).
class CountingArenaSource : public ArenaBlockSource {
 public:
  struct Holder : FrameHolder {
    explicit Holder(int* returned) : returned(returned) {}
    ~Holder() override { ++*returned; }
    int* returned;
  };
  absl::StatusOr<Acquired> Acquire(std::string_view, const wire::ArenaBlock&) override {
    ++acquired;
    return Acquired{bytes.data(), std::make_shared<Holder>(&returned)};
  }
  std::vector<uint8_t> bytes = std::vector<uint8_t>(64, 1);
  int acquired = 0;
  int returned = 0;
};

// A producer setting daemon_key, on every path a producer's sample takes:
// frames sent before any credit (the CREDIT_EXCEEDED path used to name the
// sample by the key, 77, not its id) and an arena sample (its block is
// handed back). Each is refused naming its own sample_id, counted in its
// stream, and the channel keeps serving the next sample.
TEST_CASE("a producer's daemon_key is refused naming the sample id on the frames and the arena path") {
  zmq::context_t context;
  IngestOptions options;
  options.endpoints = {"inproc://ingest-daemon-key-test"};
  options.buffer_max_bytes = 64 << 20;
  options.buffer_max_samples = 1024;
  DaemonState state(options.buffer_max_bytes, options.buffer_max_samples, 1);
  DaemonMetrics metrics;
  FakeClock clock;
  IngestChannel channel(context, options, state, metrics, clock);
  CountingArenaSource arenas;
  channel.SetArenaSource(&arenas);
  REQUIRE(channel.Bind().ok());
  zmq::socket_t producer(context, zmq::socket_type::dealer);
  producer.set(zmq::sockopt::linger, 0);
  producer.connect("inproc://ingest-daemon-key-test");
  // Hello and a frames sample in one burst: no credit granted yet.
  REQUIRE(producer.send(zmq::buffer(Serialize(Hello("p")))));
  {
    wire::TensorDesc* t = nullptr;
    wire::ProducerMessage m = TokensSample("p", 5, &t);
    t->set_frame(1);
    m.mutable_sample()->set_daemon_key(77);
    const std::vector<int64_t> tokens(8, 1);
    REQUIRE(producer.send(zmq::buffer(Serialize(m)), zmq::send_flags::sndmore));
    REQUIRE(producer.send(zmq::buffer(tokens)));
  }
  channel.OnReadable(0);
  REQUIRE_FALSE(CreditsReceived(producer).empty());
  wire::ProducerMessage arena = ArenaSample("p", 6);
  arena.mutable_sample()->mutable_tensors(0)->set_offset(0);
  arena.mutable_sample()->mutable_arena()->set_offset(0);
  arena.mutable_sample()->set_daemon_key(78);
  REQUIRE(producer.send(zmq::buffer(Serialize(arena))));
  channel.OnReadable(0);
  REQUIRE_FALSE(CreditsReceived(producer).empty());
  SendFramesSample(producer, "p", 8);  // an honest one after them, with credit
  channel.OnReadable(0);
  std::vector<wire::Rejection> rejections;
  {
    MutexLock lock(state.mu);
    rejections = state.rejections.TakeUnreported();
    CHECK(state.buffer.CountInEpoch(0) == 1);
    CHECK(state.tracker.Received(0) == 3);  // all three counted in the stream
  }
  REQUIRE(rejections.size() == 2);
  CHECK(rejections[0].sample_id() == 5);
  CHECK_THAT(rejections[0].message(), Catch::Contains("sample 5 ") && Catch::Contains("daemon_key"));
  CHECK(rejections[1].sample_id() == 6);
  CHECK(rejections[1].code() == wire::MALFORMED_HEADER);
  CHECK_THAT(rejections[1].message(), Catch::Contains("daemon_key"));
  CHECK(arenas.acquired == 1);
  CHECK(arenas.returned == 1);  // the refused arena sample's block went back
}

// alignment.deterministic: a producer that ignores its seq limit (the
// frontier + the window): a seq past it is refused (CREDIT_EXCEEDED, naming
// the seq and the limit) and not noted (it neither sits in the buffer taking
// the frontier's room nor starts a run); a rejected sample's seq past the
// limit is not noted either; within it, a rejected sample's place is taken.
// The channel keeps serving.
TEST_CASE("alignment.deterministic: a seq past the granted window is refused naming it, not buffered, not noted") {
  zmq::context_t context;
  IngestOptions options;
  options.endpoints = {"inproc://ingest-seq-window-test"};
  options.buffer_max_bytes = 64 << 20;
  options.buffer_max_samples = 400;
  options.deterministic = true;
  options.window = 8;
  DaemonState state(options.buffer_max_bytes, options.buffer_max_samples, 1);
  DaemonMetrics metrics;
  FakeClock clock;
  IngestChannel channel(context, options, state, metrics, clock);
  REQUIRE(channel.Bind().ok());
  zmq::socket_t producer(context, zmq::socket_type::dealer);
  producer.set(zmq::sockopt::linger, 0);
  producer.connect("inproc://ingest-seq-window-test");
  REQUIRE(producer.send(zmq::buffer(Serialize(Hello("p")))));
  channel.OnReadable(0);
  int64_t held = 0;
  for (uint32_t g : CreditsReceived(producer)) held += g;
  auto send = [&](uint64_t sample_id, uint64_t seq, uint64_t tokens = 8) {
    REQUIRE(held > 0);
    wire::TensorDesc* t = nullptr;
    wire::ProducerMessage m = TokensSample("p", sample_id, &t);
    t->set_frame(1);
    m.mutable_sample()->set_seq(seq);
    m.mutable_sample()->set_tokens(tokens);  // 0: refused by the decoder (ZERO_LENGTH)
    const std::vector<int64_t> payload(8, 1);
    REQUIRE(producer.send(zmq::buffer(Serialize(m)), zmq::send_flags::sndmore));
    REQUIRE(producer.send(zmq::buffer(payload)));
    --held;
    channel.OnReadable(0);
    for (uint32_t g : CreditsReceived(producer)) held += g;
  };
  for (uint64_t seq = 0; seq < 4; ++seq) send(seq, seq);
  send(100, 12);          // frontier 4 + window 8: the first seq not granted
  send(101, UINT64_MAX);  // the largest there is
  send(102, 5000, 0);     // a rejected sample far ahead: not noted
  send(103, 5, 0);        // a rejected sample within the window: its place is taken
  send(104, 11);          // the last granted seq: admitted
  send(105, 4);           // the daemon keeps serving: the frontier moves on
  std::vector<wire::Rejection> rejections;
  {
    MutexLock lock(state.mu);
    rejections = state.rejections.TakeUnreported();
    CHECK(state.buffer.CountInEpoch(0) == 6);
    CHECK(state.buffer.Frontier(0) == 6);
    CHECK(state.buffer.SeqRuns(0) == 2);  // [0, 6) and {11}
    CHECK(state.tracker.Received(0) == 10);
  }
  REQUIRE(rejections.size() == 4);
  CHECK(rejections[0].code() == wire::CREDIT_EXCEEDED);
  CHECK(rejections[0].sample_id() == 100);
  CHECK_THAT(rejections[0].message(), Catch::Contains("seq 12,") && Catch::Contains("seq limit 12") &&
                                          Catch::Contains("first 4 positions"));
  CHECK(rejections[1].code() == wire::CREDIT_EXCEEDED);
  CHECK_THAT(rejections[1].message(), Catch::Contains("seq 18446744073709551615"));
  CHECK(rejections[2].code() == wire::ZERO_LENGTH);
  CHECK(rejections[3].code() == wire::ZERO_LENGTH);
}

// Positions belong to live streams. alignment.deterministic, producers p and
// q on one rank: p ends its stream and then sends more (one valid sample,
// one the decoder rejects), and p sends a rejected sample whose header names
// q. None of them counts in a stream it does not belong to or takes a
// position: q's samples at those positions are admitted and q's end_stream
// count agrees. (Before, each took its seq and q's honest samples were
// refused as duplicates; the spoofed one also counted in q's stream.)
TEST_CASE("a sample after its producer's end_stream, or naming another producer, takes no position") {
  zmq::context_t context;
  IngestOptions options;
  options.endpoints = {"inproc://ingest-live-stream-test"};
  options.buffer_max_bytes = 64 << 20;
  options.buffer_max_samples = 400;
  options.deterministic = true;
  options.window = 8;
  DaemonState state(options.buffer_max_bytes, options.buffer_max_samples, 1);
  DaemonMetrics metrics;
  FakeClock clock;
  IngestChannel channel(context, options, state, metrics, clock);
  REQUIRE(channel.Bind().ok());
  struct Producer {
    zmq::socket_t socket;
    int64_t held = 0;
    std::vector<wire::IngestReply> replies;
  };
  auto drain = [](Producer& p) {
    zmq::message_t msg;
    while (p.socket.recv(msg, zmq::recv_flags::dontwait)) {
      wire::IngestReply reply;
      REQUIRE(reply.ParseFromArray(msg.data(), static_cast<int>(msg.size())));
      if (reply.has_credit()) p.held += reply.credit().samples();
      p.replies.push_back(reply);
    }
  };
  auto connect = [&](const std::string& id) {
    Producer p{zmq::socket_t(context, zmq::socket_type::dealer), 0, {}};
    p.socket.set(zmq::sockopt::linger, 0);
    p.socket.connect("inproc://ingest-live-stream-test");
    REQUIRE(p.socket.send(zmq::buffer(Serialize(Hello(id)))));
    channel.OnReadable(0);
    drain(p);
    return p;
  };
  Producer p = connect("p");
  Producer q = connect("q");
  auto send = [&](Producer& from, const std::string& header_producer, uint64_t sample_id, uint64_t seq,
                  uint64_t tokens = 8) {
    REQUIRE(from.held > 0);
    wire::TensorDesc* t = nullptr;
    wire::ProducerMessage m = TokensSample(header_producer, sample_id, &t);
    t->set_frame(1);
    m.mutable_sample()->set_seq(seq);
    m.mutable_sample()->set_tokens(tokens);  // 0: refused by the decoder (ZERO_LENGTH)
    const std::vector<int64_t> payload(8, 1);
    REQUIRE(from.socket.send(zmq::buffer(Serialize(m)), zmq::send_flags::sndmore));
    REQUIRE(from.socket.send(zmq::buffer(payload)));
    --from.held;
    channel.OnReadable(0);
    drain(from);
  };
  auto end_stream = [&](Producer& from, const std::string& id, uint64_t sent) {
    wire::ProducerMessage m;
    m.set_version(wire::PROTOCOL_VERSION_CURRENT);
    m.mutable_end_stream()->set_producer_id(id);
    m.mutable_end_stream()->set_samples_sent(sent);
    REQUIRE(from.socket.send(zmq::buffer(Serialize(m))));
    channel.OnReadable(0);
    drain(from);
  };
  auto acked = [](const Producer& from) {
    for (const wire::IngestReply& r : from.replies) {
      if (r.has_rejection()) FAIL_CHECK(r.rejection().message());
    }
    return std::any_of(from.replies.begin(), from.replies.end(),
                       [](const wire::IngestReply& r) { return r.has_stream_ack(); });
  };
  send(p, "p", 1, 0);
  end_stream(p, "p", 1);
  REQUIRE(acked(p));
  send(p, "p", 2, 1);     // after p's end_stream: refused, no position
  send(p, "p", 3, 2, 0);  // the same, rejected by the decoder
  send(p, "q", 4, 3, 0);  // rejected by the decoder, naming q
  send(q, "q", 11, 1);
  send(q, "q", 12, 2);
  send(q, "q", 13, 3);
  end_stream(q, "q", 3);
  CHECK(acked(q));
  std::vector<wire::Rejection> rejections;
  {
    MutexLock lock(state.mu);
    rejections = state.rejections.TakeUnreported();
    CHECK(state.buffer.CountInEpoch(0) == 4);  // p's 1, q's 11, 12, 13
    CHECK(state.buffer.Frontier(0) == 4);
  }
  std::vector<uint64_t> refused;
  for (const wire::Rejection& r : rejections) {
    INFO(r.message());
    CHECK(r.code() != wire::DUPLICATE_ID);
    CHECK(r.code() != wire::COUNT_MISMATCH);
    refused.push_back(r.sample_id());
  }
  CHECK(refused == std::vector<uint64_t>{2, 3, 4});
}

}  // namespace
}  // namespace odb::ingest
