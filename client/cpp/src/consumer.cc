#include "odb/consumer.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <zmq.hpp>

#include "client/cpp/src/daemon_probe.h"
#include "client/cpp/src/delivery_decoder.h"
#include "client/cpp/src/fork_guard.h"
#include "proto/odb.pb.h"
#include "src/shm/arena_reader.h"
#include "src/shm/fd_passing.h"
#include "src/shm/unique_fd.h"

namespace odb::client {
namespace {

// The session's mapping of the daemon's step arena (docs/shm.md). Blocks are
// returned from whichever thread drops a step's last tensor (a Python
// finalizer runs on any thread), and the completion queue is single-producer:
// every Return holds mu.
struct StepArenaMapping {
  std::mutex mu;
  std::unique_ptr<shm::ArenaReader> reader;  // Return under mu; View is const
  uint64_t generation = 0;
  std::atomic<uint64_t> held{0};
  std::atomic<uint64_t> returned{0};
  std::atomic<uint64_t> return_failures{0};
};

// Returns one step's block when the last view of the step goes. A re-sent
// copy of a step this client already has is disarmed (the block belongs to
// the first copy). A fork()ed child's copy returns nothing: the block is the
// parent's.
struct StepBlockHolder {
  std::shared_ptr<StepArenaMapping> arena;
  uint64_t offset = 0, length = 0;
  pid_t owner = ::getpid();
  bool armed = true;
  ~StepBlockHolder() {
    if (!armed || ::getpid() != owner) return;
    std::lock_guard<std::mutex> lock(arena->mu);
    // Fails only when the daemon reset or closed the arena (it gave this
    // session up): nothing is left to hand back.
    if (arena->reader->Return(offset, length).ok()) {
      arena->returned.fetch_add(1);
    } else {
      arena->return_failures.fetch_add(1);
    }
    arena->held.fetch_sub(1);
  }
};

// Fetches the step arena's fd from the daemon's socket (request: the
// generation as text; answer: the fd, or no fd and the reason).
absl::StatusOr<shm::UniqueFd> FetchStepArenaFd(const wire::StepArenaOffer& offer, int timeout_ms) {
  const std::string& path = offer.socket_path();
  absl::StatusOr<shm::UniqueFd> sock = shm::ConnectSeqpacket(path, timeout_ms);
  if (absl::IsUnavailable(sock.status())) {
    return absl::UnavailableError("cannot connect to the step arena socket " + path + ": " +
                                  std::string(sock.status().message()) +
                                  " (is the daemon on another host or in another mount namespace?)");
  }
  if (!sock.ok()) return sock.status();
  const std::string request = std::to_string(offer.generation());
  if (::send(sock->get(), request.data(), request.size(), MSG_NOSIGNAL) < 0) {
    return absl::UnavailableError("step arena socket " + path + ": send: " + std::strerror(errno));
  }
  absl::StatusOr<shm::ReceivedFds> got = shm::RecvFds(sock->get());
  if (!got.ok()) return got.status();
  if (got->fds.size() != 1) {
    return absl::FailedPreconditionError("the daemon refused the step arena: " +
                                         (got->payload.empty() ? std::string("no reason given") : got->payload));
  }
  return std::move(got->fds[0]);
}

}  // namespace

struct Consumer::Impl {
  ConsumerOptions options;
  ForkGuard owner;  // see fork_guard.h
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::dealer};
  // The socket's connection events (ZMQ_EVENT_CONNECTED): ZeroMQ reconnects
  // by itself after a blip, and this client must then speak first (below).
  zmq::socket_t monitor{context, zmq::socket_type::pair};
  uint64_t connects = 0;  // CONNECTED events: the first is the initial connection
  uint64_t reconnects = 0;
  // Epochs asked for whose first step or summary has not come: a start_epoch
  // the daemon read after its connection closed is ignored (a late message
  // is no request), so it is sent again after a reconnect. The daemon ignores
  // a repeat of an epoch it already has (StartEpoch is idempotent).
  std::map<uint32_t, wire::TrainerMessage> pending_starts;
  std::set<uint32_t> summarized;  // epochs whose summary was delivered
  bool owe_credit = false;
  uint64_t data_wait_us = 0;  // reported since the last credit (Credit.data_wait_us)
  // The session's routing id: the daemon serves one trainer session and, if
  // this one reconnects, re-sends the steps it had not acknowledged.
  std::string session;
  // The last step delivered per epoch: re-sent steps already delivered are dropped.
  std::map<uint32_t, uint64_t> next_step;
  // The session's step arena once mapped (null: steps come as frames), and
  // the holder DecodeDelivery made for the last arena step (to disarm it
  // when the step is a re-sent duplicate).
  std::shared_ptr<StepArenaMapping> arena;
  StepBlockHolder* last_holder = nullptr;
  std::string arena_note;  // why the session has no arena, when it was offered one
  // The session's acknowledgement: seen (acked), and the job settings it
  // carried (nullopt from a daemon older than them). job_settings() keeps
  // the messages it reads before the acknowledgement for Next(), in order.
  bool acked = false;
  std::optional<JobSettings> settings;
  std::deque<std::shared_ptr<std::vector<zmq::message_t>>> early;
  // The pid of the daemon behind an ipc:// endpoint (its lock file), read at
  // connect: a wait for a step notices its death within kLivenessSliceMs.
  std::optional<pid_t> daemon_pid;
  static constexpr int kLivenessSliceMs = 200;

