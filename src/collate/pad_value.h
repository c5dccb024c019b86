// A field's pad value as one element of its dtype: the conversion rule the
// collator pads with and the config and schema checks refuse by
// (CheckPadValue in collator.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "src/common/dtype.h"

namespace odb::collate {

// `value` as one element of `dtype`, in host byte order (tensor frames carry
// host-order elements): integers must be exact and in range, floats are
// rounded to nearest (ties to even) and must not overflow, bool is 0 or 1.
// An error names `field` and what would fit.
absl::StatusOr<std::array<uint8_t, 8>> EncodePadValue(double value, DType dtype, const std::string& field);

}  // namespace odb::collate
