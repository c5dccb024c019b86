#include "src/emit/trainer_channel.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "src/common/zmq_transfer.h"
#include "src/emit/step_encoder.h"

namespace odb::emit {
namespace {

std::vector<zmq::message_t> FatalMessage(wire::ErrorCode code, const std::string& text, int rank) {
  wire::DaemonMessage message;
  message.set_version(wire::PROTOCOL_VERSION_CURRENT);
  message.mutable_fatal()->set_code(code);
  message.mutable_fatal()->set_message(text);
  message.mutable_fatal()->set_rank(rank);
  return EncodeControl(message);
}

std::string Printable(const std::string& routing_id) {
  std::string out;
  for (unsigned char c : routing_id) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%02x", c);
      out += hex;
    }
  }
  return out.substr(0, 64);
}

std::atomic<int> g_monitor_count{0};

}  // namespace

TrainerChannel::TrainerChannel(zmq::context_t& context, TrainerChannelOptions options, DaemonState& state,
                               DaemonMetrics& metrics, const Clock& clock)
    : context_(context),
      options_(std::move(options)),
      state_(state),
      metrics_(metrics),
      clock_(clock),
      socket_(context, zmq::socket_type::router),
      monitor_(context, zmq::socket_type::pair),
      queue_(options_.outstanding_depth),
      arena_(StepArenaHandshakeOptions{options_.step_arena, options_.step_arena_required,
                                       options_.step_arena_bytes},
             clock),
      log_limiter_(clock, kLogKinds, "trainer socket",
                   "odb_bad_trainer_messages_total, odb_refused_trainers_total and "
                   "odb_late_trainer_messages_total") {}

