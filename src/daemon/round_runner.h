#ifndef ODB_DAEMON_ROUND_RUNNER_H_
#define ODB_DAEMON_ROUND_RUNNER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/step_fields.h"
#include "src/common/sample.h"

namespace odb {

// What a rank brings to a planning round.
struct RoundRequest {
  uint32_t epoch = 0;
  std::vector<SampleMeta> pending;  // buffered, not yet planned, this epoch
  uint32_t free_slots = 0;          // steps the emitter can still queue
  bool stream_finished = false;     // every producer ended its stream this epoch
  bool stream_started = true;       // a sample or an end of stream of this epoch arrived
};

// One step this rank emits: the planned header fields (proto/step_fields.h,
// copied onto the wire as they are) and what the step builder gathers.
struct StepPlan : StepHeader {
  std::vector<uint64_t> sample_ids;  // in batch order
  std::vector<int32_t> sample_owners;  // rank holding each sample's payload (parallel to sample_ids)
  // Per-phase plan (alignment.phase_plans): the samples this rank encodes and
  // where each encoder output goes (rank, index in that rank's sample_ids), and
  // for each of this rank's samples the rank that encodes it.
  std::vector<uint64_t> enc_ids;
  std::vector<int32_t> enc_owners;
  std::vector<int32_t> enc_dest_rank;
  std::vector<uint32_t> enc_dest_index;
  std::vector<int32_t> llm_src_rank;
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

// The seam between the daemon and the alignment layer: one collective round
// (every rank calls Run the same number of times). Implemented over
// align::Aligner; tests may substitute their own.
class RoundRunner {
 public:
  virtual ~RoundRunner() = default;
  // Rounds and steps count from first_round / first_step (a resumed
  // deterministic epoch; 0 otherwise).
  virtual void StartEpoch(uint32_t epoch, uint64_t first_round, uint64_t first_step) = 0;
  virtual absl::StatusOr<RoundOutcome> Run(const RoundRequest& request) = 0;
  // True when a round must run even with nothing pending (other ranks wait on us).
  virtual bool HasPeers() const = 0;
  virtual int Rank() const = 0;
  // One all-gather of a short string before the first round (the daemons'
  // payload-exchange endpoints). Collective, like Run.
  virtual absl::StatusOr<std::vector<std::string>> ExchangeEndpoints(const std::string& mine) = 0;
};

}  // namespace odb

#endif  // ODB_DAEMON_ROUND_RUNNER_H_
