#include "src/collate/pad_value.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "src/collate/byte_sinks.h"
#include "src/collate/collator.h"
#include "src/collate/message.h"

namespace odb::collate {
namespace {

using ::absl::InvalidArgumentError;
using internal::StoreBytes;
using internal::StrCat;

// Encodes `value` as an IEEE-754 binary float with the given exponent and
// mantissa widths, rounding to nearest, ties to even (the rounding every
// framework uses for float16/bfloat16 casts). Rounding straight from double
// avoids the double rounding of going through float32 first.
// Returns false when a finite `value` overflows the format.
bool EncodeFloatBits(double value, int exp_bits, int mant_bits, uint64_t* bits) {
  const uint64_t sign = std::signbit(value) ? (uint64_t{1} << (exp_bits + mant_bits)) : 0;
  const uint64_t exp_all_ones = (uint64_t{1} << exp_bits) - 1;
  if (std::isnan(value)) {
    *bits = sign | (exp_all_ones << mant_bits) | (uint64_t{1} << (mant_bits - 1));
    return true;
  }
  if (std::isinf(value)) {
    *bits = sign | (exp_all_ones << mant_bits);
    return true;
  }
  const double a = std::fabs(value);
  if (a == 0.0) {
    *bits = sign;
    return true;
  }
  const int bias = (1 << (exp_bits - 1)) - 1;
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int unbiased = e - 1;
  uint64_t magnitude = 0;
  if (unbiased >= 1 - bias) {
    // Normal: scale the significand to an integer in [2^mant, 2^(mant+1)).
    // ldexp is exact here and nearbyint rounds ties to even. A carry out of
    // the mantissa lands in the exponent field, which is the right encoding.
    const auto q = static_cast<uint64_t>(std::nearbyint(std::ldexp(a, mant_bits - unbiased)));
    magnitude = (static_cast<uint64_t>(unbiased + bias) << mant_bits) + (q - (uint64_t{1} << mant_bits));
  } else {
    // Subnormal: units of 2^(1 - bias - mant); q == 2^mant is the smallest normal.
    magnitude = static_cast<uint64_t>(std::nearbyint(std::ldexp(a, mant_bits - (1 - bias))));
  }
  if ((magnitude >> mant_bits) >= exp_all_ones) return false;
  *bits = sign | magnitude;
  return true;
}

template <typename T>
absl::Status EncodeInteger(double value, const std::string& field, DType dtype, std::array<uint8_t, 8>* out) {
  // max() + 1.0 is exact (a power of two) for every integer type, also int64
  // where max() itself rounds up to 2^63 as a double.
  const double lo = static_cast<double>(std::numeric_limits<T>::min());
  const double hi = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
  if (!std::isfinite(value) || value != std::trunc(value) || value < lo || value >= hi) {
    return InvalidArgumentError(StrCat("collate: pad_value ", value, " of field '", field,
                                       "' is not representable as ", DTypeName(dtype),
                                       "; use an integer in range for the field's dtype"));
  }
  StoreBytes(static_cast<T>(value), out);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::array<uint8_t, 8>> EncodePadValue(double value, DType dtype, const std::string& field) {
  std::array<uint8_t, 8> out{};
  absl::Status status;
  uint64_t bits = 0;
  auto encode_float = [&](int exp_bits, int mant_bits) -> absl::Status {
    if (!EncodeFloatBits(value, exp_bits, mant_bits, &bits)) {
      return InvalidArgumentError(StrCat("collate: pad_value ", value, " of field '", field, "' overflows ",
                                         DTypeName(dtype),
                                         "; use a value within the dtype's finite range (or inf)"));
    }
    return absl::OkStatus();
  };
  switch (dtype) {
    case DType::kUInt8:
      status = EncodeInteger<uint8_t>(value, field, dtype, &out);
      break;
    case DType::kInt8:
      status = EncodeInteger<int8_t>(value, field, dtype, &out);
      break;
    case DType::kInt16:
      status = EncodeInteger<int16_t>(value, field, dtype, &out);
      break;
    case DType::kInt32:
      status = EncodeInteger<int32_t>(value, field, dtype, &out);
      break;
    case DType::kInt64:
      status = EncodeInteger<int64_t>(value, field, dtype, &out);
      break;
    case DType::kFloat16:
      status = encode_float(5, 10);
      StoreBytes(static_cast<uint16_t>(bits), &out);
      break;
    case DType::kBFloat16:
      status = encode_float(8, 7);
      StoreBytes(static_cast<uint16_t>(bits), &out);
      break;
    case DType::kFloat32:
      status = encode_float(8, 23);
      StoreBytes(static_cast<uint32_t>(bits), &out);
      break;
    case DType::kFloat64:
      StoreBytes(value, &out);
      break;
    case DType::kBool:
      if (value != 0.0 && value != 1.0) {
        return InvalidArgumentError(
            StrCat("collate: pad_value ", value, " of bool field '", field, "' must be 0 or 1"));
      }
      out[0] = value == 1.0 ? 1 : 0;
      break;
    default:
      return InvalidArgumentError(
          StrCat("collate: field '", field, "' has unsupported dtype ", DTypeName(dtype)));
  }
  if (!status.ok()) return status;
  return out;
}

absl::Status CheckPadValue(double value, DType dtype, const std::string& field) {
  return EncodePadValue(value, dtype, field).status();
}

}  // namespace odb::collate
