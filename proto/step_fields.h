#ifndef ODB_PROTO_STEP_FIELDS_H_
#define ODB_PROTO_STEP_FIELDS_H_

#include <cstdint>

// The one list of a step's planned scalar fields (docs/protocol.md, "Step").
// The planner's step (align::PlannedStep), the daemon's emit plan (StepPlan),
// the wire header (wire::Step, proto/odb.proto: same names) and the client's
// StepInfo (and its Python mirror) all derive from StepHeader; the daemon
// copies it onto the wire and the client back from it through this list, so a
// new field is: this list, odb.proto, the Python stub, and whatever computes it.
//
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

namespace odb {

struct StepHeader {
#define ODB_STEP_FIELD_MEMBER(type, name, dflt, doc) type name = dflt;
  ODB_STEP_FIELDS(ODB_STEP_FIELD_MEMBER)
#undef ODB_STEP_FIELD_MEMBER
};

}  // namespace odb

#endif  // ODB_PROTO_STEP_FIELDS_H_
