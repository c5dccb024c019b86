#include "src/common/buffer_pool.h"

#include <algorithm>

namespace odb {

std::vector<uint8_t> BufferPool::Acquire(size_t bytes) {
  std::vector<uint8_t> out;
  if (bytes >= min_bytes_) {
    MutexLock lock(mu_);
    auto it = std::lower_bound(free_.begin(), free_.end(), bytes,
                               [](const std::vector<uint8_t>& b, size_t n) { return b.capacity() < n; });
    if (it != free_.end()) {
      out = std::move(*it);
      free_.erase(it);
      free_bytes_ -= out.capacity();
    }
  }
  out.reserve(bytes);  // a no-op for a recycled buffer
  return out;
}

void BufferPool::Release(std::vector<uint8_t>&& buffer) {
  const size_t capacity = buffer.capacity();
  if (capacity < min_bytes_ || capacity > max_free_bytes_ || max_free_buffers_ == 0) return;
  buffer.clear();
  MutexLock lock(mu_);
  auto it = std::lower_bound(free_.begin(), free_.end(), capacity,
                             [](const std::vector<uint8_t>& b, size_t n) { return b.capacity() < n; });
  free_.insert(it, std::move(buffer));
  free_bytes_ += capacity;
  // Over a bound: free the smallest idle buffers (big ones are the costly ones to map).
  while (free_.size() > max_free_buffers_ || free_bytes_ > max_free_bytes_) {
    free_bytes_ -= free_.front().capacity();
    free_.erase(free_.begin());
  }
}

size_t BufferPool::free_buffers() const {
  MutexLock lock(mu_);
  return free_.size();
}

uint64_t BufferPool::free_bytes() const {
  MutexLock lock(mu_);
  return free_bytes_;
}

}  // namespace odb
