#ifndef ODB_EMIT_STEP_ARENA_HANDSHAKE_H_
#define ODB_EMIT_STEP_ARENA_HANDSHAKE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/odb.pb.h"
#include "src/common/clock.h"
#include "src/common/mutex.h"
#include "src/emit/step_arena.h"

namespace odb::emit {

struct StepArenaHandshakeOptions {
  // shm.trainer_data_plane: offer each session a step arena (auto/shm);
  // `required` (shm) makes a failure to create or map one an error instead
  // of falling back to frames.
  bool enabled = true;
  bool required = false;
  uint64_t arena_bytes = uint64_t{1} << 30;  // shm.step_arena_bytes
  // How long the planner waits for a session's answer to its offer before
  // its steps go as frames (on the handshake's clock).
  std::chrono::milliseconds offer_wait = std::chrono::seconds(5);
};

// The step-arena handshake of one trainer endpoint (docs/shm.md): each new
// session is offered an arena of its own (the previous one is retired: its
// blocks stay mapped by whoever holds them), the trainer fetches its fd from
// the arena server and answers; only then do its steps go through shared
// memory. Until then, and whenever the trainer declines, steps go as frames.
//
// It owns the arena server and the arena state; the trainer channel owns the
// socket and the session rules, and carries the offer and the answer.
// NewSession/OfferDelivered/OnReply run on the I/O thread; Active and
// ForNextStep on any thread.
class StepArenaHandshake {
 public:
  // `clock` (not owned, outlives this) measures offer_wait: the daemon's
  // injected clock, so that a test moves a FakeClock instead of waiting.
  StepArenaHandshake(StepArenaHandshakeOptions options, const Clock& clock) : options_(options), clock_(clock) {}
  StepArenaHandshake(const StepArenaHandshake&) = delete;
  StepArenaHandshake& operator=(const StepArenaHandshake&) = delete;

  // Serves arena fds beside the bound trainer endpoint, when it is ipc://
  // (only a local trainer can map the daemon's memory) and arenas are
  // enabled. An error only when the arena is required.
  absl::Status Listen(const std::string& bound_endpoint);
  void Stop() { server_.Stop(); }

  // A new session: the old arena is retired and a new one created. Returns
  // the offer to send the session (nullopt: its steps go as frames), or an
  // error when an arena is required and cannot be had.
  absl::StatusOr<std::optional<wire::DaemonMessage>> NewSession();
  // The offer reached the session: wait for its answer before placing steps.
  void OfferDelivered();
  // The session's answer. An error when it declined a required arena; an
  // answer to another generation than the one offered is ignored.
  absl::Status OnReply(const wire::StepArenaReply& reply);

  // The arena the session has mapped (null: steps go as frames).
  std::shared_ptr<StepArena> Active() const ABSL_LOCKS_EXCLUDED(mu_);
  // The same, for the planner about to place a step: while an offer is
  // unanswered, waits for the answer (at most offer_wait, then the session's
  // steps go as frames), so that a session's steps do not start as frames
  // merely because the trainer had not called Next() yet.
  // offer_wait is read on the injected clock; the wait itself is woken by
  // the answer and re-reads the clock at least every kClockRecheck (a
  // FakeClock moves without waking anyone).
  std::shared_ptr<StepArena> ForNextStep() ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr std::chrono::milliseconds kClockRecheck{50};

 private:
  void SetState(std::shared_ptr<StepArena> active, bool pending) ABSL_LOCKS_EXCLUDED(mu_);

  const StepArenaHandshakeOptions options_;
  const Clock& clock_;
  StepArenaServer server_;
  std::shared_ptr<StepArena> offered_;  // I/O thread: offered to the session, not yet answered

  mutable Mutex mu_;
  CondVar cv_;
  std::shared_ptr<StepArena> active_ ABSL_GUARDED_BY(mu_);
  bool pending_ ABSL_GUARDED_BY(mu_) = false;  // an offer waits for its answer
};

}  // namespace odb::emit

#endif  // ODB_EMIT_STEP_ARENA_HANDSHAKE_H_
