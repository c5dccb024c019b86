#include "odb/resume.h"

#include <nlohmann/json.hpp>

namespace odb::client {

std::optional<ReplayPoint> ReplayPoint::After(const StepInfo& last) {
  if (!last.deterministic) return std::nullopt;
  ReplayPoint p;
  p.next_step = last.step_index + 1;
  if (p.next_step >= last.round_first_step + last.round_steps) {
    p.round = last.round + 1;  // its round is complete: the next one starts fresh
    p.first_step = p.next_step;
  } else {
    p.round = last.round;
    p.first_step = last.round_first_step;
  }
  return p;
}

void ConsumedSet::Add(uint64_t id) {
  if (id < cursor_) return;
  extra_.insert(id);
  Compact();
}

void ConsumedSet::AddStep(const StepInfo& step) {
  for (uint64_t id : step.sample_ids) Add(id);
}

void ConsumedSet::Merge(const ConsumedSet& other) {
  if (other.cursor_ > cursor_) {
    extra_.erase(extra_.begin(), extra_.lower_bound(other.cursor_));
    cursor_ = other.cursor_;
  }
  for (uint64_t id : other.extra_) {
    if (id >= cursor_) extra_.insert(id);
  }
  Compact();
}

void ConsumedSet::Compact() {
  while (!extra_.empty() && *extra_.begin() == cursor_) {
    extra_.erase(extra_.begin());
    ++cursor_;
  }
}

std::string ConsumedSet::Serialize(uint32_t epoch) const {
  nlohmann::json j;
  j["format"] = "odb.ConsumedSet";
  j["version"] = kVersion;
  j["epoch"] = epoch;
  j["consumed"]["cursor"] = cursor_;
  j["consumed"]["extra"] = std::vector<uint64_t>(extra_.begin(), extra_.end());
  return j.dump();
}

absl::StatusOr<ConsumedSet::Parsed> ConsumedSet::Parse(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("odb consumed-set state is not JSON (corrupt or truncated)");
  }
  if (!j.contains("format") || j["format"] != "odb.ConsumedSet") {
    return absl::InvalidArgumentError("not an odb consumed-set state (no \"format\": \"odb.ConsumedSet\")");
  }
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != kVersion) {
    return absl::InvalidArgumentError("odb consumed-set state version " +
                                      (j.contains("version") ? j["version"].dump() : std::string("missing")) +
                                      " is not supported (this client reads version " +
                                      std::to_string(kVersion) + ")");
  }
  const auto& c = j.contains("consumed") ? j["consumed"] : nlohmann::json();
  if (!j.contains("epoch") || !j["epoch"].is_number_unsigned() || !c.is_object() || !c.contains("cursor") ||
      !c["cursor"].is_number_unsigned() || !c.contains("extra") || !c["extra"].is_array()) {
    return absl::InvalidArgumentError("odb consumed-set state is truncated (epoch, consumed.cursor or "
                                      "consumed.extra missing or not a non-negative integer)");
  }
  Parsed out;
  out.epoch = j["epoch"].get<uint32_t>();
  out.consumed.cursor_ = c["cursor"].get<uint64_t>();
  uint64_t previous = 0;
  bool first = true;
  for (const auto& v : c["extra"]) {
    if (!v.is_number_unsigned()) return absl::InvalidArgumentError("odb consumed-set state: extra holds a non-id");
    const uint64_t id = v.get<uint64_t>();
    if (id < out.consumed.cursor_ || (!first && id <= previous)) {
      return absl::InvalidArgumentError("odb consumed-set state: extra is not sorted above the cursor");
    }
    out.consumed.extra_.insert(id);
    previous = id;
    first = false;
  }
  out.consumed.Compact();
  return out;
}

}  // namespace odb::client
