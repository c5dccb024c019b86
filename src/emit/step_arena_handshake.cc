#include "src/emit/step_arena_handshake.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

namespace odb::emit {

absl::Status StepArenaHandshake::Listen(const std::string& bound_endpoint) {
  if (!options_.enabled || bound_endpoint.rfind("ipc://", 0) != 0) return absl::OkStatus();
  absl::Status s = server_.Listen(StepArenaSocketPath(bound_endpoint.substr(6)));
  if (!s.ok()) {
    if (options_.required) return s;
    spdlog::warn("step arena off, steps go to the trainer as frames: {}", std::string(s.message()));
  }
  server_.Start();
  return absl::OkStatus();
}

absl::StatusOr<std::optional<wire::DaemonMessage>> StepArenaHandshake::NewSession() {
  SetState(nullptr, false);  // steps of the new session go as frames until it has mapped its arena
  offered_.reset();
  server_.Publish(nullptr);
  if (!server_.listening()) return std::nullopt;
  absl::StatusOr<std::shared_ptr<StepArena>> arena = StepArena::Create(options_.arena_bytes, clock_);
  if (!arena.ok()) {
    const std::string text = "cannot create a step arena of " + std::to_string(options_.arena_bytes) +
                             " bytes (shm.step_arena_bytes): " + std::string(arena.status().message());
    if (options_.required) return absl::InternalError(text + " (shm.trainer_data_plane: shm)");
    spdlog::warn("{}; steps go to the trainer as frames", text);
    return std::nullopt;
  }
  offered_ = *arena;
  server_.Publish(offered_);
  wire::DaemonMessage offer;
  offer.set_version(wire::PROTOCOL_VERSION_CURRENT);
  offer.mutable_step_arena()->set_generation(offered_->generation());
  offer.mutable_step_arena()->set_capacity_bytes(offered_->capacity_bytes());
  offer.mutable_step_arena()->set_socket_path(server_.path());
  return offer;
}

void StepArenaHandshake::OfferDelivered() { SetState(nullptr, true); }

absl::Status StepArenaHandshake::OnReply(const wire::StepArenaReply& reply) {
  if (offered_ == nullptr || reply.generation() != offered_->generation()) {
    spdlog::warn("trainer answered a step arena offer of generation {} that is not this session's; ignored",
                 reply.generation());
    return absl::OkStatus();
  }
  if (!reply.attached()) {
    const std::string text = "the trainer did not map the step arena: " + reply.error();
    offered_.reset();
    server_.Publish(nullptr);
    SetState(nullptr, false);
    if (options_.required) return absl::InternalError(text + " (shm.trainer_data_plane: shm)");
    spdlog::info("{}; steps go as frames", text);
    return absl::OkStatus();
  }
  spdlog::info("the trainer mapped the step arena ({} bytes); steps go through shared memory",
               offered_->capacity_bytes());
  SetState(offered_, false);
  return absl::OkStatus();
}

void StepArenaHandshake::SetState(std::shared_ptr<StepArena> active, bool pending) {
  {
    MutexLock lock(mu_);
    active_ = std::move(active);
    pending_ = pending;
  }
  cv_.NotifyAll();
}

std::shared_ptr<StepArena> StepArenaHandshake::Active() const {
  MutexLock lock(mu_);
  return active_;
}

std::shared_ptr<StepArena> StepArenaHandshake::ForNextStep() {
  MutexLock lock(mu_);
  if (!pending_) return active_;
  const Clock::TimePoint deadline = clock_.Now() + options_.offer_wait;
  for (Clock::TimePoint now = clock_.Now(); pending_ && now < deadline; now = clock_.Now()) {
    cv_.WaitFor(mu_, std::min<Clock::TimePoint::duration>(deadline - now, kClockRecheck));
  }
  if (pending_) {
    pending_ = false;
    spdlog::warn(
        "the trainer has not answered its step arena offer within {} ms (is it calling Next()?); "
        "its steps go as frames until it does",
        options_.offer_wait.count());
  }
  return active_;
}

}  // namespace odb::emit
