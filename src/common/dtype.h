#ifndef ODB_COMMON_DTYPE_H_
#define ODB_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace odb {

// Element types a tensor frame may carry. Values match proto/odb.proto's DType.
enum class DType : uint8_t {
  kUnspecified = 0,
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

// Bytes per element; 0 for kUnspecified or an out-of-range value.
size_t DTypeSize(DType dtype);

// "int64", "float32", ... as used in the YAML config and in error messages.
std::string_view DTypeName(DType dtype);
std::optional<DType> DTypeFromName(std::string_view name);

// True when `raw` is one of the enumerators above (other than kUnspecified).
bool IsValidDType(uint32_t raw);

}  // namespace odb

#endif  // ODB_COMMON_DTYPE_H_
