#ifndef ODB_STATE_ROUND_H_
#define ODB_STATE_ROUND_H_

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

// One step this rank emits: the planned header fields (proto/step_fields.h,
// copied onto the wire as they are) and what the step builder gathers.
struct StepPlan : StepHeader {
  std::vector<uint64_t> sample_ids;    // in batch order
  std::vector<int32_t> sample_owners;  // rank holding each sample's payload (parallel to sample_ids)
  // Per-phase plan (alignment.phase_plans): the samples this rank encodes and
  // where each encoder output goes (rank, index in that rank's sample_ids), and
  // for each of this rank's samples the rank that encodes it.
  std::vector<uint64_t> enc_ids;
  std::vector<int32_t> enc_owners;
  std::vector<int32_t> enc_dest_rank;
  std::vector<uint32_t> enc_dest_index;
  std::vector<int32_t> llm_src_rank;
  // The audio encoder phase (collate.audio_fields), the same lists for it.
  std::vector<uint64_t> audio_ids;
  std::vector<int32_t> audio_owners;
  std::vector<int32_t> audio_dest_rank;
  std::vector<uint32_t> audio_dest_index;
  std::vector<int32_t> llm_audio_src_rank;
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
