#ifndef ODB_DAEMON_STORE_LEASE_H_
#define ODB_DAEMON_STORE_LEASE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace odb {

// The FileStore rendezvous of one job lives in its own directory,
// "<store_dir>/<job_id>/", and every daemon of the job holds a shared flock on
// "<store_dir>/<job_id>.lease" for its whole life. Gloo's FileStore refuses to
// overwrite a key ("File already exists"), so the keys a previous run left
// behind (killed daemons, or any run of the same job id) would make every
// rank of a second run fail. With the lease:
//  - the first daemon of a run that finds no live holder (an exclusive
//    non-blocking flock succeeds) knows every key there is stale and removes
//    the directory before anyone of the new run writes to it;
//  - the last daemon to leave (the same test at exit) removes it too;
//  - a daemon whose rank is already registered by a live daemon of the same
//    job id (two jobs with one id) fails at once, naming that daemon.
// The kernel drops flocks when a process dies, so SIGKILLed runs never block
// the next one. flock works on local filesystems and NFSv4 (the shared
// directory a multi-host FileStore needs).
class StoreLease {
 public:
  ~StoreLease();
  StoreLease(const StoreLease&) = delete;
  StoreLease& operator=(const StoreLease&) = delete;

  // Takes the lease for `rank` of job `job_id` under `store_dir` (created if
  // missing). Errors name the path; a live daemon holding this rank of the
  // same job id is AlreadyExists, naming its pid and what to do.
  static absl::StatusOr<std::unique_ptr<StoreLease>> Acquire(const std::string& store_dir,
                                                            const std::string& job_id, int rank);

  // The directory the job's FileStore uses.
  static std::string JobDir(const std::string& store_dir, const std::string& job_id);

  // True when the lease removed a previous run's keys at start-up.
  bool removed_stale() const { return removed_stale_; }

 private:
  StoreLease(int fd, std::string job_dir, std::string marker, bool removed_stale)
      : fd_(fd), job_dir_(std::move(job_dir)), marker_(std::move(marker)), removed_stale_(removed_stale) {}
  int fd_;
  std::string job_dir_;
  std::string marker_;
  bool removed_stale_;
};

}  // namespace odb

#endif  // ODB_DAEMON_STORE_LEASE_H_
