#ifndef ODB_EMIT_TRAINER_CHANNEL_H_
#define ODB_EMIT_TRAINER_CHANNEL_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>
#include <zmq.hpp>

#include "absl/status/status.h"
#include "proto/odb.pb.h"
#include "src/common/clock.h"
#include "src/common/log_limiter.h"
#include "src/common/mutex.h"
#include "src/emit/connection_table.h"
#include "src/emit/credit_queue.h"
#include "src/emit/step_arena.h"
#include "src/emit/step_arena_handshake.h"
#include "src/emit/trainer_channel_options.h"
#include "src/state/daemon_state.h"
#include "src/state/metrics.h"

namespace odb::emit {

// What every SessionAck tells the trainer (JobSettings, docs/protocol.md,
// "Job settings"): the daemon's settings the trainer client must agree with.
wire::JobSettings JobSettingsOf(const TrainerChannelOptions& options);

// The trainer's side of the daemon: owns the trainer socket (ROUTER) and the
// trainer session; what it sends waits in its CreditQueue (the credit window,
// and what a reconnect sends again), the connections are tracked by its
// ConnectionTable, its log lines rate-limited by a LogLimiter.
//
// Session rules (docs/protocol.md):
//  - One trainer per daemon. The first peer that talks becomes the session
//    and gets a SessionAck carrying the job's settings (JobSettingsOf; the
//    daemon waits for no answer, a client that ignores them still works);
//    any other peer gets a SESSION_REFUSED fatal message and nothing else —
//    after a grace of kContenderGrace, since a trainer that replaces its
//    loader between epochs connects anew while the old connection's close may
//    still be on its way (its messages wait meanwhile, at most 16).
//  - Steps sent and not yet acknowledged by a credit are kept (zero-copy
//    references). If the same session reconnects (the client keeps its routing
//    id), they are sent again and the client drops the ones it already has.
//  - Only a message that came on a connection still open (the monitor's
//    accepted/disconnected events; the connection by ZMQ_SRCFD and its
//    metadata, ConnectionTable::OfFrame) is a sign of a trainer: one
//    that a closed connection left queued (a trainer's last credit before it
//    exits, read after the close) never opens, revives or contends for a
//    session. What the session's own late messages report still holds
//    (credits, data wait, an arena answer); what they ask for does not (a
//    start_epoch of a trainer that is gone); other peers' are dropped.
//    Both are counted (odb_late_trainer_messages_total). The ROUTER can still
//    route to a closed connection's id until it tears the pipe down, so a
//    send that succeeds proves nothing on its own.
//  - If the session is lost (its connection closed) after steps of an open
//    epoch were delivered, a new trainer cannot continue that epoch: it gets
//    EPOCH_LOST, and the daemon stops with the same error (what was delivered
//    to the lost trainer is unknown). Between epochs a new trainer is welcome.
//  - A lost session that does not come back within emit.trainer_timeout_ms
//    while an epoch is open is fatal (CheckLiveness).
// The step-arena handshake (offer, answer, the arena server) is its own unit,
// StepArenaHandshake; this class carries its messages.
// Malformed trainer messages (unreadable, multi-frame) are logged, counted
// and ignored: they never block the loop.
//
// OnReadable/Flush/CheckLiveness run on the I/O thread; Enqueue* and
// QueuedSteps may be called from the planner thread.
class TrainerChannel {
 public:
  TrainerChannel(zmq::context_t& context, TrainerChannelOptions options, DaemonState& state,
                 DaemonMetrics& metrics, const Clock& clock);
  TrainerChannel(const TrainerChannel&) = delete;
  TrainerChannel& operator=(const TrainerChannel&) = delete;

  absl::Status Bind();
  const std::string& endpoint() const { return bound_; }
  zmq::socket_t& socket() { return socket_; }
  zmq::socket_t& monitor() { return monitor_; }

  // Trainer messages: credits, start_epoch. Returns true when an epoch was requested.
  bool OnReadable();
  // Connection events of the trainer socket (liveness of the session).
  void OnMonitor();
  // One event of the monitor (ZMQ_EVENT_ACCEPTED / ZMQ_EVENT_DISCONNECTED and
  // the connection's descriptor), as OnMonitor hands them on; public so that
  // a test can order a connection's close before a message it sent.
  void OnConnectionEvent(uint16_t event, int fd);
  // The session's connection (its descriptor on this side); -1 when there is
  // no session or it is lost.
  int session_fd() const { return session_connection_ != 0 ? session_fd_ : -1; }
  // Messages sent to the session and not known to have arrived (steps and
  // epoch ends): what a reconnect would send again.
  size_t unacknowledged() const { return queue_.Unacknowledged(); }
  // Connections of the trainer socket open as far as the monitor has told.
  size_t open_connections() const { return connections_.open(); }
  // A second peer waits while the session may be closing, then takes over
  // (the session is gone) or is refused. Returns true when an epoch was
  // requested. Call once per loop.
  bool SettleContender();
  // Sends queued messages while credits last.
  void Flush();
  // A fatal message when the session is lost past trainer_timeout_ms with an
  // epoch open, or when a new trainer asked to continue a lost epoch.
  std::optional<std::pair<wire::ErrorCode, std::string>> CheckLiveness();
  // emit.exit_when_trainer_done: a log line once the session has ended
  // between epochs (its connection closed, no epoch open or requested, nothing
  // left to send, nobody waiting to take over) and no trainer came back
  // within max(trainer_timeout_ms, kContenderGrace); nullopt otherwise.
  // Never before a session existed.
  std::optional<std::string> SessionEnded();

