#include "src/daemon/daemon.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <tuple>

#include "src/common/status_macros.h"
#include "src/common/zmq_transfer.h"
#include "src/daemon/stage_options.h"
#include "src/shm/arena.h"

namespace odb {
namespace {

// The I/O loop's longest sleep: timeouts are checked at least this often.
constexpr auto kPollInterval = std::chrono::milliseconds(50);

}  // namespace

Daemon::Daemon(DaemonConfig config, std::unique_ptr<RoundRunner> runner, const Clock* clock,
               zmq::context_t* context)
    : config_(std::move(config)),
      runner_(std::move(runner)),
      clock_(clock != nullptr ? *clock : steady_clock_),
      own_context_(context != nullptr ? nullptr : std::make_unique<zmq::context_t>(1)),
      context_(context != nullptr ? *context : *own_context_),
      state_(config_.buffer_max_bytes, config_.buffer_max_samples, config_.expected_producers,
             static_cast<size_t>(config_.buffer_max_id_runs)),
      arenas_(ingest::ArenaRegistry::Options{.max_arenas = config_.shm_max_arenas}, clock_),
      ingest_(context_, IngestOptionsFor(config_), state_, metrics_, clock_),
      trainer_(context_, TrainerChannelOptionsFor(config_), state_, metrics_, clock_),
      exchange_(runner_->HasPeers() ? std::make_unique<exchange::PayloadExchange>(ExchangeOptionsFor(config_),
                                                                                  state_, metrics_, clock_)
                                    : nullptr),
      steps_(StepBuilderOptionsFor(config_), state_, metrics_, exchange_.get()),
      metrics_server_(metrics_, config_.rank) {
  ingest_.SetArenaSource(&arenas_);
  if (pipe2(wake_pipe_, O_NONBLOCK | O_CLOEXEC) != 0) {
    spdlog::critical("cannot create the daemon's wake-up pipe");
    std::abort();  // start-up invariant: nothing can run without it
  }
}

Daemon::~Daemon() {
  stop_.store(true);
  state_.cv.NotifyAll();
  if (exchange_) exchange_->WakeAll();
  if (planner_.joinable()) planner_.join();
  metrics_server_.Stop();
  for (int fd : wake_pipe_) {
    if (fd >= 0) close(fd);
  }
}

absl::Status Daemon::Bind() {
  std::vector<std::string> endpoints = config_.ingest.endpoints;
  endpoints.push_back(config_.trainer.endpoint);
  ODB_RETURN_IF_ERROR(lock_.Acquire(EndpointLock::PathsFor(config_.run_dir, config_.rank, endpoints)));
  // Segments that dead processes left in run_dir (file arenas; memfds leave
  // nothing behind) go before anything new is created.
  SweepStaleArenas();
  // The registration sockets first: a producer that finds the ingest socket
  // finds them too (otherwise it would send over ZeroMQ).
  if (config_.shm_producer_arenas) {
    for (const std::string& endpoint : config_.ingest.endpoints) {
      if (endpoint.rfind("ipc://", 0) != 0) continue;
      EnsureIpcDirectory(endpoint);
      const std::string path = ingest::ArenaSocketPath(endpoint.substr(6));
      // Producers fall back to ZeroMQ when there is no registration socket.
      if (absl::Status s = arenas_.Listen(path); !s.ok()) {
        spdlog::warn("shared-memory arenas off for {}: {}", endpoint, std::string(s.message()));
      }
    }
    arenas_.Start();  // a producer that connects from now on is answered
  }
  ODB_RETURN_IF_ERROR(ingest_.Bind());
  ODB_RETURN_IF_ERROR(trainer_.Bind());
  if (!config_.round_trace.empty()) {
    ODB_ASSIGN_OR_RETURN(round_trace_, RoundTrace::Open(config_.round_trace));
  }
  if (exchange_) ODB_RETURN_IF_ERROR(exchange_->Bind());
  if (!config_.metrics_endpoint.empty()) {
    auto bound = metrics_server_.Start(config_.metrics_endpoint);
    if (!bound.ok()) return bound.status();
    bound_metrics_ = *bound;
  }
  return absl::OkStatus();
}

void Daemon::SweepStaleArenas() {
  absl::StatusOr<shm::SweepReport> swept = shm::SweepStale(config_.run_dir);
  if (!swept.ok()) {
    if (swept.status().code() == absl::StatusCode::kNotFound) return;  // a new run_dir: nothing left there
    spdlog::warn("stale arena sweep of {}: {}", config_.run_dir, std::string(swept.status().message()));
    return;
  }
  for (const std::string& path : swept->removed) spdlog::info("removed stale arena segment {}", path);
  for (const auto& [path, why] : swept->kept) {
    spdlog::warn("arena-named file {} left in place, not used: {}", path, why);
  }
}

void Daemon::Stop() {
  stop_.store(true);
  Wake();
}

void Daemon::Wake() {
  const char byte = 1;
  (void)!write(wake_pipe_[1], &byte, 1);  // full pipe: a wake-up is already pending
}

void Daemon::Fail(wire::ErrorCode code, const std::string& message) {
  // The rank is named once: by the log pattern ("[odbd N]") here, and by the
  // fatal message's rank field for the trainer (the clients print "odbd rank
  // N failed"). Messages therefore never start with their own rank.
  spdlog::error("{}", message);
  // A cause of this rank's own (not a peer's failure seen here): the peers' errors will name it.
  if (code != wire::PEER_FAILURE) runner_->ReportFailure(wire::ErrorCode_Name(code) + ": " + message);
  trainer_.EnqueueFatal(code, message, config_.rank);
  {
    MutexLock lock(fatal_mu_);
    if (fatal_status_.ok()) fatal_status_ = absl::UnavailableError(message);
  }
  failed_.store(true);
  Wake();
}

absl::Status Daemon::Run() {
  planner_ = std::thread([this] { PlannerLoop(); });
  // Fixed slots first (wake-up pipe, trainer, its monitor, peer payloads), then ingest.
  std::vector<zmq::pollitem_t> items;
  items.push_back({nullptr, wake_pipe_[0], ZMQ_POLLIN, 0});
  items.push_back({trainer_.socket().handle(), 0, ZMQ_POLLIN, 0});
  items.push_back({trainer_.monitor().handle(), 0, ZMQ_POLLIN, 0});
  const short exchange_events = exchange_ ? ZMQ_POLLIN : 0;
  items.push_back({exchange_ ? exchange_->socket().handle() : nullptr, -1, exchange_events, 0});
  const size_t fixed = items.size();
  for (size_t i = 0; i < ingest_.socket_count(); ++i) {
    items.push_back({ingest_.socket(i).handle(), 0, ZMQ_POLLIN, 0});
  }
  while (!Stopping()) {
    if (zmq_poll(items.data(), static_cast<int>(items.size()), kPollInterval.count()) < 0) {
      if (zmq_errno() == EINTR) continue;
      Fail(wire::INTERNAL, std::string("polling the daemon's sockets failed: ") + zmq_strerror(zmq_errno()));
      break;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      char drain[64];
      while (read(wake_pipe_[0], drain, sizeof(drain)) > 0) {
      }
    }
    // Connection events first: a trainer that reconnects is then judged
    // against the session's current state.
    if (items[2].revents & ZMQ_POLLIN) trainer_.OnMonitor();
    if (items[1].revents & ZMQ_POLLIN) {
      if (trainer_.OnReadable()) ingest_.NoteEpochRequested();
    }
    if (trainer_.SettleContender()) ingest_.NoteEpochRequested();
    if (exchange_ && (items[3].revents & ZMQ_POLLIN)) {
      if (absl::Status s = exchange_->OnReadable(); !s.ok())
        Fail(wire::PEER_FAILURE, std::string(s.message()));
    }
    for (size_t i = fixed; i < items.size(); ++i) {
      if (items[i].revents & ZMQ_POLLIN) ingest_.OnReadable(i - fixed);
    }
    ingest_.GrantCredits();
    trainer_.Flush();
    PublishGauges();
    if (auto lost = trainer_.CheckLiveness()) Fail(lost->first, lost->second);
    if (auto silent = ingest_.CheckSilence()) Fail(wire::PRODUCER_TIMEOUT, *silent);
    if (auto stalled = ingest_.CheckStall()) Fail(wire::STALLED, *stalled);
    if (auto mismatch = ingest_.TakeConfigMismatch(); mismatch && config_.steps.rejections_are_errors) {
      Fail(wire::CONFIG_MISMATCH,
           *mismatch + " (bad_input: error; skip_and_report rejects such samples instead)");
    }
    if (config_.exit_when_trainer_done && !Stopping()) {
      if (auto ended = trainer_.SessionEnded()) {
        spdlog::info("{}: stopping", *ended);
        break;  // a clean end: Run() returns OK, odbd exits 0
      }
    }
  }
  stop_.store(true);
  state_.cv.NotifyAll();
  if (exchange_) exchange_->WakeAll();
  if (planner_.joinable()) planner_.join();
  arenas_.Stop();
  trainer_.StopArenaServer();
  // Give a fatal message a chance to reach the trainer (the socket lingers).
  trainer_.Flush();
  metrics_server_.Stop();
  MutexLock lock(fatal_mu_);
  return fatal_status_;
}

bool Daemon::InputBlocked() const {
  // The buffer is as full as credit lets it get once less than one largest
  // sample of room is left, or as full as a producer's shared-memory arena
  // lets it get once the daemon holds half of it (the daemon holds its
  // arena's blocks until they are collated: see AnyArenaFilling).
  return state_.buffer.Full() || state_.buffer.RoomBytes() < ingest_.MaxSampleBytes() || arenas_.AnyArenaFilling();
}

bool Daemon::RoundDue(Clock::TimePoint last_round) const {
  if (!state_.current_epoch) return false;
  const uint32_t epoch = *state_.current_epoch;
  // A round waits for half the output queue to be free (PlannerConfig::
  // min_free_slots): many steps grouped at once, not one per freed slot.
  const bool has_slots = trainer_.QueuedSteps() + std::max<uint32_t>(1, config_.queue_steps / 2) <= config_.queue_steps;
  const bool buffer_full = InputBlocked();
  if (has_slots && (state_.tracker.StreamFinished(epoch, state_.expected_producers) ||
                    state_.buffer.CountInEpoch(epoch) >= config_.window || buffer_full)) {
    return true;
  }
  const bool waited = clock_.Now() - last_round >= std::chrono::milliseconds(config_.max_wait_ms);
  if (!waited) return false;
  // Rounds are collective: with peers, take part at a steady pace even with
  // nothing to offer or no free slot (the planner then plans 0 steps), so no
  // peer waits on this rank longer than max_wait_ms.
  return runner_->HasPeers() || (has_slots && state_.buffer.CountInEpoch(epoch) > 0);
}

void Daemon::PlannerLoop() {
  if (exchange_) {
    auto endpoints = runner_->ExchangeEndpoints(exchange_->Announcement());
    absl::Status s = endpoints.ok() ? exchange_->Connect(*endpoints) : endpoints.status();
    if (!s.ok()) {
      Fail(wire::PEER_FAILURE, std::string(s.message()));
      return;
    }
  }
  // When a round is due is decided against the injected clock (a test
  // advances it past max_wait_ms instead of waiting).
  Clock::TimePoint last_round = clock_.Now();
  while (!Stopping()) {
    {
      MutexLock lock(state_.mu);
      if (!state_.current_epoch && !state_.requested_epochs.empty()) {
        state_.current_epoch = state_.requested_epochs.front();
        state_.requested_epochs.pop_front();
        uint64_t first_round = 0, first_step = 0;
        if (auto it = state_.resume_points.find(*state_.current_epoch); it != state_.resume_points.end()) {
          std::tie(first_round, first_step) = it->second;
          state_.resume_points.erase(it);
        }
        DropEpochsBefore(*state_.current_epoch);
        runner_->StartEpoch(*state_.current_epoch, first_round, first_step);
        last_round = clock_.Now();
      }
      state_.cv.WaitFor(state_.mu, std::chrono::milliseconds(20));
      if (Stopping() || !RoundDue(last_round)) continue;
    }
    absl::Status status = RunOneRound();
    last_round = clock_.Now();
    if (!status.ok() && !Stopping()) {
      const wire::ErrorCode code = status.code() == absl::StatusCode::kAborted            ? wire::COLLATE_FAILED
                                 : status.code() == absl::StatusCode::kResourceExhausted ? wire::INTERNAL
                                                                                         : wire::PEER_FAILURE;
    Fail(code, std::string(status.message()));
      return;
    }
    Wake();  // steps are queued: the I/O loop sends them
  }
}

void Daemon::DropEpochsBefore(uint32_t epoch) {
  // Samples of an earlier epoch that the trainer skipped (producers started
  // before the trainer said where a resumed job stands) would hold buffer
  // room forever; they go, each one reported, and the epoch is closed so that
  // its producers are told it ended.
  for (uint32_t skipped : state_.tracker.OpenEpochsBefore(epoch)) {
    std::vector<Sample> dropped = state_.buffer.CloseEpoch(skipped);
    state_.tracker.CloseEpoch(skipped);
    state_.epoch_received.erase(skipped);
    state_.epoch_totals.erase(skipped);
    const uint64_t rejected = state_.rejections.TakeEpoch(skipped).count;
    std::string ids;
    for (size_t i = 0; i < dropped.size() && i < 20; ++i) ids += (i ? "," : "") + std::to_string(dropped[i].UserId());
    if (dropped.size() > 20) ids += ",...";
    spdlog::warn(
        "epoch {} is not trained: the trainer started epoch {} after it; its {} buffered sample(s) [{}] "
        "are dropped ({} rejection(s) of it were not reported in a summary)",
        skipped, epoch, dropped.size(), ids, rejected);
  }
}

namespace {
int64_t ThreadCpuNanos() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}
}  // namespace

