#ifndef ODB_CLIENT_TYPES_H_
#define ODB_CLIENT_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace odb::client {

// Element type codes, identical to the wire protocol (docs/protocol.md).
enum class DType : uint32_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat16 = 6,
  kBFloat16 = 7,
  kFloat32 = 8,
  kFloat64 = 9,
  kBool = 10,
};

size_t DTypeBytes(DType dtype);

struct Lengths {
  uint32_t tokens = 0;  // LLM tokens after all preprocessing (> 0)
  uint32_t vision_patches = 0;
  uint32_t audio_frames = 0;
  // Loss-bearing tokens (labels not equal to the ignore index), <= tokens;
  // unset: every token bears loss.
  std::optional<uint32_t> loss_tokens;
};

// One tensor of a sample to send; bytes are read during Send only.
struct TensorInput {
  std::string name;
  DType dtype = DType::kInt64;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t size_bytes = 0;
};

}  // namespace odb::client

#endif  // ODB_CLIENT_TYPES_H_
