#ifndef ODB_SHM_SLOT_ALLOCATOR_H_
#define ODB_SHM_SLOT_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace odb::shm {

// The writer's private bookkeeping of which byte ranges of an arena's data
// region are free. It lives in the writer's heap, never in the shared mapping:
// the reader cannot corrupt it, only hand ranges back through the completion
// queue, which the writer validates before calling Free.
//
// Policy: best fit over a free list kept in two ordered sets (by address, for
// coalescing neighbours on Free; by size, to find the smallest range that fits
// in O(log n)), ties going to the lowest address. Frees may come in any order:
// the daemon keeps samples in its buffer by length group, not by arrival, so a
// ring that only reclaims from its tail would be held up by the oldest sample
// still buffered. Every range starts and ends on `alignment` (a power of two);
// requests are rounded up to it, and a request of 0 bytes takes one unit.
class SlotAllocator {
 public:
  // Manages [base, base + size); base and size must be multiples of alignment.
  SlotAllocator(uint64_t base, uint64_t size, uint64_t alignment);

  // The offset of a range of RoundUp(bytes), or nullopt when no free range is
  // large enough (fragmentation or exhaustion; free_bytes() tells which).
  std::optional<uint64_t> Allocate(uint64_t bytes);
  // Returns a range from Allocate (same `bytes`). The caller guarantees it is
  // allocated; the arena writer checks that against its outstanding table.
  void Free(uint64_t offset, uint64_t bytes);
  // Everything free again.
  void Reset();

  uint64_t RoundUp(uint64_t bytes) const {
    const uint64_t b = bytes == 0 ? 1 : bytes;
    return (b + alignment_ - 1) & ~(alignment_ - 1);
  }
  uint64_t base() const { return base_; }
  uint64_t size() const { return size_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t largest_free() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }
  size_t free_ranges() const { return by_offset_.size(); }

 private:
  void InsertFree(uint64_t offset, uint64_t bytes);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  const uint64_t base_;
  const uint64_t size_;
  const uint64_t alignment_;
  uint64_t free_bytes_ = 0;
  std::map<uint64_t, uint64_t> by_offset_;           // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (length, offset)
};

}  // namespace odb::shm

#endif  // ODB_SHM_SLOT_ALLOCATOR_H_
