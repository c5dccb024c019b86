#ifndef ODB_EMIT_STEP_BUILDER_H_
#define ODB_EMIT_STEP_BUILDER_H_

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>
#include <zmq.hpp>

#include "absl/status/statusor.h"
#include "src/collate/collator.h"
#include "src/common/buffer_pool.h"
#include "src/emit/step_arena.h"
#include "src/emit/step_builder_options.h"
#include "src/emit/step_encoder.h"
#include "src/exchange/payload_exchange.h"
#include "src/state/daemon_state.h"
#include "src/state/metrics.h"
#include "src/state/round.h"

namespace odb::emit {

// Turns one planned step into the message the trainer receives: gathers the
// step's samples (from the buffer, or parked by the payload exchange),
// collates them (encoder fields into the encoder batch with per-phase plans),
// attaches the rejections not yet reported and accounts the step in the
// epoch's totals. The plan's StepPlan is the one step representation from the
// planner up to the wire header. Planner thread only.
class StepBuilder {
 public:
  StepBuilder(StepBuilderOptions options, DaemonState& state, DaemonMetrics& metrics,
              exchange::PayloadExchange* exchange);

  struct BuiltStep {
    std::vector<zmq::message_t> parts;
    bool in_arena = false;  // the tensors are in the step arena given to Build
  };
  // The encoded step, or an error that is fatal for the daemon (a peer's
  // payload that never came, a step that breaks per-phase routes, a step
  // arena that stayed full for shm.step_arena_wait_ms). With `arena` (the
  // trainer session's step arena), the step is collated straight into one
  // block of it and the message is the header alone; an idle step, a step
  // larger than the arena or an arena whose reader died goes as frames
  // (logged once, counted).
  absl::StatusOr<BuiltStep> Build(uint32_t epoch, const StepPlan& plan, const std::function<bool()>& cancelled,
                                  StepArena* arena = nullptr);

  // The epoch's summary (and the buffer's leftovers as not emitted); closes the
  // epoch in the tracker and the buffer.
  std::vector<zmq::message_t> FinishEpoch(uint32_t epoch, const RoundOutcome& outcome);

 private:
  struct StepSamples {
    std::vector<Sample> owned;
    std::vector<const Sample*> llm;
    std::array<std::vector<const Sample*>, kEncoderPhases> phases;  // parallel to each PhaseRoute::ids
  };
  // The sample fields an encoder phase's batch holds (collate.encoder_fields,
  // collate.audio_fields).
  const std::vector<std::string>& PhaseFields(EncoderPhase phase) const;
  absl::StatusOr<StepSamples> Gather(uint32_t epoch, const StepPlan& plan,
                                     const std::function<bool()>& cancelled);
  // A block of `arena` for tensors of these sizes; nullopt: the step goes as
  // frames (see Build).
  absl::StatusOr<std::optional<ArenaPlacement>> ReserveInArena(StepArena& arena,
                                                                const std::vector<uint64_t>& sizes,
                                                                const std::function<bool()>& cancelled);

  const StepBuilderOptions options_;
  DaemonState& state_;
  DaemonMetrics& metrics_;
  exchange::PayloadExchange* exchange_;  // null with one rank
  // Batch tensor buffers, recycled from ZeroMQ's free callback to the next
  // collation. Shared: ZeroMQ may free a frame after the daemon is gone.
  std::shared_ptr<BufferPool> batch_buffers_;
  bool arena_fallback_logged_ = false;
};

}  // namespace odb::emit

#endif  // ODB_EMIT_STEP_BUILDER_H_
