#include "src/shm/completion_queue.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace odb::shm {
namespace {

// Shared (not FUTEX_PRIVATE) operations: the word is in a MAP_SHARED mapping
// and the waiter and the waker are different processes.
void FutexWait(uint32_t* word, uint32_t expected, absl::Duration timeout) {
  timespec ts = absl::ToTimespec(timeout);
  (void)syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(uint32_t* word) {
  (void)syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

bool CompletionQueue::TryPush(const CompletionEntry& entry) {
  const uint64_t tail = Atomic(header_->cq_tail).load(std::memory_order_relaxed);  // ours
  const uint64_t head = Atomic(header_->cq_head).load(std::memory_order_acquire);
  if (tail - head >= capacity_) return false;
  entries_[tail & (capacity_ - 1)] = entry;
  Atomic(header_->cq_tail).store(tail + 1, std::memory_order_release);
  // Dekker pair with WaitForEntries: the writer stores writer_waiting then loads
  // cq_seq and cq_tail; we store cq_tail, bump cq_seq, then load
  // writer_waiting. Sequentially consistent, one of us sees the other.
  Atomic(header_->cq_seq).fetch_add(1, std::memory_order_seq_cst);
  if (Atomic(header_->writer_waiting).load(std::memory_order_seq_cst) != 0) FutexWakeAll(&header_->cq_seq);
  return true;
}

bool CompletionQueue::writer_waiting() const {
  return Atomic(header_->writer_waiting).load(std::memory_order_seq_cst) != 0;
}

CompletionQueue::PopResult CompletionQueue::TryPop(CompletionEntry* out) {
  const uint64_t head = Atomic(header_->cq_head).load(std::memory_order_relaxed);  // ours
  const uint64_t tail = Atomic(header_->cq_tail).load(std::memory_order_acquire);
  if (tail == head) return PopResult::kEmpty;
  if (tail - head > capacity_) return PopResult::kCorrupt;  // also catches tail < head (wraps huge)
  *out = entries_[head & (capacity_ - 1)];
  Atomic(header_->cq_head).store(head + 1, std::memory_order_release);  // the slot is the reader's again
  return PopResult::kEntry;
}

uint64_t CompletionQueue::Pending() const {
  const uint64_t head = Atomic(header_->cq_head).load(std::memory_order_relaxed);
  const uint64_t tail = Atomic(header_->cq_tail).load(std::memory_order_seq_cst);
  return tail - head;
}

bool CompletionQueue::WaitForEntries(absl::Duration timeout) {
  if (Pending() != 0) return true;
  if (timeout <= absl::ZeroDuration()) return false;
  Atomic(header_->writer_waiting).store(1, std::memory_order_seq_cst);
  const uint32_t seq = Atomic(header_->cq_seq).load(std::memory_order_seq_cst);
  if (Pending() == 0) FutexWait(&header_->cq_seq, seq, timeout);  // returns at once if cq_seq moved
  Atomic(header_->writer_waiting).store(0, std::memory_order_seq_cst);
  return Pending() != 0;
}

void CompletionQueue::DiscardAll() {
  const uint64_t tail = Atomic(header_->cq_tail).load(std::memory_order_acquire);
  Atomic(header_->cq_head).store(tail, std::memory_order_release);
}

}  // namespace odb::shm
