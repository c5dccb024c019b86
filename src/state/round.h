#ifndef ODB_STATE_ROUND_H_
#define ODB_STATE_ROUND_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "proto/step_fields.h"
#include "src/common/sample.h"

namespace odb {

// The round types: what a rank brings to a planning round and what the round
// plans. The planner layer produces them (daemon/round_runner.h); the I/O
// stages (emit, exchange) consume them.

// What a rank brings to a planning round.
struct RoundRequest {
  uint32_t epoch = 0;
  std::vector<SampleMeta> pending;  // buffered, not yet planned, this epoch
  uint32_t free_slots = 0;          // steps the emitter can still queue
  bool stream_finished = false;     // every producer ended its stream this epoch
  bool stream_started = true;       // a sample or an end of stream of this epoch arrived
  bool input_blocked = false;       // the buffer is full: ingest reads nothing until steps go out
};

// One encoder phase of a step under per-phase plans (alignment.phase_plans):
// the samples this rank encodes and where each encoder output goes (a rank,
// and the index of the output's sample in that rank's sample_ids), and for
// each of this rank's samples the rank that encodes it.
struct PhaseRoute {
  std::vector<uint64_t> ids;         // encoded here, in encoder batch order
  std::vector<int32_t> owners;       // rank holding each one's payload (parallel to ids)
  std::vector<int32_t> dest_rank;    // rank that trains on each output (parallel to ids)
  std::vector<uint32_t> dest_index;  // its index in that rank's sample_ids (parallel to ids)
  std::vector<int32_t> src_rank;     // parallel to StepPlan::sample_ids: the rank that encodes it
};

// The encoder phases, in the order a step gathers their samples and collates
// their batches. A new phase is one more value here (kEncoderPhases grows with
// it), its cost in the round runner that fills the routes
// (src/daemon/aligned_round_runner.cc), and its sample fields, header fields
// and batch prefix in the step builder (src/emit/step_builder.cc); every other
// use loops over StepPlan::phases.
enum class EncoderPhase : size_t {
  kVision = 0,  // collate.encoder_fields: header fields enc_*, llm_src_rank; batch "enc."
  kAudio = 1,   // collate.audio_fields: header fields audio_*, llm_audio_src_rank; batch "audio."
};
inline constexpr size_t kEncoderPhases = 2;

// One step this rank emits: the planned header fields (proto/step_fields.h,
// copied onto the wire as they are) and what the step builder gathers.
struct StepPlan : StepHeader {
  std::vector<uint64_t> sample_ids;    // in batch order
  std::vector<int32_t> sample_owners;  // rank holding each sample's payload (parallel to sample_ids)
  // Per-phase plans, indexed by EncoderPhase (empty routes without them, or
  // for a phase the step does not have).
  std::array<PhaseRoute, kEncoderPhases> phases;

  PhaseRoute& phase(EncoderPhase p) { return phases[static_cast<size_t>(p)]; }
  const PhaseRoute& phase(EncoderPhase p) const { return phases[static_cast<size_t>(p)]; }
};

struct RoundOutcome {
  std::vector<StepPlan> steps;
  bool epoch_finished = false;
  std::vector<uint64_t> not_emitted;  // Non-Join: this rank's ids left out at epoch end
  // Samples held here that another rank emits this round: destination rank -> ids.
  std::vector<std::pair<int, std::vector<uint64_t>>> outgoing;
  bool waiting = false;  // no steps: some rank waits for samples (see reason)
  std::string reason;    // why the round has its step count (for logs)
};

}  // namespace odb

#endif  // ODB_STATE_ROUND_H_
