#include "src/emit/credit_queue.h"

#include <algorithm>
#include <utility>

namespace odb::emit {

std::vector<zmq::message_t> CreditQueue::CopyParts(std::vector<zmq::message_t>& parts) {
  std::vector<zmq::message_t> copy;
  copy.reserve(parts.size());
  for (auto& p : parts) {
    zmq::message_t c;
    c.copy(p);
    copy.push_back(std::move(c));
  }
  return copy;
}

void CreditQueue::PushStep(std::vector<zmq::message_t>&& parts, std::shared_ptr<StepArena> arena) {
  MutexLock lock(mu_);
  out_.push_back({std::move(parts), true, std::move(arena)});
  ++queued_steps_;
}

void CreditQueue::PushControl(std::vector<zmq::message_t>&& parts) {
  MutexLock lock(mu_);
  out_.push_back({std::move(parts), false, nullptr});
}

void CreditQueue::PushFront(std::vector<zmq::message_t>&& parts) {
  MutexLock lock(mu_);
  out_.push_front({std::move(parts), false, nullptr});
}

size_t CreditQueue::QueuedSteps() const {
  MutexLock lock(mu_);
  return queued_steps_;
}

bool CreditQueue::Empty() const {
  MutexLock lock(mu_);
  return out_.empty();
}

std::optional<CreditQueue::Message> CreditQueue::Next() {
  MutexLock lock(mu_);
  if (out_.empty() || (out_.front().is_step && credits_ == 0)) return std::nullopt;
  Message message = std::move(out_.front());
  out_.pop_front();
  return message;
}

void CreditQueue::Unsend(Message message) {
  MutexLock lock(mu_);
  out_.push_front(std::move(message));
}

void CreditQueue::Sent(std::vector<zmq::message_t> parts, bool is_step) {
  if (is_step) {
    --credits_;
    ++delivered_in_epoch_;
    in_flight_.push_back({std::move(parts), true});
    MutexLock lock(mu_);
    --queued_steps_;
    return;
  }
  // Control messages: an epoch summary closes the epoch's deliveries. Kept
  // like a step: a blip may lose it, and the trainer would wait for its
  // epoch's end forever (the client drops a summary it has).
  delivered_in_epoch_ = 0;
  in_flight_.push_back({std::move(parts), false});
  if (in_flight_.size() - UnacknowledgedSteps() > kControlsKept) {
    in_flight_.erase(
        std::find_if(in_flight_.begin(), in_flight_.end(), [](const InFlight& m) { return !m.is_step; }));
  }
}

void CreditQueue::Credit(uint32_t steps) {
  for (uint32_t i = 0; i < steps; ++i) {
    // The oldest step sent has arrived, and what was sent before it (ordered delivery): summaries too.
    auto step =
        std::find_if(in_flight_.begin(), in_flight_.end(), [](const InFlight& m) { return m.is_step; });
    if (step == in_flight_.end()) break;
    in_flight_.erase(in_flight_.begin(), step + 1);
  }
  credits_ = std::min<uint64_t>(credits_ + steps, depth_);
}

void CreditQueue::Reset() {
  credits_ = depth_;
  in_flight_.clear();
}

size_t CreditQueue::UnacknowledgedSteps() const {
  return static_cast<size_t>(
      std::count_if(in_flight_.begin(), in_flight_.end(), [](const InFlight& m) { return m.is_step; }));
}

}  // namespace odb::emit
