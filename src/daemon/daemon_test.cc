// The wired daemon, driven in-process: its stages, a single-rank planner and
// a fake clock (timeouts are decided by advancing it, not by waiting), over
// ipc sockets in a temporary run_dir spoken to at the wire level.
#include "src/daemon/daemon.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include "src/align/peer_group.h"
#include "src/daemon/aligned_round_runner.h"
#include "src/daemon/peers.h"
#include "src/daemon/round_trace.h"

namespace odb {
namespace {

// Waits (bounded) until `done` holds: the daemon's own counters are the events.
template <typename F>
bool Eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A single-rank daemon's configuration in a fresh temporary run_dir (removed first).
DaemonConfig SingleRankConfig(const std::string& name, std::string& dir) {
  dir = std::filesystem::temp_directory_path() / ("odb-daemon-test-" + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  DaemonConfig config;
  config.rank = 0;
  config.world_size = 1;
  config.local_rank = 0;
  config.local_world_size = 1;
  config.run_dir = dir;
  config.ingest.endpoints = {"ipc://" + dir + "/in.sock"};
  config.trainer.endpoint = "ipc://" + dir + "/out.sock";
  return config;
}

struct Harness {
  explicit Harness(const std::string& name, uint32_t producer_timeout_ms = 0, uint32_t trainer_timeout_ms = 0,
                   uint32_t max_wait_ms = 20, const std::string& round_trace = "") {
    config = SingleRankConfig(name, dir);
    config.ingest.producer_timeout_ms = producer_timeout_ms;
    config.trainer.trainer_timeout_ms = trainer_timeout_ms;
    config.max_wait_ms = max_wait_ms;
    if (!round_trace.empty()) {
      std::filesystem::create_directories(dir);
      config.round_trace = dir + "/" + round_trace;
    }
    auto peers = ConnectPeers(config);
    REQUIRE(peers.ok());
    daemon = std::make_unique<Daemon>(
        config, std::make_unique<AlignedRoundRunner>(std::move(*peers), config, &clock), &clock, &context);
    REQUIRE(daemon->Bind().ok());
    result = std::async(std::launch::async, [this] { return daemon->Run(); });
  }
  ~Harness() {
    daemon->Stop();
    result.wait();
    daemon.reset();
    std::filesystem::remove_all(dir);
  }

  std::string dir;
  DaemonConfig config;
  FakeClock clock;
  zmq::context_t context;
  std::unique_ptr<Daemon> daemon;
  std::future<absl::Status> result;
};

// A producer at the wire level: waits for credit like the client does.
struct RawProducer {
  RawProducer(zmq::context_t& ctx, const std::string& endpoint, const std::string& id)
      : socket(ctx, zmq::socket_type::dealer), id(id) {
    socket.set(zmq::sockopt::linger, 1000);
    socket.connect(endpoint);
    wire::ProducerMessage m;
    m.set_version(wire::PROTOCOL_VERSION_CURRENT);
    m.mutable_hello()->set_producer_id(id);
    socket.send(zmq::buffer(m.SerializeAsString()));
  }
  wire::IngestReply Reply() {
    zmq::message_t frame;
    socket.set(zmq::sockopt::rcvtimeo, 20000);
    REQUIRE(socket.recv(frame));
    wire::IngestReply r;
    REQUIRE(r.ParseFromArray(frame.data(), static_cast<int>(frame.size())));
    return r;
  }
  void Send(uint64_t sample_id, uint32_t tokens) {
    const int64_t charge = 8 * tokens + 512;  // payload + bookkeeping per tensor
    while (credit_samples < 1 || credit_bytes < charge) {
      wire::IngestReply r = Reply();
      credit_samples += r.credit().samples();
      credit_bytes += static_cast<int64_t>(r.credit().bytes());
    }
    --credit_samples;
    credit_bytes -= charge;
    wire::ProducerMessage m;
    m.set_version(wire::PROTOCOL_VERSION_CURRENT);
    auto* h = m.mutable_sample();
    h->set_producer_id(id);
    h->set_sample_id(sample_id);
    h->set_tokens(tokens);
    auto* t = h->add_tensors();
    t->set_name("input_ids");
    t->set_dtype(wire::INT64);
    t->add_shape(tokens);
    t->set_frame(1);
    socket.send(zmq::buffer(m.SerializeAsString()), zmq::send_flags::sndmore);
    socket.send(zmq::message_t(std::vector<int64_t>(tokens, 7).data(), 8 * tokens), zmq::send_flags::none);
    ++sent;
  }
  void End() {
    wire::ProducerMessage m;
    m.set_version(wire::PROTOCOL_VERSION_CURRENT);
    m.mutable_end_stream()->set_producer_id(id);
    m.mutable_end_stream()->set_samples_sent(sent);
    socket.send(zmq::buffer(m.SerializeAsString()));
    while (true) {
      wire::IngestReply r = Reply();
      if (r.has_stream_ack()) {
        REQUIRE(r.stream_ack().samples_received() == sent);
        return;
      }
    }
  }
  zmq::socket_t socket;
  std::string id;
  int64_t credit_samples = 0, credit_bytes = 0;
  uint64_t sent = 0;
};

struct RawTrainer {
  RawTrainer(zmq::context_t& ctx, const std::string& endpoint) : socket(ctx, zmq::socket_type::dealer) {
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::rcvtimeo, 20000);
    socket.connect(endpoint);
  }
  void Send(const wire::TrainerMessage& m) { socket.send(zmq::buffer(m.SerializeAsString())); }
  void StartEpoch(uint32_t epoch) {
    wire::TrainerMessage m;
    m.set_version(wire::PROTOCOL_VERSION_CURRENT);
    m.mutable_start_epoch()->set_epoch(epoch);
    m.mutable_start_epoch()->set_expected_producers(1);
    Send(m);
  }
  void Credit() {
    wire::TrainerMessage m;
    m.set_version(wire::PROTOCOL_VERSION_CURRENT);
    m.mutable_credit()->set_steps(1);
    Send(m);
  }
  wire::DaemonMessage Next() {
    while (true) {
      std::vector<zmq::message_t> parts;
      zmq::message_t part;
      do {
        REQUIRE(socket.recv(part));
        parts.push_back(std::move(part));
      } while (parts.back().more());
      wire::DaemonMessage m;
      REQUIRE(m.ParseFromArray(parts[0].data(), static_cast<int>(parts[0].size())));
      if (m.has_step_arena()) {
        // A step arena offer: this wire-level trainer reads frames only, and says so.
        wire::TrainerMessage reply;
        reply.set_version(wire::PROTOCOL_VERSION_CURRENT);
        reply.mutable_step_arena_reply()->set_generation(m.step_arena().generation());
        reply.mutable_step_arena_reply()->set_attached(false);
        reply.mutable_step_arena_reply()->set_error("a raw test trainer reads frames");
        Send(reply);
        continue;
      }
      if (!m.has_session_ack()) return m;  // the daemon checking a new session: skipped, as clients do
    }
  }
  zmq::socket_t socket;
};

TEST_CASE("the wired daemon emits every sample exactly once and a true summary") {
  Harness h("once");
  RawTrainer trainer(h.context, h.config.trainer.endpoint);
  trainer.StartEpoch(0);
  RawProducer producer(h.context, h.config.ingest.endpoints[0], "p");
  for (uint64_t i = 0; i < 500; ++i) producer.Send(i, 1 + i % 50);
  producer.End();
  std::multiset<uint64_t> ids;
  double weight = 0;
  uint64_t steps = 0;
  while (true) {
    wire::DaemonMessage m = trainer.Next();
    if (m.has_epoch_end()) {
      REQUIRE(m.epoch_end().emitted() == 500);
      REQUIRE(m.epoch_end().received() == 500);
      REQUIRE(m.epoch_end().steps() == steps);
      break;
    }
    REQUIRE(m.has_step());
    ids.insert(m.step().sample_ids().begin(), m.step().sample_ids().end());
    weight += m.step().loss_weight();
    ++steps;
    trainer.Credit();
  }
  REQUIRE(ids.size() == 500);
  REQUIRE(std::set<uint64_t>(ids.begin(), ids.end()).size() == 500);
  REQUIRE(weight == Approx(static_cast<double>(steps)));  // W = 1: every step weighs 1
}

TEST_CASE("round_trace gets one line per round: its index, wall-clock entry and exit, planner CPU") {
  Harness h("trace", 0, 0, 20, "rounds.txt");
  RawTrainer trainer(h.context, h.config.trainer.endpoint);
  trainer.StartEpoch(0);
  RawProducer producer(h.context, h.config.ingest.endpoints[0], "p");
  const auto before = std::chrono::system_clock::now();
  for (uint64_t i = 0; i < 200; ++i) producer.Send(i, 1 + i % 50);
  producer.End();
  while (true) {
    wire::DaemonMessage m = trainer.Next();
    if (m.has_epoch_end()) break;
    trainer.Credit();
  }
  const auto after = std::chrono::system_clock::now();
  const uint64_t rounds = h.daemon->metrics().rounds.load();
  REQUIRE(rounds > 1);
  std::ifstream in(h.config.round_trace);
  auto ns = [](std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  uint64_t round = 0;
  long long entered = 0, exited = 0, cpu = 0, last_exit = ns(before), cpu_total = 0;
  uint64_t lines = 0;
  while (in >> round >> entered >> exited >> cpu) {
    CHECK(round == lines);        // the k-th round: the same collective on every rank
    CHECK(entered >= last_exit);  // rounds do not overlap, and none started before the samples
    CHECK(exited >= entered);
    CHECK(cpu >= 0);
    cpu_total += cpu;
    last_exit = exited;
    ++lines;
  }
  CHECK(last_exit <= ns(after));
  CHECK(lines == rounds);  // line-buffered: every finished round is in the file already
  CHECK(cpu_total > 0);    // planning 200 samples takes some CPU
}

// What Bind says for `config` (a single-rank daemon, stopped again).
absl::Status BindOnce(const DaemonConfig& config) {
  auto peers = ConnectPeers(config);
  REQUIRE(peers.ok());
  FakeClock clock;
  zmq::context_t context;
  Daemon daemon(config, std::make_unique<AlignedRoundRunner>(std::move(*peers), config, &clock), &clock,
                &context);
  absl::Status s = daemon.Bind();
  daemon.Stop();
  return s;
}

TEST_CASE("a round_trace that cannot be opened fails Bind, naming the key and the path") {
  std::string dir;
  DaemonConfig config = SingleRankConfig("badtrace", dir);
  config.round_trace = dir + "/no/such/dir/rounds.txt";
  const absl::Status s = BindOnce(config);
  CHECK_FALSE(s.ok());
  CHECK_THAT(std::string(s.message()), Catch::Contains("round_trace") && Catch::Contains("no/such/dir"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a round_trace another daemon writes fails Bind instead of both overwriting it") {
  std::string dir;
  DaemonConfig config = SingleRankConfig("sharedtrace", dir);
  std::filesystem::create_directories(dir);
  config.round_trace = dir + "/rounds.txt";           // no {rank}: what two daemons of a job would share
  auto first = RoundTrace::Open(config.round_trace);  // the other daemon's, holding the file
  REQUIRE(first.ok());
  const absl::Status s = BindOnce(config);
  CHECK_FALSE(s.ok());
  CHECK_THAT(std::string(s.message()), Catch::Contains("round_trace") && Catch::Contains("rounds.txt"));
  first->reset();
  std::filesystem::remove_all(dir);
}

TEST_CASE("a window that does not fill is planned once max_wait_ms of the fake clock has passed") {
  // Ten minutes: real time never gets there during the test, only the clock.
  Harness h("wait", /*producer_timeout_ms=*/0, /*trainer_timeout_ms=*/0, /*max_wait_ms=*/600000);
  RawTrainer trainer(h.context, h.config.trainer.endpoint);
  trainer.StartEpoch(0);
  RawProducer producer(h.context, h.config.ingest.endpoints[0], "p");
  for (uint64_t i = 0; i < 3; ++i) producer.Send(i, 8);  // far below the window; the stream stays open
  REQUIRE(Eventually([&] { return h.daemon->metrics().buffer_samples.load() == 3; }));
  CHECK(h.daemon->metrics().rounds.load() == 0);  // nothing makes a round due but the wait
  // The planner may pick the epoch up after an advance (its wait then counts
  // from there), so the clock moves on until a step is planned.
  REQUIRE(Eventually([&] {
    h.clock.Advance(std::chrono::milliseconds(600001));
    return h.daemon->metrics().steps_emitted.load() > 0;
  }));
  wire::DaemonMessage m = trainer.Next();
  REQUIRE(m.has_step());
  CHECK(m.step().sample_ids_size() == 3);
}

TEST_CASE("a silent producer is a PRODUCER_TIMEOUT once the fake clock passes the timeout") {
  Harness h("silent", /*producer_timeout_ms=*/60000);
  RawTrainer trainer(h.context, h.config.trainer.endpoint);
  trainer.StartEpoch(0);
  RawProducer producer(h.context, h.config.ingest.endpoints[0], "stalled-worker");
  producer.Send(1, 4);  // holds credit, never ends its stream
  REQUIRE(Eventually([&] { return h.daemon->metrics().samples_received.load() == 1; }));
  REQUIRE(h.result.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);
  // Silence counts only while the epoch is being planned and a producer may
  // send; CheckSilence restarts it otherwise. On a loaded machine the planner
  // can start the epoch (or hold its first step for the trainer's step arena
  // answer, which this raw trainer gives only in Next()) after the first
  // advance, so the clock moves on until the daemon gives up.
  for (int i = 0; i < 10; ++i) {
    h.clock.Advance(std::chrono::milliseconds(60001));
    if (h.result.wait_for(std::chrono::seconds(2)) == std::future_status::ready) break;
  }
  REQUIRE(h.result.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready);
  absl::Status s = h.result.get();
  REQUIRE(!s.ok());
  REQUIRE(std::string(s.message()).find("stalled-worker") != std::string::npos);
  REQUIRE(std::string(s.message()).find("60000 ms") != std::string::npos);
  h.result = std::async(std::launch::deferred, [] { return absl::OkStatus(); });
}

TEST_CASE("a second trainer is refused and the first keeps its steps") {
  Harness h("second");
  RawTrainer first(h.context, h.config.trainer.endpoint);
  first.StartEpoch(0);
  RawTrainer second(h.context, h.config.trainer.endpoint);
  second.StartEpoch(0);
  // It waits out the contender grace (the first session might be closing),
  // on the daemon's injected clock.
  REQUIRE(Eventually([&] {
    h.clock.Advance(std::chrono::milliseconds(500));
    return h.daemon->metrics().refused_trainers.load() == 1;
  }));
  wire::DaemonMessage refused = second.Next();
  REQUIRE(refused.has_fatal());
  REQUIRE(refused.fatal().code() == wire::SESSION_REFUSED);
  RawProducer producer(h.context, h.config.ingest.endpoints[0], "p");
  for (uint64_t i = 0; i < 50; ++i) producer.Send(i, 8);
  producer.End();
  uint64_t got = 0;
  while (true) {
    wire::DaemonMessage m = first.Next();
    if (m.has_epoch_end()) break;
    got += m.step().sample_ids_size();
    first.Credit();
  }
  REQUIRE(got == 50);
}

TEST_CASE("a trainer lost mid-epoch is fatal after trainer_timeout_ms of the fake clock") {
  Harness h("lost", /*producer_timeout_ms=*/0, /*trainer_timeout_ms=*/30000);
  {
    RawTrainer trainer(h.context, h.config.trainer.endpoint);
    trainer.StartEpoch(0);
    RawProducer producer(h.context, h.config.ingest.endpoints[0], "p");
    for (uint64_t i = 0; i < 20; ++i) producer.Send(i, 8);
    // Rounds wait max_wait_ms of the fake clock for a fuller window.
    REQUIRE(Eventually([&] {
      h.clock.Advance(std::chrono::milliseconds(50));
      return h.daemon->metrics().steps_emitted.load() > 0;
    }));
    (void)trainer.Next();
  }  // the trainer's socket closes
  // The daemon notices the disconnect (an event), then waits for the clock.
  REQUIRE(Eventually([&] { return h.daemon->metrics().trainer_disconnects.load() == 1; }));
  REQUIRE(h.result.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);
  h.clock.Advance(std::chrono::milliseconds(30001));
  REQUIRE(h.result.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  absl::Status s = h.result.get();
  REQUIRE(std::string(s.message()).find("trainer disconnected mid-epoch") != std::string::npos);
  h.result = std::async(std::launch::deferred, [] { return absl::OkStatus(); });
}

}  // namespace
}  // namespace odb
