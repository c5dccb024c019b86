#ifndef ODB_SHM_COMPLETION_QUEUE_H_
#define ODB_SHM_COMPLETION_QUEUE_H_

#include <cstdint>

#include "absl/time/time.h"
#include "src/shm/layout.h"

namespace odb::shm {

// The single-producer/single-consumer ring through which the reader hands
// blocks back to the writer. It lives in the shared segment: `cq_tail` and the
// entries are written by the reader only, `cq_head` by the writer only, both
// monotonically increasing 64-bit counters (slot = counter & (capacity - 1)).
// An entry is published by the release store of cq_tail and its slot is given
// back by the release store of cq_head: no locks, no cross-process reference
// counts. The writer may sleep on the futex word cq_seq, which the reader
// bumps after every push; the reader makes the wake syscall only while the
// writer says it waits (writer_waiting), so returns cost no syscall in steady
// state.
//
// This object is a view (two pointers into the mapping) and holds no state of
// its own; each side builds one.
class CompletionQueue {
 public:
  CompletionQueue(ArenaHeader* header, CompletionEntry* entries, uint32_t capacity)
      : header_(header), entries_(entries), capacity_(capacity) {}

  // --- reader side ---
  // false when the ring is full (cannot happen for a writer that keeps at most
  // `capacity` blocks outstanding, which ArenaWriter does).
  bool TryPush(const CompletionEntry& entry);
  // Whether the writer is (about to be) asleep waiting for a return.
  bool writer_waiting() const;

  // --- writer side ---
  enum class PopResult { kEmpty, kEntry, kCorrupt };
  // kCorrupt: the reader's tail is behind the head or more than `capacity`
  // ahead of it; nothing is read.
  PopResult TryPop(CompletionEntry* out);
  // Entries waiting (as the writer sees them).
  uint64_t Pending() const;
  // Sleeps until an entry is pending or `timeout` passes (a futex wait on the
  // shared word, woken by the reader's push). Returns whether one is pending.
  // Spurious early returns are possible; callers loop.
  bool WaitForEntries(absl::Duration timeout);
  // Drops everything pending (the writer's Reset after the reader died).
  void DiscardAll();

  uint32_t capacity() const { return capacity_; }

 private:
  ArenaHeader* header_;
  CompletionEntry* entries_;
  uint32_t capacity_;
};

}  // namespace odb::shm

#endif  // ODB_SHM_COMPLETION_QUEUE_H_
