#ifndef ODB_PROTO_STEP_FIELDS_H_
#define ODB_PROTO_STEP_FIELDS_H_

#include <cstdint>

// The one list of a step's fields (docs/protocol.md, "Step"), in four
// groups: the planned scalars (ODB_STEP_FIELDS), the job's flags
// (ODB_STEP_JOB_FIELDS), the per-sample lists (ODB_STEP_SAMPLE_FIELDS) and the
// per-phase route lists (ODB_STEP_ROUTE_FIELDS); ODB_STEP_OTHER_FIELDS names
// the few that have code of their own. The wire Step (proto/odb.proto: same
// names), the daemon's builder (src/emit/step_builder.cc), the client's
// decoder (client/cpp/src/delivery_decoder.cc), its StepInfo, the pybind
// mirror and its stub (client/python/odb/_odb_native.pyi) and odb.Step
// (client/python/odb/step.py) all take their step fields from these lists;
// tools/check_step_fields.py holds each representation to them. A new field
// is: one line here, its line in odb.proto, its property in the stub,
// (optionally) its attribute of odb.Step, and whatever computes it.
//
// The planned scalars. The planner's step (align::PlannedStep) and the
// daemon's emit plan (StepPlan) derive from StepHeader; the daemon copies it
// onto the wire and the client back from it.
// X(type, name, default, doc)
#define ODB_STEP_FIELDS(X)                                                                                  \
  X(uint64_t, step_index, 0, "identical on every rank")                                                    \
  X(bool, idle, false, "no samples; weight 0")                                                             \
  X(uint64_t, real_tokens, 0, "this rank's tokens in the step")                                            \
  X(uint64_t, padded_tokens, 0, "what this rank computes on (the cost model)")                             \
  X(uint64_t, global_real_tokens, 0, "T_tok: all ranks' real tokens of this step")                         \
  X(double, loss_weight, 0.0,                                                                              \
    "W * loss_tokens / window_loss_tokens (per step without windows); 0 when idle")                        \
  X(bool, over_budget, false, "a lone sample that fit no budget")                                          \
  X(uint64_t, round, 0, "the planning round of this step")                                                 \
  X(uint64_t, round_first_step, 0, "that round's first step index")                                        \
  X(uint32_t, round_steps, 0, "that round's step count")                                                   \
  X(uint64_t, loss_tokens, 0, "this rank's loss-bearing tokens (labels not ignored; real_tokens if unknown)") \
  X(uint64_t, window, 0, "the accumulation window (optimizer step) of the epoch this step belongs to")     \
  X(uint32_t, window_steps, 1, "micro-steps in that window, the same on every rank")                       \
  X(uint64_t, window_loss_tokens, 0, "all ranks' loss tokens over the whole window")                       \
  X(bool, closes_window, true, "the last micro-step of its window: run the optimizer after it")            \
  X(bool, window_short, false, "the epoch ended before the window reached its target")                     \
  X(uint64_t, window_target, 0, "the daemon's optimizer.tokens_per_step (0: every step is a window)")

// The job's flags, the same on every step: the builder copies
// StepBuilderOptions' field of the same name.
// X(type, name, default, doc)
#define ODB_STEP_JOB_FIELDS(X)                                                                \
  X(bool, samples_may_move, false, "a global plan: real steps may come until the epoch ends") \
  X(bool, deterministic, false, "the daemon runs alignment.deterministic")                    \
  X(bool, rejections_are_errors, false, "bad_input policy error: the client raises on rejections")

// Per-sample lists: one entry per sample of this rank's LLM batch, in
// sample_ids order (wire: `repeated <type> <name>`; StepInfo: a
// std::vector<type>). The builder adds `value` for each sample `s` (the
// daemon's const Sample&). `always`: the list is as long as sample_ids in
// every step; otherwise a daemon older than the field sends it empty (and the
// client keeps it empty), and any other length is refused.
// X(type, name, value, always, doc)
// An OPTIONAL entry travels as two lists, the values (0 where absent) and
// `present` (wire: `repeated bool <present>`); StepInfo holds a
// std::vector<std::optional<type>> (None in Python), `value` is a
// std::optional<type>. A daemon older than the field sends neither: every
// entry is unknown.
// OPTIONAL(type, name, present, value, doc)
#define ODB_STEP_SAMPLE_FIELDS(X, OPTIONAL)                                                            \
  X(uint64_t, sample_ids, s.UserId(), true, "the producer's id of each sample")                        \
  X(uint32_t, lengths, s.meta.lengths.tokens, true, "LLM tokens per sample, same order as sample_ids") \
  X(int32_t, owner_ranks, s.meta.owner_rank, true, "rank that received each sample")                   \
  OPTIONAL(uint64_t, seqs, has_seq, s.seq,                                                             \
           "each sample's position in its owner rank's list (its seq), None where it had none")

// Per-phase route lists (alignment.phase_plans; proto/odb.proto, Step): one
// list per encoder phase, the vision encoder's and the audio encoder's. An
// encoder-order list (llm_order false) has one entry per sample the phase
// encodes on this rank, `value` of entry i of the phase's PhaseRoute `route`
// and its gathered samples `encoded` (const Sample* each); an LLM-order list
// (llm_order true) has one per entry of route.src_rank, in sample_ids order,
// and may be empty.
// X(type, vision, audio, llm_order, value, doc)
#define ODB_STEP_ROUTE_FIELDS(X)                                                                        \
  X(uint64_t, enc_sample_ids, audio_sample_ids, false, encoded[i]->UserId(),                            \
    "the samples this rank encodes (the rows of its encoder tensors), by the producer's id")            \
  X(int32_t, enc_owner_ranks, audio_owner_ranks, false, route.owners[i], "the rank that received each") \
  X(int32_t, enc_dest_rank, audio_dest_rank, false, route.dest_rank[i],                                 \
    "the rank that runs the LLM part of each encoded sample")                                           \
  X(uint32_t, enc_dest_index, audio_dest_index, false, route.dest_index[i],                             \
    "its place in that rank's sample_ids")                                                              \
  X(int32_t, llm_src_rank, llm_audio_src_rank, true, route.src_rank[i],                                 \
    "the rank that encodes each of this rank's samples (sample_ids order)")

// The Step fields with code of their own: the epoch (the builder's argument),
// the batch (tensors, or arena with the step arena: step_encoder.cc and the
// decoder) and the rejections since the previous step.
#define ODB_STEP_OTHER_FIELDS(X) X(epoch) X(tensors) X(arena) X(rejections)

namespace odb {

struct StepHeader {
#define ODB_STEP_FIELD_MEMBER(type, name, dflt, doc) type name = dflt;
  ODB_STEP_FIELDS(ODB_STEP_FIELD_MEMBER)
#undef ODB_STEP_FIELD_MEMBER
};

}  // namespace odb

#endif  // ODB_PROTO_STEP_FIELDS_H_
