#include "src/shm/slot_allocator.h"

#include <cassert>

namespace odb::shm {

SlotAllocator::SlotAllocator(uint64_t base, uint64_t size, uint64_t alignment)
    : base_(base), size_(size), alignment_(alignment) {
  assert(alignment != 0 && (alignment & (alignment - 1)) == 0);
  assert(base % alignment == 0 && size % alignment == 0);
  Reset();
}

void SlotAllocator::Reset() {
  by_offset_.clear();
  by_size_.clear();
  free_bytes_ = 0;
  if (size_ > 0) InsertFree(base_, size_);
}

void SlotAllocator::InsertFree(uint64_t offset, uint64_t bytes) {
  by_offset_.emplace(offset, bytes);
  by_size_.emplace(bytes, offset);
  free_bytes_ += bytes;
}

void SlotAllocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_offset_.erase(it);
}

std::optional<uint64_t> SlotAllocator::Allocate(uint64_t bytes) {
  if (bytes > size_) return std::nullopt;
  const uint64_t need = RoundUp(bytes);
  auto fit = by_size_.lower_bound({need, 0});
  if (fit == by_size_.end()) return std::nullopt;
  const uint64_t offset = fit->second;
  const uint64_t length = fit->first;
  EraseFree(by_offset_.find(offset));
  if (length > need) InsertFree(offset + need, length - need);
  return offset;
}

void SlotAllocator::Free(uint64_t offset, uint64_t bytes) {
  uint64_t start = offset;
  uint64_t length = RoundUp(bytes);
  // Merge with the free range that ends where this one starts...
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      EraseFree(prev);
    }
  }
  // ...and with the one that starts where it ends.
  next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first == start + length) {
    length += next->second;
    EraseFree(next);
  }
  InsertFree(start, length);
}

}  // namespace odb::shm
