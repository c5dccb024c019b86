#include "src/daemon/daemon.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <filesystem>
#include <unordered_map>

#include "src/collate/collator.h"
#include "src/common/status_macros.h"
#include "src/emit/step_encoder.h"
#include "src/grouping/budget.h"

namespace odb {
namespace {

constexpr char kWakeEndpoint[] = "inproc://odb-planner-wake";
constexpr char kMonitorEndpoint[] = "inproc://odb-trainer-monitor";
constexpr auto kPollInterval = std::chrono::milliseconds(50);
// Batch tensors of at least this size are recycled; at most this many idle
// buffers and bytes are kept (idle memory next to buffer.max_bytes).
constexpr size_t kPooledBufferMinBytes = 64 << 10;
constexpr size_t kPooledBuffersMax = 8;
constexpr uint64_t kPooledBytesMax = uint64_t{256} << 20;

// Makes the directory of an ipc:// endpoint so bind() does not fail on a fresh machine.
void EnsureIpcDirectory(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) != 0) return;
  std::filesystem::path path(endpoint.substr(6));
  std::error_code ignored;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ignored);
}

std::string LastEndpoint(zmq::socket_t& socket) {
  return socket.get(zmq::sockopt::last_endpoint);
}

}  // namespace

Daemon::Daemon(DaemonConfig config, std::unique_ptr<RoundRunner> runner)
    : config_(std::move(config)),
      runner_(std::move(runner)),
      context_(1),
      trainer_(context_, zmq::socket_type::dealer),
      wake_rx_(context_, zmq::socket_type::pull),
      monitor_(context_, zmq::socket_type::pair),
      peer_rx_(context_, zmq::socket_type::router),
      metrics_socket_(context_, zmq::socket_type::stream),
      batch_buffers_(std::make_shared<BufferPool>(kPooledBufferMinBytes, kPooledBuffersMax, kPooledBytesMax)),
      buffer_(config_.buffer_max_bytes, config_.buffer_max_samples),
      expected_producers_(config_.expected_producers) {}

Daemon::~Daemon() {
  stop_.store(true);
  cv_.notify_all();
  if (planner_.joinable()) planner_.join();
}

