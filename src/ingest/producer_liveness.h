#ifndef ODB_INGEST_PRODUCER_LIVENESS_H_
#define ODB_INGEST_PRODUCER_LIVENESS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/common/clock.h"

namespace odb::ingest {

// The ingest channel's timers, read against the injected clock so that a
// test moves a FakeClock instead of waiting: producer silence
// (emit.producer_timeout_ms), a deterministic rank's stall, the probe of quiet
// connections. Socket- and lock-free: the caller decides from the daemon's
// state whether producers may send at all, this decides whether they have
// been silent for too long.
class ProducerLiveness {
 public:
  // `producer_timeout_ms`: 0 = silence is never fatal.
  ProducerLiveness(const Clock& clock, uint32_t producer_timeout_ms);

  // Silence counts from now: a producer message arrived, the trainer started
  // an epoch, or the daemon itself holds every producer back.
  void NoteHeard();
  // Nothing heard for more than producer_timeout_ms.
  bool Silent() const;

  // alignment.deterministic: `stalled` says whether, right now, the rank waits
  // for a sample no producer may send. True once that has held without a break
  // for kStallGrace (a grant in between is a break).
  bool Stalled(bool stalled);

  // True at most once per kProbeEvery: time to probe quiet connections.
  bool ProbeDue();
  // A connection not heard from since `last_heard` is quiet (probed, or
  // forgotten when it never said hello).
  bool Quiet(Clock::TimePoint last_heard) const;

  const Clock& clock() const { return clock_; }

  static constexpr auto kStallGrace = std::chrono::seconds(2);
  static constexpr auto kProbeEvery = std::chrono::seconds(1);

 private:
  const Clock& clock_;
  const uint32_t timeout_ms_;
  Clock::TimePoint last_heard_;
  Clock::TimePoint last_probe_;
  std::optional<Clock::TimePoint> stall_since_;
};

// What the fatal message on producer silence names: the epoch, whose streams
// ended and which are open, how many producers never sent, and whether input
// of the epoch was rejected (often why its streams never complete).
struct SilenceReport {
  uint32_t timeout_ms = 0;
  uint32_t epoch = 0;
  size_t expected = 0;
  size_t ended = 0;
  std::vector<std::string> open;  // producers with samples sent and no end_stream
  uint64_t rejected = 0;
};
std::string DescribeSilence(const SilenceReport& report);

// What the fatal message on a deterministic rank's stall names: the seq it
// waits for and the buffer's fill against its limits.
struct StallReport {
  int rank = 0;
  uint32_t epoch = 0;
  uint64_t frontier = 0;  // the seq waited for
  size_t in_order = 0;
  uint32_t window = 0;
  size_t buffered_samples = 0;
  uint64_t buffered_bytes = 0;
  uint64_t max_samples = 0;
  uint64_t max_bytes = 0;
};
std::string DescribeStall(const StallReport& report);

}  // namespace odb::ingest

#endif  // ODB_INGEST_PRODUCER_LIVENESS_H_
