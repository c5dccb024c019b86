#ifndef ODB_SHM_ARENA_WRITER_H_
#define ODB_SHM_ARENA_WRITER_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/shm/arena.h"
#include "src/shm/completion_queue.h"
#include "src/shm/slot_allocator.h"

namespace odb::shm {

// A block of an arena: `offset` from the start of the segment (what goes into
// a descriptor), the `length` asked for, and the writer's address of its first
// byte. offset and data are multiples of 64; the block owns
// RoundUp(length, 64) bytes.
struct Block {
  uint64_t offset = 0;
  uint64_t length = 0;
  std::byte* data = nullptr;
};

// Whether `status` is TryAllocate's "would block" (the arena or its block
// count is exhausted for now; returns will free space).
bool IsWouldBlock(const absl::Status& status);

// The creating, allocating side of an arena: the one process that writes
// blocks (a producer for its sample arena, the daemon for a step arena).
// Not thread-safe: one thread of the writer process uses it.
//
// Life of a block: TryAllocate/Allocate here, fill it, send (offset, length) to
// the reader out of band (a ZeroMQ message), the reader reads it and Returns
// it through the completion queue, and the next allocation here reclaims it.
// Free gives back a block that was never sent.
class ArenaWriter {
 public:
  static absl::StatusOr<std::unique_ptr<ArenaWriter>> Create(const ArenaOptions& options);
  // Marks the arena closed (a reader's CheckWriter fails from then on) and
  // removes its file; a reader's mapping stays valid until it detaches.
  ~ArenaWriter() = default;

  Arena& arena() { return *arena_; }
  const Arena& arena() const { return *arena_; }

  // A block of `length` bytes, or:
  //  - kResourceExhausted "would block" (IsWouldBlock) when no free range fits
  //    or max_blocks are outstanding: blocks returned later make room;
  //  - kInvalidArgument naming the length and the arena's capacity when the
  //    block could never fit;
  //  - kDataLoss when the reader corrupted the completion queue (Reset).
  // Reclaims returned blocks first.
  absl::StatusOr<Block> TryAllocate(uint64_t length);
  // Like TryAllocate but waits up to `timeout` for returns (futex sleep on the
  // completion queue, woken by the reader's Return). Beyond the errors above:
  // kDeadlineExceeded when the time runs out, kUnavailable when the attached
  // reader died meanwhile (its blocks never come back: Reset).
  absl::StatusOr<Block> Allocate(uint64_t length, absl::Duration timeout);
  // Gives back a block this writer allocated and never handed to the reader.
  absl::Status Free(const Block& block);

  // Drains the completion queue, freeing what it returns; the count freed.
  // Entries for blocks that are not outstanding (or with another length) are
  // counted in stats().bad_returns and ignored; entries from before the last
  // Reset are dropped (stats().stale_returns).
  size_t Reclaim();

  enum class ReaderState { kNone, kAlive, kDead };
  // Who holds the reader claim: nobody, a running process, or one that died
  // (its start time no longer matches).
  ReaderState reader_state() const;
  pid_t reader_pid() const;

  // The reader is gone (it died, or its connection closed and the caller knows
  // it will not return anything): every outstanding block is free again, the
  // completion queue is emptied, the reader claim is released and the reader
  // epoch moves on, so returns a lingering old reader might still push are
  // dropped. Blocks allocated before must not be used afterwards.
  void Reset();

  // Address of offset `offset` (a block's first byte).
  std::byte* At(uint64_t offset) const { return arena_->base() + offset; }

  struct Stats {
    uint64_t allocations = 0;
    uint64_t returns = 0;        // blocks freed by the reader's returns
    uint64_t bad_returns = 0;    // entries naming no outstanding block
    uint64_t stale_returns = 0;  // entries from an epoch before the last Reset
    uint64_t waits = 0;          // futex sleeps in Allocate
    uint64_t resets = 0;
    uint64_t outstanding_blocks = 0;
    uint64_t outstanding_bytes = 0;  // rounded to 64
    uint64_t free_bytes = 0;
    uint64_t largest_free = 0;
  };
  Stats stats() const;
  uint64_t capacity_bytes() const { return arena_->capacity_bytes(); }
  uint32_t max_blocks() const { return arena_->cq_capacity(); }

 private:
  explicit ArenaWriter(std::unique_ptr<Arena> arena);
  absl::Status Oversize(uint64_t length) const;

  std::unique_ptr<Arena> arena_;
  CompletionQueue cq_;
  SlotAllocator allocator_;
  std::unordered_map<uint64_t, uint64_t> outstanding_;  // offset -> length asked for
  uint64_t outstanding_bytes_ = 0;
  bool cq_corrupt_ = false;
  std::string cq_corrupt_what_;
  Stats stats_;
};

}  // namespace odb::shm

#endif  // ODB_SHM_ARENA_WRITER_H_
