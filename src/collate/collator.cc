#include "src/collate/collator.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "src/collate/byte_sinks.h"
#include "src/collate/message.h"
#include "src/collate/pad_value.h"

namespace odb::collate {
namespace {

using ::absl::InvalidArgumentError;
using ::absl::ResourceExhaustedError;
using internal::PatternFill;
using internal::PointerSink;
using internal::StoreBytes;
using internal::StrCat;
using internal::VectorSink;
using internal::WriteValue;

constexpr std::string_view kAttentionMask = "attention_mask";
constexpr std::string_view kCuSeqlens = "cu_seqlens";
constexpr std::string_view kPositionIds = "position_ids";
constexpr std::string_view kOffsetsSuffix = "_offsets";

}  // namespace

std::string_view RuleName(FieldRule rule) {
  switch (rule) {
    case FieldRule::kPad:
      return "pad";
    case FieldRule::kStack:
      return "stack";
    case FieldRule::kConcat:
      return "concat";
  }
  return "unknown";
}

std::vector<std::string> DerivedTensorNames(const CollateOptions& options) {
  if (options.packed) return {std::string(kCuSeqlens), std::string(kPositionIds)};
  if (options.attention_mask) return {std::string(kAttentionMask)};
  return {};
}

std::string OffsetsName(std::string_view field) { return StrCat(field, kOffsetsSuffix); }

namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// "field 'x' of sample 42": the prefix of every per-sample error.
std::string Where(const std::string& field, const Sample& sample) {
  return StrCat("collate: field '", field, "' of sample ", sample.meta.id);
}

// The bytes of batch tensor `tensor`, the product of `factors`: an error
// when the product overflows or is over `cap` (checked before any
// allocation, so a hostile shape never reaches the allocator).
absl::StatusOr<size_t> OutputSize(std::string_view tensor, std::initializer_list<uint64_t> factors,
                                  uint64_t cap) {
  uint64_t bytes = 1;
  bool overflow = false;
  for (uint64_t f : factors) overflow = overflow || __builtin_mul_overflow(bytes, f, &bytes);
  if (overflow || bytes > cap || bytes > std::numeric_limits<size_t>::max()) {
    std::string product;
    for (uint64_t f : factors) product += (product.empty() ? "" : " x ") + std::to_string(f);
    const std::string total = overflow ? " (overflows 64 bits)" : StrCat(" = ", bytes, " bytes");
    return ResourceExhaustedError(StrCat("collate: batch tensor '", tensor, "' would need ", product,
                                         total, ", over the limit of ", cap,
                                         " (CollateOptions::max_batch_tensor_bytes); lower the "
                                         "budget or check the samples' shapes"));
  }
  return static_cast<size_t>(bytes);
}

// Sum of dim 0 of `field` over the group, overflow-checked.
absl::StatusOr<int64_t> TotalRows(const std::vector<const TensorView*>& views,
                                  const std::string& field) {
  int64_t total = 0;
  for (const TensorView* v : views) {
    if (__builtin_add_overflow(total, v->shape[0], &total)) {
      return ResourceExhaustedError(
          StrCat("collate: the rows of field '", field, "' over the group overflow int64"));
    }
  }
  return total;
}

// An empty output buffer with room for `bytes`: from the pool when there is
// one (memory already mapped), else a fresh reservation.
std::vector<uint8_t> OutputBuffer(size_t bytes, BufferPool* pool) {
  if (pool != nullptr) return pool->Acquire(bytes);
  std::vector<uint8_t> out;
  out.reserve(bytes);
  return out;
}

// One field of the group: its rule and the view of every sample, in order.
struct Field {
  std::string name;
  const FieldSpec* spec = nullptr;  // null: default rule, pad value 0, right side; planning only
  FieldRule rule = FieldRule::kPad;
  DType dtype = DType::kUnspecified;
  std::vector<const TensorView*> views;  // one per sample
  size_t row_bytes = 0;  // bytes of one dim-0 row (whole tensor for rank 0)