  // Maps the offered arena, answers the daemon. An error only when it
  // cannot be mapped and data_plane is "shm".
  absl::Status AcceptStepArena(const wire::StepArenaOffer& offer) {
    wire::TrainerMessage reply;
    reply.set_version(wire::PROTOCOL_VERSION_CURRENT);
    reply.mutable_step_arena_reply()->set_generation(offer.generation());
    absl::Status mapped = options.data_plane == "zmq"
                              ? absl::FailedPreconditionError("the trainer's data_plane is zmq")
                              : MapStepArena(offer);
    reply.mutable_step_arena_reply()->set_attached(mapped.ok());
    if (!mapped.ok()) {
      arena_note = std::string(mapped.message());
      reply.mutable_step_arena_reply()->set_error(arena_note);
    }
    if (absl::Status s = SendTrainer(reply); !s.ok()) return s;
    if (!mapped.ok() && options.data_plane == "shm") {
      return absl::FailedPreconditionError("data_plane shm: cannot map the daemon's step arena (" +
                                           offer.socket_path() + "): " + std::string(mapped.message()));
    }
    return absl::OkStatus();
  }

  absl::Status MapStepArena(const wire::StepArenaOffer& offer) {
    absl::StatusOr<shm::UniqueFd> fd = FetchStepArenaFd(offer, 5000);
    if (!fd.ok()) return fd.status();
    shm::AttachOptions o;
    o.expected_generation = offer.generation();
    o.expected_capacity_bytes = offer.capacity_bytes();
    auto reader = shm::ArenaReader::AttachFd(fd->get(), o);
    if (!reader.ok()) return reader.status();
    auto mapping = std::make_shared<StepArenaMapping>();
    mapping->reader = std::move(*reader);
    mapping->generation = offer.generation();
    arena = std::move(mapping);  // a previous session's mapping stays while its steps are held
    arena_note.clear();
    return absl::OkStatus();
  }

  absl::StatusOr<ResolvedBlock> ResolveBlock(uint64_t generation, uint64_t offset, uint64_t length) {
    if (arena == nullptr || arena->generation != generation) {
      return absl::DataLossError("its block is in step arena generation " + std::to_string(generation) +
                                 ", this client mapped " +
                                 (arena ? "generation " + std::to_string(arena->generation) : "none"));
    }
    absl::StatusOr<std::span<std::byte>> bytes = arena->reader->View(offset, length);
    if (!bytes.ok()) return bytes.status();
    auto holder = std::make_shared<StepBlockHolder>();
    holder->arena = arena;
    holder->offset = offset;
    holder->length = length;
    arena->held.fetch_add(1);
    last_holder = holder.get();
    return ResolvedBlock{reinterpret_cast<const uint8_t*>(bytes->data()), std::move(holder)};
  }

