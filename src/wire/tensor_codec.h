#ifndef ODB_WIRE_TENSOR_CODEC_H_
#define ODB_WIRE_TENSOR_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/odb.pb.h"
#include "src/common/dtype.h"

// The one place where tensor descriptions (wire::TensorDesc: name, dtype,
// shape, frame index) are written and read. Every multipart message of the
// protocol is [header][frame 1]...[frame N], and the header lists one
// TensorDesc per payload frame. Producers' samples (read by the daemon's
// ingest), the daemon's steps (read by the client), and samples moved
// between daemons all go through this codec, so a description is validated
// the same way wherever it is read: a reader that gets a description from
// DecodeTensorDescs may index `size_bytes` bytes of its frame as `numel`
// elements of `dtype` laid out as `shape` without further checks.
namespace odb::wire {

// Bounds on what a description may declare. Generous for real data; they
// exist so that hostile headers cannot make a reader allocate or loop on
// numbers it only read.
// Memory a buffered tensor costs besides its bytes (view, name, shape, frame
// holder), charged against buffer.max_bytes and the producer's credit alike.
inline constexpr uint64_t kBookkeepingBytesPerTensor = 512;

struct TensorDescLimits {
  // Tensors per message: each costs bookkeeping beyond its bytes (see
  // kBookkeepingBytesPerTensor), so their number is bounded too.
  size_t max_tensors = 64;
  size_t max_name_bytes = 256;
  size_t max_rank = 8;
  // Per dimension. Also keeps sums of dims over a batch far from int64 overflow.
  int64_t max_dim = int64_t{1} << 40;
};

// A validated description: `size_bytes` = `numel` x DTypeSize(`dtype`) =
// the size of message frame `frame`.
struct DecodedTensorDesc {
  std::string name;
  odb::DType dtype = odb::DType::kUnspecified;
  std::vector<int64_t> shape;
  uint32_t frame = 0;  // message frame index, 1-based (frame 0 is the header); 0 for arena tensors
  uint64_t offset = 0;  // arena tensors: offset in the producer's arena segment
  uint64_t numel = 0;
  uint64_t size_bytes = 0;
};

// Writes one description. `frame` is the message frame index that holds the
// tensor's bytes (1 is the first frame after the header).
void EncodeTensorDesc(const std::string& name, odb::DType dtype, const std::vector<int64_t>& shape,
                      uint32_t frame, TensorDesc* out);

// Arena tensors (shared-memory data plane) start on multiples of this.
inline constexpr uint64_t kArenaTensorAlignment = 64;

// Writes the description of a tensor whose bytes are [offset, offset + length)
// of the producer's arena (frame 0).
void EncodeArenaTensorDesc(const std::string& name, odb::DType dtype, const std::vector<int64_t>& shape,
                           uint64_t offset, uint64_t length, TensorDesc* out);

// Reads and validates the descriptions of one message against its payload
// frames. `payload_frame_sizes[k]` is the size of message frame k + 1.
// Checks, in this order, stopping at the first error:
//  - one description per payload frame (FRAME_COUNT_MISMATCH);
//  - per description: a non-empty name (MALFORMED_HEADER) within
//    limits.max_name_bytes (TOO_LARGE), not used twice (MALFORMED_HEADER);
//    a known dtype (UNKNOWN_DTYPE); a frame index in 1..N not used by
//    another description (FRAME_COUNT_MISMATCH); rank <= limits.max_rank
//    (TOO_LARGE); every dim in 0..limits.max_dim, numel and numel x dtype
//    size without int64 overflow, and that many bytes in the frame
//    (SHAPE_SIZE_MISMATCH).
// Errors are absl::InvalidArgumentError whose message names the tensor and
// the numbers involved ("tensor 'x' declares shape [2, 3] of int64 = 48
// bytes, but its frame has 40 bytes"); callers prefix the context (sample or
// step). With `error_code`, the wire error code of the failure is stored
// there (left unchanged on success).
absl::StatusOr<std::vector<DecodedTensorDesc>> DecodeTensorDescs(
    const google::protobuf::RepeatedPtrField<TensorDesc>& descs,
    absl::Span<const size_t> payload_frame_sizes, const TensorDescLimits& limits = {},
    ErrorCode* error_code = nullptr);

// The same for a sample whose tensors are in one arena block
// [block_offset, block_offset + block_length) instead of frames: the checks
// above, except that each description must have frame 0 (FRAME_COUNT_MISMATCH)
// and an offset that is a multiple of kArenaTensorAlignment with [offset,
// offset + length) inside the block, overflow-checked (INVALID_ARENA_BLOCK),
// and length = shape x dtype size (SHAPE_SIZE_MISMATCH). Whether the block
// itself is a valid block of a registered arena is the caller's check.
absl::StatusOr<std::vector<DecodedTensorDesc>> DecodeArenaTensorDescs(
    const google::protobuf::RepeatedPtrField<TensorDesc>& descs, uint64_t block_offset, uint64_t block_length,
    const TensorDescLimits& limits = {}, ErrorCode* error_code = nullptr);

// "[2, 3]": shapes as every error message of the protocol prints them.
std::string ShapeString(absl::Span<const int64_t> shape);

}  // namespace odb::wire

#endif  // ODB_WIRE_TENSOR_CODEC_H_
