#ifndef ODB_STATE_DAEMON_STATE_H_
#define ODB_STATE_DAEMON_STATE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>

#include "proto/odb.pb.h"
#include "src/buffer/sample_buffer.h"
#include "src/common/mutex.h"
#include "src/state/rejection_log.h"
#include "src/state/stream_tracker.h"

namespace odb {

// What the ingest channel (I/O thread) and the planner thread share: the
// buffered samples and where each epoch stands. Everything here is guarded by
// `mu` (clang's -Wthread-safety checks it: tools/check_thread_safety.py);
// `cv` is notified whenever the buffer or the epoch state changes.
// Stages receive a reference; none of them owns it.
struct DaemonState {
  DaemonState(uint64_t buffer_max_bytes, uint64_t buffer_max_samples, uint32_t expected,
              size_t buffer_max_runs = buffer::SampleBuffer::kDefaultMaxRuns)
      : buffer(buffer_max_bytes, buffer_max_samples, buffer_max_runs), expected_producers(expected) {}

  Mutex mu;
  CondVar cv;
  buffer::SampleBuffer buffer ABSL_GUARDED_BY(mu);
  StreamTracker tracker ABSL_GUARDED_BY(mu);
  RejectionLog rejections ABSL_GUARDED_BY(mu);
  std::deque<uint32_t> requested_epochs ABSL_GUARDED_BY(mu);  // the trainer's StartEpoch, in order
  // A requested epoch's (first_round, first_step) when the trainer resumes a
  // deterministic epoch mid-way.
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> resume_points ABSL_GUARDED_BY(mu);
  std::optional<uint32_t> current_epoch ABSL_GUARDED_BY(mu);  // the epoch being planned
  uint32_t expected_producers ABSL_GUARDED_BY(mu);
  std::map<uint32_t, uint64_t> epoch_received ABSL_GUARDED_BY(mu);          // samples incl. rejected
  std::map<uint32_t, wire::EpochSummary> epoch_totals ABSL_GUARDED_BY(mu);  // steps emitted so far
};

}  // namespace odb

#endif  // ODB_STATE_DAEMON_STATE_H_