absl::Status Daemon::Bind() {
  try {
    for (const auto& endpoint : config_.ingest_endpoints) {
      EnsureIpcDirectory(endpoint);
      zmq::socket_t socket(context_, zmq::socket_type::pull);
      socket.set(zmq::sockopt::linger, 0);
      socket.set(zmq::sockopt::rcvhwm, config_.ingest_hwm);
      socket.bind(endpoint);
      bound_ingest_.push_back(LastEndpoint(socket));
      ingest_.push_back(std::move(socket));
    }
    EnsureIpcDirectory(config_.trainer_endpoint);
    trainer_.set(zmq::sockopt::linger, 1000);
    trainer_.set(zmq::sockopt::sndhwm, static_cast<int>(config_.outstanding_depth) + 16);
    trainer_.bind(config_.trainer_endpoint);
    bound_trainer_ = LastEndpoint(trainer_);
    wake_rx_.set(zmq::sockopt::linger, 0);
    wake_rx_.bind(kWakeEndpoint);
    // Trainer liveness: ZMQ reports when the trainer's connection comes and goes.
    if (zmq_socket_monitor(trainer_.handle(), kMonitorEndpoint,
                           ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
      return absl::InternalError("cannot monitor the trainer socket");
    }
    monitor_.set(zmq::sockopt::linger, 0);
    monitor_.connect(kMonitorEndpoint);
    if (runner_->HasPeers()) {
      // Payload exchange for samples a global plan moves between daemons.
      peer_rx_.set(zmq::sockopt::linger, 0);
      peer_rx_.set(zmq::sockopt::rcvhwm, 0);
      peer_rx_.bind("tcp://" + config_.gloo_hostname + ":*");
      bound_peer_ = LastEndpoint(peer_rx_);
    }
    if (!config_.metrics_endpoint.empty()) {
      metrics_socket_.set(zmq::sockopt::linger, 0);
      metrics_socket_.bind(config_.metrics_endpoint);
      bound_metrics_ = LastEndpoint(metrics_socket_);
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(std::string("cannot bind a socket (") + e.what() +
                                  "); is another odbd using the same endpoint or run_dir?");
  }
  return absl::OkStatus();
}

absl::Status Daemon::Run() {
  planner_ = std::thread([this] { PlannerLoop(); });
  std::vector<zmq::pollitem_t> items;
  while (!stop_.load() && !failed_.load()) {
    bool buffer_full;
    {
      std::lock_guard<std::mutex> lock(mu_);
      buffer_full = buffer_.Full();
      uint64_t bytes = buffer_.bytes();
      if (bytes > metrics_.peak_buffer_bytes.load()) metrics_.peak_buffer_bytes.store(bytes);
    }
    // Fixed poll slots first (trainer, wake-up, monitor, peers, metrics), then ingest.
    constexpr size_t kFixedItems = 5;
    items.clear();
    items.push_back({static_cast<void*>(trainer_), 0, ZMQ_POLLIN, 0});
    items.push_back({static_cast<void*>(wake_rx_), 0, ZMQ_POLLIN, 0});
    items.push_back({static_cast<void*>(monitor_), 0, ZMQ_POLLIN, 0});
    items.push_back({static_cast<void*>(peer_rx_), 0, ZMQ_POLLIN, 0});
    items.push_back({static_cast<void*>(metrics_socket_), 0, ZMQ_POLLIN, 0});
    if (!buffer_full) {
      for (auto& socket : ingest_) items.push_back({static_cast<void*>(socket), 0, ZMQ_POLLIN, 0});
    } else {
      metrics_.buffer_full_stalls.fetch_add(1);
      last_ingest_ = std::chrono::steady_clock::now();  // silence under back-pressure is not death
    }
    try {
      zmq::poll(items.data(), items.size(), kPollInterval);
      if (items[0].revents & ZMQ_POLLIN) HandleTrainer();
      if (items[1].revents & ZMQ_POLLIN) {
        zmq::message_t drain;
        while (wake_rx_.recv(drain, zmq::recv_flags::dontwait)) {
        }
      }
      if (items[2].revents & ZMQ_POLLIN) HandleMonitor();
      if (items[3].revents & ZMQ_POLLIN) HandlePeerPayloads();
      if (items[4].revents & ZMQ_POLLIN) HandleMetricsRequest();
      for (size_t i = kFixedItems; i < items.size(); ++i) {
        if (items[i].revents & ZMQ_POLLIN) HandleIngest(ingest_[i - kFixedItems]);
      }
      FlushOutput();
      CheckTimeouts();
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      stop_.store(true);
      cv_.notify_all();
      if (planner_.joinable()) planner_.join();
      return absl::InternalError(std::string("socket error in the I/O loop: ") + e.what());
    }
  }
  cv_.notify_all();
  if (failed_.load()) {
    // Give the fatal message a moment to reach the trainer (linger is set).
    FlushOutput();
  }
  stop_.store(true);
  if (planner_.joinable()) planner_.join();
  if (failed_.load()) return fatal_status_;
  return absl::OkStatus();
}

void Daemon::HandleIngest(zmq::socket_t& socket) {
  // A burst of messages is received and decoded outside the lock, then
  // applied under one lock with one wake-up of the planner. The burst is
  // bounded (the trainer socket is never starved) and ends once it fills the
  // buffer's free room, so the buffer overshoots its bound by at most one
  // message, as when every message checked Full() first.
  uint64_t room_bytes, room_samples;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (buffer_.Full()) return;
    room_bytes = buffer_.RoomBytes();
    room_samples = buffer_.RoomSamples();
  }
  constexpr size_t kBurst = 256;
  std::vector<ingest::IngestEvent>& events = ingest_burst_;
  uint64_t bytes = 0, samples = 0;
  while (events.size() < kBurst && bytes < room_bytes && samples < room_samples) {
    std::vector<zmq::message_t> parts;
    parts.reserve(4);
    zmq::message_t part;
    if (!socket.recv(part, zmq::recv_flags::dontwait)) break;
    parts.push_back(std::move(part));
    while (parts.back().more()) {
      zmq::message_t next;
      (void)socket.recv(next);  // the rest of a multipart message is already here
      parts.push_back(std::move(next));
    }
    events.push_back(ingest::DecodeProducerMessage(std::move(parts)));
    if (const auto* s = std::get_if<ingest::SampleEvent>(&events.back())) {
      bytes += s->sample.meta.payload_bytes;
      ++samples;
    }
  }
  if (events.empty()) return;
  last_ingest_ = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (ingest::IngestEvent& event : events) HandleEvent(std::move(event));
  }
  events.clear();  // what was not moved into the buffer is freed outside the lock
  cv_.notify_all();
}

