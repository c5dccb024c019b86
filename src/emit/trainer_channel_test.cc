// The trainer channel alone: a real ROUTER socket, a DEALER standing in for
// the trainer at the wire level, the state it shares and a fake clock.
#include "src/emit/trainer_channel.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "src/emit/step_encoder.h"

namespace odb::emit {
namespace {

using std::chrono::milliseconds;

wire::TrainerMessage StartEpoch(uint32_t epoch) {
  wire::TrainerMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  m.mutable_start_epoch()->set_epoch(epoch);
  m.mutable_start_epoch()->set_expected_producers(1);
  return m;
}

wire::TrainerMessage Credit(uint32_t steps) {
  wire::TrainerMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  m.mutable_credit()->set_steps(steps);
  return m;
}

std::vector<zmq::message_t> Step(uint64_t index) {
  wire::Step step;
  step.set_step_index(index);
  return EncodeStep(step, {});
}

struct Fixture {
  explicit Fixture(const std::string& name, uint32_t outstanding_depth = 2,
                   uint32_t trainer_timeout_ms = 30000, const std::string& routing_id = "",
                   const std::function<void(TrainerChannelOptions&)>& configure = nullptr)
      : state(1 << 20, 64, 1), trainer(context, zmq::socket_type::dealer) {
    dir = std::filesystem::temp_directory_path() /
          ("odb-trainer-channel-" + name + "-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    TrainerChannelOptions options;
    options.endpoint = "ipc://" + dir + "/out.sock";
    options.outstanding_depth = outstanding_depth;
    options.step_arena = false;  // frames only: the arena handshake is not under test here
    options.trainer_timeout_ms = trainer_timeout_ms;
    if (configure) configure(options);
    channel = std::make_unique<TrainerChannel>(context, options, state, metrics, clock);
    REQUIRE(channel->Bind().ok());
    trainer.set(zmq::sockopt::linger, 0);
    if (!routing_id.empty()) trainer.set(zmq::sockopt::routing_id, routing_id);
    trainer.connect(channel->endpoint());
  }
  ~Fixture() {
    trainer.close();
    channel.reset();
    std::filesystem::remove_all(dir);
  }

  void Send(const wire::TrainerMessage& m) { trainer.send(zmq::buffer(m.SerializeAsString())); }

  // Reads the channel's socket until `done` holds (10 s at most); true when
  // an epoch was requested meanwhile.
  template <typename F>
  bool PumpUntil(F done) {
    bool requested = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      zmq::pollitem_t items[] = {{channel->socket().handle(), 0, ZMQ_POLLIN, 0},
                                 {channel->monitor().handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 2, milliseconds(20));
      requested |= channel->OnReadable();
      channel->OnMonitor();
    }
    return requested;
  }

  // The trainer's next message (10 s at most); nullopt when none came.
  std::optional<wire::DaemonMessage> Receive(milliseconds wait = milliseconds(10000)) {
    trainer.set(zmq::sockopt::rcvtimeo, static_cast<int>(wait.count()));
    zmq::message_t frame;
    if (!trainer.recv(frame)) return std::nullopt;
    while (frame.more()) {
      zmq::message_t rest;
      REQUIRE(trainer.recv(rest));
      if (!rest.more()) break;
    }
    wire::DaemonMessage m;
    REQUIRE(m.ParseFromArray(frame.data(), static_cast<int>(frame.size())));
    return m;
  }

  // Starts the session with epoch 0 and takes its acknowledgement.
  void OpenSession() {
    Send(StartEpoch(0));
    REQUIRE(PumpUntil([&] {
      MutexLock lock(state.mu);
      return !state.requested_epochs.empty();
    }));
    auto ack = Receive();
    REQUIRE(ack);
    REQUIRE(ack->has_session_ack());
  }

  // The session `routing_id` comes back on a new connection (the old one
  // closes first, so the new one takes the id) and announces itself with a
  // credit of 0: returns the index of the first step the daemon re-sends,
  // and keeps the new connection as `trainer`.
  uint64_t ReconnectAndFirstStep(const std::string& routing_id) {
    zmq::socket_t again(context, zmq::socket_type::dealer);
    again.set(zmq::sockopt::linger, 0);
    again.set(zmq::sockopt::routing_id, routing_id);
    trainer.close();
    again.connect(channel->endpoint());
    again.send(zmq::buffer(Credit(0).SerializeAsString()));
    PumpUntil([&] { return channel->session_fd() >= 0; });
    REQUIRE(channel->session_fd() >= 0);
    again.set(zmq::sockopt::rcvtimeo, 10000);
    while (true) {
      zmq::message_t frame;
      REQUIRE(again.recv(frame));
      wire::DaemonMessage m;
      REQUIRE(m.ParseFromArray(frame.data(), static_cast<int>(frame.size())));
      while (frame.more()) REQUIRE(again.recv(frame));
      if (m.has_step()) {
        trainer = std::move(again);
        return m.step().step_index();
      }
    }
  }

  std::string dir;
  zmq::context_t context;
  DaemonState state;
  DaemonMetrics metrics;
  FakeClock clock;
  std::unique_ptr<TrainerChannel> channel;
  zmq::socket_t trainer;
};

TEST_CASE("the first trainer's start_epoch opens the session and requests the epoch") {
  Fixture f("open");
  f.OpenSession();
  MutexLock lock(f.state.mu);
  REQUIRE(f.state.requested_epochs.size() == 1);
  CHECK(f.state.requested_epochs.front() == 0);
}

TEST_CASE(
    "the session's acknowledgement tells the trainer the job's settings, before any epoch and again after a "
    "reconnect") {
  Fixture f("settings", 2, 30000, "trainer-settings", [](TrainerChannelOptions& o) {
    o.window_target = 4096;
    o.collate.packed = true;
    o.collate.length_field = "tokens";
    o.collate.fields.push_back({.name = "labels", .pad_value = -1});
  });
  auto check_settings = [](const wire::DaemonMessage& m) {
    REQUIRE(m.has_session_ack());
    REQUIRE(m.session_ack().has_settings());
    const wire::JobSettings& s = m.session_ack().settings();
    CHECK(s.tokens_per_step() == 4096);
    CHECK(s.packed());
    CHECK(s.trainer_data_plane() == "zmq");  // the fixture's step_arena false
    CHECK(s.length_field() == "tokens");
    REQUIRE(s.has_ignore_index());
    CHECK(s.ignore_index() == -1);
  };
  // What Consumer::Connect sends: a credit of 0, no epoch asked for.
  f.Send(Credit(0));
  REQUIRE_FALSE(f.PumpUntil([&] { return f.channel->session_fd() >= 0; }));
  auto ack = f.Receive();
  REQUIRE(ack);
  check_settings(*ack);
  // The daemon waits for no answer: a step goes out to a trainer that sent nothing more.
  f.channel->EnqueueStep(Step(0));
  f.channel->Flush();
  auto step = f.Receive();
  REQUIRE(step);
  CHECK(step->has_step());
  // Back on a new connection (the old one closed): the acknowledgement of the
  // reconnect says them again, ahead of the re-sent step.
  zmq::socket_t again(f.context, zmq::socket_type::dealer);
  again.set(zmq::sockopt::linger, 0);
  again.set(zmq::sockopt::routing_id, "trainer-settings");
  f.trainer.close();
  f.PumpUntil([&] { return f.channel->session_fd() < 0; });
  again.connect(f.channel->endpoint());
  f.trainer = std::move(again);
  f.Send(Credit(0));
  f.PumpUntil([&] { return f.channel->session_fd() >= 0; });
  auto reack = f.Receive();
  REQUIRE(reack);
  check_settings(*reack);
}

TEST_CASE("the job settings name the data plane and the labels' pad value as configured") {
  TrainerChannelOptions o;
  CHECK(JobSettingsOf(o).trainer_data_plane() == "auto");
  CHECK(JobSettingsOf(o).length_field() == "input_ids");
  CHECK_FALSE(JobSettingsOf(o).has_ignore_index());  // no labels field collated
  o.step_arena_required = true;
  CHECK(JobSettingsOf(o).trainer_data_plane() == "shm");
  o.step_arena = false;
  CHECK(JobSettingsOf(o).trainer_data_plane() == "zmq");
  o.collate.fields.push_back({.name = "labels", .rule = collate::FieldRule::kStack});
  CHECK_FALSE(JobSettingsOf(o).has_ignore_index());  // not padded: no pad value
  o.collate.fields.push_back({.name = "labels", .pad_value = -100});
  CHECK(JobSettingsOf(o).ignore_index() == -100);
}

TEST_CASE("steps go out outstanding_depth ahead, then one per credit") {
  Fixture f("credit", /*outstanding_depth=*/2);
  f.OpenSession();
  for (uint64_t i = 0; i < 3; ++i) f.channel->EnqueueStep(Step(i));
  CHECK(f.channel->QueuedSteps() == 3);
  f.channel->Flush();
  for (uint64_t i = 0; i < 2; ++i) {
    auto m = f.Receive();
    REQUIRE(m);
    REQUIRE(m->has_step());
    CHECK(m->step().step_index() == i);
  }
  CHECK(f.channel->QueuedSteps() == 1);  // no credit left for the third
  f.channel->Flush();
  CHECK(f.channel->QueuedSteps() == 1);
  f.Send(Credit(1));
  f.PumpUntil([&] {
    f.channel->Flush();
    return f.channel->QueuedSteps() == 0;
  });
  auto third = f.Receive();
  REQUIRE(third);
  CHECK(third->step().step_index() == 2);
}

TEST_CASE("a control message does not wait for credit; a fatal one goes ahead of queued steps") {
  Fixture f("control", /*outstanding_depth=*/1);
  f.OpenSession();
  f.channel->EnqueueStep(Step(0));
  f.channel->EnqueueStep(Step(1));  // waits: one step of credit
  f.channel->EnqueueFatal(wire::INTERNAL, "stop", 0);
  f.channel->Flush();
  auto first = f.Receive();
  REQUIRE(first);
  REQUIRE(first->has_fatal());
  CHECK(first->fatal().code() == wire::INTERNAL);
  auto second = f.Receive();
  REQUIRE(second);
  CHECK(second->step().step_index() == 0);
  CHECK(f.channel->QueuedSteps() == 1);
}

TEST_CASE("a multi-frame or unreadable trainer message is counted and ignored") {
  Fixture f("bad");
  f.trainer.send(zmq::str_buffer("x"), zmq::send_flags::sndmore);
  f.trainer.send(zmq::str_buffer("y"), zmq::send_flags::none);
  f.trainer.send(zmq::str_buffer("\xff\xff\xff not a protobuf"));
  f.PumpUntil([&] { return f.metrics.bad_trainer_messages.load() == 2; });
  CHECK(f.metrics.bad_trainer_messages.load() == 2);
  f.OpenSession();  // the channel still serves
}

TEST_CASE("a session lost mid-epoch is fatal once trainer_timeout_ms of the injected clock has passed") {
  Fixture f("lost", /*outstanding_depth=*/2, /*trainer_timeout_ms=*/30000);
  f.OpenSession();
  f.trainer.close();
  f.PumpUntil([&] { return f.metrics.trainer_disconnects.load() == 1; });
  REQUIRE(f.metrics.trainer_disconnects.load() == 1);
  CHECK(!f.channel->CheckLiveness());
  f.clock.Advance(milliseconds(30000));
  CHECK(!f.channel->CheckLiveness());  // not past the timeout yet
  f.clock.Advance(milliseconds(1));
  auto fatal = f.channel->CheckLiveness();
  REQUIRE(fatal);
  CHECK_THAT(fatal->second, Catch::Contains("emit.trainer_timeout_ms"));
}

TEST_CASE("a credit read after its session's disconnect event still counts its data wait") {
  // The trainer sends its last credit and exits; the daemon may see the
  // disconnect before it reads that credit (the credit waits in the socket).
  // The credit is late for the session's bookkeeping but its wait is real.
  Fixture f("late-credit");
  f.OpenSession();
  wire::TrainerMessage last = Credit(1);
  last.mutable_credit()->set_data_wait_us(123456);
  f.trainer.set(zmq::sockopt::linger, 10000);  // the credit leaves before the socket closes
  f.Send(last);
  f.trainer.close();
  // The monitor alone first: the disconnect is handled before the credit is read.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (f.metrics.trainer_disconnects.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    zmq::pollitem_t monitor{f.channel->monitor().handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&monitor, 1, milliseconds(20));
    f.channel->OnMonitor();
  }
  REQUIRE(f.metrics.trainer_disconnects.load() == 1);
  CHECK(f.metrics.trainer_data_wait_us.load() == 0);
  zmq::pollitem_t socket{f.channel->socket().handle(), 0, ZMQ_POLLIN, 0};
  REQUIRE(zmq::poll(&socket, 1, std::chrono::seconds(10)) == 1);  // the credit is still queued
  CHECK_FALSE(f.channel->OnReadable());
  CHECK(f.metrics.trainer_data_wait_us.load() == 123456);
  // Read after the close (really closed here): not a reconnect. The ROUTER
  // may still route the id at this point; that used to revive the session
  // in about half of the runs.
  CHECK(f.metrics.late_trainer_messages.load() == 1);
  CHECK(f.channel->session_fd() == -1);
  f.clock.Advance(milliseconds(30001));
  CHECK(f.channel->CheckLiveness());
}

// Drives the channel's socket and monitor until `done` holds, without
// reading the socket: a connection's events come first, its messages wait.
template <typename F>
void PumpMonitorUntil(Fixture& f, F done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    zmq::pollitem_t monitor{f.channel->monitor().handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&monitor, 1, milliseconds(20));
    f.channel->OnMonitor();
  }
}

// Reads the channel's socket once a message is there (10 s at most).
bool ReadOne(Fixture& f) {
  zmq::pollitem_t socket{f.channel->socket().handle(), 0, ZMQ_POLLIN, 0};
  REQUIRE(zmq::poll(&socket, 1, std::chrono::seconds(10)) == 1);
  return f.channel->OnReadable();
}

TEST_CASE("a message read after its connection closed does not revive the session") {
  // The race seen with real trainers: the monitor reports the connection's
  // close, yet the ROUTER still routes the session's id (it has not torn the
  // pipe down), and a message that connection left queued is read. The test
  // orders it: the close event goes first (the connection itself stays open,
  // as the ROUTER's pipe does), then the message. Every kind of message.
  for (const char* kind : {"credit", "start_epoch", "step_arena_reply"}) {
    DYNAMIC_SECTION(kind) {
      Fixture f(std::string("late-") + kind, /*outstanding_depth=*/2, /*trainer_timeout_ms=*/30000);
      f.OpenSession();
      f.channel->EnqueueStep(Step(0));
      f.channel->EnqueueStep(Step(1));
      f.channel->Flush();
      for (int i = 0; i < 2; ++i) REQUIRE(f.Receive());  // two steps in flight
      const int fd = f.channel->session_fd();
      REQUIRE(fd >= 0);
      f.channel->OnConnectionEvent(ZMQ_EVENT_DISCONNECTED, fd);
      REQUIRE(f.metrics.trainer_disconnects.load() == 1);
      REQUIRE(f.channel->session_fd() == -1);

      wire::TrainerMessage late = Credit(1);
      if (std::string(kind) == "start_epoch") late = StartEpoch(1);
      if (std::string(kind) == "step_arena_reply") {
        late.clear_credit();
        late.mutable_step_arena_reply()->set_generation(7);
      }
      f.Send(late);
      // What it reports holds (a credit acknowledges its step); what it asks
      // for does not: a start_epoch of a trainer that is gone opens no epoch.
      CHECK_FALSE(ReadOne(f));
      {
        MutexLock lock(f.state.mu);
        CHECK(f.state.requested_epochs == std::deque<uint32_t>{0});
      }
      CHECK(f.metrics.late_trainer_messages.load() == 1);
      CHECK(f.channel->session_fd() == -1);  // still lost
      // Nothing re-sent to it: the next thing the trainer gets is nothing.
      CHECK_FALSE(f.Receive(milliseconds(200)));

      // The timeout runs from the close, not from the late message.
      f.clock.Advance(milliseconds(30001));
      auto fatal = f.channel->CheckLiveness();
      REQUIRE(fatal);
      CHECK_THAT(fatal->second, Catch::Contains("did not come back"));
      // A late credit still acknowledges its step.
      CHECK_THAT(fatal->second, Catch::Contains(std::string(kind) == "credit" ? "1 step(s)" : "2 step(s)"));
    }
  }
}

TEST_CASE("a late credit still acknowledges its steps and counts its wait; a later reconnect is one") {
  // The late message is what the trainer said before its connection closed:
  // if the session comes back, it does not send that credit again.
  Fixture f("late-then-back", /*outstanding_depth=*/2, /*trainer_timeout_ms=*/30000, "trainer-back");
  f.OpenSession();
  f.channel->EnqueueStep(Step(0));
  f.channel->EnqueueStep(Step(1));
  f.channel->Flush();
  for (int i = 0; i < 2; ++i) REQUIRE(f.Receive());
  f.channel->OnConnectionEvent(ZMQ_EVENT_DISCONNECTED, f.channel->session_fd());
  wire::TrainerMessage late = Credit(1);
  late.mutable_credit()->set_data_wait_us(777);
  f.Send(late);
  CHECK_FALSE(ReadOne(f));
  CHECK(f.metrics.late_trainer_messages.load() == 1);
  CHECK(f.metrics.trainer_data_wait_us.load() == 777);
  CHECK(f.channel->session_fd() == -1);

  // The same session on a new connection: a reconnect, and only step 1 (not
  // acknowledged) is sent again.
  CHECK(f.ReconnectAndFirstStep("trainer-back") == 1);
}

std::vector<zmq::message_t> EpochEnd(uint32_t epoch) {
  wire::DaemonMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  m.mutable_epoch_end()->set_epoch(epoch);
  return EncodeControl(m);
}

// What a reconnected session `routing_id` is sent again, in order, as
// "step N" / "end N": `expected` messages (each waited for up to 10 s), then
// whatever else comes within 500 ms (the re-send happens before that wait,
// on this thread, so a longer quiet means nothing more was sent).
std::vector<std::string> ReconnectAndResent(Fixture& f, const std::string& routing_id, size_t expected) {
  zmq::socket_t again(f.context, zmq::socket_type::dealer);
  again.set(zmq::sockopt::linger, 0);
  again.set(zmq::sockopt::routing_id, routing_id);
  f.trainer.close();
  f.PumpUntil([&] { return f.channel->session_fd() < 0; });  // the daemon saw the close
  REQUIRE(f.channel->session_fd() < 0);
  again.connect(f.channel->endpoint());
  again.send(zmq::buffer(Credit(0).SerializeAsString()));
  f.PumpUntil([&] { return f.channel->session_fd() >= 0; });
  REQUIRE(f.channel->session_fd() >= 0);
  f.trainer = std::move(again);
  std::vector<std::string> resent;
  while (auto m = f.Receive(milliseconds(resent.size() < expected ? 10000 : 500))) {
    if (m->has_step()) resent.push_back("step " + std::to_string(m->step().step_index()));
    if (m->has_epoch_end()) resent.push_back("end " + std::to_string(m->epoch_end().epoch()));
  }
  return resent;
}

// An epoch's summary lost in a blip left the trainer waiting for the epoch's
// end forever (steps were re-sent, the summary was not): it is kept like a
// step until a credit shows that something sent after it arrived.
TEST_CASE("an epoch's summary is sent again after a reconnect until a later step is acknowledged") {
  Fixture f("summary-back", /*outstanding_depth=*/4, /*trainer_timeout_ms=*/30000, "trainer-sum");
  f.OpenSession();
  f.channel->EnqueueStep(Step(0));
  f.channel->EnqueueStep(Step(1));
  f.channel->EnqueueControl(EpochEnd(0));
  f.channel->Flush();
  for (int i = 0; i < 3; ++i) REQUIRE(f.Receive());
  // Both steps acknowledged: the summary after them is not known to have arrived.
  f.Send(Credit(2));
  f.PumpUntil([&] { return f.channel->unacknowledged() == 1; });
  REQUIRE(f.channel->unacknowledged() == 1);
  CHECK(ReconnectAndResent(f, "trainer-sum", 1) == std::vector<std::string>{"end 0"});
  // A step of the next epoch sent after it and acknowledged: the summary
  // arrived before it, and is not sent again.
  f.channel->EnqueueStep(Step(0));
  f.channel->Flush();
  REQUIRE(f.Receive());
  f.Send(Credit(1));
  f.PumpUntil([&] { return f.channel->unacknowledged() == 0; });
  REQUIRE(f.channel->unacknowledged() == 0);
  CHECK(ReconnectAndResent(f, "trainer-sum", 0).empty());
}

// The window session 12 left open: the session's connection closes with a
// credit still queued, and before the daemon reads it the OS gives the
// descriptor to a new connection (an outsider connecting in a loop gets it
// often). By descriptor the late credit looked like the new connection's:
// the session was revived ("reconnected"), its steps re-sent into a dead
// pipe and its timeout restarted, for as long as the outsider stayed. By the
// connection's metadata it is known as the closed connection's. The test
// orders it with the monitor's events (the close, then a new accept on the
// same descriptor); a real reconnect afterwards is still one.
TEST_CASE("a late message read after its descriptor went to a new connection does not revive the session") {
  Fixture f("fd-reuse", /*outstanding_depth=*/2, /*trainer_timeout_ms=*/30000, "trainer-reuse");
  f.OpenSession();
  f.channel->EnqueueStep(Step(0));
  f.channel->EnqueueStep(Step(1));
  f.channel->Flush();
  for (int i = 0; i < 2; ++i) REQUIRE(f.Receive());
  const int fd = f.channel->session_fd();
  REQUIRE(fd >= 0);
  f.channel->OnConnectionEvent(ZMQ_EVENT_DISCONNECTED, fd);
  f.channel->OnConnectionEvent(ZMQ_EVENT_ACCEPTED, fd);  // another connection got the descriptor
  REQUIRE(f.channel->open_connections() == 1);
  f.Send(Credit(1));
  CHECK_FALSE(ReadOne(f));
  CHECK(f.metrics.late_trainer_messages.load() == 1);
  CHECK(f.channel->session_fd() == -1);       // still lost
  CHECK_FALSE(f.Receive(milliseconds(200)));  // nothing re-sent
  // The timeout still runs from the close; the late credit acknowledged step 0.
  f.clock.Advance(milliseconds(30001));
  auto fatal = f.channel->CheckLiveness();
  REQUIRE(fatal);
  CHECK_THAT(fatal->second, Catch::Contains("1 step(s)"));

  // The same session on a really new connection is a reconnect: step 1 again.
  CHECK(f.ReconnectAndFirstStep("trainer-reuse") == 1);
}

TEST_CASE("a message a closed connection left queued neither opens a session nor contends for it") {
  for (const bool with_session : {true, false}) {
    DYNAMIC_SECTION((with_session ? "while a session is served" : "before any session")) {
      Fixture f(with_session ? "late-stranger" : "late-first");
      if (with_session) f.OpenSession();
      PumpMonitorUntil(f, [&] { return f.channel->open_connections() == 1; });
      REQUIRE(f.channel->open_connections() == 1);  // the fixture's trainer
      // Another trainer connects, talks and closes before the daemon reads it.
      zmq::socket_t other(f.context, zmq::socket_type::dealer);
      other.set(zmq::sockopt::linger, 10000);  // its message leaves before the socket closes
      other.set(zmq::sockopt::routing_id, std::string("stranger"));
      other.connect(f.channel->endpoint());
      PumpMonitorUntil(f, [&] { return f.channel->open_connections() == 2; });
      REQUIRE(f.channel->open_connections() == 2);
      other.send(zmq::buffer(StartEpoch(1).SerializeAsString()));
      other.close();
      PumpMonitorUntil(f, [&] { return f.channel->open_connections() == 1; });
      REQUIRE(f.channel->open_connections() == 1);
      CHECK_FALSE(ReadOne(f));
      CHECK(f.metrics.late_trainer_messages.load() == 1);
      // Not held as a contender: past the grace nobody is refused.
      f.clock.Advance(milliseconds(2001));
      CHECK_FALSE(f.channel->SettleContender());
      CHECK(f.metrics.refused_trainers.load() == 0);
      {
        MutexLock lock(f.state.mu);
        CHECK(f.state.requested_epochs.size() == (with_session ? 1u : 0u));
      }
      if (with_session) {
        CHECK(f.channel->session_fd() >= 0);  // the session is untouched
      } else {
        CHECK(f.channel->session_fd() == -1);
        CHECK_FALSE(f.channel->SessionEnded());  // no session existed
        f.OpenSession();                         // the next live trainer opens it
      }
    }
  }
}

TEST_CASE("a contender that left while it waited does not take over the session it waited for") {
  Fixture f("late-contender");
  f.OpenSession();
  PumpMonitorUntil(f, [&] { return f.channel->open_connections() == 1; });
  zmq::socket_t other(f.context, zmq::socket_type::dealer);
  other.set(zmq::sockopt::linger, 10000);
  other.set(zmq::sockopt::routing_id, std::string("contender"));
  other.connect(f.channel->endpoint());
  PumpMonitorUntil(f, [&] { return f.channel->open_connections() == 2; });
  REQUIRE(f.channel->open_connections() == 2);
  other.send(zmq::buffer(StartEpoch(1).SerializeAsString()));
  CHECK_FALSE(ReadOne(f));  // held: the session is alive
  other.close();
  PumpMonitorUntil(f, [&] { return f.channel->open_connections() == 1; });
  REQUIRE(f.channel->open_connections() == 1);
  // Then the session's connection closes: the contender's held start_epoch
  // is judged now, and its connection is gone.
  f.channel->OnConnectionEvent(ZMQ_EVENT_DISCONNECTED, f.channel->session_fd());
  CHECK_FALSE(f.channel->SettleContender());
  CHECK(f.metrics.late_trainer_messages.load() == 1);
  CHECK(f.metrics.refused_trainers.load() == 0);
  CHECK(f.channel->session_fd() == -1);
  MutexLock lock(f.state.mu);
  CHECK(f.state.requested_epochs == std::deque<uint32_t>{0});
}

TEST_CASE("a second trainer is held for the contender grace of the injected clock, then refused") {
  Fixture f("contender");
  f.OpenSession();
  zmq::socket_t other(f.context, zmq::socket_type::dealer);
  other.set(zmq::sockopt::linger, 0);
  other.set(zmq::sockopt::rcvtimeo, 0);
  other.connect(f.channel->endpoint());
  other.send(zmq::buffer(StartEpoch(1).SerializeAsString()));
  // Its message is read and held: the session may be closing.
  zmq::pollitem_t item{f.channel->socket().handle(), 0, ZMQ_POLLIN, 0};
  REQUIRE(zmq::poll(&item, 1, std::chrono::seconds(10)) == 1);
  CHECK_FALSE(f.channel->OnReadable());
  zmq::message_t refusal;
  CHECK_FALSE(other.recv(refusal));
  f.clock.Advance(milliseconds(1999));
  CHECK_FALSE(f.channel->SettleContender());
  CHECK_FALSE(other.recv(refusal));
  // Past the grace with the session alive: refused, its start_epoch unheard.
  f.clock.Advance(milliseconds(1));
  CHECK_FALSE(f.channel->SettleContender());
  other.set(zmq::sockopt::rcvtimeo, 10000);
  REQUIRE(other.recv(refusal));
  wire::DaemonMessage m;
  REQUIRE(m.ParseFromArray(refusal.data(), static_cast<int>(refusal.size())));
  REQUIRE(m.has_fatal());
  CHECK(m.fatal().code() == wire::SESSION_REFUSED);
  CHECK(f.metrics.refused_trainers.load() == 1);
  MutexLock lock(f.state.mu);
  CHECK(f.state.requested_epochs.size() == 1);
}

}  // namespace
}  // namespace odb::emit

