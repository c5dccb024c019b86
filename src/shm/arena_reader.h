#ifndef ODB_SHM_ARENA_READER_H_
#define ODB_SHM_ARENA_READER_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/shm/arena.h"
#include "src/shm/completion_queue.h"

namespace odb::shm {

// The consuming side of an arena (the daemon for a producer's arena, the
// trainer for a step arena): maps the segment, reads the blocks it is told
// about, and returns them to the writer through the completion queue.
// An arena has one reader at a time: Attach claims the header's reader slot
// (pid and start time), the destructor releases it. Not thread-safe: one
// thread returns blocks (the queue is single-producer).
class ArenaReader {
 public:
  // Attaches by path / by an fd received over a UNIX socket (duplicated; the
  // caller keeps its own). Arena::Attach's checks, then the claim; refused with
  // kFailedPrecondition when another live process reads the arena, or when the
  // previous reader died and the writer has not Reset the arena yet.
  static absl::StatusOr<std::unique_ptr<ArenaReader>> Attach(const std::string& path,
                                                             const AttachOptions& options = {});
  static absl::StatusOr<std::unique_ptr<ArenaReader>> AttachFd(int fd, const AttachOptions& options = {});
  // Releases the claim and unmaps (detach). Blocks not returned stay the
  // writer's problem: it Resets when told this reader is gone.
  ~ArenaReader();

  const Arena& arena() const { return *arena_; }

  // The bytes of block (offset, length) as sent by the writer: bounds and
  // alignment are checked against the layout (the writer is trusted for which
  // blocks are live, not for where they are). The address is 64-byte aligned.
  absl::StatusOr<std::span<std::byte>> View(uint64_t offset, uint64_t length) const;
  // Hands block (offset, length) back to the writer. kFailedPrecondition when
  // the writer has Reset the arena since this reader attached (it gave this
  // reader up: detach); kResourceExhausted when the queue is full, which only
  // a block returned twice can cause.
  absl::Status Return(uint64_t offset, uint64_t length);

  // OK while the writer runs and has not closed the arena; otherwise
  // kFailedPrecondition naming its pid. After a failure the mapping stays
  // valid: finish with the blocks already received, then detach.
  absl::Status CheckWriter() const { return arena_->CheckCreator(); }
  // Whether the writer sleeps in Allocate waiting for a return (diagnostics,
  // and what tests synchronise on).
  bool writer_waiting() const { return cq_.writer_waiting(); }
  uint32_t epoch() const { return epoch_; }

 private:
  ArenaReader(std::unique_ptr<Arena> arena, uint32_t epoch);
  static absl::StatusOr<std::unique_ptr<ArenaReader>> Claim(std::unique_ptr<Arena> arena);

  std::unique_ptr<Arena> arena_;
  mutable CompletionQueue cq_;
  const uint32_t epoch_;
  const pid_t pid_;
};

}  // namespace odb::shm

#endif  // ODB_SHM_ARENA_READER_H_