void Daemon::HandleEvent(ingest::IngestEvent&& event) {
  if (auto* hello = std::get_if<ingest::HelloEvent>(&event)) {
    tracker_.OnHello(hello->producer_id);
    spdlog::debug("producer '{}' connected (rank {})", hello->producer_id, hello->rank);
    if (hello->rank >= 0 && hello->rank != config_.rank) {
      spdlog::warn("producer '{}' says it feeds rank {} but this is rank {}", hello->producer_id,
                   hello->rank, config_.rank);
    }
  } else if (std::get_if<ingest::StartEpochEvent>(&event)) {
    // Producers announce epochs for logging only; the trainer decides the order.
  } else if (auto* end = std::get_if<ingest::EndStreamEvent>(&event)) {
    if (auto r = tracker_.OnEndStream(end->producer_id, end->epoch, end->samples_sent)) {
      RecordRejectionLocked(std::move(*r), end->epoch, false);
    }
    spdlog::debug("producer '{}' ended epoch {} after {} samples", end->producer_id, end->epoch,
                  end->samples_sent);
  } else if (auto* reject = std::get_if<ingest::RejectEvent>(&event)) {
    std::optional<uint32_t> epoch;
    if (reject->has_epoch) epoch = reject->epoch;
    const bool is_sample = reject->rejection.has_sample_id();
    if (is_sample && reject->has_epoch) {
      // Count it against the producer's stream so end_stream totals still match.
      tracker_.OnSample(reject->rejection.producer_id(), reject->epoch, reject->rejection.sample_id());
    }
    RecordRejectionLocked(std::move(reject->rejection), epoch, is_sample);
    return;
  } else if (auto* s = std::get_if<ingest::SampleEvent>(&event)) {
    Sample& sample = s->sample;
    const uint32_t epoch = sample.epoch;
    if (auto r = tracker_.OnSample(sample.producer_id, epoch, sample.meta.id)) {
      RecordRejectionLocked(std::move(*r), epoch, true);
      return;
    }
    sample.meta.owner_rank = config_.rank;
    if (config_.over_budget == OverBudgetPolicy::kReject &&
        !grouping::FitsAlone(config_.budget, sample.meta.lengths)) {
      wire::Rejection r;
      r.set_code(wire::OVER_BUDGET);
      r.set_sample_id(sample.meta.id);
      r.set_has_sample_id(true);
      r.set_producer_id(sample.producer_id);
      r.set_message("sample " + std::to_string(sample.meta.id) + " (tokens=" +
                    std::to_string(sample.meta.lengths.tokens) + ", vision=" +
                    std::to_string(sample.meta.lengths.vision_patches) + ", audio=" +
                    std::to_string(sample.meta.lengths.audio_frames) + ") fits no budget (" +
                    grouping::DescribeBudget(config_.budget) +
                    "); raise the budget or set grouping.over_budget: isolate");
      RecordRejectionLocked(std::move(r), epoch, true);
      return;
    }
    if (auto r = buffer_.Add(std::move(sample))) {
      RecordRejectionLocked(std::move(*r), epoch, true);
      return;
    }
    ++epoch_received_[epoch];
    metrics_.samples_received.fetch_add(1);
  }
}

void Daemon::RecordRejection(wire::Rejection rejection, std::optional<uint32_t> epoch, bool is_sample) {
  std::lock_guard<std::mutex> lock(mu_);
  RecordRejectionLocked(std::move(rejection), epoch, is_sample);
}

void Daemon::RecordRejectionLocked(wire::Rejection rejection, std::optional<uint32_t> epoch, bool is_sample) {
  spdlog::warn("rejected input: {} ({})", rejection.message(), wire::ErrorCode_Name(rejection.code()));
  if (is_sample) {
    metrics_.samples_rejected.fetch_add(1);
    metrics_.samples_received.fetch_add(1);
  }
  uint32_t e = epoch.value_or(current_epoch_.value_or(0));
  if (is_sample) ++epoch_received_[e];
  epoch_rejections_[e].push_back(rejection);
  unreported_.push_back(std::move(rejection));
  cv_.notify_all();
}

void Daemon::HandleTrainer() {
  for (int n = 0; n < 64; ++n) {
    zmq::message_t frame;
    if (!trainer_.recv(frame, zmq::recv_flags::dontwait)) return;
    while (frame.more()) {
      zmq::message_t extra;
      (void)trainer_.recv(extra);
    }
    wire::TrainerMessage msg;
    if (!msg.ParseFromArray(frame.data(), static_cast<int>(frame.size()))) {
      spdlog::warn("trainer sent an unreadable message ({} bytes); ignored", frame.size());
      continue;
    }
    if (msg.version() != wire::PROTOCOL_VERSION_CURRENT) {
      QueueFatal(wire::VERSION_MISMATCH,
                 "trainer client speaks protocol version " + std::to_string(msg.version()) +
                     ", daemon speaks " + std::to_string(wire::PROTOCOL_VERSION_CURRENT));
      continue;
    }
    if (msg.has_credit()) {
      credits_ += msg.credit().steps();
    } else if (msg.has_start_epoch()) {
      if (!trainer_seen_) {
        trainer_seen_ = true;
        credits_ = config_.outstanding_depth;
      }
      last_ingest_ = std::chrono::steady_clock::now();  // producer silence counts from here
      std::lock_guard<std::mutex> lock(mu_);
      const uint32_t epoch = msg.start_epoch().epoch();
      if (msg.start_epoch().expected_producers() > 0) {
        expected_producers_ = msg.start_epoch().expected_producers();
      }
      if (tracker_.IsClosed(epoch) ||
          std::find(requested_epochs_.begin(), requested_epochs_.end(), epoch) != requested_epochs_.end() ||
          current_epoch_ == epoch) {
        spdlog::warn("trainer asked for epoch {} again; ignored", epoch);
      } else {
        requested_epochs_.push_back(epoch);
        spdlog::info("trainer started epoch {} (expecting {} producer(s))", epoch, expected_producers_);
      }
      cv_.notify_all();
    }
  }
}

