#ifndef ODB_CLIENT_PRODUCER_H_
#define ODB_CLIENT_PRODUCER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "odb/types.h"

namespace odb::client {

struct ProducerOptions {
  std::string endpoint;     // the daemon's ingest endpoint (ipc://... or tcp://...)
  std::string producer_id;  // unique per producer process (e.g. "rank0-worker3")
  int rank = -1;            // the rank this producer feeds, -1 = unknown
  int send_hwm = 64;        // messages queued in ZMQ before Send blocks (back-pressure)
  // A Send blocked this long by back-pressure fails with DeadlineExceeded
  // naming the endpoint (a daemon that is gone or stuck is an error, not a hang).
  int send_timeout_ms = 120000;
};

// Sends samples to one daemon. Not thread-safe; one per worker process.
// Create it after fork (it owns a ZeroMQ context).
class Producer {
 public:
  static absl::StatusOr<std::unique_ptr<Producer>> Connect(const ProducerOptions& options);
  ~Producer();
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  absl::Status StartEpoch(uint32_t epoch);
  // Copies each tensor's bytes into one frame (the only copy on the way in).
  // `seq`: the sample's position in its rank's list for the epoch (0, 1, ...
  // over all producers of the rank); required by a daemon running
  // alignment.deterministic, which then also holds a sample back until the
  // samples well before it in the list have arrived.
  absl::Status Send(uint64_t sample_id, uint32_t epoch, const Lengths& lengths,
                    const std::vector<TensorInput>& tensors, std::optional<uint64_t> seq = std::nullopt);
  // Ends this producer's stream for the epoch, reporting how many samples it sent.
  absl::Status EndStream(uint32_t epoch);
  // Makes a Send or EndStream that waits for the daemon (credit, seq limit,
  // acknowledgement) return CancelledError within ~100 ms, and every later
  // one at once. The one call that may come from another thread (e.g. a
  // watcher that stops a data worker).
  void Cancel();
  // Sends frames as given (tests of bad input).
  absl::Status SendRawFrames(const std::vector<std::string>& frames);

  uint64_t sent(uint32_t epoch) const;

 private:
  struct Impl;
  explicit Producer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace odb::client

#endif  // ODB_CLIENT_PRODUCER_H_
