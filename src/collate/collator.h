#ifndef ODB_COLLATE_COLLATOR_H_
#define ODB_COLLATE_COLLATOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/common/buffer_pool.h"
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
  // The dtype the samples carry for this field, when the config declares it
  // (YAML `dtype:`). Lets start-up validation check `pad_value` against it; a
  // non-integer pad_value needs a floating dtype here. nullopt: undeclared.
  std::optional<DType> dtype = std::nullopt;
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
  // Upper bound on one batch tensor's bytes, checked before allocating: a
  // group that would exceed it fails with ResourceExhausted instead of
  // asking the allocator (which, with overcommit, may say yes and let the
  // OOM killer answer later). The default is far above any real step.
  uint64_t max_batch_tensor_bytes = uint64_t{1} << 36;
};

// An owned, contiguous batch tensor ready to be sent as one frame.
struct BatchTensor {
  std::string name;
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// One batch tensor as a collation lays it out, known before any byte is
// written: lets the caller decide where the bytes go (CollatePlan).
struct BatchTensorLayout {
  std::string name;
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  uint64_t size_bytes = 0;
};

// Collates the group (in the given order) into batch tensors. All samples
// must carry the same set of tensor names with matching dtypes; errors name
// the field and the sample id. Deterministic output order: fields sorted by
// name, then the derived tensors (offsets, attention_mask, cu_seqlens, position_ids).
//
// Output order, exactly: every field in name order (std::string `<`), each
// kConcat field immediately followed by its "<name>_offsets"; then
// "attention_mask" (padded mode with options.attention_mask), or
// "cu_seqlens" then "position_ids" (packed mode).
//
// Contract details:
// - kPad: shapes [L_i, d1, ...] with equal trailing dims -> [B, Lmax, d1, ...];
//   `pad_value` is converted to the field dtype (integers: must be an integer
//   in range; float16/bfloat16/float32: round to nearest even, a finite value
//   that overflows is an error, inf/nan are kept; bool: 0 or 1). Scalars
//   (shape []) cannot be padded: use kStack.
// - kStack: identical shapes (rank 0 included) -> [B, ...].
// - kConcat: equal trailing dims -> [sum N_i, d1, ...] plus
//   "<name>_offsets" int64 [B+1] (prefix sums of N_i, starting at 0).
// - Packed mode: kPad fields become [1, sum L_i, d1, ...]; each must have the
//   same dim 0 as `length_field` in every sample (cu_seqlens indexes them all).
//   cu_seqlens int32 [B+1]; position_ids int64 [1, sum L_i] restart at 0 for
//   each sample.
// - attention_mask int64 [B, Lmax]: Lmax and lengths from `length_field`'s
//   dim 0, the pad side from its FieldSpec (right when not listed).
// - `length_field` must be present (rank >= 1) when packed or attention_mask.
// - FieldSpecs naming a tensor the group does not carry are ignored; a name
//   listed twice is an error. A field whose name equals a derived tensor's
//   name ("attention_mask", "x_offsets", ...) is an error.
// - Every tensor's size_bytes must equal numel x dtype size.
// Errors are absl::InvalidArgumentError; on error nothing is returned.
// Collate never throws: size arithmetic is overflow-checked, and a batch
// tensor over options.max_batch_tensor_bytes or an allocation failure is
// absl::ResourceExhaustedError. A group whose samples all passed one
// ingest::EpochSchema built from the same options collates without an
// InvalidArgument error (see src/ingest/schema.h).
//
// With `buffers`, the batch tensors are written into buffers taken from that
// pool (give them back with BufferPool::Release once sent).
absl::StatusOr<std::vector<BatchTensor>> Collate(const std::vector<const Sample*>& group,
                                                 const CollateOptions& options,
                                                 BufferPool* buffers = nullptr);

// Collate in two phases, for a caller that owns the destination memory (the
// daemon writes a step straight into the trainer's step arena): Make() does
// every check Collate() does and lays out the outputs (same order, names,
// dtypes, shapes and errors as Collate); WriteTo() then writes each output
// exactly once and cannot fail. The plan points into the group's samples,
// which must outlive it; it does not keep `options`.
class CollatePlan {
 public:
  static absl::StatusOr<CollatePlan> Make(const std::vector<const Sample*>& group,
                                          const CollateOptions& options);
  CollatePlan(CollatePlan&&) noexcept;
  CollatePlan& operator=(CollatePlan&&) noexcept;
  ~CollatePlan();

  const std::vector<BatchTensorLayout>& outputs() const;
  // Writes output i at destinations[i], which has room for
  // outputs()[i].size_bytes (any alignment). destinations.size() must equal
  // outputs().size().
  void WriteTo(const std::vector<uint8_t*>& destinations) const;
  // The outputs as owned tensors, in buffers from `buffers` when given (what
  // Collate returns); ResourceExhausted when memory runs out.
  absl::StatusOr<std::vector<BatchTensor>> WriteToBuffers(BufferPool* buffers) const;

 private:
  struct Impl;
  explicit CollatePlan(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The pad value as `dtype` would store it: OK when `value` is representable
// (the rules of kPad above), else the InvalidArgumentError Collate would
// return, naming `field`. Lets a config be checked once the dtypes are known.
absl::Status CheckPadValue(double value, DType dtype, const std::string& field);

// "pad", "stack" or "concat", as in the config and in error messages.
std::string_view RuleName(FieldRule rule);

// The tensors Collate adds besides the fields, in the order it adds them:
// cu_seqlens and position_ids when packed, else attention_mask when asked
// for. A concat field `f` also gets OffsetsName(f). They share the fields'
// namespace, so a field of the same name is an error (here, in the schema and
// in the config).
std::vector<std::string> DerivedTensorNames(const CollateOptions& options);
std::string OffsetsName(std::string_view field);

}  // namespace odb::collate

#endif  // ODB_COLLATE_COLLATOR_H_
