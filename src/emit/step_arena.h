#ifndef ODB_EMIT_STEP_ARENA_H_
#define ODB_EMIT_STEP_ARENA_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/common/clock.h"
#include "src/common/mutex.h"
#include "src/emit/step_encoder.h"
#include "src/shm/arena_writer.h"
#include "src/shm/poll_thread.h"
#include "src/shm/unique_fd.h"

namespace odb::emit {

// One trainer session's step arena (docs/shm.md, "Step arena"): the daemon's
// ArenaWriter over a memfd that the trainer maps. Each step is one block with
// every tensor at a 64-byte aligned offset; the trainer returns the block
// through the completion queue when it has released the step's tensors.
//
// Shared (shared_ptr): the planner thread allocates and fills blocks, the I/O
// thread replaces the arena when a new session starts, and every queued step
// keeps the arena it was written into alive (its bytes stay readable even
// after the session moved on). The writer is not thread-safe, so every call
// into it holds mu_.
class StepArena {
 public:
  // `clock` (the daemon's injected clock) decides Allocate's wait; it must
  // outlive every Allocate call.
  static absl::StatusOr<std::shared_ptr<StepArena>> Create(uint64_t capacity_bytes, const Clock& clock);

  uint64_t generation() const { return generation_; }
  uint64_t capacity_bytes() const { return capacity_; }
  int fd() const { return fd_; }

  // A block of `length` bytes. A full arena is back-pressure: waits for the
  // trainer's returns up to `wait` on the injected clock, then
  // kDeadlineExceeded naming the arena and what the trainer holds. The wait
  // goes in slices of at most kWaitSlice of real time, after each of which
  // `cancelled` and the clock are read again (a FakeClock moves without
  // waking anyone). Oversize (kInvalidArgument) and a dead reader
  // (kUnavailable) come back at once.
  absl::StatusOr<shm::Block> Allocate(uint64_t length, std::chrono::milliseconds wait,
                                      const std::function<bool()>& cancelled) ABSL_LOCKS_EXCLUDED(mu_);
  void Free(const shm::Block& block) ABSL_LOCKS_EXCLUDED(mu_);
  std::byte* At(uint64_t offset) const { return base_ + offset; }
  static constexpr std::chrono::milliseconds kWaitSlice{100};

  struct Stats {
    uint64_t outstanding_blocks = 0;
    uint64_t outstanding_bytes = 0;
    uint64_t returns = 0;
  };
  // Reclaims returns first; the last figures when the planner holds the arena.
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  StepArena(std::unique_ptr<shm::ArenaWriter> writer, const Clock& clock);

  mutable Mutex mu_;
  // The pointer is set once (constructor); every call through it holds mu_.
  const std::unique_ptr<shm::ArenaWriter> writer_ ABSL_PT_GUARDED_BY(mu_);
  // The last figures, for a reader that finds mu_ taken (the planner may
  // sleep under it). Their own mutex, held only to copy them, never with mu_.
  mutable Mutex stats_mu_;
  mutable Stats last_stats_ ABSL_GUARDED_BY(stats_mu_);
  const Clock& clock_;
  const uint64_t generation_;
  const uint64_t capacity_;
  const int fd_;
  std::byte* const base_;
};

// One block of `arena` for a step whose tensors have these sizes, and where
// each tensor goes in it: in order, each at the next multiple of 64 bytes.
// The block is the caller's to fill (the collator writes the step straight
// into it) and to encode with EncodeArenaStep. Errors: Allocate's.
absl::StatusOr<ArenaPlacement> AllocateStepBlock(StepArena& arena, const std::vector<uint64_t>& sizes,
                                                 std::chrono::milliseconds wait,
                                                 const std::function<bool()>& cancelled);

// A step written into an arena that is no longer the
// session's (a new trainer session, one that declined the arena): copies the
// tensors into frames and frees the block.
std::vector<zmq::message_t> StepToFrames(const std::vector<zmq::message_t>& parts, StepArena& arena);

// The socket path next to an ipc trainer socket where a trainer fetches its
// step arena's fd.
std::string StepArenaSocketPath(const std::string& trainer_socket_path);

// The generation a trainer's step-arena request asks for: its canonical
// decimal text (what clients send, std::to_string), 1 to 20 digits, no
// overflow. Anything else is refused with the request shown escaped
// (printable ASCII, at most 64 bytes of it): the reason goes to the log and
// back to the peer.
absl::StatusOr<uint64_t> ParseStepArenaRequest(std::string_view request);

// Hands the current session's step arena fd to the trainer: a UNIX
// SOCK_SEQPACKET socket (mode 0600) served by its own thread. A request is the
// arena's generation as decimal text (the trainer learnt it from the
// StepArenaOffer on its ZeroMQ session); the answer is the fd (SCM_RIGHTS,
// empty payload) when the generation is the current arena's and the peer runs
// as our uid, else no fd and the reason as text.
class StepArenaServer {
 public:
  StepArenaServer() = default;
  ~StepArenaServer();
  StepArenaServer(const StepArenaServer&) = delete;
  StepArenaServer& operator=(const StepArenaServer&) = delete;

  absl::Status Listen(const std::string& path);
  void Start();
  void Stop();
  bool listening() const { return listener_.valid(); }
  const std::string& path() const { return path_; }
  // The arena a request may fetch from now on (null: none).
  void Publish(std::shared_ptr<StepArena> arena) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Serve();
  void Answer(int conn);

  shm::UniqueFd listener_;
  std::string path_;
  Mutex mu_;
  std::shared_ptr<StepArena> current_ ABSL_GUARDED_BY(mu_);
  shm::PollThread thread_;              // last: stopped before the members it serves go
};

}  // namespace odb::emit

#endif  // ODB_EMIT_STEP_ARENA_H_
