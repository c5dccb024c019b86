#ifndef ODB_INGEST_SCHEMA_H_
#define ODB_INGEST_SCHEMA_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/odb.pb.h"
#include "src/collate/collator.h"
#include "src/common/dtype.h"
#include "src/common/sample.h"

namespace odb::ingest {

// The tensor layout every sample of one epoch must share, so that the
// collator can never fail on a group of admitted samples: a sample that does
// not fit is rejected alone, at ingest, and the samples of other producers
// are batched as usual.
//
// The first sample that passes Check fixes the schema: its tensor names,
// dtypes and ranks, and per field what its collate rule needs of every other
// sample (the full shape for stack, the dims after dim 0 for pad and concat).
// Every sample is also checked alone against the collate options: tensor
// sizes agree with shapes, no scalar under pad/concat, the length field is
// present with rank >= 1 when the attention mask or packing needs it, in
// packed mode every pad field has the length field's dim 0 (at most int32
// max), and the config itself is usable with the sample's dtypes
// (CheckConfigAgainst).
//
// Contract: if every sample of a group passed Check of one EpochSchema built
// from the same options, collate::Collate(group, options) does not return
// InvalidArgument. It can still fail for resources only: a tensor over
// options.max_batch_tensor_bytes or out of memory (ResourceExhausted), and in
// packed mode a group whose length-field rows sum past int32 max (the token
// budget keeps groups far below that).
//
// Use: one EpochSchema per epoch, built when the epoch starts; call Check on
// each decoded sample before admitting it and reject the sample with the
// returned Rejection. Not thread-safe: one ingest thread owns it.
//
//   EpochSchema schema(options.collate);
//   ...
//   if (auto r = schema.Check(sample)) reject(*r);  // else admit
class EpochSchema {
 public:
  explicit EpochSchema(collate::CollateOptions options);

  EpochSchema(const EpochSchema&) = delete;
  EpochSchema& operator=(const EpochSchema&) = delete;

  // Null when `sample` fits the epoch's schema (fixing it on the first
  // sample that passes); else the rejection, naming the sample id, producer,
  // field, and the expected vs actual dtype/shape:
  //  - SCHEMA_MISMATCH: the sample differs from the schema, or breaks a rule
  //    alone (scalar to pad, packed rows differ from the length field, ...);
  //  - SHAPE_SIZE_MISMATCH: a tensor's bytes disagree with its shape (the
  //    decoder already refuses these; checked for samples built elsewhere);
  //  - CONFIG_MISMATCH: CheckConfigAgainst(sample) failed, the message is its
  //    error. The schema stays unfixed. This is a disagreement between the
  //    config and the data: a caller may treat it as fatal, knowing that a
  //    single malformed sample can trigger it too.
  std::optional<wire::Rejection> Check(const Sample& sample);

  // OK when the collate options can collate `sample` (typically the epoch's
  // first): fields listed once, pad_value representable in the field's dtype
  // (collate.fields[<name>].pad_value), the length field present with rank
  // >= 1 when needed (collate.length_field), pad/concat fields not scalars
  // (collate.fields[<name>].rule), no tensor named like a derived one.
  // Errors are InvalidArgument naming the config field first, then the sample.
  absl::Status CheckConfigAgainst(const Sample& sample) const;

  // True once a sample has fixed the schema.
  bool fixed() const { return fixed_; }

 private:
  struct Field {
    std::string name;
    collate::FieldRule rule = collate::FieldRule::kPad;
    DType dtype = DType::kUnspecified;
    std::vector<int64_t> shape;  // dim 0 is not compared unless the rule is stack
  };

  collate::FieldRule RuleOf(const std::string& name) const;
  // The checks of one sample on its own (sizes, packed rows).
  std::optional<wire::Rejection> CheckAlone(const Sample& sample) const;
  std::optional<wire::Rejection> CheckAgainstSchema(const Sample& sample) const;
  void Fix(const Sample& sample);

  const collate::CollateOptions options_;
  bool fixed_ = false;
  std::vector<Field> fields_;  // sorted by name
  uint64_t first_id_ = 0;
  std::string first_producer_;
};

}  // namespace odb::ingest

#endif  // ODB_INGEST_SCHEMA_H_