void Daemon::HandleMetricsRequest() {
  // ZMQ_STREAM: every message is [connection id][bytes]; an empty payload
  // announces a connect or a disconnect. Any request gets the metrics and the
  // connection is closed (HTTP/1.0 style), which is all a Prometheus scrape needs.
  for (int n = 0; n < 16; ++n) {
    zmq::message_t id, request;
    if (!metrics_socket_.recv(id, zmq::recv_flags::dontwait)) return;
    (void)metrics_socket_.recv(request);
    if (request.size() == 0) continue;
    DaemonGauges gauges;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gauges.buffer_bytes = buffer_.bytes();
      gauges.buffer_samples = buffer_.count();
      gauges.queued_steps = queued_steps_;
    }
    const std::string body = RenderPrometheus(metrics_, gauges, config_.rank);
    const std::string response = "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
                                 std::to_string(body.size()) + "\r\n\r\n" + body;
    metrics_socket_.send(id, zmq::send_flags::sndmore);
    metrics_socket_.send(zmq::buffer(response), zmq::send_flags::none);
    metrics_socket_.send(id, zmq::send_flags::sndmore);  // empty frame: close the connection
    metrics_socket_.send(zmq::message_t(), zmq::send_flags::none);
  }
}

void Daemon::HandleMonitor() {
  while (true) {
    zmq::message_t event, address;
    if (!monitor_.recv(event, zmq::recv_flags::dontwait)) return;
    if (event.more()) (void)monitor_.recv(address);
    uint16_t id = 0;
    std::memcpy(&id, event.data(), sizeof(id));
    if (id == ZMQ_EVENT_ACCEPTED) {
      ++trainer_connections_;
      trainer_lost_since_.reset();
    } else if (id == ZMQ_EVENT_DISCONNECTED) {
      trainer_connections_ = std::max(0, trainer_connections_ - 1);
      if (trainer_connections_ == 0) trainer_lost_since_ = std::chrono::steady_clock::now();
      spdlog::info("trainer disconnected");
    }
  }
}

void Daemon::CheckTimeouts() {
  const auto now = std::chrono::steady_clock::now();
  bool epoch_open;
  std::vector<std::string> open_producers;
  bool waiting_for_input = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    epoch_open = current_epoch_.has_value() || !requested_epochs_.empty();
    if (current_epoch_ && !tracker_.StreamFinished(*current_epoch_, expected_producers_)) {
      waiting_for_input = true;
      open_producers = tracker_.OpenProducers(*current_epoch_);
    }
  }
  if (config_.trainer_timeout_ms > 0 && trainer_lost_since_ && epoch_open &&
      now - *trainer_lost_since_ > std::chrono::milliseconds(config_.trainer_timeout_ms)) {
    Fail(wire::INTERNAL, "the trainer disconnected mid-epoch and did not come back within " +
                             std::to_string(config_.trainer_timeout_ms) + " ms (emit.trainer_timeout_ms)");
    return;
  }
  if (config_.producer_timeout_ms > 0 && waiting_for_input &&
      now - last_ingest_ > std::chrono::milliseconds(config_.producer_timeout_ms)) {
    std::string names;
    for (const auto& p : open_producers) names += (names.empty() ? "" : ", ") + p;
    Fail(wire::PRODUCER_TIMEOUT,
         "no message from any producer for " + std::to_string(config_.producer_timeout_ms) +
             " ms while the epoch's input is incomplete (streams still open: " +
             (names.empty() ? std::string("none connected yet") : names) +
             "); a data worker probably died (emit.producer_timeout_ms)");
  }
}

void Daemon::Fail(wire::ErrorCode code, const std::string& message) {
  spdlog::error("rank {}: {}", config_.rank, message);
  QueueFatal(code, message);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fatal_status_.ok()) fatal_status_ = absl::UnavailableError(message);
  }
  failed_.store(true);
}

