#ifndef ODB_CLIENT_PRODUCER_H_
#define ODB_CLIENT_PRODUCER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "odb/types.h"

namespace odb::client {

// How a producer's payload bytes reach the daemon (docs/shm.md).
enum class DataPlane {
  // A shared-memory arena when the daemon is local (an ipc:// endpoint whose
  // registration socket `<socket path>.arena` answers, run by the same user),
  // for samples of at least `shm_min_bytes` payload; smaller samples, samples
  // larger than the arena and every sample to a daemon that is not local go as
  // ZeroMQ frames.
  kAuto,
  // Every sample through the arena: Connect fails if the arena cannot be
  // registered, Send if a sample cannot fit the arena.
  kShm,
  // ZeroMQ frames only.
  kZmq,
};
// "auto" | "shm" | "zmq".
absl::StatusOr<DataPlane> ParseDataPlane(std::string_view name);
const char* DataPlaneName(DataPlane plane);

// The producer's side of its arena (what Producer::arena_stats reports).
struct ArenaStats {
  uint64_t capacity_bytes = 0;
  uint64_t allocations = 0;         // blocks written (one per sample sent through the arena)
  uint64_t returns = 0;             // blocks the daemon gave back
  uint64_t waits = 0;               // times Send waited for the daemon to return blocks (arena full)
  uint64_t outstanding_blocks = 0;  // held by the daemon now
  uint64_t outstanding_bytes = 0;
};

struct ProducerOptions {
  std::string endpoint;     // the daemon's ingest endpoint (ipc://... or tcp://...)
  std::string producer_id;  // unique per producer process (e.g. "rank0-worker3")
  int rank = -1;            // the rank this producer feeds, -1 = unknown
  int send_hwm = 64;        // messages queued in ZMQ before Send blocks (back-pressure)
  // A Send blocked this long by back-pressure fails with DeadlineExceeded
  // naming the endpoint (a daemon that is gone or stuck is an error, not a hang).
  int send_timeout_ms = 120000;
  DataPlane data_plane = DataPlane::kAuto;
  // The arena's capacity for blocks (a memfd; its pages are allocated when
  // first written, so an arena costs what the producer has in flight: at most
  // its credit from the daemon). A full arena is back-pressure: Send waits
  // for the daemon to return blocks (up to send_timeout_ms).
  uint64_t arena_bytes = uint64_t{256} << 20;
  // kAuto: samples with fewer payload bytes go as frames (small messages cost
  // the same either way; the arena saves copies of large ones).
  uint64_t shm_min_bytes = uint64_t{16} << 10;
};

// Sends samples to one daemon. Not thread-safe; one per worker process.
// Create it after fork (it owns a ZeroMQ context): a copy inherited by a
// forked child fails every call with FailedPrecondition, and destroying it
// there leaves the parent's sockets alone (never a hang in zmq_ctx_term).
class Producer {
 public:
  static absl::StatusOr<std::unique_ptr<Producer>> Connect(const ProducerOptions& options);
  ~Producer();
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  absl::Status StartEpoch(uint32_t epoch);
  // Copies each tensor's bytes into one frame, or (shared-memory data plane)
  // into one block of the producer's arena (the only copy on the way in).
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
  // The data plane in use: kShm when an arena is registered with the daemon
  // (samples may still go as frames, see DataPlane::kAuto), else kZmq.
  DataPlane data_plane() const;
  // The registered arena's id (0 without one), and why there is none ("" with one).
  uint64_t arena_id() const;
  const std::string& arena_note() const;
  // Null without an arena.
  std::optional<ArenaStats> arena_stats() const;

 private:
  struct Impl;
  explicit Producer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace odb::client

#endif  // ODB_CLIENT_PRODUCER_H_
