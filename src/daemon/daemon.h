#ifndef ODB_DAEMON_DAEMON_H_
#define ODB_DAEMON_DAEMON_H_

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "absl/status/status.h"
#include "src/common/clock.h"
#include "src/common/mutex.h"
#include "src/daemon/config.h"
#include "src/daemon/endpoint_lock.h"
#include "src/daemon/metrics_server.h"
#include "src/daemon/round_runner.h"
#include "src/daemon/round_trace.h"
#include "src/emit/step_builder.h"
#include "src/emit/trainer_channel.h"
#include "src/exchange/payload_exchange.h"
#include "src/ingest/arena_registry.h"
#include "src/ingest/ingest_channel.h"
#include "src/state/daemon_state.h"
#include "src/state/metrics.h"

namespace odb {

// One rank's collation daemon, wired from its stages:
//  - IngestChannel (producers: sockets, credit, admission into the buffer),
//  - ArenaRegistry (producers' shared-memory arenas: registration on its own
//    thread, block validation and returns),
//  - TrainerChannel (the trainer: session, credits, output queue, liveness),
//  - PayloadExchange (sample payloads between daemons, global plans),
//  - StepBuilder (a planned step -> the collated message),
//  - MetricsServer (Prometheus text over HTTP, its own threads).
// Two threads of its own: the I/O loop (Run's caller) polls the channels'
// sockets; the planner thread runs alignment rounds (collectives that may
// block on peers) and builds steps. They share DaemonState. Stop() wakes the
// I/O loop through a pipe (safe from a signal handler); the loop then stops
// the planner through the state's condition variable and joins it.
class Daemon {
 public:
  // `clock` (not owned, may be null = steady clock) decides the producer and
  // trainer timeouts; `context` (not owned, may be null = its own) lets a test
  // use inproc:// endpoints.
  Daemon(DaemonConfig config, std::unique_ptr<RoundRunner> runner, const Clock* clock = nullptr,
         zmq::context_t* context = nullptr);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Takes the run_dir/endpoint locks, binds every socket, starts the metrics
  // server. Errors name the endpoint (or the daemon holding it).
  absl::Status Bind();
  // Serves until Stop() or a fatal error (returned).
  absl::Status Run();
  // Async-signal-safe: writes one byte to the loop's wake-up pipe.
  void Stop();

  const DaemonMetrics& metrics() const { return metrics_; }
  std::vector<std::string> IngestEndpoints() const { return ingest_.endpoints(); }
  std::string TrainerEndpoint() const { return trainer_.endpoint(); }
  std::string PeerEndpoint() const { return exchange_ ? exchange_->endpoint() : ""; }
  std::string MetricsEndpoint() const { return bound_metrics_; }

 private:
  void SweepStaleArenas();
  void PlannerLoop();
  bool RoundDue(Clock::TimePoint last_round) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // The buffer holds as much as it can take: ingest reads nothing more until
  // steps go out (RoundDue; RoundRequest::input_blocked).
  bool InputBlocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // Closes the open epochs before `epoch` (the one the trainer starts),
  // dropping their buffered samples with a log line.
  void DropEpochsBefore(uint32_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  absl::Status RunOneRound();
  void ReportLongWait(uint32_t epoch, const RoundOutcome& outcome);
  void RecordRoundTime(std::chrono::steady_clock::duration took);  // planner thread
  void Fail(wire::ErrorCode code, const std::string& message);
  void Wake();
  void PublishGauges();
  bool Stopping() const { return stop_.load() || failed_.load(); }

  DaemonConfig config_;
  std::unique_ptr<RoundRunner> runner_;
  SteadyClock steady_clock_;
  const Clock& clock_;
  std::unique_ptr<zmq::context_t> own_context_;
  zmq::context_t& context_;
  DaemonMetrics metrics_;
  DaemonState state_;
  EndpointLock lock_;
  // Before ingest_ and steps_ (destroyed after them): buffered samples hold
  // blocks of its arenas. The arenas themselves outlive it while held.
  ingest::ArenaRegistry arenas_;
  ingest::IngestChannel ingest_;
  emit::TrainerChannel trainer_;
  std::unique_ptr<exchange::PayloadExchange> exchange_;  // W > 1 only
  emit::StepBuilder steps_;
  MetricsServer metrics_server_;
  std::string bound_metrics_;
  int wake_pipe_[2] = {-1, -1};  // planner / Stop() -> I/O loop

  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  Mutex fatal_mu_;
  absl::Status fatal_status_ ABSL_GUARDED_BY(fatal_mu_);
  std::thread planner_;
  // Start of the current run of waiting rounds, and whether it was reported
  // (a long wait gets one log line). Planner thread only.
  std::optional<Clock::TimePoint> waiting_since_;
  bool wait_reported_ = false;
  // The last rounds' durations (planner thread only), for the p50/p99 gauges.
  static constexpr size_t kRoundTimesKept = 256;
  std::vector<uint64_t> round_times_;
  size_t round_time_next_ = 0;
  // config.round_trace, opened by Bind (planner thread writes, one line per round).
  std::unique_ptr<RoundTrace> round_trace_;
};

}  // namespace odb

#endif  // ODB_DAEMON_DAEMON_H_
