// Where the collator's bytes go, and how padding is written.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "src/common/stream_copy.h"

namespace odb::collate::internal {

// `value`'s bytes at the start of an 8-byte element slot.
template <typename T>
void StoreBytes(T value, std::array<uint8_t, 8>* out) {
  static_assert(sizeof(T) <= 8);
  std::memcpy(out->data(), &value, sizeof(T));
}

// Where collated bytes go: appended to a vector whose capacity is reserved
// (Collate's owned tensors), or written from a pointer on (memory the caller
// owns, CollatePlan::WriteTo). Either way every output byte is written once,
// with no zero-initialisation first.
class VectorSink {
 public:
  explicit VectorSink(std::vector<uint8_t>* out) : out_(out) {}
  void Copy(const uint8_t* src, size_t n) {
    if (n > 0) out_->insert(out_->end(), src, src + n);
  }
  void Set(uint8_t byte, size_t n) { out_->insert(out_->end(), n, byte); }

 private:
  std::vector<uint8_t>* out_;
};

// Caller memory is the trainer's step arena in the daemon: another process
// reads it, so large copies bypass this core's cache (StreamCopy).
class PointerSink {
 public:
  explicit PointerSink(uint8_t* at) : at_(at) {}
  void Copy(const uint8_t* src, size_t n) {
    StreamCopy(at_, src, n);
    at_ += n;
  }
  void Set(uint8_t byte, size_t n) {
    if (n > 0) std::memset(at_, byte, n);
    at_ += n;
  }

 private:
  uint8_t* at_;
};

// Fills padding by copying a pre-built block of repeated elements (or one
// memset when all bytes of the element are equal), so padding costs the same
// as a memcpy whatever the dtype.
class PatternFill {
 public:
  PatternFill(const std::array<uint8_t, 8>& element, size_t element_size) {
    uniform_ = std::all_of(element.begin(), element.begin() + element_size,
                           [&](uint8_t b) { return b == element[0]; });
    byte_ = element[0];
    for (size_t i = 0; i < block_.size(); ++i) block_[i] = element[i % element_size];
  }

  // Writes `n` bytes of the pattern; `n` must be a multiple of the element
  // size (the block size is a multiple of every element size).
  template <typename Sink>
  void Fill(size_t n, Sink& out) const {
    if (uniform_) {
      out.Set(byte_, n);
      return;
    }
    while (n > 0) {
      const size_t chunk = std::min(n, block_.size());
      out.Copy(block_.data(), chunk);
      n -= chunk;
    }
  }

 private:
  bool uniform_ = true;
  uint8_t byte_ = 0;
  std::array<uint8_t, 1024> block_{};
};

template <typename T, typename Sink>
void WriteValue(T value, Sink& out) {
  uint8_t raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));
  out.Copy(raw, sizeof(T));
}

}  // namespace odb::collate::internal
