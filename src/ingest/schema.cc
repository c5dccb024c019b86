#include "src/ingest/schema.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace odb::ingest {
namespace {

using collate::FieldRule;

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// What a rule compares: the full shape for stack, "[*, d1, ...]" otherwise.
std::string Layout(FieldRule rule, DType dtype, const std::vector<int64_t>& shape) {
  std::string s = std::string(DTypeName(dtype)) + " ";
  if (rule == FieldRule::kStack || shape.empty()) return s + ShapeString(shape);
  std::string out = "[*";
  for (size_t i = 1; i < shape.size(); ++i) out += ", " + std::to_string(shape[i]);
  return s + out + "]";
}

std::string SampleName(const Sample& s) {
  return "sample " + std::to_string(s.meta.id) + " from producer '" + s.producer_id + "'";
}

wire::Rejection Reject(wire::ErrorCode code, const Sample& s, const std::string& why) {
  wire::Rejection r;
  r.set_code(code);
  r.set_message(SampleName(s) + ": " + why);
  r.set_producer_id(s.producer_id);
  r.set_sample_id(s.meta.id);
  r.set_has_sample_id(true);
  return r;
}

const collate::FieldSpec* FindSpec(const collate::CollateOptions& options, const std::string& name) {
  for (const collate::FieldSpec& spec : options.fields) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

// "collate.fields[x].rule" when the field is listed, else the default rule.
std::string RuleKey(const collate::CollateOptions& options, const std::string& name) {
  return FindSpec(options, name) != nullptr ? "collate.fields[" + name + "].rule"
                                            : std::string("collate.default_rule");
}

}  // namespace

EpochSchema::EpochSchema(collate::CollateOptions options) : options_(std::move(options)) {}

FieldRule EpochSchema::RuleOf(const std::string& name) const {
  const collate::FieldSpec* spec = FindSpec(options_, name);
  return spec != nullptr ? spec->rule : options_.default_rule;
}

absl::Status EpochSchema::CheckConfigAgainst(const Sample& sample) const {
  auto error = [&](const std::string& key, const std::string& why) {
    return absl::InvalidArgumentError(key + ": " + why + " (" + SampleName(sample) + ")");
  };
  for (size_t i = 0; i < options_.fields.size(); ++i) {
    for (size_t j = i + 1; j < options_.fields.size(); ++j) {
      if (options_.fields[i].name == options_.fields[j].name) {
        return error("collate.fields[" + options_.fields[i].name + "]", "listed twice");
      }
    }
  }
  const bool needs_length = options_.packed || options_.attention_mask;
  if (needs_length) {
    const TensorView* length = sample.FindTensor(options_.length_field);
    const std::string why = options_.packed ? "packed mode" : "the attention mask";
    if (length == nullptr) {
      std::string names;
      for (const TensorView& t : sample.tensors) names += (names.empty() ? "'" : ", '") + t.name + "'";
      return error("collate.length_field",
                   "'" + options_.length_field + "' is not a tensor of the sample (it has " +
                       (names.empty() ? "none" : names) + "); " + why +
                       " needs it: set it to the tensor whose dim 0 is the token count");
    }
    if (length->shape.empty()) {
      return error("collate.length_field", "'" + options_.length_field + "' is a scalar; " + why +
                                               " needs its dim 0 as the sequence length");
    }
  }
  std::vector<std::string> derived = collate::DerivedTensorNames(options_);
  for (const TensorView& t : sample.tensors) {
    const FieldRule rule = RuleOf(t.name);
    if (rule == FieldRule::kConcat) derived.push_back(collate::OffsetsName(t.name));
    if (rule != FieldRule::kStack && t.shape.empty()) {
      return error(RuleKey(options_, t.name), "tensor '" + t.name + "' is a scalar; rule " +
                                                  std::string(collate::RuleName(rule)) +
                                                  " needs at least one dimension (use stack for scalars)");
    }
    const collate::FieldSpec* spec = FindSpec(options_, t.name);
    if (spec != nullptr && rule == FieldRule::kPad && !options_.packed) {
      absl::Status s = collate::CheckPadValue(spec->pad_value, t.dtype, t.name);
      if (!s.ok()) {
        return error("collate.fields[" + t.name + "].pad_value", std::string(s.message()));
      }
    }
  }
  for (const std::string& name : derived) {
    if (sample.FindTensor(name) != nullptr) {
      return error("collate", "tensor '" + name +
                                  "' clashes with the derived tensor of the same name; rename "
                                  "the field or change the collate options");
    }
  }
  return absl::OkStatus();
}

std::optional<wire::Rejection> EpochSchema::CheckAlone(const Sample& sample) const {
  for (size_t i = 0; i < sample.tensors.size(); ++i) {
    const TensorView& t = sample.tensors[i];
    for (size_t j = 0; j < i; ++j) {
      if (sample.tensors[j].name == t.name) {
        return Reject(wire::SCHEMA_MISMATCH, sample, "tensor '" + t.name + "' appears twice");
      }
    }
    const size_t elem = DTypeSize(t.dtype);
    if (elem == 0) {
      return Reject(wire::SCHEMA_MISMATCH, sample,
                    "tensor '" + t.name + "' has invalid dtype " +
                        std::to_string(static_cast<int>(t.dtype)));
    }
    // numel x elem == size_bytes; and a row (dims after 0) must fit too,
    // since dim 0 may be 0.
    uint64_t numel = 1;
    uint64_t row = elem;
    bool overflow = false;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      const int64_t dim = t.shape[d];
      if (dim < 0) {
        overflow = true;
        break;
      }
      overflow = overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &numel);
      if (d > 0) overflow = overflow || __builtin_mul_overflow(row, static_cast<uint64_t>(dim), &row);
    }
    uint64_t bytes = 0;
    if (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(elem), &bytes) ||
        bytes != t.size_bytes || (t.size_bytes > 0 && t.data == nullptr)) {
      return Reject(wire::SHAPE_SIZE_MISMATCH, sample,
                    "tensor '" + t.name + "' declares " + std::string(DTypeName(t.dtype)) + " " +
                        ShapeString(t.shape) + " but has " + std::to_string(t.size_bytes) +
                        " bytes");
    }
  }
  if (options_.packed) {
    // cu_seqlens indexes every packed field with the length field's rows.
    const TensorView* length = sample.FindTensor(options_.length_field);
    if (length != nullptr && !length->shape.empty()) {
      const int64_t rows = length->shape[0];
      if (rows > std::numeric_limits<int32_t>::max()) {
        return Reject(wire::SCHEMA_MISMATCH, sample,
                      "length field '" + length->name + "' has " + std::to_string(rows) +
                          " rows, more than packed mode's int32 cu_seqlens can index");
      }
      for (const TensorView& t : sample.tensors) {
        if (RuleOf(t.name) != FieldRule::kPad || t.shape.empty() || t.shape[0] == rows) continue;
        return Reject(wire::SCHEMA_MISMATCH, sample,
                      "field '" + t.name + "': expected " + std::to_string(rows) +
                          " rows (dim 0 of length field '" + length->name + "'), got " +
                          ShapeString(t.shape) +
                          "; packed fields must match the length field (use concat for fields "
                          "with their own length)");
      }
    }
  }
  return std::nullopt;
}