void Daemon::FlushOutput() {
  while (true) {
    OutMessage message;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (out_.empty()) return;
      if (out_.front().is_step && credits_ == 0) return;
      message = std::move(out_.front());
      out_.pop_front();
      if (message.is_step) --queued_steps_;
    }
    const size_t n = message.parts.size();
    // The first frame goes non-blocking: with no trainer connected, DEALER
    // would block, and the loop must keep polling (liveness, SIGTERM). Once
    // the first frame is accepted ZMQ takes the rest of the message atomically.
    auto first = n > 1 ? zmq::send_flags::sndmore | zmq::send_flags::dontwait : zmq::send_flags::dontwait;
    if (!trainer_.send(message.parts[0], first)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (message.is_step) ++queued_steps_;
      out_.push_front(std::move(message));
      return;
    }
    for (size_t i = 1; i < n; ++i) {
      (void)trainer_.send(message.parts[i], i + 1 < n ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    if (message.is_step) --credits_;
    cv_.notify_all();
  }
}

bool Daemon::RoundDue(std::chrono::steady_clock::time_point last_round) const {
  if (!current_epoch_) return false;
  const uint32_t epoch = *current_epoch_;
  const bool has_slots = queued_steps_ < config_.queue_steps;
  if (has_slots && (tracker_.StreamFinished(epoch, expected_producers_) ||
                    buffer_.CountInEpoch(epoch) >= config_.window || buffer_.Full())) {
    return true;
  }
  const bool waited = std::chrono::steady_clock::now() - last_round >=
                      std::chrono::milliseconds(config_.max_wait_ms);
  if (!waited) return false;
  // Rounds are collective: with peers, take part at a steady pace even with
  // nothing to offer or no free slot (the planner then plans 0 steps), so no
  // peer waits on this rank longer than max_wait_ms.
  return runner_->HasPeers() || (has_slots && buffer_.CountInEpoch(epoch) > 0);
}

void Daemon::PlannerLoop() {
  zmq::socket_t wake_tx(context_, zmq::socket_type::push);
  wake_tx.set(zmq::sockopt::linger, 0);
  wake_tx.set(zmq::sockopt::sndhwm, 1);
  wake_tx.connect(kWakeEndpoint);
  std::vector<zmq::socket_t> senders;
  if (runner_->HasPeers()) {
    if (absl::Status s = ConnectPeerSenders(senders); !s.ok()) {
      Fail(wire::PEER_FAILURE, std::string(s.message()));
      return;
    }
  }
  auto last_round = std::chrono::steady_clock::now();
  while (!stop_.load()) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!current_epoch_ && !requested_epochs_.empty()) {
        current_epoch_ = requested_epochs_.front();
        requested_epochs_.pop_front();
        runner_->StartEpoch(*current_epoch_);
        last_round = std::chrono::steady_clock::now();
      }
      cv_.wait_for(lock, std::chrono::milliseconds(20));
      if (!RoundDue(last_round)) continue;
    }
    absl::Status status = RunOneRound(senders);
    last_round = std::chrono::steady_clock::now();
    if (!status.ok()) {
      spdlog::error("rank {}: {}", config_.rank, std::string(status.message()));
      QueueFatal(wire::PEER_FAILURE, std::string(status.message()));
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (fatal_status_.ok()) fatal_status_ = status;
      }
      failed_.store(true);
    }
    try {
      (void)wake_tx.send(zmq::buffer("w", 1), zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
    if (failed_.load()) return;
  }
}

absl::Status Daemon::RunOneRound(std::vector<zmq::socket_t>& senders) {
  RoundRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.epoch = *current_epoch_;
    // The planner groups at most `window` samples per rank per round; offering
    // a bounded prefix keeps a round O(window) however deep the backlog. The
    // rest stays buffered (and is reported by FinishEpoch in Non-Join mode).
    request.pending = buffer_.Pending(request.epoch, 2 * static_cast<size_t>(config_.window));
    request.free_slots = config_.queue_steps > queued_steps_
                             ? static_cast<uint32_t>(config_.queue_steps - queued_steps_)
                             : 0;
    request.stream_finished = tracker_.StreamFinished(request.epoch, expected_producers_);
    request.stream_started = tracker_.StreamStarted(request.epoch);
  }
  auto outcome = runner_->Run(request);
  if (!outcome.ok()) return outcome.status();
  metrics_.rounds.fetch_add(1);
  ReportLongWait(request.epoch, *outcome);
  if (!outcome->outgoing.empty()) ODB_RETURN_IF_ERROR(SendOutgoing(request.epoch, *outcome, senders));
  for (const StepPlan& plan : outcome->steps) {
    ODB_ASSIGN_OR_RETURN(auto samples, GatherStepSamples(request.epoch, plan));
    EmitPlannedStep(request.epoch, plan, std::move(samples));
  }
  if (outcome->epoch_finished) FinishEpoch(request.epoch, *outcome);
  return absl::OkStatus();
}

