#ifndef ODB_CLIENT_FORK_GUARD_H_
#define ODB_CLIENT_FORK_GUARD_H_

#include <unistd.h>

#include <string>

#include "absl/status/status.h"

namespace odb::client {

// A ZeroMQ context belongs to the process that created it: its I/O threads
// do not exist in a fork()ed child, and zmq_ctx_term on the child's copy
// waits for them forever (a Consumer garbage-collected in a DataLoader worker
// or in a test's forked rank spun at 100% CPU until killed). A Producer or
// Consumer remembers its owner; a forked copy refuses to be used and, when
// destroyed, leaves the copy's sockets and context alone (their memory goes
// with the child's exit; the parent still owns the real ones).
class ForkGuard {
 public:
  bool forked() const { return getpid() != owner_; }

  // OK in the process that created `what`; FailedPrecondition in a fork of it.
  absl::Status Check(const std::string& what) const {
    if (!forked()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        what + " was created in process " + std::to_string(owner_) + " and cannot be used in process " +
        std::to_string(getpid()) + ", a fork of it: ZeroMQ sockets do not survive fork(); create a new one "
        "in the child (after the fork), e.g. in a DataLoader worker's worker_init_fn");
  }

 private:
  pid_t owner_ = getpid();
};

}  // namespace odb::client

#endif  // ODB_CLIENT_FORK_GUARD_H_