  PadSide pad_side() const { return spec != nullptr ? spec->pad_side : PadSide::kRight; }
  double pad_value() const { return spec != nullptr ? spec->pad_value : 0.0; }
  int64_t Rows(size_t i) const { return views[i]->shape[0]; }
  int64_t MaxRows() const {
    int64_t max_rows = 0;
    for (size_t i = 0; i < views.size(); ++i) max_rows = std::max(max_rows, Rows(i));
    return max_rows;
  }
};

absl::Status ValidateView(const TensorView& view, const Sample& sample) {
  const size_t elem = DTypeSize(view.dtype);
  if (elem == 0) {
    return InvalidArgumentError(StrCat(Where(view.name, sample), ": invalid dtype ",
                                       static_cast<int>(view.dtype)));
  }
  uint64_t numel = 1;
  for (int64_t d : view.shape) {
    if (d < 0) {
      return InvalidArgumentError(StrCat(Where(view.name, sample), ": negative dimension in shape ",
                                         ShapeString(view.shape)));
    }
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
      return InvalidArgumentError(
          StrCat(Where(view.name, sample), ": shape ", ShapeString(view.shape), " overflows"));
    }
  }
  uint64_t expected = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(elem), &expected) ||
      expected != view.size_bytes) {
    return InvalidArgumentError(StrCat(Where(view.name, sample), ": size_bytes ", view.size_bytes,
                                       " != ", numel, " elements x ", elem, " bytes (",
                                       DTypeName(view.dtype), ", shape ", ShapeString(view.shape),
                                       ")"));
  }
  if (view.size_bytes > 0 && view.data == nullptr) {
    return InvalidArgumentError(
        StrCat(Where(view.name, sample), ": data is null but size_bytes is ", view.size_bytes));
  }
  return absl::OkStatus();
}

bool SameTrailingDims(const TensorView& a, const TensorView& b) {
  return a.shape.size() == b.shape.size() &&
         std::equal(a.shape.begin() + 1, a.shape.end(), b.shape.begin() + 1);
}

// Checks the per-rule shape contract of one field across the group and
// computes its row size.
absl::Status ValidateFieldShapes(const std::vector<const Sample*>& group, Field* field) {
  const TensorView& first = *field->views[0];
  const Sample& first_sample = *group[0];
  const size_t elem = DTypeSize(field->dtype);
  if (field->rule == FieldRule::kStack) {
    for (size_t i = 1; i < group.size(); ++i) {
      if (field->views[i]->shape != first.shape) {
        return InvalidArgumentError(
            StrCat(Where(field->name, *group[i]), ": shape ", ShapeString(field->views[i]->shape),
                   " differs from ", ShapeString(first.shape), " of sample ", first_sample.meta.id,
                   "; rule stack needs identical shapes (use pad or concat for variable dim 0)"));
      }
    }
    field->row_bytes = first.size_bytes;
    return absl::OkStatus();
  }
  // kPad and kConcat work along dim 0.
  for (size_t i = 0; i < group.size(); ++i) {
    if (field->views[i]->shape.empty()) {
      return InvalidArgumentError(StrCat(Where(field->name, *group[i]),
                                         " is a scalar (shape []); rule ", RuleName(field->rule),
                                         " needs at least one dimension (use stack for scalars)"));
    }
  }
  for (size_t i = 1; i < group.size(); ++i) {
    if (!SameTrailingDims(*field->views[i], first)) {
      return InvalidArgumentError(
          StrCat(Where(field->name, *group[i]), ": shape ", ShapeString(field->views[i]->shape),
                 " does not match ", ShapeString(first.shape), " of sample ", first_sample.meta.id,
                 " beyond dim 0; rule ", RuleName(field->rule),
                 " needs equal rank and trailing dims"));
    }
  }
  uint64_t row = elem;
  for (size_t d = 1; d < first.shape.size(); ++d) {
    if (__builtin_mul_overflow(row, static_cast<uint64_t>(first.shape[d]), &row) ||
        row > std::numeric_limits<size_t>::max()) {
      return ResourceExhaustedError(StrCat(Where(field->name, first_sample), ": a row of shape ",
                                           ShapeString(first.shape), " overflows 64 bits"));
    }
  }
  field->row_bytes = static_cast<size_t>(row);
  return absl::OkStatus();
}