void Daemon::ReportLongWait(uint32_t epoch, const RoundOutcome& outcome) {
  if (!outcome.waiting) {
    waiting_since_.reset();
    wait_reported_ = false;
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (!waiting_since_) waiting_since_ = now;
  constexpr auto kReportAfter = std::chrono::seconds(5);
  if (wait_reported_ || now - *waiting_since_ < kReportAfter) return;
  wait_reported_ = true;
  spdlog::info("epoch {}: no step for {} s, {} (bounded by alignment.start_wait_ms {} while a rank has "
               "received nothing of the epoch, then max_wait_ms {})",
               epoch, std::chrono::duration_cast<std::chrono::seconds>(now - *waiting_since_).count(),
               outcome.reason, config_.start_wait_ms, config_.max_wait_ms);
}

absl::Status Daemon::ConnectPeerSenders(std::vector<zmq::socket_t>& senders) {
  auto endpoints = runner_->ExchangeEndpoints(bound_peer_);
  if (!endpoints.ok()) return endpoints.status();
  for (size_t r = 0; r < endpoints->size(); ++r) {
    zmq::socket_t socket(context_, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::sndhwm, 0);  // bounded by the plan, never dropped
    socket.set(zmq::sockopt::routing_id, std::to_string(config_.rank));
    if (static_cast<int>(r) != config_.rank) socket.connect((*endpoints)[r]);
    senders.push_back(std::move(socket));
  }
  spdlog::info("payload exchange ready: {} peers", endpoints->size() - 1);
  return absl::OkStatus();
}

absl::Status Daemon::SendOutgoing(uint32_t epoch, const RoundOutcome& outcome,
                                  std::vector<zmq::socket_t>& senders) {
  // Samples this rank also needs itself (it encodes or emits them too) stay
  // here, parked with the payloads that arrive from peers.
  std::set<uint64_t> needed_here;
  for (const StepPlan& step : outcome.steps) {
    for (size_t i = 0; i < step.sample_ids.size(); ++i) {
      if (step.sample_owners[i] == config_.rank) needed_here.insert(step.sample_ids[i]);
    }
    for (size_t i = 0; i < step.enc_ids.size(); ++i) {
      if (step.enc_owners[i] == config_.rank) needed_here.insert(step.enc_ids[i]);
    }
  }
  std::map<uint64_t, Sample> taken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [dest, ids] : outcome.outgoing) {
      for (uint64_t id : ids) {
        if (taken.count(id)) continue;
        auto one = buffer_.Take(epoch, {id});
        if (one.empty()) {
          return absl::InternalError("the plan moves sample " + std::to_string(id) + " that rank " +
                                     std::to_string(config_.rank) + " does not hold");
        }
        taken.emplace(id, std::move(one.front()));
      }
    }
  }
  for (const auto& [dest, ids] : outcome.outgoing) {
    for (uint64_t id : ids) {
      const Sample& sample = taken.at(id);
      wire::ProducerMessage m;
      m.set_version(wire::PROTOCOL_VERSION_CURRENT);
      wire::SampleHeader* h = m.mutable_sample();
      h->set_producer_id(sample.producer_id);
      h->set_sample_id(sample.meta.id);
      h->set_epoch(epoch);
      h->set_tokens(sample.meta.lengths.tokens);
      h->set_vision_patches(sample.meta.lengths.vision_patches);
      h->set_audio_frames(sample.meta.lengths.audio_frames);
      for (size_t i = 0; i < sample.tensors.size(); ++i) {
        const TensorView& t = sample.tensors[i];
        wire::TensorDesc* d = h->add_tensors();
        d->set_name(t.name);
        d->set_dtype(static_cast<wire::DType>(t.dtype));
        for (int64_t dim : t.shape) d->add_shape(dim);
        d->set_frame(static_cast<uint32_t>(i + 1));
      }
      try {
        std::string header = m.SerializeAsString();
        auto& socket = senders.at(static_cast<size_t>(dest));
        const size_t n = sample.tensors.size();
        socket.send(zmq::buffer(header), n > 0 ? zmq::send_flags::sndmore : zmq::send_flags::none);
        for (size_t i = 0; i < n; ++i) {
          socket.send(zmq::const_buffer(sample.tensors[i].data, sample.tensors[i].size_bytes),
                      i + 1 < n ? zmq::send_flags::sndmore : zmq::send_flags::none);
        }
      } catch (const zmq::error_t& e) {
        return absl::UnavailableError("sending sample " + std::to_string(sample.meta.id) + " to rank " +
                                      std::to_string(dest) + " failed: " + e.what());
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, sample] : taken) {
    if (needed_here.count(id)) foreign_.emplace(SampleKey{config_.rank, id}, std::move(sample));
  }
  return absl::OkStatus();
}

void Daemon::HandlePeerPayloads() {
  for (int n = 0; n < 256; ++n) {
    zmq::message_t identity;
    if (!peer_rx_.recv(identity, zmq::recv_flags::dontwait)) return;
    std::vector<zmq::message_t> parts;
    while (true) {
      zmq::message_t part;
      (void)peer_rx_.recv(part);
      const bool more = part.more();
      parts.push_back(std::move(part));
      if (!more) break;
    }
    const int32_t owner = std::atoi(identity.to_string().c_str());
    auto event = ingest::DecodeProducerMessage(std::move(parts));
    auto* s = std::get_if<ingest::SampleEvent>(&event);
    if (s == nullptr) {
      Fail(wire::INTERNAL, "rank " + std::to_string(owner) + " sent an unreadable sample payload");
      return;
    }
    s->sample.meta.owner_rank = owner;
    std::lock_guard<std::mutex> lock(mu_);
    foreign_.emplace(std::make_pair(owner, s->sample.meta.id), std::move(s->sample));
    cv_.notify_all();
  }
}

