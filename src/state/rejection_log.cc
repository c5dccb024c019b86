#include "src/state/rejection_log.h"

#include <string>

namespace odb {
namespace {

void Shorten(std::string* s, size_t max) {
  if (s->size() <= max) return;
  const size_t dropped = s->size() - max;
  s->resize(max);
  s->append("...(" + std::to_string(dropped) + " more bytes)");
}

}  // namespace

void RejectionLog::Truncate(wire::Rejection& rejection) {
  Shorten(rejection.mutable_producer_id(), kMaxProducerIdBytes);
  Shorten(rejection.mutable_message(), kMaxMessageBytes);
}

bool RejectionLog::Record(wire::Rejection rejection, uint32_t epoch) {
  Truncate(rejection);
  EpochRecord& record = epochs_[epoch];
  ++record.count;
  if (record.kept.size() >= max_kept_) return false;
  if (unreported_.size() < kMaxUnreported) unreported_.push_back(rejection);
  record.kept.push_back(std::move(rejection));
  return true;
}

std::vector<wire::Rejection> RejectionLog::TakeUnreported() {
  std::vector<wire::Rejection> out;
  out.swap(unreported_);
  return out;
}

RejectionLog::EpochRecord RejectionLog::TakeEpoch(uint32_t epoch) {
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return {};
  EpochRecord out = std::move(it->second);
  epochs_.erase(it);
  return out;
}

uint64_t RejectionLog::Count(uint32_t epoch) const {
  auto it = epochs_.find(epoch);
  return it == epochs_.end() ? 0 : it->second.count;
}

}  // namespace odb
