#include "src/wire/tensor_codec.h"

#include <functional>
#include <string_view>
#include <unordered_set>

#include "absl/status/status.h"

namespace odb::wire {
namespace {

// Names in errors are quoted as sent, but never more than this many bytes of
// them: a hostile name must not turn into a huge log line.
constexpr size_t kNameInErrors = 64;

std::string Quoted(const std::string& name) {
  if (name.size() <= kNameInErrors) return "'" + name + "'";
  return "'" + name.substr(0, kNameInErrors) + "...' (" + std::to_string(name.size()) + " bytes)";
}

// Remembers which frame indices (1..n) are taken; a message has few frames,
// so the first 64 need no allocation.
class FrameSet {
 public:
  explicit FrameSet(size_t frames) : frames_(frames) {}

  // Marks `frame` taken; false when it already was.
  bool Insert(uint32_t frame) {
    if (frame < 64) {
      const bool seen = (low_ >> frame) & 1;
      low_ |= uint64_t{1} << frame;
      return !seen;
    }
    if (high_.empty()) high_.assign(frames_ + 1, false);
    const bool seen = high_[frame];
    high_[frame] = true;
    return !seen;
  }

 private:
  size_t frames_;
  uint64_t low_ = 0;
  std::vector<bool> high_;
};

}  // namespace

std::string ShapeString(absl::Span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

void EncodeTensorDesc(const std::string& name, odb::DType dtype, const std::vector<int64_t>& shape,
                      uint32_t frame, TensorDesc* out) {
  out->set_name(name);
  out->set_dtype(static_cast<wire::DType>(dtype));
  out->mutable_shape()->Clear();
  out->mutable_shape()->Reserve(static_cast<int>(shape.size()));
  for (int64_t d : shape) out->add_shape(d);
  out->set_frame(frame);
}

void EncodeArenaTensorDesc(const std::string& name, odb::DType dtype, const std::vector<int64_t>& shape,
                           uint64_t offset, uint64_t length, TensorDesc* out) {
  EncodeTensorDesc(name, dtype, shape, 0, out);
  out->set_offset(offset);
  out->set_length(length);
}

namespace {

// Where a description's bytes are and how many there are: the frame it points
// at, or its (offset, length) in an arena block. Returns the bytes available
// at that place, or an error (with its code) naming the tensor.
// `field` names the tensor for an error message; it is built only then (this
// runs for every tensor of every sample).
using FieldName = std::function<std::string()>;
using LocateFn = std::function<absl::StatusOr<uint64_t>(const TensorDesc& desc, const FieldName& field,
                                                         ErrorCode* code)>;

// The checks shared by both kinds of description (see DecodeTensorDescs).
absl::StatusOr<std::vector<DecodedTensorDesc>> DecodeDescs(
    const google::protobuf::RepeatedPtrField<TensorDesc>& descs, const TensorDescLimits& limits,
    ErrorCode* error_code, const LocateFn& locate, const char* place) {
  auto fail = [&](ErrorCode code, const std::string& why) -> absl::Status {
    if (error_code != nullptr) *error_code = code;
    return absl::InvalidArgumentError(why);
  };
  // Duplicate names: a linear scan for the usual handful of tensors, a set
  // beyond that so a message with many tensors stays linear.
  constexpr int kScanLimit = 16;
  std::unordered_set<std::string_view> names;
  std::vector<DecodedTensorDesc> out;
  out.reserve(descs.size());
  for (const TensorDesc& desc : descs) {
    const std::string& name = desc.name();
    if (name.empty()) return fail(MALFORMED_HEADER, "a tensor has an empty name");
    if (name.size() > limits.max_name_bytes) {
      return fail(TOO_LARGE, "tensor name " + Quoted(name) + " has " + std::to_string(name.size()) +
                                 " bytes, over the limit of " +
                                 std::to_string(limits.max_name_bytes));
    }
    const FieldName field = [&name] { return "tensor " + Quoted(name); };
    bool duplicate = false;
    if (descs.size() <= kScanLimit) {
      for (const DecodedTensorDesc& seen : out) duplicate = duplicate || seen.name == name;
    } else {
      duplicate = !names.insert(name).second;  // views into `descs`, which outlives the set
    }
    if (duplicate) return fail(MALFORMED_HEADER, field() + " appears twice");

    const auto raw_dtype = static_cast<uint32_t>(desc.dtype());
    if (!IsValidDType(raw_dtype)) {
      return fail(UNKNOWN_DTYPE, field() + " has unknown dtype code " +
                                     std::to_string(static_cast<int>(desc.dtype())));
    }
    ErrorCode located_code = MALFORMED_HEADER;
    absl::StatusOr<uint64_t> actual = locate(desc, field, &located_code);
    if (!actual.ok()) return fail(located_code, std::string(actual.status().message()));
    if (static_cast<size_t>(desc.shape_size()) > limits.max_rank) {
      return fail(TOO_LARGE, field() + " has rank " + std::to_string(desc.shape_size()) +
                                 ", over the limit of " + std::to_string(limits.max_rank));
    }

    DecodedTensorDesc d;
    d.dtype = static_cast<odb::DType>(raw_dtype);
    d.shape.assign(desc.shape().begin(), desc.shape().end());
    d.frame = desc.frame();
    d.offset = desc.offset();
    const size_t elem = DTypeSize(d.dtype);
    auto declared = [&d] { return " declares shape " + ShapeString(d.shape) + " of " + std::string(DTypeName(d.dtype)); };
    // numel and bytes stay below 2^63 so they also fit int64 / ptrdiff_t.
    constexpr uint64_t kMaxCount = uint64_t{1} << 63;
    uint64_t numel = 1;
    for (int64_t dim : d.shape) {
      if (dim < 0 || dim > limits.max_dim) {
        return fail(SHAPE_SIZE_MISMATCH, field() + " has invalid dimension " + std::to_string(dim) +
                                             " in shape " + ShapeString(d.shape) +
                                             " (each must be in 0.." +
                                             std::to_string(limits.max_dim) + ")");
      }
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &numel) || numel >= kMaxCount) {
        return fail(SHAPE_SIZE_MISMATCH,
                    field() + declared() + ": its element count overflows 64 bits");
      }
    }
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(elem), &bytes) || bytes >= kMaxCount) {
      return fail(SHAPE_SIZE_MISMATCH, field() + declared() + " = " + std::to_string(numel) +
                                           " elements: its byte size overflows 64 bits");
    }
    if (bytes != *actual) {
      return fail(SHAPE_SIZE_MISMATCH, field() + declared() + " = " + std::to_string(bytes) + " bytes, but its " +
                                           place + " has " + std::to_string(*actual) + " bytes");
    }
    d.numel = numel;
    d.size_bytes = bytes;
    d.name = name;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<DecodedTensorDesc>> DecodeTensorDescs(
    const google::protobuf::RepeatedPtrField<TensorDesc>& descs,
    absl::Span<const size_t> payload_frame_sizes, const TensorDescLimits& limits,
    ErrorCode* error_code) {
  const size_t frames = payload_frame_sizes.size();
  if (static_cast<size_t>(descs.size()) > limits.max_tensors) {
    if (error_code != nullptr) *error_code = TOO_LARGE;
    return absl::InvalidArgumentError("header lists " + std::to_string(descs.size()) +
                                      " tensors, over the limit of " + std::to_string(limits.max_tensors) +
                                      " per sample");
  }
  if (static_cast<size_t>(descs.size()) != frames) {
    if (error_code != nullptr) *error_code = FRAME_COUNT_MISMATCH;
    return absl::InvalidArgumentError("header lists " + std::to_string(descs.size()) +
                                      " tensors but the message has " + std::to_string(frames) +
                                      " payload frames");
  }
  FrameSet used_frames(frames);
  LocateFn locate = [&](const TensorDesc& desc, const FieldName& field,
                        ErrorCode* code) -> absl::StatusOr<uint64_t> {
    const uint32_t frame = desc.frame();
    *code = FRAME_COUNT_MISMATCH;
    if (frame < 1 || frame > frames) {
      return absl::InvalidArgumentError(field() + " points at frame " + std::to_string(frame) + " but frames 1.." +
                                        std::to_string(frames) + " exist");
    }
    if (!used_frames.Insert(frame)) {
      return absl::InvalidArgumentError(field() + " reuses frame " + std::to_string(frame));
    }
    return static_cast<uint64_t>(payload_frame_sizes[frame - 1]);
  };
  return DecodeDescs(descs, limits, error_code, locate, "frame");
}

absl::StatusOr<std::vector<DecodedTensorDesc>> DecodeArenaTensorDescs(
    const google::protobuf::RepeatedPtrField<TensorDesc>& descs, uint64_t block_offset, uint64_t block_length,
    const TensorDescLimits& limits, ErrorCode* error_code) {
  if (static_cast<size_t>(descs.size()) > limits.max_tensors) {
    if (error_code != nullptr) *error_code = TOO_LARGE;
    return absl::InvalidArgumentError("header lists " + std::to_string(descs.size()) +
                                      " tensors, over the limit of " + std::to_string(limits.max_tensors) +
                                      " per sample");
  }
  auto block = [&] {
    return "its arena block [" + std::to_string(block_offset) + ", +" + std::to_string(block_length) + ")";
  };
  LocateFn locate = [&](const TensorDesc& desc, const FieldName& field,
                        ErrorCode* code) -> absl::StatusOr<uint64_t> {
    *code = INVALID_ARENA_BLOCK;
    if (desc.frame() != 0) {
      *code = FRAME_COUNT_MISMATCH;
      return absl::InvalidArgumentError(field() + " points at frame " + std::to_string(desc.frame()) +
                                        " but the sample's tensors are in " + block() + " (frame must be 0)");
    }
    const uint64_t offset = desc.offset(), length = desc.length();
    auto where = [&] { return field() + " at [" + std::to_string(offset) + ", +" + std::to_string(length) + ")"; };
    if (offset % kArenaTensorAlignment != 0) {
      return absl::InvalidArgumentError(where() + " is not " + std::to_string(kArenaTensorAlignment) +
                                        "-byte aligned");
    }
    // Overflow-free: offset - block_offset only once offset >= block_offset.
    if (offset < block_offset || offset - block_offset > block_length ||
        length > block_length - (offset - block_offset)) {
      return absl::InvalidArgumentError(where() + " lies outside " + block());
    }
    return length;
  };
  return DecodeDescs(descs, limits, error_code, locate, "arena range");
}

}  // namespace odb::wire
