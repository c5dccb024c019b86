#ifndef ODB_DAEMON_ENDPOINT_LOCK_H_
#define ODB_DAEMON_ENDPOINT_LOCK_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace odb {

// Exclusive locks (flock) that one odbd holds for its life: one per ipc://
// socket path it binds ("<path>.lock") and one for its rank in run_dir. A
// second daemon for the same rank and run_dir (or the same socket paths)
// fails at start with the first one's pid, instead of silently taking the
// sockets over and leaving the first one orphaned. The kernel drops the locks
// when the process dies, so a crashed daemon never blocks a restart.
class EndpointLock {
 public:
  EndpointLock() = default;
  ~EndpointLock();
  EndpointLock(const EndpointLock&) = delete;
  EndpointLock& operator=(const EndpointLock&) = delete;

  // Takes every lock or none; the error names the path and the holder's pid.
  absl::Status Acquire(const std::vector<std::string>& lock_paths);

  // The lock files for a daemon: rank lock in run_dir plus ipc endpoints.
  static std::vector<std::string> PathsFor(const std::string& run_dir, int rank,
                                           const std::vector<std::string>& endpoints);

 private:
  void Release();
  std::vector<int> fds_;
};

}  // namespace odb

#endif  // ODB_DAEMON_ENDPOINT_LOCK_H_