  // Handles the connection events queued so far: after a reconnect the
  // daemon revives the session only on a message from the new connection,
  // and forgets a start_epoch that came on the old one after it closed. So
  // the client announces itself again (a credit of 0 steps: the daemon
  // re-sends the steps it had not acknowledged) and re-sends every epoch
  // request not yet answered, with the same fields and `resend` set (the
  // epoch may have ended meanwhile, its steps not read yet).
  // A zmq call again while a signal interrupts it (EINTR: e.g. the SIGCHLD a
  // trainer gets when a DataLoader worker or a spawned odbd exits); any other
  // error is thrown as before.
  template <typename F>
  static auto RetryOnSignal(F&& call) {
    while (true) {
      try {
        return call();
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) throw;
      }
    }
  }

  absl::Status OnMonitor() {
    bool reconnected = false;
    while (true) {
      zmq::message_t event;
      zmq::recv_result_t got;
      try {
        got = monitor.recv(event, zmq::recv_flags::dontwait);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        return absl::OkStatus();  // the monitor is gone (the socket closes): nothing to do
      }
      if (!got) break;
      if (event.more()) {  // the second frame (the endpoint): not needed
        zmq::message_t endpoint;
        (void)RetryOnSignal([&] { return monitor.recv(endpoint, zmq::recv_flags::dontwait); });
      }
      if (event.size() < 6) continue;
      uint16_t id = 0;
      std::memcpy(&id, event.data(), sizeof(id));
      if (id == ZMQ_EVENT_CONNECTED && ++connects > 1) reconnected = true;
    }
    if (!reconnected) return absl::OkStatus();
    ++reconnects;
    wire::TrainerMessage hello;
    hello.set_version(wire::PROTOCOL_VERSION_CURRENT);
    hello.mutable_credit()->set_steps(0);
    if (absl::Status s = SendTrainer(hello); !s.ok()) return s;
    for (const auto& [epoch, start] : pending_starts) {
      wire::TrainerMessage again = start;
      again.mutable_start_epoch()->set_resend(true);
      if (absl::Status s = SendTrainer(again); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Waits until a message is there to read (true) or `timeout_ms` passed
  // (false), handling connection events meanwhile.
  absl::StatusOr<bool> WaitReadable(int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      if (absl::Status s = OnMonitor(); !s.ok()) return s;
      if (RetryOnSignal([&] { return socket.get(zmq::sockopt::events); }) & ZMQ_POLLIN) return true;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      if (daemon_pid) {
        if (absl::Status s = client_internal::CheckDaemonAlive(options.endpoint, *daemon_pid); !s.ok())
          return s;
      }
      zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0}, {monitor.handle(), 0, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 2, daemon_pid ? std::min(left, std::chrono::milliseconds(kLivenessSliceMs)) : left);
      } catch (const zmq::error_t& e) {
        // A signal (e.g. the SIGCHLD PyTorch's DataLoader gets when a worker
        // exits) interrupts the wait: that is not an error, wait on.
        if (e.num() != EINTR) throw;
      }
    }
  }

  // One message from the daemon (its frames), waiting at most `timeout_ms`
  // for it; a timeout says `what` did not come.
  absl::StatusOr<std::shared_ptr<std::vector<zmq::message_t>>> Receive(const std::string& what,
                                                                       int timeout_ms) {
    auto frames = std::make_shared<std::vector<zmq::message_t>>();
    try {
      absl::StatusOr<bool> readable = WaitReadable(timeout_ms);
      if (!readable.ok()) return readable.status();
      if (!*readable) {
        return absl::DeadlineExceededError(what + " within " + std::to_string(timeout_ms) +
                                           " ms: is odbd running, and are its producers sending?");
      }
      do {
        zmq::message_t part;
        // A signal (e.g. the SIGCHLD PyTorch's DataLoader gets when a worker
        // exits) interrupts recv with EINTR: that is not an error, retry.
        zmq::recv_result_t got;
        while (true) {
          try {
            got = socket.recv(part);
            break;
          } catch (const zmq::error_t& e) {
            if (e.num() != EINTR) throw;
          }
        }
        if (!got) {
          return absl::DeadlineExceededError(what + " within " + std::to_string(timeout_ms) +
                                             " ms: is odbd running, and are its producers sending?");
        }
        frames->push_back(std::move(part));
      } while (frames->back().more());
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError("receive from daemon at " + options.endpoint + " failed: " + e.what());
    }
    return frames;
  }

  absl::Status SendTrainer(const wire::TrainerMessage& m) {
    std::string bytes = m.SerializeAsString();
    try {
      if (!socket.send(zmq::buffer(bytes), zmq::send_flags::dontwait)) {
        return absl::UnavailableError("cannot reach the daemon at " + options.endpoint +
                                      " (send queue full)");
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError("send to daemon at " + options.endpoint + " failed: " + e.what());
    }
    return absl::OkStatus();
  }
};