  // `arena`: the step arena the step was placed in (PlaceStepInArena), or
  // null for frames. A step whose arena is not the session's by the time it
  // is sent goes as frames (StepToFrames).
  void EnqueueStep(std::vector<zmq::message_t>&& parts, std::shared_ptr<StepArena> arena = nullptr) {
    queue_.PushStep(std::move(parts), std::move(arena));
  }
  void EnqueueControl(std::vector<zmq::message_t>&& parts) { queue_.PushControl(std::move(parts)); }
  // Ahead of every queued step: a fatal error does not wait for credits.
  void EnqueueFatal(wire::ErrorCode code, const std::string& message, int rank);
  size_t QueuedSteps() const { return queue_.QueuedSteps(); }
  // The session's step arena once the trainer has mapped it; null while steps
  // go as frames (no session yet, a remote trainer, shm.trainer_data_plane:
  // zmq, the trainer declined). Any thread.
  std::shared_ptr<StepArena> ActiveArena() const { return arena_.Active(); }
  // The same for the planner about to place a step: while the session has
  // not answered its arena offer yet, waits for the answer (at most the
  // handshake's offer_wait on the injected clock, then the session's steps
  // go as frames), so that a session's steps do not start as frames merely
  // because the trainer had not called Next() yet.
  std::shared_ptr<StepArena> ArenaForNextStep() { return arena_.ForNextStep(); }
  // Stops handing out arena fds (before the daemon's threads end).
  void StopArenaServer() { arena_.Stop(); }

 private:
  // A new session gets a step arena of its own (StepArenaHandshake) and is
  // offered it.
  void OfferStepArena(const std::string& peer);
  void Refuse(const std::string& peer, wire::ErrorCode code, const std::string& message);
  // One trainer message from `peer` (a frame that parsed, current version)
  // that came on `connection` (ConnectionTable::OfFrame at the time it was read).
  bool Handle(const std::string& peer, int fd, uint64_t connection, const wire::TrainerMessage& msg);
  // The session rules for that message: it opens the session (a first or a
  // replacing trainer, acknowledged), is the session's (its connection, or a
  // reconnect that re-sends what is unacknowledged), is the session's but
  // late (a closed connection had left it queued: what it reports still
  // holds, what it asks for does not), or is dropped (refused, or another
  // peer's late message).
  enum class Admission { kSession, kLate, kDropped };
  Admission Admit(const std::string& peer, int fd, uint64_t connection, const wire::TrainerMessage& msg);
  // A trainer's request for an epoch; true when it is queued.
  bool StartEpoch(const std::string& peer, const wire::StartEpoch& request);
  bool IsOpen(int fd, uint64_t connection) const { return connections_.IsOpen(fd, connection); }
  // Counts and logs a message its closed connection had left queued.
  void NoteLate(const std::string& peer, const wire::TrainerMessage& msg, bool applied);
  // Adds a credit's data_wait_us to odb_trainer_data_wait_microseconds_total.
  void CountDataWait(const wire::Credit& credit);

  // Log lines a peer can cause once per message or connection (garbage, a
  // second trainer that keeps talking, connection churn between epochs):
  // each kind logs at most 20 lines a minute on the injected clock (LogLimiter);
  // the rest are counted and the next line logged says how many were not.
  // The metrics count every occurrence; nothing else is dropped.
  enum LogKind {
    kLogMalformed,
    kLogRefused,
    kLogUndelivered,
    kLogBadValue,
    kLogLate,
    kLogSession,
    kLogKinds
  };
  bool MayLog(LogKind kind) { return log_limiter_.MayLog(kind); }

  bool SendToSession(std::vector<zmq::message_t>& parts);  // false: not sent (retry later)
  // Sends session_ack to `peer`; false when no such peer is connected.
  bool Acknowledge(const std::string& peer);

  zmq::context_t& context_;
  const TrainerChannelOptions options_;
  DaemonState& state_;
  DaemonMetrics& metrics_;
  const Clock& clock_;
  zmq::socket_t socket_;
  zmq::socket_t monitor_;
  std::string bound_;
  std::string monitor_endpoint_;

  CreditQueue queue_;
  StepArenaHandshake arena_;

  // I/O thread only.
  ConnectionTable connections_;
  std::string session_;              // routing id of the trainer; empty = none yet
  int session_fd_ = -1;              // its connection (from ZMQ_SRCFD)
  uint64_t session_connection_ = 0;  // that connection's serial; 0 while the session is lost
  std::optional<Clock::TimePoint> lost_since_;
  std::optional<std::pair<wire::ErrorCode, std::string>> fatal_;
  struct Contender {
    std::string peer;
    int fd = -1;
    uint64_t connection = 0;
    Clock::TimePoint since;                     // on the injected clock
    std::vector<wire::TrainerMessage> waiting;  // at most kContenderMessages
  };
  std::optional<Contender> contender_;
  static constexpr auto kContenderGrace = std::chrono::seconds(2);
  static constexpr size_t kContenderMessages = 16;
  LogLimiter log_limiter_;
};

}  // namespace odb::emit

#endif  // ODB_EMIT_TRAINER_CHANNEL_H_