std::vector<int64_t> TrailingDims(const TensorView& view) {
  return std::vector<int64_t>(view.shape.begin() + 1, view.shape.end());
}

// How one output is written (its layout is next to it in the plan).
enum class OutputKind {
  kPadded,         // kPad: [B, Lmax, ...], each sample padded on `left` or right
  kSamplesInOrder, // kStack, kConcat and packed kPad: every sample's bytes, in order
  kOffsets,        // "<name>_offsets": int64 prefix sums of dim 0
  kAttentionMask,  // int64 [B, Lmax] of the length field
  kCuSeqlens,      // int32 prefix sums of the length field's dim 0
  kPositionIds,    // int64 [1, sum L]: 0..L_i-1 per sample
};

struct Output {
  OutputKind kind = OutputKind::kSamplesInOrder;
  size_t field = 0;  // index into the plan's fields (the length field for derived tensors)
  bool left = false;  // kPadded, kAttentionMask: pad on the left
  std::array<uint8_t, 8> pad_element{};  // kPadded
  int64_t max_rows = 0;  // kPadded, kAttentionMask, kPositionIds
};

template <typename Sink>
void WriteOutput(const Output& o, const std::vector<Field>& fields, size_t batch, Sink& out) {
  const Field& field = fields[o.field];
  switch (o.kind) {
    case OutputKind::kPadded: {
      const PatternFill fill(o.pad_element, DTypeSize(field.dtype));
      for (size_t i = 0; i < batch; ++i) {
        const TensorView& v = *field.views[i];
        const size_t pad_bytes = static_cast<size_t>(o.max_rows - field.Rows(i)) * field.row_bytes;
        if (o.left) fill.Fill(pad_bytes, out);
        out.Copy(v.data, v.size_bytes);
        if (!o.left) fill.Fill(pad_bytes, out);
      }
      return;
    }
    case OutputKind::kSamplesInOrder:
      for (size_t i = 0; i < batch; ++i) out.Copy(field.views[i]->data, field.views[i]->size_bytes);
      return;
    case OutputKind::kOffsets: {
      int64_t offset = 0;
      WriteValue(offset, out);
      for (size_t i = 0; i < batch; ++i) {
        offset += field.Rows(i);
        WriteValue(offset, out);
      }
      return;
    }
    case OutputKind::kAttentionMask: {
      std::array<uint8_t, 8> one{};
      StoreBytes(int64_t{1}, &one);
      const PatternFill ones(one, sizeof(int64_t));
      const PatternFill zeros(std::array<uint8_t, 8>{}, sizeof(int64_t));
      for (size_t i = 0; i < batch; ++i) {
        const size_t real = static_cast<size_t>(field.Rows(i)) * sizeof(int64_t);
        const size_t pad = static_cast<size_t>(o.max_rows) * sizeof(int64_t) - real;
        if (o.left) zeros.Fill(pad, out);
        ones.Fill(real, out);
        if (!o.left) zeros.Fill(pad, out);
      }
      return;
    }
    case OutputKind::kCuSeqlens: {
      int32_t acc = 0;  // the plan checked that the total fits in int32
      WriteValue(acc, out);
      for (size_t i = 0; i < batch; ++i) {
        acc += static_cast<int32_t>(field.Rows(i));
        WriteValue(acc, out);
      }
      return;
    }
    case OutputKind::kPositionIds: {
      // Every sample's positions are a prefix of one ramp 0..Lmax-1: build it
      // once and copy slices, so position_ids cost a memcpy per sample.
      std::vector<int64_t> ramp(static_cast<size_t>(o.max_rows));
      for (int64_t j = 0; j < o.max_rows; ++j) ramp[static_cast<size_t>(j)] = j;
      const auto* ramp_bytes = reinterpret_cast<const uint8_t*>(ramp.data());
      for (size_t i = 0; i < batch; ++i) {
        out.Copy(ramp_bytes, static_cast<size_t>(field.Rows(i)) * sizeof(int64_t));
      }
      return;
    }
  }
}