Consumer::Consumer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Consumer::~Consumer() {
  // A forked copy must not touch the context (zmq_ctx_term would wait forever).
  if (impl_ && impl_->owner.forked()) (void)impl_.release();
}

absl::StatusOr<std::unique_ptr<Consumer>> Consumer::Connect(const ConsumerOptions& options) {
  if (options.data_plane != "auto" && options.data_plane != "shm" && options.data_plane != "zmq") {
    return absl::InvalidArgumentError("data_plane '" + options.data_plane + "' is not one of auto, shm, zmq");
  }
  if (options.data_plane == "shm" && options.endpoint.rfind("ipc://", 0) != 0) {
    return absl::InvalidArgumentError("data_plane shm needs an ipc:// endpoint (a daemon on this host), not '" +
                                      options.endpoint + "'");
  }
  // ZeroMQ connects lazily: a missing daemon or a stale socket file is told now, not by a timeout.
  if (absl::Status s = client_internal::CheckDaemonReachable(options.endpoint); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->daemon_pid = client_internal::DaemonPid(options.endpoint);
  try {
    // Closing flushes what is queued (the last credit carries the trainer's
    // data wait for the epoch's last step) for at most 1 s: bounded when the
    // daemon is gone, and with linger 0 ZeroMQ would drop it.
    impl->socket.set(zmq::sockopt::linger, 1000);
    impl->socket.set(zmq::sockopt::rcvtimeo, options.receive_timeout_ms);
    impl->socket.set(zmq::sockopt::sndhwm, 1000);
    std::random_device random;
    char id[32];
    std::snprintf(id, sizeof(id), "trainer-%08x%08x", random(), random());
    impl->session = id;
    impl->socket.set(zmq::sockopt::routing_id, impl->session);
    // The monitor first, so that the initial connection is its first CONNECTED.
    const char* monitor_endpoint = "inproc://odb-consumer-monitor";  // this consumer's own context
    if (zmq_socket_monitor(impl->socket.handle(), monitor_endpoint, ZMQ_EVENT_CONNECTED) != 0) {
      return absl::InternalError(std::string("cannot monitor the trainer socket: ") +
                                 zmq_strerror(zmq_errno()));
    }
    impl->monitor.set(zmq::sockopt::linger, 0);
    impl->monitor.connect(monitor_endpoint);
    impl->socket.connect(options.endpoint);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError("cannot connect to '" + options.endpoint + "': " + e.what());
  }
  // Announce the session (a credit of 0 steps): a daemon that already serves
  // another trainer answers SESSION_REFUSED at once.
  wire::TrainerMessage hello;
  hello.set_version(wire::PROTOCOL_VERSION_CURRENT);
  hello.mutable_credit()->set_steps(0);
  if (absl::Status s = impl->SendTrainer(hello); !s.ok()) return s;
  return std::unique_ptr<Consumer>(new Consumer(std::move(impl)));
}

namespace {

wire::TrainerMessage StartEpochMessage(uint32_t epoch, uint32_t expected_producers, uint64_t first_round,
                                       uint64_t first_step) {
  wire::TrainerMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  m.mutable_start_epoch()->set_epoch(epoch);
  m.mutable_start_epoch()->set_expected_producers(expected_producers);
  m.mutable_start_epoch()->set_first_round(first_round);
  m.mutable_start_epoch()->set_first_step(first_step);
  return m;
}

}  // namespace

absl::Status Consumer::StartEpoch(uint32_t epoch, uint32_t expected_producers, uint64_t first_round,
                                  uint64_t first_step) {
  if (absl::Status s = impl_->owner.Check("this odb Consumer"); !s.ok()) return s;
  const wire::TrainerMessage m = StartEpochMessage(epoch, expected_producers, first_round, first_step);
  impl_->pending_starts[epoch] = m;
  return impl_->SendTrainer(m);
}

absl::Status Consumer::StartEpochLostForTest(uint32_t epoch, uint32_t expected_producers,
                                             uint64_t first_round, uint64_t first_step) {
  if (absl::Status s = impl_->owner.Check("this odb Consumer"); !s.ok()) return s;
  const wire::TrainerMessage m = StartEpochMessage(epoch, expected_producers, first_round, first_step);
  impl_->pending_starts[epoch] = m;  // sent, as far as this client knows; the daemon never acts on it
  return absl::OkStatus();
}

absl::Status Consumer::ReconnectForTest() {
  if (absl::Status s = impl_->owner.Check("this odb Consumer"); !s.ok()) return s;
  try {
    impl_->socket.disconnect(impl_->options.endpoint);
    impl_->socket.connect(impl_->options.endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError("reconnect to '" + impl_->options.endpoint + "' failed: " + e.what());
  }
  return absl::OkStatus();
}

uint64_t Consumer::reconnects() const { return impl_->reconnects; }

absl::StatusOr<Delivery> Consumer::Next() {
  if (absl::Status s = impl_->owner.Check("this odb Consumer"); !s.ok()) return s;
  if (impl_->owe_credit) {
    wire::TrainerMessage credit;
    credit.set_version(wire::PROTOCOL_VERSION_CURRENT);
    credit.mutable_credit()->set_steps(1);
    credit.mutable_credit()->set_data_wait_us(impl_->data_wait_us);
    if (absl::Status s = impl_->SendTrainer(credit); !s.ok()) return s;
    impl_->owe_credit = false;
    impl_->data_wait_us = 0;
  }
  while (true) {
    std::shared_ptr<std::vector<zmq::message_t>> frames;
    if (!impl_->early.empty()) {
      frames = std::move(impl_->early.front());
      impl_->early.pop_front();
    } else {
      absl::StatusOr<std::shared_ptr<std::vector<zmq::message_t>>> received = impl_->Receive(
          "no step from the daemon at " + impl_->options.endpoint, impl_->options.receive_timeout_ms);
      if (!received.ok()) return received.status();
      frames = std::move(*received);
    }
  if (frames->size() == 1) {
    // A step arena offer is answered here, never delivered.
    wire::DaemonMessage head;
    const zmq::message_t& f = frames->front();
    if (head.ParseFromArray(f.data(), static_cast<int>(f.size())) && head.has_step_arena() &&
        head.version() == wire::PROTOCOL_VERSION_CURRENT) {
      if (absl::Status s = impl_->AcceptStepArena(head.step_arena()); !s.ok()) return s;
      continue;
    }
  }
  impl_->last_holder = nullptr;
  absl::StatusOr<Delivery> d =
      DecodeDelivery(std::move(frames), impl_->options.endpoint,
                     [this](uint64_t g, uint64_t o, uint64_t l) { return impl_->ResolveBlock(g, o, l); });
  if (d.ok() && d->kind == Delivery::Kind::kSessionAck) {  // the daemon checking this session
    impl_->acked = true;
    impl_->settings = d->settings;
    continue;
  }
  if (d.ok()) {
    // The epoch is answered: a reconnect from now on needs no request again.
    impl_->pending_starts.erase(d->kind == Delivery::Kind::kStep ? d->step.epoch : d->summary.epoch);
  }
  if (d.ok() && d->kind == Delivery::Kind::kStep) {
    // After a reconnect the daemon re-sends the steps it had no credit for;
    // the ones delivered already are dropped here (steps arrive in order).
    // A dropped copy's block is not returned: the first copy's holder does
    // that (and may have done it already).
    uint64_t& next = impl_->next_step[d->step.epoch];
    if (d->step.step_index < next) {
      if (impl_->last_holder != nullptr) impl_->last_holder->armed = false;
      continue;
    }
    next = d->step.step_index + 1;
    impl_->owe_credit = true;
  }
  if (d.ok() && d->kind == Delivery::Kind::kEpochEnd) {
    // The daemon re-sends an epoch's summary after a reconnect until a step
    // sent after it is credited: one delivered already is dropped.
    if (!impl_->summarized.insert(d->summary.epoch).second) continue;
  }
  return d;
  }
}

absl::StatusOr<std::optional<JobSettings>> Consumer::job_settings(std::optional<int> timeout_ms) {
  if (absl::Status s = impl_->owner.Check("this odb Consumer"); !s.ok()) return s;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(timeout_ms.value_or(impl_->options.receive_timeout_ms));
  while (!impl_->acked) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    absl::StatusOr<std::shared_ptr<std::vector<zmq::message_t>>> frames = impl_->Receive(
        "no session acknowledgement (job settings) from the daemon at " + impl_->options.endpoint,
        static_cast<int>(std::max<int64_t>(0, left.count())));
    if (!frames.ok()) return frames.status();
    wire::DaemonMessage head;
    const zmq::message_t& f = (*frames)->front();
    if (head.ParseFromArray(f.data(), static_cast<int>(f.size())) && head.has_session_ack() &&
        head.version() == wire::PROTOCOL_VERSION_CURRENT) {
      absl::StatusOr<Delivery> ack = DecodeDelivery(std::move(*frames), impl_->options.endpoint);
      if (!ack.ok()) return ack.status();
      impl_->acked = true;
      impl_->settings = ack->settings;
    } else if (head.has_fatal() || head.version() != wire::PROTOCOL_VERSION_CURRENT) {
      // A refused session, a daemon that failed, another protocol: the error Next() would give.
      return DecodeDelivery(std::move(*frames), impl_->options.endpoint).status();
    } else {
      impl_->early.push_back(std::move(*frames));  // Next() delivers it
    }
  }
  return impl_->settings;
}

void Consumer::ReportDataWait(std::chrono::microseconds wait) {
  if (wait.count() > 0) impl_->data_wait_us += static_cast<uint64_t>(wait.count());
}

std::string Consumer::data_plane() const { return impl_->arena ? "shm" : "zmq"; }

const std::string& Consumer::arena_note() const { return impl_->arena_note; }

std::optional<StepArenaStats> Consumer::step_arena_stats() const {
  if (!impl_->arena) return std::nullopt;
  StepArenaStats s;
  s.generation = impl_->arena->generation;
  s.capacity_bytes = impl_->arena->reader->arena().capacity_bytes();
  s.held_steps = impl_->arena->held.load();
  s.returned_steps = impl_->arena->returned.load();
  s.return_failures = impl_->arena->return_failures.load();
  return s;
}

}  // namespace odb::client
