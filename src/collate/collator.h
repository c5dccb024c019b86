#ifndef ODB_COLLATE_COLLATOR_H_
#define ODB_COLLATE_COLLATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/common/dtype.h"
#include "src/common/sample.h"

namespace odb::collate {

// How one named field of the samples becomes one batch tensor.
enum class FieldRule {
  kPad,     // pad dim 0 to the group's longest, then stack -> [B, Lmax, ...]
  kStack,   // all samples have the same shape -> [B, ...]
  kConcat,  // concatenate along dim 0 -> [sum N_i, ...] plus "<name>_offsets" int64 [B+1]
};

enum class PadSide { kRight, kLeft };

struct FieldSpec {
  std::string name;
  FieldRule rule = FieldRule::kPad;
  double pad_value = 0.0;  // converted to the field's dtype
  PadSide pad_side = PadSide::kRight;
};

// Rules for turning a group into batch tensors. Fields not listed here use
// `default_rule` (pad for variable dim 0, stack otherwise is NOT guessed: the
// default is kPad, which also works for equal shapes).
struct CollateOptions {
  std::vector<FieldSpec> fields;
  FieldRule default_rule = FieldRule::kPad;
  // Packed output: every kPad field is instead concatenated into one row
  // [1, sum L_i, ...], and "cu_seqlens" (int32 [B+1]) and "position_ids"
  // (int64 [1, sum L_i]) are added. No attention mask in packed mode.
  bool packed = false;
  // Padded output: add "attention_mask" (int64 [B, Lmax], 1 = real token)
  // built from the lengths of `length_field`.
  bool attention_mask = true;
  std::string length_field = "input_ids";
};

// An owned, contiguous batch tensor ready to be sent as one frame.
struct BatchTensor {
  std::string name;
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Collates the group (in the given order) into batch tensors. All samples
// must carry the same set of tensor names with matching dtypes; errors name
// the field and the sample id. Deterministic output order: fields sorted by
// name, then the derived tensors (offsets, attention_mask, cu_seqlens, position_ids).
absl::StatusOr<std::vector<BatchTensor>> Collate(const std::vector<const Sample*>& group,
                                                 const CollateOptions& options);

}  // namespace odb::collate

#endif  // ODB_COLLATE_COLLATOR_H_