absl::StatusOr<Daemon::StepSamples> Daemon::GatherStepSamples(uint32_t epoch, const StepPlan& plan) {
  // Keys in plan order: the LLM batch first, then encoder samples not already
  // in it (a sample both emitted and encoded here is taken once).
  std::vector<SampleKey> keys;
  keys.reserve(plan.sample_ids.size() + plan.enc_ids.size());
  for (size_t i = 0; i < plan.sample_ids.size(); ++i) keys.emplace_back(plan.sample_owners[i], plan.sample_ids[i]);
  std::vector<size_t> llm_index(keys.size()), enc_index(plan.enc_ids.size());
  for (size_t i = 0; i < keys.size(); ++i) llm_index[i] = i;
  const bool all_own = std::all_of(plan.sample_owners.begin(), plan.sample_owners.end(),
                                   [&](int32_t owner) { return owner == config_.rank; });
  if (!all_own || !plan.enc_ids.empty()) {
    std::map<SampleKey, size_t> index;
    std::vector<SampleKey> unique;
    unique.reserve(keys.size() + plan.enc_ids.size());
    auto add = [&](const SampleKey& key) {
      auto [it, inserted] = index.emplace(key, unique.size());
      if (inserted) unique.push_back(key);
      return it->second;
    };
    for (size_t i = 0; i < keys.size(); ++i) llm_index[i] = add(keys[i]);
    for (size_t i = 0; i < plan.enc_ids.size(); ++i) enc_index[i] = add({plan.enc_owners[i], plan.enc_ids[i]});
    keys = std::move(unique);
  }
  StepSamples out;
  out.owned.reserve(keys.size());
  {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.collective_timeout_ms);
    for (const SampleKey& key : keys) {
      if (key.first == config_.rank) {
        if (std::optional<Sample> own = buffer_.TakeOne(epoch, key.second)) {
          out.owned.push_back(std::move(*own));
          continue;
        }
      }
      // A peer's payload (or our own, parked by SendOutgoing). Payloads move
      // while earlier steps are emitted; wait only for this one.
      while (!foreign_.count(key)) {
        if (key.first == config_.rank) {
          return absl::InternalError("planner returned sample " + std::to_string(key.second) +
                                     " that is not buffered on rank " + std::to_string(config_.rank));
        }
        if (stop_.load() || failed_.load()) return absl::CancelledError("daemon stopping");
        if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !foreign_.count(key)) {
          return absl::DeadlineExceededError("sample " + std::to_string(key.second) + " from rank " +
                                             std::to_string(key.first) + " did not arrive within " +
                                             std::to_string(config_.collective_timeout_ms) + " ms");
        }
      }
      auto it = foreign_.find(key);
      out.owned.push_back(std::move(it->second));
      foreign_.erase(it);
    }
  }
  out.llm.reserve(llm_index.size());
  for (size_t i : llm_index) out.llm.push_back(&out.owned[i]);
  out.enc.reserve(enc_index.size());
  for (size_t i : enc_index) out.enc.push_back(&out.owned[i]);
  return out;
}

namespace {

// The sample with only (keep = true) or without (keep = false) the named
// tensors; frames are shared, not copied.
Sample WithFields(const Sample& sample, const std::vector<std::string>& names, bool keep) {
  Sample out = sample;
  std::erase_if(out.tensors, [&](const TensorView& t) {
    return (std::find(names.begin(), names.end(), t.name) != names.end()) != keep;
  });
  return out;
}

}  // namespace

