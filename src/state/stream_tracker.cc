#include "src/state/stream_tracker.h"

namespace odb {
namespace {

wire::Rejection Reject(wire::ErrorCode code, const std::string& producer, const std::string& message,
                       const uint64_t* sample_id) {
  wire::Rejection r;
  r.set_code(code);
  r.set_producer_id(producer);
  r.set_message(message);
  if (sample_id != nullptr) {
    r.set_sample_id(*sample_id);
    r.set_has_sample_id(true);
  }
  return r;
}

}  // namespace

void StreamTracker::OnHello(const std::string& producer_id) { producers_.insert(producer_id); }

std::optional<wire::Rejection> StreamTracker::OnSample(const std::string& producer_id, uint32_t epoch,
                                                       uint64_t sample_id) {
  if (!producers_.count(producer_id)) {
    return Reject(wire::UNKNOWN_PRODUCER, producer_id,
                  "sample " + std::to_string(sample_id) + " comes from producer '" + producer_id +
                      "', which never sent hello; call Producer::Connect before sending",
                  &sample_id);
  }
  if (quota_closed_.count(epoch)) {
    return Reject(wire::LATE_FOR_CLOSED_EPOCH, producer_id,
                  "sample " + std::to_string(sample_id) + " from producer '" + producer_id +
                      "' arrived after Non-Join epoch " + std::to_string(epoch) +
                      " closed; it was not emitted",
                  &sample_id);
  }
  if (closed_.count(epoch)) {
    return Reject(wire::WRONG_EPOCH, producer_id,
                  "sample " + std::to_string(sample_id) + " from producer '" + producer_id +
                      "' belongs to epoch " + std::to_string(epoch) + ", which has already ended",
                  &sample_id);
  }
  EpochStream& stream = epochs_[epoch];
  if (stream.ended.count(producer_id)) {
    return Reject(wire::WRONG_EPOCH, producer_id,
                  "sample " + std::to_string(sample_id) + " arrived after producer '" + producer_id +
                      "' ended its stream for epoch " + std::to_string(epoch),
                  &sample_id);
  }
  ++stream.received_by_producer[producer_id];
  ++stream.received;
  return std::nullopt;
}

std::optional<wire::Rejection> StreamTracker::OnEndStream(const std::string& producer_id, uint32_t epoch,
                                                          uint64_t samples_sent) {
  if (!producers_.count(producer_id)) {
    return Reject(wire::UNKNOWN_PRODUCER, producer_id,
                  "end_stream from producer '" + producer_id + "', which never sent hello", nullptr);
  }
  if (quota_closed_.count(epoch)) return std::nullopt;  // the stream ran past quota closure
  if (closed_.count(epoch)) {
    return Reject(wire::WRONG_EPOCH, producer_id,
                  "end_stream from producer '" + producer_id + "' for epoch " + std::to_string(epoch) +
                      ", which has already ended",
                  nullptr);
  }
  EpochStream& stream = epochs_[epoch];
  if (!stream.ended.insert(producer_id).second) {
    return Reject(
        wire::MALFORMED_HEADER, producer_id,
        "producer '" + producer_id + "' ended its stream for epoch " + std::to_string(epoch) + " twice",
        nullptr);
  }
  // Refused samples arrived too (each has its own rejection): they count.
  uint64_t refused = 0;
  if (auto it = refused_.find({producer_id, epoch}); it != refused_.end()) {
    refused = it->second;
    refused_.erase(it);
  }
  const uint64_t arrived = stream.received_by_producer[producer_id] + refused;
  if (arrived != samples_sent) {
    return Reject(wire::COUNT_MISMATCH, producer_id,
                  "producer '" + producer_id + "' reports " + std::to_string(samples_sent) +
                      " samples sent for epoch " + std::to_string(epoch) + " but " + std::to_string(arrived) +
                      " arrived",
                  nullptr);
  }
  return std::nullopt;
}

bool StreamTracker::StreamFinished(uint32_t epoch, uint32_t expected_producers) const {
  auto it = epochs_.find(epoch);
  return it != epochs_.end() && it->second.ended.size() >= expected_producers;
}

bool StreamTracker::StreamStarted(uint32_t epoch) const {
  auto it = epochs_.find(epoch);
  return it != epochs_.end() && (it->second.received > 0 || !it->second.ended.empty());
}

uint64_t StreamTracker::Received(uint32_t epoch) const {
  auto it = epochs_.find(epoch);
  return it == epochs_.end() ? 0 : it->second.received;
}

std::vector<std::string> StreamTracker::OpenProducers(uint32_t epoch) const {
  std::vector<std::string> open;
  auto it = epochs_.find(epoch);
  for (const auto& p : producers_) {
    if (it == epochs_.end() || !it->second.ended.count(p)) open.push_back(p);
  }
  return open;
}

std::vector<std::string> StreamTracker::ActiveProducers(uint32_t epoch) const {
  std::vector<std::string> active;
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return active;
  for (const auto& [p, n] : it->second.received_by_producer) {
    if (!it->second.ended.count(p)) active.push_back(p);
  }
  return active;
}

size_t StreamTracker::EndedCount(uint32_t epoch) const {
  auto it = epochs_.find(epoch);
  return it == epochs_.end() ? 0 : it->second.ended.size();
}

bool StreamTracker::HasEnded(const std::string& producer_id, uint32_t epoch) const {
  auto it = epochs_.find(epoch);
  return it != epochs_.end() && it->second.ended.count(producer_id) > 0;
}

std::optional<std::pair<uint32_t, uint32_t>> StreamTracker::OpenEpochRange() const {
  // Closing erases an epoch's stream, so every entry left is open.
  if (epochs_.empty()) return std::nullopt;
  return std::make_pair(epochs_.begin()->first, epochs_.rbegin()->first);
}

std::vector<uint32_t> StreamTracker::OpenEpochsBefore(uint32_t epoch) const {
  std::vector<uint32_t> before;
  for (auto it = epochs_.begin(); it != epochs_.end() && it->first < epoch; ++it) before.push_back(it->first);
  return before;
}

void StreamTracker::NoteRefused(const std::string& producer_id, uint32_t epoch) {
  auto it = refused_.find({producer_id, epoch});
  if (it != refused_.end()) {
    ++it->second;
  } else if (refused_.size() < kMaxRefusedStreams) {
    refused_.emplace(std::make_pair(producer_id, epoch), 1);
  }
}

uint64_t StreamTracker::Refused(const std::string& producer_id, uint32_t epoch) const {
  auto it = refused_.find({producer_id, epoch});
  return it == refused_.end() ? 0 : it->second;
}

void StreamTracker::CloseEpoch(uint32_t epoch, bool quota_closed) {
  closed_.insert(epoch);
  if (quota_closed) quota_closed_.insert(epoch);
  epochs_.erase(epoch);
  std::erase_if(refused_, [&](const auto& entry) { return entry.first.second == epoch; });
}

}  // namespace odb
