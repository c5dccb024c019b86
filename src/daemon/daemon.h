#ifndef ODB_DAEMON_DAEMON_H_
#define ODB_DAEMON_DAEMON_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "absl/status/status.h"
#include "proto/odb.pb.h"
#include "src/buffer/sample_buffer.h"
#include "src/common/buffer_pool.h"
#include "src/daemon/config.h"
#include "src/daemon/metrics.h"
#include "src/daemon/round_runner.h"
#include "src/ingest/decoder.h"
#include "src/ingest/stream_tracker.h"

namespace odb {

// One rank's collation daemon. Two threads:
//  - the I/O loop (Run's caller) owns every ZeroMQ socket: it reads producer
//    messages into the buffer (only while the buffer has room, so back-pressure
//    reaches producers through ZMQ high-water marks), reads credits from the
//    trainer and sends queued steps while credits last;
//  - the planner thread runs alignment rounds (a collective: it may block on
//    peers, which is why it is not the I/O loop), collates the planned steps
//    and queues them for the I/O loop.
// The buffer, tracker state and output queue are shared under `mu_`.
class Daemon {
 public:
  Daemon(DaemonConfig config, std::unique_ptr<RoundRunner> runner);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Binds the ingest and trainer sockets. Errors name the endpoint.
  absl::Status Bind();
  // Serves until Stop() or a fatal error (returned).
  absl::Status Run();
  // Async-signal-safe: only sets a flag that both threads poll.
  void Stop() { stop_.store(true); }

  const DaemonMetrics& metrics() const { return metrics_; }
  // Endpoints actually bound (tcp://127.0.0.1:* resolved to the real port).
  std::vector<std::string> IngestEndpoints() const { return bound_ingest_; }
  std::string TrainerEndpoint() const { return bound_trainer_; }
  std::string PeerEndpoint() const { return bound_peer_; }
  std::string MetricsEndpoint() const { return bound_metrics_; }

 private:
  using SampleKey = std::pair<int32_t, uint64_t>;  // (owner rank, id)

  struct OutMessage {
    std::vector<zmq::message_t> parts;
    bool is_step = false;
  };

  void HandleIngest(zmq::socket_t& socket);
  void HandleEvent(ingest::IngestEvent&& event);  // requires mu_
  void HandleTrainer();
  void FlushOutput();
  void RecordRejection(wire::Rejection rejection, std::optional<uint32_t> epoch, bool is_sample);
  void RecordRejectionLocked(wire::Rejection rejection, std::optional<uint32_t> epoch,
                             bool is_sample);  // requires mu_
  void PlannerLoop();
  bool RoundDue(std::chrono::steady_clock::time_point last_round) const;  // requires mu_
  absl::Status RunOneRound(std::vector<zmq::socket_t>& senders);
  void ReportLongWait(uint32_t epoch, const RoundOutcome& outcome);
  // The samples one step needs here, each taken once: `llm` parallel to the
  // plan's sample_ids, `enc` to its enc_ids, both pointing into `owned`.
  struct StepSamples {
    std::vector<Sample> owned;
    std::vector<const Sample*> llm;
    std::vector<const Sample*> enc;
  };
  void EmitPlannedStep(uint32_t epoch, const StepPlan& plan, StepSamples&& samples);
  void FinishEpoch(uint32_t epoch, const RoundOutcome& outcome);
  void QueueFatal(wire::ErrorCode code, const std::string& message);
  void HandleMonitor();
  void HandlePeerPayloads();
  void HandleMetricsRequest();
  absl::Status ConnectPeerSenders(std::vector<zmq::socket_t>& senders);
  absl::Status SendOutgoing(uint32_t epoch, const RoundOutcome& outcome,
                            std::vector<zmq::socket_t>& senders);
  // Every sample the step needs here (its LLM samples and, with per-phase
  // plans, the samples this rank encodes), each once.
  absl::StatusOr<StepSamples> GatherStepSamples(uint32_t epoch, const StepPlan& plan);
  void CheckTimeouts();
  void Fail(wire::ErrorCode code, const std::string& message);

  DaemonConfig config_;
  std::unique_ptr<RoundRunner> runner_;
  DaemonMetrics metrics_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  absl::Status fatal_status_;  // set by the planner thread before failed_

  zmq::context_t context_;
  std::vector<zmq::socket_t> ingest_;
  zmq::socket_t trainer_;
  zmq::socket_t wake_rx_;  // inproc: planner -> I/O loop "output queued"
  zmq::socket_t monitor_;  // inproc: connect/disconnect events of trainer_
  zmq::socket_t peer_rx_;  // ROUTER: sample payloads other daemons send us (W > 1)
  zmq::socket_t metrics_socket_;  // STREAM: plain HTTP, Prometheus text (metrics_endpoint)
  std::string bound_peer_;
  std::string bound_metrics_;
  std::vector<std::string> bound_ingest_;
  std::string bound_trainer_;
  std::thread planner_;
  // Batch tensor buffers, recycled from ZeroMQ's free callback to the next
  // collation (no page faults for big steps). Shared: ZeroMQ may free a frame
  // after the daemon's other members are gone.
  std::shared_ptr<BufferPool> batch_buffers_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // buffer or epoch state changed
  buffer::SampleBuffer buffer_;                        // guarded by mu_
  ingest::StreamTracker tracker_;                      // guarded by mu_
  std::deque<uint32_t> requested_epochs_;              // guarded by mu_ (trainer's StartEpoch)
  std::optional<uint32_t> current_epoch_;              // guarded by mu_
  uint32_t expected_producers_;                        // guarded by mu_
  std::deque<OutMessage> out_;                         // guarded by mu_
  size_t queued_steps_ = 0;                            // guarded by mu_
  std::vector<wire::Rejection> unreported_;            // guarded by mu_: for the next step
  std::map<uint32_t, std::vector<wire::Rejection>> epoch_rejections_;  // guarded by mu_
  std::map<uint32_t, uint64_t> epoch_received_;        // guarded by mu_
  std::map<uint32_t, wire::EpochSummary> epoch_totals_;  // guarded by mu_
  // Payloads received from the daemon that holds them, keyed (owner rank, id).
  std::map<SampleKey, Sample> foreign_;  // guarded by mu_
  std::vector<ingest::IngestEvent> ingest_burst_;  // I/O loop only (reused per burst)
  uint64_t credits_ = 0;  // I/O loop only
  bool trainer_seen_ = false;  // I/O loop only
  int trainer_connections_ = 0;  // I/O loop only
  std::optional<std::chrono::steady_clock::time_point> trainer_lost_since_;  // I/O loop only
  std::chrono::steady_clock::time_point last_ingest_ = std::chrono::steady_clock::now();  // I/O loop only
  // Start of the current run of waiting rounds, and whether it was reported
  // (a long wait gets one log line). Planner thread only.
  std::optional<std::chrono::steady_clock::time_point> waiting_since_;
  bool wait_reported_ = false;
};

}  // namespace odb

#endif  // ODB_DAEMON_DAEMON_H_
