#include "src/align/failure_report.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "proto/peer.pb.h"
#include "src/align/peer_wire.h"

namespace odb::align {

std::string EncodeFailureReport(const FailureReport& report) {
  peer::FailureReport p;
  p.set_timed_out(report.timed_out);
  p.set_stopped_ms(static_cast<uint64_t>(std::max<int64_t>(0, report.stopped.count())));
  return EncodePeerMessage(p);
}

absl::StatusOr<FailureReport> DecodeFailureReport(std::string_view bytes) {
  peer::FailureReport p;
  if (absl::Status s = ParsePeerMessage(bytes, "failure report", p); !s.ok()) return s;
  FailureReport report;
  report.timed_out = p.timed_out();
  constexpr uint64_t kMaxMs = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  report.stopped = std::chrono::milliseconds(static_cast<int64_t>(std::min(p.stopped_ms(), kMaxMs)));
  return report;
}

std::string EncodeFailureCause(const std::string& cause) {
  peer::FailureCause p;
  p.set_cause(cause);
  return EncodePeerMessage(p);
}

absl::StatusOr<std::string> DecodeFailureCause(std::string_view bytes) {
  peer::FailureCause p;
  if (absl::Status s = ParsePeerMessage(bytes, "failure cause", p); !s.ok()) return s;
  return std::move(*p.mutable_cause());
}

}  // namespace odb::align