absl::Status Daemon::RunOneRound() {
  RoundRequest request;
  {
    MutexLock lock(state_.mu);
    request.epoch = *state_.current_epoch;
    // The planner groups at most `window` samples per rank per round; offering
    // a bounded prefix keeps a round O(window) however deep the backlog.
    const size_t queued = trainer_.QueuedSteps();
    request.free_slots =
        config_.queue_steps > queued ? static_cast<uint32_t>(config_.queue_steps - queued) : 0;
    request.stream_finished = state_.tracker.StreamFinished(request.epoch, state_.expected_producers);
    request.stream_started = state_.tracker.StreamStarted(request.epoch);
    request.input_blocked = InputBlocked();
    if (config_.deterministic) {
      // The unbroken prefix of the rank's list, in list order (the planner
      // looks at window + 1 of them, see PlannerConfig::deterministic).
      request.pending = state_.buffer.PendingInOrder(request.epoch, static_cast<size_t>(config_.window) + 1,
                                                     request.stream_finished);
    } else {
      request.pending = state_.buffer.Pending(request.epoch, 2 * static_cast<size_t>(config_.window));
    }
  }
  // Measured, not decided on: the round time metrics are real time.
  const auto round_start = std::chrono::steady_clock::now();
  const auto entered = std::chrono::system_clock::now();
  const int64_t cpu_before = ThreadCpuNanos();
  auto outcome = runner_->Run(request);
  if (!outcome.ok()) return outcome.status();
  const uint64_t round = metrics_.rounds.fetch_add(1);
  RecordRoundTime(std::chrono::steady_clock::now() - round_start);
  if (round_trace_) {
    // Wall clock, so that the rounds of several daemons line up (the k-th
    // round is the same collective on every rank).
    auto ns = [](std::chrono::system_clock::time_point t) {
      return static_cast<long long>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
    };
    // The planner thread's CPU time in the round (encode, decode, plan): on
    // a machine with fewer cores than daemons the wall time stretches it.
    round_trace_->Append(round, ns(entered), ns(std::chrono::system_clock::now()),
                         ThreadCpuNanos() - cpu_before);
  }
  ReportLongWait(request.epoch, *outcome);
  if (!outcome->outgoing.empty()) {
    if (!exchange_) return absl::InternalError("a single-rank plan moves samples");
    ODB_RETURN_IF_ERROR(exchange_->SendOutgoing(request.epoch, *outcome));
  }
  auto cancelled = [this] { return Stopping(); };
  for (const StepPlan& plan : outcome->steps) {
    // The session's step arena, if the trainer took one: the step is collated straight into it.
    std::shared_ptr<emit::StepArena> arena = trainer_.ArenaForNextStep();
    auto step = steps_.Build(request.epoch, plan, cancelled, arena.get());
    if (!step.ok()) return step.status();
    if (step->in_arena) {
      trainer_.EnqueueStep(std::move(step->parts), std::move(arena));
    } else {
      trainer_.EnqueueStep(std::move(step->parts));
    }
    Wake();  // sent while the next step is built, not after the round
  }
  if (outcome->epoch_finished) trainer_.EnqueueControl(steps_.FinishEpoch(request.epoch, *outcome));
  return absl::OkStatus();
}

void Daemon::ReportLongWait(uint32_t epoch, const RoundOutcome& outcome) {
  if (!outcome.waiting) {
    waiting_since_.reset();
    wait_reported_ = false;
    return;
  }
  const auto now = clock_.Now();
  if (!waiting_since_) waiting_since_ = now;
  constexpr auto kReportAfter = std::chrono::seconds(5);
  if (wait_reported_ || now - *waiting_since_ < kReportAfter) return;
  wait_reported_ = true;
  spdlog::info(
      "epoch {}: no step for {} s, {} (bounded by alignment.start_wait_ms {} while a rank has "
      "received nothing of the epoch, then max_wait_ms {})",
      epoch, std::chrono::duration_cast<std::chrono::seconds>(now - *waiting_since_).count(), outcome.reason,
      config_.start_wait_ms, config_.max_wait_ms);
}

}  // namespace odb
