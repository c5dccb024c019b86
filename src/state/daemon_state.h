#ifndef ODB_STATE_DAEMON_STATE_H_
#define ODB_STATE_DAEMON_STATE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include "proto/odb.pb.h"
#include "src/buffer/sample_buffer.h"
#include "src/state/rejection_log.h"
#include "src/state/stream_tracker.h"

namespace odb {

// What the ingest channel (I/O thread) and the planner thread share: the
// buffered samples and where each epoch stands. Everything here is guarded by
// `mu`; `cv` is notified whenever the buffer or the epoch state changes.
// Stages receive a reference; none of them owns it.
struct DaemonState {
  DaemonState(uint64_t buffer_max_bytes, uint64_t buffer_max_samples, uint32_t expected)
      : buffer(buffer_max_bytes, buffer_max_samples), expected_producers(expected) {}

  std::mutex mu;
  std::condition_variable cv;
  buffer::SampleBuffer buffer;            // guarded by mu
  StreamTracker tracker;                  // guarded by mu
  RejectionLog rejections;                // guarded by mu
  std::deque<uint32_t> requested_epochs;  // guarded by mu: the trainer's StartEpoch, in order
  // guarded by mu: a requested epoch's (first_round, first_step) when the
  // trainer resumes a deterministic epoch mid-way
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> resume_points;
  std::optional<uint32_t> current_epoch;                // guarded by mu: the epoch being planned
  uint32_t expected_producers;                          // guarded by mu
  std::map<uint32_t, uint64_t> epoch_received;          // guarded by mu: samples incl. rejected
  std::map<uint32_t, wire::EpochSummary> epoch_totals;  // guarded by mu: steps emitted so far
};

}  // namespace odb

#endif  // ODB_STATE_DAEMON_STATE_H_