std::optional<wire::Rejection> EpochSchema::CheckAgainstSchema(const Sample& sample) const {
  const std::string fixed_by = "the epoch's schema, fixed by sample " + std::to_string(first_id_) +
                               " from producer '" + first_producer_ + "'";
  for (const Field& f : fields_) {
    const TensorView* t = sample.FindTensor(f.name);
    const std::string expected = Layout(f.rule, f.dtype, f.shape);
    if (t == nullptr) {
      return Reject(wire::SCHEMA_MISMATCH, sample,
                    "field '" + f.name + "': expected " + expected + " (" + fixed_by +
                        "), got no such tensor");
    }
    bool same = t->dtype == f.dtype && t->shape.size() == f.shape.size();
    if (same && f.rule == FieldRule::kStack) {
      same = t->shape == f.shape;
    } else if (same) {
      same = std::equal(t->shape.begin() + (f.shape.empty() ? 0 : 1), t->shape.end(),
                        f.shape.begin() + (f.shape.empty() ? 0 : 1));
    }
    if (!same) {
      return Reject(wire::SCHEMA_MISMATCH, sample,
                    "field '" + f.name + "': expected " + expected + " (" + fixed_by + "; rule " +
                        std::string(collate::RuleName(f.rule)) + "), got " +
                        std::string(DTypeName(t->dtype)) + " " + ShapeString(t->shape));
    }
  }
  if (sample.tensors.size() != fields_.size()) {
    for (const TensorView& t : sample.tensors) {
      const bool known = std::any_of(fields_.begin(), fields_.end(),
                                     [&](const Field& f) { return f.name == t.name; });
      if (!known) {
        return Reject(wire::SCHEMA_MISMATCH, sample,
                      "field '" + t.name + "': expected no such tensor (" + fixed_by + "), got " +
                          std::string(DTypeName(t.dtype)) + " " + ShapeString(t.shape));
      }
    }
  }
  return std::nullopt;
}

void EpochSchema::Fix(const Sample& sample) {
  fields_.clear();
  for (const TensorView& t : sample.tensors) fields_.push_back({t.name, RuleOf(t.name), t.dtype, t.shape});
  std::sort(fields_.begin(), fields_.end(),
            [](const Field& a, const Field& b) { return a.name < b.name; });
  first_id_ = sample.meta.id;
  first_producer_ = sample.producer_id;
  fixed_ = true;
}

std::optional<wire::Rejection> EpochSchema::Check(const Sample& sample) {
  if (auto r = CheckAlone(sample)) return r;
  if (fixed_) return CheckAgainstSchema(sample);
  if (absl::Status s = CheckConfigAgainst(sample); !s.ok()) {
    wire::Rejection r = Reject(wire::CONFIG_MISMATCH, sample, "");
    r.set_message(std::string(s.message()));  // already names the sample
    return r;
  }
  Fix(sample);
  return std::nullopt;
}

}  // namespace odb::ingest
