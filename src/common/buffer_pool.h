#ifndef ODB_COMMON_BUFFER_POOL_H_
#define ODB_COMMON_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "src/common/mutex.h"

namespace odb {

// Recycles the large byte buffers that batch tensors are collated into.
//
// A step of big samples is tens of MiB; a fresh allocation of that size is
// mapped by the kernel page by page on first write (a page fault and a page
// clear per 4 KiB, about three times the cost of the memcpy that fills it) and
// unmapped again when ZeroMQ frees it. The collator takes buffers from the
// pool and the emitter's free callback gives them back once ZeroMQ has sent
// them, so in steady state every step is written into memory that is already
// mapped. Buffers under `min_bytes` are left to malloc (cheap at that size).
// At most `max_free_buffers` buffers and `max_free_bytes` bytes are kept idle;
// beyond that the smallest are freed. Thread-safe: Release is called from
// ZeroMQ's I/O thread.
class BufferPool {
 public:
  BufferPool(size_t min_bytes, size_t max_free_buffers, uint64_t max_free_bytes)
      : min_bytes_(min_bytes), max_free_buffers_(max_free_buffers), max_free_bytes_(max_free_bytes) {}
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // An empty vector with capacity() >= bytes: the smallest idle buffer that
  // fits, else a new reservation.
  std::vector<uint8_t> Acquire(size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps `buffer` (its contents are dropped) for a later Acquire.
  void Release(std::vector<uint8_t>&& buffer) ABSL_LOCKS_EXCLUDED(mu_);

  size_t free_buffers() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t free_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t min_bytes_;
  const size_t max_free_buffers_;
  const uint64_t max_free_bytes_;
  mutable Mutex mu_;
  std::vector<std::vector<uint8_t>> free_ ABSL_GUARDED_BY(mu_);  // ascending capacity
  uint64_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace odb

#endif  // ODB_COMMON_BUFFER_POOL_H_
