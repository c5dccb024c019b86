// The daemon's gauges: what the stages hold, copied into the metrics each
// loop (PublishGauges), and the round-time percentiles (RecordRoundTime).
#include <algorithm>
#include <chrono>
#include <vector>

#include "src/daemon/daemon.h"

namespace odb {

void Daemon::PublishGauges() {
  {
    MutexLock lock(state_.mu);
    const uint64_t bytes = state_.buffer.bytes();
    metrics_.buffer_bytes.store(bytes);
    metrics_.buffer_samples.store(state_.buffer.count());
    if (bytes > metrics_.peak_buffer_bytes.load()) metrics_.peak_buffer_bytes.store(bytes);
  }
  metrics_.queued_steps.store(trainer_.QueuedSteps());
  metrics_.ingest_credit_bytes.store(static_cast<uint64_t>(std::max<int64_t>(ingest_.OutstandingBytes(), 0)));
  metrics_.ingest_credit_samples.store(
      static_cast<uint64_t>(std::max<int64_t>(ingest_.OutstandingSamples(), 0)));
  metrics_.producer_connections.store(ingest_.ConnectionCount());
  const ingest::ArenaRegistry::Stats arenas = arenas_.stats();
  metrics_.producer_arenas.store(arenas.arenas);
  metrics_.producer_arenas_mapped.store(arenas.mapped);
  metrics_.arena_held_bytes.store(arenas.held_bytes);
  metrics_.arena_writers_waiting.store(arenas.writers_waiting);
  metrics_.arena_registrations.store(arenas.registrations);
  metrics_.arena_refusals.store(arenas.refused);
  if (std::shared_ptr<emit::StepArena> step_arena = trainer_.ActiveArena()) {
    const emit::StepArena::Stats s = step_arena->stats();
    metrics_.step_arena_held_steps.store(s.outstanding_blocks);
    metrics_.step_arena_held_bytes.store(s.outstanding_bytes);
    metrics_.step_arena_returns.store(s.returns);
  }
}

void Daemon::RecordRoundTime(std::chrono::steady_clock::duration took) {
  const auto us = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(took).count());
  if (round_times_.size() < kRoundTimesKept) {
    round_times_.push_back(us);
  } else {
    round_times_[round_time_next_] = us;
  }
  round_time_next_ = (round_time_next_ + 1) % kRoundTimesKept;
  std::vector<uint64_t> sorted = round_times_;
  std::sort(sorted.begin(), sorted.end());
  metrics_.round_p50_us.store(sorted[sorted.size() / 2]);
  metrics_.round_p99_us.store(sorted[std::min(sorted.size() - 1, sorted.size() * 99 / 100)]);
}

}  // namespace odb