// Gathers every sample's view of every field, checking that all samples carry
// exactly the first sample's set of names with its dtypes. Fields come back
// sorted by name.
absl::StatusOr<std::vector<Field>> GatherFields(const std::vector<const Sample*>& group) {
  const Sample& first = *group[0];
  std::vector<Field> fields;
  fields.reserve(first.tensors.size());
  for (const TensorView& t : first.tensors) {
    Field f;
    f.name = t.name;
    f.dtype = t.dtype;
    f.views.assign(group.size(), nullptr);
    fields.push_back(std::move(f));
  }
  std::sort(fields.begin(), fields.end(),
            [](const Field& a, const Field& b) { return a.name < b.name; });
  std::unordered_map<std::string_view, size_t> index;
  for (size_t f = 0; f < fields.size(); ++f) {
    if (!index.emplace(fields[f].name, f).second) {
      return InvalidArgumentError(
          StrCat(Where(fields[f].name, first), " appears twice; tensor names must be unique"));
    }
  }

  for (size_t i = 0; i < group.size(); ++i) {
    const Sample& sample = *group[i];
    for (const TensorView& t : sample.tensors) {
      auto it = index.find(t.name);
      if (it == index.end()) {
        return InvalidArgumentError(StrCat(Where(t.name, sample), " is not in sample ",
                                           first.meta.id,
                                           " (first of the group); all samples of a group must "
                                           "carry the same tensor names"));
      }
      Field& field = fields[it->second];
      if (field.views[i] != nullptr) {
        return InvalidArgumentError(
            StrCat(Where(t.name, sample), " appears twice; tensor names must be unique"));
      }
      absl::Status status = ValidateView(t, sample);
      if (!status.ok()) return status;
      if (t.dtype != field.dtype) {
        return InvalidArgumentError(StrCat(Where(t.name, sample), ": dtype ", DTypeName(t.dtype),
                                           " does not match ", DTypeName(field.dtype),
                                           " of sample ", first.meta.id));
      }
      field.views[i] = &t;
    }
    for (const Field& field : fields) {
      if (field.views[i] == nullptr) {
        return InvalidArgumentError(StrCat(Where(field.name, sample), " is missing; sample ",
                                           first.meta.id,
                                           " (first of the group) has it and all samples of a "
                                           "group must carry the same tensor names"));
      }
    }
  }
  return fields;
}

absl::Status CheckOptions(const CollateOptions& options) {
  for (size_t i = 0; i < options.fields.size(); ++i) {
    for (size_t j = i + 1; j < options.fields.size(); ++j) {
      if (options.fields[i].name == options.fields[j].name) {
        return InvalidArgumentError(StrCat("collate: field '", options.fields[i].name,
                                           "' is listed twice in CollateOptions::fields"));
      }
    }
  }
  return absl::OkStatus();
}