namespace odb::emit {
namespace {

// A message with no kind a trainer sends (a daemon's own message sent back,
// a field of a newer protocol) opened a session and was then ignored without
// a count. Now it is counted as a bad message and opens nothing; the real
// trainer's first message still does.
TEST_CASE("a message of no known kind is counted, opens no session, and the next trainer message does") {
  Fixture f("nokind");
  wire::TrainerMessage empty;
  empty.set_version(wire::PROTOCOL_VERSION_CURRENT);
  f.Send(empty);
  wire::DaemonMessage echoed;  // a daemon's message, sent back
  echoed.set_version(wire::PROTOCOL_VERSION_CURRENT);
  echoed.mutable_session_ack();
  f.trainer.send(zmq::buffer(echoed.SerializeAsString()));
  f.PumpUntil([&] { return f.metrics.bad_trainer_messages.load() >= 2; });
  CHECK(f.metrics.bad_trainer_messages.load() == 2);
  CHECK(f.channel->session_fd() == -1);
  CHECK_FALSE(f.Receive(milliseconds(200)).has_value());  // no acknowledgement: no session
  f.OpenSession();
  CHECK(f.channel->session_fd() != -1);
}

// With more than one I/O thread a connection's close may be reported before
// its accept (the engine runs on another thread than the listener): the
// table would keep a closed connection open. The channel refuses such a
// context rather than track connections wrongly.
TEST_CASE("a context with more than one I/O thread is refused at Bind, saying why") {
  zmq::context_t context(2);
  DaemonState state(1 << 20, 64, 1);
  DaemonMetrics metrics;
  FakeClock clock;
  const std::string dir =
      std::filesystem::temp_directory_path() / ("odb-trainer-channel-io-" + std::to_string(getpid()));
  TrainerChannelOptions options;
  options.endpoint = "ipc://" + dir + "/out.sock";
  options.step_arena = false;
  TrainerChannel channel(context, options, state, metrics, clock);
  const absl::Status s = channel.Bind();
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(std::string(s.message()), Catch::Contains("one I/O thread") && Catch::Contains("has 2"));
  std::filesystem::remove_all(dir);
}

// 1,500 connections that each send a credit and close while the session is
// open, pumped as the daemon's loop does: the table of open connections
// comes back to the session's own (one entry per open descriptor, never one
// per connection ever made), none of them contends for or takes the
// session, and the session still gets its steps.
TEST_CASE("connection churn: the open-connection table stays bounded and the session keeps its steps") {
  Fixture f("churn", /*outstanding_depth=*/2);
  f.OpenSession();
  REQUIRE(f.channel->open_connections() == 1);
  const int session_fd = f.channel->session_fd();
  for (int batch = 0; batch < 15; ++batch) {
    std::vector<zmq::socket_t> peers;
    for (int i = 0; i < 100; ++i) {
      zmq::socket_t& peer = peers.emplace_back(f.context, zmq::socket_type::dealer);
      peer.set(zmq::sockopt::linger, 0);
      peer.connect(f.channel->endpoint());
      peer.send(zmq::buffer(Credit(1).SerializeAsString()));
    }
    f.PumpUntil([&] { return f.channel->open_connections() >= 1 + peers.size(); });
    peers.clear();  // closes them
    f.PumpUntil([&] { return f.channel->open_connections() == 1; });
    INFO("batch " << batch);
    REQUIRE(f.channel->open_connections() == 1);
  }
  CHECK(f.channel->session_fd() == session_fd);
  f.channel->EnqueueStep(Step(7));
  f.channel->Flush();
  auto step = f.Receive();
  REQUIRE(step);
  CHECK(step->has_step());
}

}  // namespace
}  // namespace odb::emit
