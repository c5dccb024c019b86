#ifndef ODB_ALIGN_FAILURE_REPORT_H_
#define ODB_ALIGN_FAILURE_REPORT_H_

// What a rank of a Gloo peer group leaves in the rendezvous store when it
// fails, for its peers' diagnosis (GlooPeerGroup::DiagnoseFailure and
// ReportFailure): the messages FailureReport and FailureCause of
// proto/peer.proto, read through src/align/peer_wire.h.

#include <chrono>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace odb::align {

// A rank whose collective failed: whether it timed out, and how long its
// process did not run when that explains the failure (else 0).
struct FailureReport {
  bool timed_out = false;
  std::chrono::milliseconds stopped{0};
};

std::string EncodeFailureReport(const FailureReport& report);
absl::StatusOr<FailureReport> DecodeFailureReport(std::string_view bytes);

// Why a rank failed the job for a reason of its own (its text, as is).
std::string EncodeFailureCause(const std::string& cause);
absl::StatusOr<std::string> DecodeFailureCause(std::string_view bytes);

}  // namespace odb::align

#endif  // ODB_ALIGN_FAILURE_REPORT_H_
