#ifndef ODB_STATE_METRICS_H_
#define ODB_STATE_METRICS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace odb {

// Counters of one daemon, exported on the metrics endpoint, in the exit log
// and (per epoch) in the epoch summary.
struct DaemonMetrics {
  std::atomic<uint64_t> samples_received{0};
  std::atomic<uint64_t> samples_rejected{0};
  std::atomic<uint64_t> samples_emitted{0};
  std::atomic<uint64_t> steps_emitted{0};
  std::atomic<uint64_t> idle_steps{0};
  std::atomic<uint64_t> rounds{0};
  std::atomic<uint64_t> peak_buffer_bytes{0};
  std::atomic<uint64_t> bad_trainer_messages{0};  // unreadable or multi-frame, ignored
  std::atomic<uint64_t> refused_trainers{0};      // second trainers told SESSION_REFUSED
  std::atomic<uint64_t> metrics_scrapes{0};
  std::atomic<uint64_t> trainer_disconnects{0};  // the session's connection closed
  // Trainer messages read after their connection had closed (never a reconnect).
  std::atomic<uint64_t> late_trainer_messages{0};
  // The trainer's reported time blocked on data (Credit.data_wait_us): a data stall.
  std::atomic<uint64_t> trainer_data_wait_us{0};
  std::atomic<uint64_t> real_tokens{0};          // tokens of the samples emitted
  std::atomic<uint64_t> padded_tokens{0};        // tokens the trainer computes on (cost model)
  std::atomic<uint64_t> exchange_bytes_sent{0};  // payload bytes sent to other daemons
  // Connections to the payload exchange refused: no key of this job's peers.
  std::atomic<uint64_t> exchange_connections_refused{0};
  // Metrics connections closed unanswered (deadline, displaced, not HTTP).
  std::atomic<uint64_t> metrics_connections_dropped{0};
  // Alignment round time (the collective) over the last 256 rounds, microseconds.
  std::atomic<uint64_t> round_p50_us{0};
  std::atomic<uint64_t> round_p99_us{0};
  // Gauges the I/O loop publishes each iteration (read by the metrics server
  // thread without taking any daemon lock).
  std::atomic<uint64_t> buffer_bytes{0};
  std::atomic<uint64_t> buffer_samples{0};
  std::atomic<uint64_t> queued_steps{0};
  std::atomic<uint64_t> ingest_credit_bytes{0};
  std::atomic<uint64_t> ingest_credit_samples{0};
  std::atomic<uint64_t> producer_connections{0};
  // Shared-memory data plane: producer arenas registered / still mapped (a
  // retired arena stays mapped while the daemon holds its blocks), and the
  // blocks and bytes of them the daemon holds (buffered arena samples).
  std::atomic<uint64_t> producer_arenas{0};
  std::atomic<uint64_t> producer_arenas_mapped{0};
  std::atomic<uint64_t> arena_held_bytes{0};
  std::atomic<uint64_t> arena_writers_waiting{0};  // producers waiting for a block (their arena is full)
  std::atomic<uint64_t> arena_registrations{0};    // counter
  std::atomic<uint64_t> arena_refusals{0};         // counter
  // Step arena (daemon -> trainer): steps sent through it, steps that went as
  // frames although the session has one (larger than the arena, a dead
  // reader), and the blocks / bytes of it not yet returned (steps queued
  // here, in flight and held by the trainer).
  std::atomic<uint64_t> step_arena_steps{0};            // counter
  std::atomic<uint64_t> step_arena_frame_fallbacks{0};  // counter
  std::atomic<uint64_t> step_arena_held_steps{0};       // gauge
  std::atomic<uint64_t> step_arena_held_bytes{0};       // gauge
  std::atomic<uint64_t> step_arena_returns{0};          // blocks the current session's trainer returned
};

enum class MetricType { kCounter, kGauge };

// One exported series: its Prometheus name, type and help text, and the
// member of DaemonMetrics it reads (or, for a process-wide value, the
// function). MetricTable() is the one list of the daemon's series: the
// metrics endpoint renders it in its order.
struct MetricSpec {
  const char* name;
  MetricType type;
  const char* help;
  std::atomic<uint64_t> DaemonMetrics::*member = nullptr;
  uint64_t (*read)() = nullptr;  // when `member` is null
};
const std::vector<MetricSpec>& MetricTable();

// The value `spec` exports now (an atomic load: any thread).
uint64_t MetricValue(const MetricSpec& spec, const DaemonMetrics& metrics);

// Prometheus text exposition format (version 0.0.4) of every series of
// MetricTable(), each labelled with the rank.
std::string RenderPrometheus(const DaemonMetrics& metrics, int rank);

}  // namespace odb

#endif  // ODB_STATE_METRICS_H_
