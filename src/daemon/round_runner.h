#ifndef ODB_DAEMON_ROUND_RUNNER_H_
#define ODB_DAEMON_ROUND_RUNNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/state/round.h"

namespace odb {

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
  // This rank fails the job for a reason of its own: the peers' errors name it
  // (align::PeerGroup::ReportFailure). Any thread; no-op without peers.
  virtual void ReportFailure(const std::string& cause) { (void)cause; }
};

}  // namespace odb

#endif  // ODB_DAEMON_ROUND_RUNNER_H_