const FieldSpec* FindSpec(const CollateOptions& options, const std::string& name) {
  for (const FieldSpec& spec : options.fields) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

// Derived tensors share the namespace of fields; a clash would make the
// trainer read the wrong tensor, so it is an error rather than a silent
// overwrite.
absl::Status CheckNameClashes(const std::vector<Field>& fields, const CollateOptions& options,
                              const Sample& first) {
  std::vector<std::string> derived = DerivedTensorNames(options);
  for (const Field& f : fields) {
    if (f.rule == FieldRule::kConcat) derived.push_back(OffsetsName(f.name));
  }
  for (const std::string& name : derived) {
    if (first.FindTensor(name) != nullptr) {
      return InvalidArgumentError(StrCat(Where(name, first),
                                         " clashes with the derived tensor of the same name; "
                                         "rename the field or change the collate options"));
    }
  }
  return absl::OkStatus();
}

// A collation's outputs: what each one is and how it is written.
struct Planned {
  size_t batch = 0;
  std::vector<Field> fields;
  std::vector<Output> outputs;             // how each output is written
  std::vector<BatchTensorLayout> layouts;  // what each output is
};

// Adds one output: its layout and how to write it.
void AddOutput(Planned* plan, BatchTensorLayout layout, Output how) {
  plan->layouts.push_back(std::move(layout));
  plan->outputs.push_back(how);
}

// Layout of field `index` under its rule (and the "<name>_offsets" of a
// concatenated one).
absl::Status PlanField(Planned* plan, size_t index, bool packed, uint64_t cap) {
  const Field& field = plan->fields[index];
  const size_t batch = plan->batch;
  const TensorView& first = *field.views[0];
  Output how;
  how.field = index;
  if (field.rule == FieldRule::kPad && !packed) {
    auto pad_element = EncodePadValue(field.pad_value(), field.dtype, field.name);
    if (!pad_element.ok()) return pad_element.status();
    how.kind = OutputKind::kPadded;
    how.pad_element = *pad_element;
    how.left = field.pad_side() == PadSide::kLeft;
    how.max_rows = field.MaxRows();
    auto size = OutputSize(field.name, {batch, static_cast<uint64_t>(how.max_rows), field.row_bytes}, cap);
    if (!size.ok()) return size.status();
    std::vector<int64_t> shape = {static_cast<int64_t>(batch), how.max_rows};
    for (int64_t d : TrailingDims(first)) shape.push_back(d);
    AddOutput(plan, {field.name, field.dtype, std::move(shape), *size}, how);
    return absl::OkStatus();
  }
  how.kind = OutputKind::kSamplesInOrder;
  if (field.rule == FieldRule::kStack) {
    auto size = OutputSize(field.name, {batch, field.row_bytes}, cap);
    if (!size.ok()) return size.status();
    std::vector<int64_t> shape = {static_cast<int64_t>(batch)};
    for (int64_t d : first.shape) shape.push_back(d);
    AddOutput(plan, {field.name, field.dtype, std::move(shape), *size}, how);
    return absl::OkStatus();
  }
  // Concatenation along dim 0 (kConcat, and kPad in packed mode).
  auto total_rows = TotalRows(field.views, field.name);
  if (!total_rows.ok()) return total_rows.status();
  // Every sample's bytes are rows x row_bytes, so the total is too.
  auto size = OutputSize(field.name, {static_cast<uint64_t>(*total_rows), field.row_bytes}, cap);
  if (!size.ok()) return size.status();
  std::vector<int64_t> shape;
  if (field.rule == FieldRule::kPad) shape.push_back(1);  // the packed row
  shape.push_back(*total_rows);
  for (int64_t d : TrailingDims(first)) shape.push_back(d);
  AddOutput(plan, {field.name, field.dtype, std::move(shape), *size}, how);
  if (field.rule == FieldRule::kConcat) {
    how.kind = OutputKind::kOffsets;
    AddOutput(plan,
              {OffsetsName(field.name),
               DType::kInt64,
               {static_cast<int64_t>(batch) + 1},
               (batch + 1) * sizeof(int64_t)},
              how);
  }
  return absl::OkStatus();
}

// "cu_seqlens" and "position_ids" of packed mode.
absl::Status PlanPackedIndex(Planned* plan, size_t length_index, uint64_t cap) {
  const Field& length_field = plan->fields[length_index];
  const size_t batch = plan->batch;
  auto total_rows = TotalRows(length_field.views, length_field.name);
  if (!total_rows.ok()) return total_rows.status();
  const int64_t total = *total_rows;
  if (total > std::numeric_limits<int32_t>::max()) {
    return InvalidArgumentError(StrCat("collate: packed group has ", total, " rows of '",
                                       length_field.name,
                                       "', more than int32 cu_seqlens can index; lower the budget"));
  }
  // The ramp is at most as long as position_ids, so this bounds both.
  auto pos_size = OutputSize(kPositionIds, {static_cast<uint64_t>(total), sizeof(int64_t)}, cap);
  if (!pos_size.ok()) return pos_size.status();
  Output how;
  how.field = length_index;
  how.kind = OutputKind::kCuSeqlens;
  AddOutput(plan,
            {std::string(kCuSeqlens), DType::kInt32, {static_cast<int64_t>(batch) + 1},
             (batch + 1) * sizeof(int32_t)},
            how);
  how.kind = OutputKind::kPositionIds;
  how.max_rows = length_field.MaxRows();
  AddOutput(plan, {std::string(kPositionIds), DType::kInt64, {1, total}, *pos_size}, how);
  return absl::OkStatus();
}

absl::Status PlanAttentionMask(Planned* plan, size_t length_index, uint64_t cap) {
  const Field& length_field = plan->fields[length_index];
  Output how;
  how.kind = OutputKind::kAttentionMask;
  how.field = length_index;
  how.left = length_field.pad_side() == PadSide::kLeft;
  how.max_rows = length_field.MaxRows();
  auto size = OutputSize(kAttentionMask,
                         {plan->batch, static_cast<uint64_t>(how.max_rows), sizeof(int64_t)}, cap);
  if (!size.ok()) return size.status();
  AddOutput(plan,
            {std::string(kAttentionMask), DType::kInt64, {static_cast<int64_t>(plan->batch), how.max_rows},
             *size},
            how);
  return absl::OkStatus();
}

absl::Status PlanOrThrow(const std::vector<const Sample*>& group, const CollateOptions& options,
                         Planned* plan) {
  if (group.empty()) {
    return InvalidArgumentError("collate: empty group; a group needs at least one sample");
  }
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i] == nullptr) {
      return InvalidArgumentError(StrCat("collate: group entry ", i, " is a null sample"));
    }
  }
  absl::Status status = CheckOptions(options);
  if (!status.ok()) return status;

  auto gathered = GatherFields(group);
  if (!gathered.ok()) return gathered.status();
  plan->fields = std::move(*gathered);
  plan->batch = group.size();
  std::vector<Field>& fields = plan->fields;
  const size_t batch = group.size();

  for (Field& field : fields) {
    field.spec = FindSpec(options, field.name);
    field.rule = field.spec != nullptr ? field.spec->rule : options.default_rule;
    status = ValidateFieldShapes(group, &field);
    if (!status.ok()) return status;
  }
  status = CheckNameClashes(fields, options, *group[0]);
  if (!status.ok()) return status;

  std::optional<size_t> length_index;
  if (options.packed || options.attention_mask) {
    const std::string_view why = options.packed ? "packed mode (cu_seqlens, position_ids)"
                                                : "attention_mask";
    for (size_t f = 0; f < fields.size(); ++f) {
      if (fields[f].name == options.length_field) length_index = f;
    }
    if (!length_index) {
      return InvalidArgumentError(StrCat(
          Where(options.length_field, *group[0]), " (length_field) is missing; ", why,
          " needs it: set CollateOptions::length_field to a tensor the samples carry"));
    }
    const Field& length_field = fields[*length_index];
    if (length_field.views[0]->shape.empty()) {
      return InvalidArgumentError(StrCat(Where(length_field.name, *group[0]),
                                         " (length_field) is a scalar; ", why,
                                         " needs its dim 0 as the sequence length"));
    }
  }
  if (options.packed) {
    // Packed rows share one cu_seqlens, so every packed field must have the
    // length field's row count in every sample.
    const Field& length_field = fields[*length_index];
    for (const Field& f : fields) {
      if (f.rule != FieldRule::kPad) continue;
      for (size_t i = 0; i < batch; ++i) {
        if (f.Rows(i) != length_field.Rows(i)) {
          return InvalidArgumentError(StrCat(
              Where(f.name, *group[i]), ": ", f.Rows(i), " rows but length_field '",
              length_field.name, "' has ", length_field.Rows(i),
              "; packed fields must match the length field (use concat for fields with their own "
              "length)"));
        }
      }
    }
  }

  const uint64_t cap = options.max_batch_tensor_bytes;
  plan->outputs.reserve(fields.size() * 2 + 2);
  plan->layouts.reserve(fields.size() * 2 + 2);
  for (size_t f = 0; f < fields.size(); ++f) {
    status = PlanField(plan, f, options.packed, cap);
    if (!status.ok()) return status;
  }
  if (options.packed) {
    status = PlanPackedIndex(plan, *length_index, cap);
  } else if (options.attention_mask) {
    status = PlanAttentionMask(plan, *length_index, cap);
  }
  if (!status.ok()) return status;
  for (Field& field : fields) field.spec = nullptr;  // `options` is not kept
  return absl::OkStatus();
}