void Daemon::EmitPlannedStep(uint32_t epoch, const StepPlan& plan, StepSamples&& samples) {
  wire::Step step;
  step.set_epoch(epoch);
  step.set_step_index(plan.step_index);
  step.set_idle(plan.idle);
  step.set_real_tokens(plan.real_tokens);
  step.set_padded_tokens(plan.padded_tokens);
  step.set_global_real_tokens(plan.global_real_tokens);
  step.set_loss_weight(plan.loss_weight);
  step.set_over_budget(plan.over_budget);
  step.set_rejections_are_errors(config_.bad_input == BadInputPolicy::kError);
  const bool phases = config_.phase_plans;
  step.set_samples_may_move(phases || config_.planner == PlannerKind::kGlobal);
  // With per-phase plans the encoder fields travel in the encoder batch only
  // (filtered views; frames are shared). Without, the samples are used as they are.
  std::vector<Sample> filtered, enc_samples;
  std::vector<const Sample*> llm_group;
  filtered.reserve(phases ? plan.sample_ids.size() : 0);
  for (size_t i = 0; i < plan.sample_ids.size(); ++i) {
    const Sample& s = *samples.llm[i];
    if (phases) {
      filtered.push_back(WithFields(s, config_.encoder_fields, false));
      llm_group.push_back(&filtered.back());
    } else {
      llm_group.push_back(&s);
    }
    step.add_sample_ids(s.meta.id);
    step.add_lengths(s.meta.lengths.tokens);
    step.add_owner_ranks(s.meta.owner_rank);
  }
  for (size_t i = 0; i < plan.enc_ids.size(); ++i) {
    enc_samples.push_back(WithFields(*samples.enc[i], config_.encoder_fields, true));
    step.add_enc_sample_ids(plan.enc_ids[i]);
    step.add_enc_owner_ranks(plan.enc_owners[i]);
    step.add_enc_dest_rank(plan.enc_dest_rank[i]);
    step.add_enc_dest_index(plan.enc_dest_index[i]);
  }
  for (int32_t src : plan.llm_src_rank) step.add_llm_src_rank(src);
  std::vector<collate::BatchTensor> tensors;
  auto collate_group = [&](const std::vector<const Sample*>& group, const std::string& prefix,
                           const collate::CollateOptions& options) -> absl::Status {
    if (group.empty()) return absl::OkStatus();
    auto collated = collate::Collate(group, options, batch_buffers_.get());
    if (!collated.ok()) return collated.status();
    for (auto& t : *collated) {
      t.name = prefix + t.name;
      tensors.push_back(std::move(t));
    }
    return absl::OkStatus();
  };
  absl::Status collated = collate_group(llm_group, "", config_.collate);
  if (collated.ok() && !enc_samples.empty()) {
    // The encoder batch has no tokens: no attention mask, never packed.
    collate::CollateOptions enc_options = config_.collate;
    enc_options.attention_mask = false;
    enc_options.packed = false;
    std::vector<const Sample*> enc_group;
    for (const Sample& s : enc_samples) enc_group.push_back(&s);
    collated = collate_group(enc_group, "enc.", enc_options);
  }
  if (!collated.ok() && phases) {
    // Other ranks' routes count on this rank's encoder outputs: a step that
    // cannot be batched breaks the plan for everyone.
    Fail(wire::COLLATE_FAILED, "step " + std::to_string(plan.step_index) +
                                   " cannot be collated under per-phase plans: " +
                                   std::string(collated.message()));
    return;
  }
  if (!collated.ok()) {
    // The samples cannot be batched together: report every one of them and
    // keep the step (as IDLE) so alignment with the other ranks holds.
    tensors.clear();
    for (const Sample* s : llm_group) {
      wire::Rejection r;
      r.set_code(wire::COLLATE_FAILED);
      r.set_sample_id(s->meta.id);
      r.set_has_sample_id(true);
      r.set_producer_id(s->producer_id);
      r.set_message(std::string(collated.message()));
      RecordRejection(std::move(r), epoch, false);
    }
    step.clear_sample_ids();
    step.clear_lengths();
    step.clear_owner_ranks();
    step.set_idle(true);
    step.set_loss_weight(0.0);
    step.set_real_tokens(0);
    step.set_padded_tokens(0);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : unreported_) *step.add_rejections() = std::move(r);
  unreported_.clear();
  wire::EpochSummary& totals = epoch_totals_[epoch];
  totals.set_steps(totals.steps() + 1);
  if (step.idle()) totals.set_idle_steps(totals.idle_steps() + 1);
  totals.set_emitted(totals.emitted() + step.sample_ids_size());
  totals.set_real_tokens(totals.real_tokens() + step.real_tokens());
  totals.set_padded_tokens(totals.padded_tokens() + step.padded_tokens());
  metrics_.steps_emitted.fetch_add(1);
  if (step.idle()) metrics_.idle_steps.fetch_add(1);
  metrics_.samples_emitted.fetch_add(step.sample_ids_size());
  out_.push_back({emit::EncodeStep(std::move(step), std::move(tensors), batch_buffers_), true});
  ++queued_steps_;
}

void Daemon::FinishEpoch(uint32_t epoch, const RoundOutcome& outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  wire::EpochSummary summary = epoch_totals_[epoch];
  summary.set_epoch(epoch);
  summary.set_received(epoch_received_[epoch]);
  summary.set_rejections_are_errors(config_.bad_input == BadInputPolicy::kError);
  for (const auto& r : epoch_rejections_[epoch]) *summary.add_rejections() = r;
  summary.set_rejected(epoch_rejections_[epoch].size());
  std::vector<uint64_t> not_emitted = outcome.not_emitted;
  for (Sample& s : buffer_.CloseEpoch(epoch)) {
    if (std::find(not_emitted.begin(), not_emitted.end(), s.meta.id) == not_emitted.end()) {
      not_emitted.push_back(s.meta.id);
    }
  }
  std::sort(not_emitted.begin(), not_emitted.end());
  for (uint64_t id : not_emitted) summary.add_not_emitted_ids(id);
  tracker_.CloseEpoch(epoch, config_.mode == AlignMode::kNonJoin);
  epoch_rejections_.erase(epoch);
  epoch_received_.erase(epoch);
  epoch_totals_.erase(epoch);
  spdlog::info(
      "rank {} epoch {} done: received={} emitted={} rejected={} not_emitted={} steps={} idle={} "
      "padding={:.1f}%",
      config_.rank, epoch, summary.received(), summary.emitted(), summary.rejected(),
      summary.not_emitted_ids_size(), summary.steps(), summary.idle_steps(),
      summary.padded_tokens() ? 100.0 * (1.0 - double(summary.real_tokens()) / double(summary.padded_tokens()))
                              : 0.0);
  wire::DaemonMessage message;
  message.set_version(wire::PROTOCOL_VERSION_CURRENT);
  *message.mutable_epoch_end() = std::move(summary);
  out_.push_back({emit::EncodeControl(message), false});
  current_epoch_.reset();
  cv_.notify_all();
}

void Daemon::QueueFatal(wire::ErrorCode code, const std::string& text) {
  wire::DaemonMessage message;
  message.set_version(wire::PROTOCOL_VERSION_CURRENT);
  message.mutable_fatal()->set_code(code);
  message.mutable_fatal()->set_message(text);
  message.mutable_fatal()->set_rank(config_.rank);
  std::lock_guard<std::mutex> lock(mu_);
  // Ahead of queued steps: a fatal error must not wait for credits.
  out_.push_front({emit::EncodeControl(message), false});
}

}  // namespace odb