absl::Status TrainerChannel::Bind() {
  // Connection tracking relies on the monitor reporting a connection's
  // accept before its close: true with one I/O thread (the listener emits
  // the accept before the new connection's engine first runs, on the same
  // thread). With more, an engine on another thread may report its close
  // first, and a closed connection would stay "open" in the table.
  if (const int io_threads = zmq_ctx_get(context_.handle(), ZMQ_IO_THREADS); io_threads != 1) {
    return absl::InternalError(
        "the trainer channel needs a ZeroMQ context with one I/O thread (this one has " +
        std::to_string(io_threads) + "): its connection events must arrive in order");
  }
  try {
    EnsureIpcDirectory(options_.endpoint);
    socket_.set(zmq::sockopt::linger, 1000);
    socket_.set(zmq::sockopt::sndhwm, static_cast<int>(options_.outstanding_depth) * 2 + 16);
    socket_.set(zmq::sockopt::rcvhwm, 1000);
    socket_.set(zmq::sockopt::router_mandatory, true);
    socket_.set(zmq::sockopt::router_handover, true);         // the same session may reconnect
    socket_.set(zmq::sockopt::maxmsgsize, int64_t{1} << 20);  // trainer messages are tiny
    // The monitor first: a message counts only from a connection whose
    // accept the monitor reported, so none may be accepted before it listens.
    // Its events are never dropped: when its pipe is full (~2,000 events
    // the loop has not read: OnMonitor drains it every iteration) libzmq's
    // I/O thread waits for room, stalling every socket of the context until
    // the loop reads again (seen with 1,000 connections churned while
    // nothing read the monitor).
    monitor_endpoint_ = "inproc://odb-trainer-monitor-" + std::to_string(g_monitor_count.fetch_add(1));
    if (zmq_socket_monitor(socket_.handle(), monitor_endpoint_.c_str(),
                           ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
      // Without it no message could ever open a session: refuse to start.
      return absl::InternalError(std::string("cannot monitor the trainer socket's connections (") +
                                 zmq_strerror(zmq_errno()) +
                                 "); the daemon cannot tell a trainer's messages "
                                 "from a closed connection's without it");
    }
    monitor_.set(zmq::sockopt::linger, 0);
    monitor_.connect(monitor_endpoint_);
    socket_.bind(options_.endpoint);
    bound_ = socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError("cannot bind the trainer endpoint " + options_.endpoint + " (" + e.what() +
                                  "); is another odbd using it?");
  }
  if (const std::string why = RestrictIpcSocket(bound_); !why.empty()) {
    return absl::PermissionDeniedError("the trainer endpoint " + options_.endpoint + ": " + why);
  }
  // The step arena: only a local trainer (ipc://) can map the daemon's memory.
  if (absl::Status s = arena_.Listen(bound_); !s.ok()) return s;
  return absl::OkStatus();
}

void TrainerChannel::OfferStepArena(const std::string& peer) {
  absl::StatusOr<std::optional<wire::DaemonMessage>> offer = arena_.NewSession();
  if (!offer.ok()) {
    fatal_ = {wire::INTERNAL, std::string(offer.status().message())};
    return;
  }
  if (!offer->has_value()) return;
  auto parts = EncodeControl(**offer);
  if (!TrySendTo(socket_, peer, parts).ok()) {
    if (MayLog(kLogUndelivered)) spdlog::warn("step arena offer not delivered; steps go as frames");
    return;
  }
  arena_.OfferDelivered();
}

void TrainerChannel::Refuse(const std::string& peer, wire::ErrorCode code, const std::string& message) {
  if (MayLog(kLogRefused)) spdlog::warn("trainer peer {}: {}", Printable(peer), message);
  auto parts = FatalMessage(code, message, options_.rank);
  Transfer t = TrySendTo(socket_, peer, parts);
  if (!t.ok() && MayLog(kLogUndelivered)) {
    spdlog::warn("refusal not delivered ({})", TransferCodeName(t.code));
  }
}

bool TrainerChannel::OnReadable() {
  bool requested = false;
  std::vector<zmq::message_t> parts;
  for (int n = 0; n < 64; ++n) {
    Transfer t = TryRecvMultipart(socket_, parts);
    if (t.code == TransferCode::kAgain) break;
    if (t.code == TransferCode::kInterrupted) continue;
    if (!t.ok()) {
      spdlog::warn("trainer socket: receive failed ({})", t.error);
      break;
    }
    if (parts.size() < 2) continue;
    const std::string peer = parts[0].to_string();
    const int fd = zmq_msg_get(parts[1].handle(), ZMQ_SRCFD);
    if (parts.size() != 2) {
      metrics_.bad_trainer_messages.fetch_add(1);
      if (MayLog(kLogMalformed)) {
        spdlog::warn("trainer peer {} sent a message of {} frames; a trainer message is one frame; ignored",
                     Printable(peer), parts.size() - 1);
      }
      continue;
    }
    wire::TrainerMessage msg;
    if (!msg.ParseFromArray(parts[1].data(), static_cast<int>(parts[1].size()))) {
      metrics_.bad_trainer_messages.fetch_add(1);
      if (MayLog(kLogMalformed)) {
        spdlog::warn("trainer peer {} sent an unreadable message ({} bytes); ignored", Printable(peer),
                     parts[1].size());
      }
      continue;
    }
    if (msg.version() != wire::PROTOCOL_VERSION_CURRENT) {
      Refuse(peer, wire::VERSION_MISMATCH,
             "trainer client speaks protocol version " + std::to_string(msg.version()) + ", daemon speaks " +
                 std::to_string(wire::PROTOCOL_VERSION_CURRENT) + "; upgrade both together");
      continue;
    }
    if (msg.kind_case() == wire::TrainerMessage::KIND_NOT_SET) {
      // No kind a trainer sends (a daemon's message sent back, a field of a
      // newer protocol): neither a sign of a trainer nor anything to apply.
      metrics_.bad_trainer_messages.fetch_add(1);
      if (MayLog(kLogMalformed)) {
        spdlog::warn(
            "trainer peer {} sent a message of no kind this daemon knows ({} bytes; a trainer sends credit, "
            "start_epoch or step_arena_reply); ignored",
            Printable(peer), parts[1].size());
      }
      continue;
    }
    // Which connection it came on, judged after the monitor's pending events:
    // a close that happened before this read is known by now.
    OnMonitor();
    const uint64_t connection = connections_.OfFrame(fd, parts[1]);
    if (connection == 0 && peer != session_) {
      NoteLate(peer, msg, /*applied=*/false);  // its sender is gone: it neither contends nor opens a session
      continue;
    }
    if (!session_.empty() && peer != session_ && !lost_since_) {
      if (!contender_ || contender_->peer != peer) {
        if (contender_) {  // a third peer: only one may wait
          metrics_.refused_trainers.fetch_add(1);
          Refuse(peer, wire::SESSION_REFUSED,
                 "rank " + std::to_string(options_.rank) + " already serves trainer session " +
                     Printable(session_) + "; one trainer per daemon");
          continue;
        }
        contender_ = Contender{peer, fd, connection, clock_.Now(), {}};
      }
      if (contender_->waiting.size() < kContenderMessages) contender_->waiting.push_back(std::move(msg));
      continue;
    }
    if (contender_ && contender_->peer == peer) {
      // The waiting peer is through (the session closed): its held messages
      // first, in order.
      Contender c = std::move(*contender_);
      contender_.reset();
      for (const wire::TrainerMessage& m : c.waiting) requested |= Handle(c.peer, c.fd, c.connection, m);
    }
    requested |= Handle(peer, fd, connection, msg);
  }
  requested |= SettleContender();
  return requested;
}

bool TrainerChannel::SettleContender() {
  if (!contender_) return false;
  if (!lost_since_ && clock_.Now() - contender_->since < kContenderGrace) return false;
  Contender c = std::move(*contender_);
  contender_.reset();
  if (!lost_since_) {
    metrics_.refused_trainers.fetch_add(1);
    Refuse(c.peer, wire::SESSION_REFUSED,
           "rank " + std::to_string(options_.rank) + " already serves trainer session " +
               Printable(session_) +
               "; one trainer per daemon (is a second training process pointed at the same odbd?)");
    return false;
  }
  bool requested = false;
  for (const wire::TrainerMessage& m : c.waiting) requested |= Handle(c.peer, c.fd, c.connection, m);
  return requested;
}

void TrainerChannel::CountDataWait(const wire::Credit& credit) {
  // The trainer's data wait since its last credit (odb.top names the rank
  // that waits most). One report is at most a day: a garbage value cannot
  // wrap the counter or swamp the other ranks' numbers.
  constexpr uint64_t kMaxDataWaitUs = 86400ull * 1000 * 1000;
  const uint64_t wait_us = credit.data_wait_us();
  if (wait_us > kMaxDataWaitUs) {
    metrics_.bad_trainer_messages.fetch_add(1);
    if (MayLog(kLogBadValue)) {
      spdlog::warn("trainer reported a data wait of {} us on one credit (more than a day); counted as {} us",
                   wait_us, kMaxDataWaitUs);
    }
  }
  metrics_.trainer_data_wait_us.fetch_add(std::min(wait_us, kMaxDataWaitUs));
}

void TrainerChannel::NoteLate(const std::string& peer, const wire::TrainerMessage& msg, bool applied) {
  metrics_.late_trainer_messages.fetch_add(1);
  const char* kind = msg.has_credit()             ? "credit"
                     : msg.has_start_epoch()      ? "start_epoch"
                     : msg.has_step_arena_reply() ? "step_arena_reply"
                                                  : "message";
  spdlog::debug("trainer peer {}: a {} read after its connection had closed; {}", Printable(peer), kind,
                applied ? "applied as the session's, not taken as a reconnect"
                        : "not applied and not taken as a (re)connect: its sender is gone");
}

TrainerChannel::Admission TrainerChannel::Admit(const std::string& peer, int fd, uint64_t connection,
                                                const wire::TrainerMessage& msg) {
  // A contender's held messages are judged when they are handled: its
  // connection may have closed while it waited.
  const bool open = IsOpen(fd, connection);
  if (session_.empty() || peer != session_) {
    // Only a connected peer opens a session: one on a connection the monitor
    // still knows open, and that takes the acknowledgement.
    if (!open || !Acknowledge(peer)) {
      NoteLate(peer, msg, /*applied=*/false);
      return Admission::kDropped;
    }
    if (!session_.empty() && queue_.DeliveredInEpoch() > 0) {
      // The lost trainer had steps of an open epoch; nobody knows which it trained.
      const std::string text =
          std::string("a new trainer connected while epoch steps were ") +
          "delivered to a previous trainer session that disconnected (" +
          std::to_string(queue_.DeliveredInEpoch()) + " steps sent, " +
          std::to_string(queue_.UnacknowledgedSteps()) +
          " not acknowledged); the epoch cannot continue with a new session: restart the job "
          "(its daemons and trainers) from a checkpoint";
      Refuse(peer, wire::EPOCH_LOST, text);
      fatal_ = {wire::EPOCH_LOST, text};
      return Admission::kDropped;
    }
    if (!session_.empty() && MayLog(kLogSession)) {
      spdlog::info("trainer session {} replaced between epochs", Printable(session_));
    }
    session_ = peer;
    session_fd_ = fd;
    session_connection_ = connection;
    lost_since_.reset();
    queue_.Reset();
    if (MayLog(kLogSession)) spdlog::info("trainer session {} started", Printable(peer));
    OfferStepArena(peer);
  } else if (lost_since_ || connection != session_connection_) {
    // The session's id on a connection other than the one it is bound to:
    // back on a new connection (a transient disconnect), or a message that a
    // closed connection had left queued. Only the first is a reconnect: the
    // connection must be open, and the peer reachable (ROUTER_MANDATORY). A
    // late message does not revive the session, reset its timeout or re-send
    // steps. What it reports still holds (a credit acknowledges steps the
    // trainer did consume and is not sent again; its data wait was real; an
    // arena answer), so that is applied below; what it asks for is not (a
    // start_epoch of a trainer that is gone: a trainer restarted from a
    // checkpoint asks for that epoch itself, maybe resuming mid-way).
    // (A late message read after the OS gave its descriptor to a new
    // connection is still known by its connection's metadata: see
    // ConnectionOfFrame.)
    if (!open || !Acknowledge(session_)) {
      NoteLate(peer, msg, /*applied=*/!msg.has_start_epoch());
      return Admission::kLate;
    } else {
      // Back: re-send what it may not have received (the client drops the
      // steps it already has).
      lost_since_.reset();
      session_fd_ = fd;
      session_connection_ = connection;
      spdlog::info("trainer session {} reconnected; re-sending {} unacknowledged step(s) and {} epoch end(s)",
                   Printable(peer), queue_.UnacknowledgedSteps(),
                   queue_.Unacknowledged() - queue_.UnacknowledgedSteps());
      queue_.Resend(
          [this](std::vector<zmq::message_t> copy) { return TrySendTo(socket_, session_, copy).ok(); });
    }
  }
  return Admission::kSession;
}

bool TrainerChannel::StartEpoch(const std::string& peer, const wire::StartEpoch& request) {
  bool requested = false;
  MutexLock lock(state_.mu);
  const uint32_t epoch = request.epoch();
  if (request.expected_producers() > 0) {
    state_.expected_producers = request.expected_producers();
  }
  constexpr size_t kMaxRequestedEpochs = 16;
  const size_t waiting = state_.requested_epochs.size();
  const bool again = std::find(state_.requested_epochs.begin(), state_.requested_epochs.end(), epoch) !=
                     state_.requested_epochs.end();
  if (state_.tracker.IsClosed(epoch) && request.resend()) {
    // A reconnect's re-send of a request this daemon did serve: the epoch
    // ended while the client reconnected, its steps and summary are sent or
    // queued to it (the unacknowledged ones again, above).
    if (MayLog(kLogBadValue))
      spdlog::info("trainer re-sent its request for epoch {}, which has ended; ignored", epoch);
  } else if (state_.tracker.IsClosed(epoch)) {
    // A first request (the client forgets a start_epoch once the epoch's
    // first step or summary came, and marks re-sends): a new trainer (a
    // second loader, a rerun of a script) on a daemon that already ran this
    // epoch. Told at once, not after its workers sent the whole epoch for
    // nothing.
    const uint32_t next = state_.tracker.FirstOpenEpoch();
    Refuse(peer, wire::WRONG_EPOCH,
           "epoch " + std::to_string(epoch) + " has already ended on this daemon (an earlier loader or run " +
               "used it; epochs on one daemon only go forward): start at epoch " + std::to_string(next) +
               " or later (OdbDataLoader.set_epoch(" + std::to_string(next) +
               ")), or start a fresh daemon for a new job");
  } else if (again || state_.current_epoch == epoch) {
    // The client re-sends an unanswered start_epoch after a reconnect: normal.
    if (MayLog(kLogBadValue)) spdlog::info("trainer asked for epoch {} again; ignored", epoch);
  } else if (waiting >= kMaxRequestedEpochs) {
    metrics_.bad_trainer_messages.fetch_add(1);
    if (MayLog(kLogBadValue)) {
      spdlog::warn("trainer asked for epoch {} with {} epochs already waiting; ignored (at most {})", epoch,
                   waiting, kMaxRequestedEpochs);
    }
  } else {
    state_.requested_epochs.push_back(epoch);
    if (request.first_round() > 0 || request.first_step() > 0) {
      state_.resume_points[epoch] = {request.first_round(), request.first_step()};
      spdlog::info("trainer resumes epoch {} at round {}, step {}", epoch, request.first_round(),
                   request.first_step());
    }
    requested = true;
    spdlog::info("trainer started epoch {} (expecting {} producer(s))", epoch, state_.expected_producers);
  }
  state_.cv.NotifyAll();
  return requested;
}

bool TrainerChannel::Handle(const std::string& peer, int fd, uint64_t connection,
                            const wire::TrainerMessage& msg) {
  const Admission admission = Admit(peer, fd, connection, msg);
  if (admission == Admission::kDropped) return false;
  const bool late =
      admission == Admission::kLate;  // the session's message, from a connection that has closed
  bool requested = false;
  if (msg.has_step_arena_reply()) {
    if (absl::Status s = arena_.OnReply(msg.step_arena_reply()); !s.ok()) {
      fatal_ = {wire::INTERNAL, std::string(s.message())};
    }
  } else if (msg.has_credit()) {
    queue_.Credit(msg.credit().steps());
    CountDataWait(msg.credit());
  } else if (msg.has_start_epoch() && late) {
    if (MayLog(kLogLate)) {
      spdlog::info(
          "trainer session {} asked for epoch {} on a connection that closed before the daemon read it; "
          "ignored (a trainer that is gone asks for nothing; a new one asks for its epoch itself)",
          Printable(peer), msg.start_epoch().epoch());
    }
  } else if (msg.has_start_epoch()) {
    requested = StartEpoch(peer, msg.start_epoch());
  }
  return requested;
}

wire::JobSettings JobSettingsOf(const TrainerChannelOptions& options) {
  wire::JobSettings s;
  s.set_tokens_per_step(options.window_target);
  s.set_packed(options.collate.packed);
  s.set_trainer_data_plane(!options.step_arena ? "zmq" : options.step_arena_required ? "shm" : "auto");
  s.set_length_field(options.collate.length_field);
  // The pad value of the padded `labels` field is what the loss ignores (the
  // name odb's Python encoding and loss use).
  for (const collate::FieldSpec& f : options.collate.fields) {
    if (f.name == "labels" && f.rule == collate::FieldRule::kPad) {
      s.set_ignore_index(static_cast<int64_t>(f.pad_value));
    }
  }
  return s;
}

bool TrainerChannel::Acknowledge(const std::string& peer) {
  wire::DaemonMessage ack;
  ack.set_version(wire::PROTOCOL_VERSION_CURRENT);
  *ack.mutable_session_ack()->mutable_settings() = JobSettingsOf(options_);
  auto parts = EncodeControl(ack);
  return TrySendTo(socket_, peer, parts).ok();
}

void TrainerChannel::OnMonitor() {
  std::vector<zmq::message_t> event;
  while (TryRecvMultipart(monitor_, event).ok()) {
    if (event.empty() || event[0].size() < 6) continue;
    uint16_t id = 0;
    int32_t value = 0;
    std::memcpy(&id, event[0].data(), sizeof(id));
    std::memcpy(&value, static_cast<const char*>(event[0].data()) + 2, sizeof(value));
    OnConnectionEvent(id, value);
  }
}

void TrainerChannel::OnConnectionEvent(uint16_t event, int fd) {
  if (event == ZMQ_EVENT_ACCEPTED) {
    connections_.Accepted(fd);  // the descriptor may be one a closed connection had
    return;
  }
  if (event != ZMQ_EVENT_DISCONNECTED) return;
  const std::optional<uint64_t> closed = connections_.Closed(fd);
  if (!closed) return;
  if (!session_.empty() && *closed == session_connection_) {
    lost_since_ = clock_.Now();
    session_connection_ = 0;
    metrics_.trainer_disconnects.fetch_add(1);
    if (MayLog(kLogSession)) spdlog::info("trainer session {} disconnected", Printable(session_));
  }
}

bool TrainerChannel::SendToSession(std::vector<zmq::message_t>& parts) {
  if (session_.empty() || lost_since_) return false;
  Transfer t = TrySendTo(socket_, session_, parts);
  if (t.code == TransferCode::kUnreachable) {
    if (!lost_since_) lost_since_ = clock_.Now();
    session_connection_ = 0;  // gone, whatever the monitor says yet: only a reconnect revives it
    return false;
  }
  if (t.code == TransferCode::kError) spdlog::warn("send to the trainer failed: {}", t.error);
  return t.ok();
}

void TrainerChannel::Flush() {
  while (std::optional<CreditQueue::Message> message = queue_.Next()) {
    if (message->arena != nullptr && message->arena != ActiveArena()) {
      // Placed in an arena the session no longer reads (a new session, or
      // it declined): its bytes are still mapped here, they go as frames.
      message->parts = StepToFrames(message->parts, *message->arena);
      message->arena.reset();
    }
    std::vector<zmq::message_t> kept = CreditQueue::CopyParts(message->parts);
    if (!SendToSession(message->parts)) {
      queue_.Unsend(std::move(*message));
      return;
    }
    queue_.Sent(std::move(kept), message->is_step);
    state_.cv.NotifyAll();
  }
}

std::optional<std::pair<wire::ErrorCode, std::string>> TrainerChannel::CheckLiveness() {
  if (fatal_) return fatal_;
  if (options_.trainer_timeout_ms == 0 || !lost_since_) return std::nullopt;
  bool epoch_open;
  {
    MutexLock lock(state_.mu);
    epoch_open = state_.current_epoch.has_value() || !state_.requested_epochs.empty();
  }
  if (!epoch_open) return std::nullopt;
  if (clock_.Now() - *lost_since_ <= std::chrono::milliseconds(options_.trainer_timeout_ms))
    return std::nullopt;
  return std::make_pair(wire::INTERNAL, "the trainer disconnected mid-epoch and did not come back within " +
                                            std::to_string(options_.trainer_timeout_ms) +
                                            " ms (emit.trainer_timeout_ms); " +
                                            std::to_string(queue_.UnacknowledgedSteps()) +
                                            " step(s) sent to it were not acknowledged");
}

std::optional<std::string> TrainerChannel::SessionEnded() {
  if (session_.empty() || !lost_since_ || contender_ || fatal_) return std::nullopt;
  // A trainer that replaces its loader, or closes it over an evaluation, comes
  // back within the grace; only then is the session's end its last.
  const std::chrono::milliseconds grace = std::max<std::chrono::milliseconds>(
      std::chrono::milliseconds(options_.trainer_timeout_ms), kContenderGrace);
  if (clock_.Now() - *lost_since_ <= grace) return std::nullopt;
  {
    MutexLock lock(state_.mu);
    if (state_.current_epoch.has_value() || !state_.requested_epochs.empty()) return std::nullopt;
  }
  if (!queue_.Empty()) return std::nullopt;
  return "trainer session " + Printable(session_) + " ended between epochs and no trainer came back within " +
         std::to_string(grace.count()) + " ms (emit.exit_when_trainer_done)";
}

void TrainerChannel::EnqueueFatal(wire::ErrorCode code, const std::string& message, int rank) {
  queue_.PushFront(FatalMessage(code, message, rank));
}

}  // namespace odb::emit