absl::Status OutOfMemory(size_t batch, const std::exception& e, bool too_large) {
  return too_large ? ResourceExhaustedError(StrCat("collate: a batch tensor of ", batch,
                                                   " samples is too large (", e.what(), "); lower the budget"))
                   : ResourceExhaustedError(StrCat("collate: out of memory building a batch of ", batch,
                                                   " samples (", e.what(), "); lower the budget"));
}

}  // namespace

struct CollatePlan::Impl : Planned {};

CollatePlan::CollatePlan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CollatePlan::CollatePlan(CollatePlan&&) noexcept = default;
CollatePlan& CollatePlan::operator=(CollatePlan&&) noexcept = default;
CollatePlan::~CollatePlan() = default;

absl::StatusOr<CollatePlan> CollatePlan::Make(const std::vector<const Sample*>& group,
                                              const CollateOptions& options) {
  // The size checks keep hostile shapes from the allocator; what is left (a
  // real step larger than the memory there is) must not take the daemon down
  // either: it becomes an error for this step.
  try {
    auto impl = std::make_unique<Impl>();
    absl::Status status = PlanOrThrow(group, options, impl.get());
    if (!status.ok()) return status;
    return CollatePlan(std::move(impl));
  } catch (const std::bad_alloc& e) {
    return OutOfMemory(group.size(), e, false);
  } catch (const std::length_error& e) {
    return OutOfMemory(group.size(), e, true);
  }
}

const std::vector<BatchTensorLayout>& CollatePlan::outputs() const { return impl_->layouts; }

void CollatePlan::WriteTo(const std::vector<uint8_t*>& destinations) const {
  for (size_t i = 0; i < impl_->outputs.size() && i < destinations.size(); ++i) {
    PointerSink sink(destinations[i]);
    WriteOutput(impl_->outputs[i], impl_->fields, impl_->batch, sink);
  }
}

absl::StatusOr<std::vector<BatchTensor>> CollatePlan::WriteToBuffers(BufferPool* buffers) const {
  try {
    std::vector<BatchTensor> tensors;
    tensors.reserve(impl_->outputs.size());
    for (size_t i = 0; i < impl_->outputs.size(); ++i) {
      const BatchTensorLayout& layout = impl_->layouts[i];
      BatchTensor t{layout.name, layout.dtype, layout.shape, OutputBuffer(layout.size_bytes, buffers)};
      VectorSink sink(&t.bytes);
      WriteOutput(impl_->outputs[i], impl_->fields, impl_->batch, sink);
      tensors.push_back(std::move(t));
    }
    return tensors;
  } catch (const std::bad_alloc& e) {
    return OutOfMemory(impl_->batch, e, false);
  } catch (const std::length_error& e) {
    return OutOfMemory(impl_->batch, e, true);
  }
}

absl::StatusOr<std::vector<BatchTensor>> Collate(const std::vector<const Sample*>& group,
                                                 const CollateOptions& options, BufferPool* buffers) {
  auto plan = CollatePlan::Make(group, options);
  if (!plan.ok()) return plan.status();
  return plan->WriteToBuffers(buffers);
}

}  // namespace odb::collate
