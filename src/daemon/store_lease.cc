#include "src/daemon/store_lease.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace odb {
namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A pid from a marker is alive when /proc has it and it is not a zombie.
bool PidAlive(const std::string& pid) {
  if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) return false;
  const std::string stat = ReadSmallFile("/proc/" + pid + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace

std::string StoreLease::JobDir(const std::string& store_dir, const std::string& job_id) {
  return store_dir + "/" + job_id;
}

absl::StatusOr<std::unique_ptr<StoreLease>> StoreLease::Acquire(const std::string& store_dir,
                                                               const std::string& job_id, int rank) {
  std::error_code ec;
  std::filesystem::create_directories(store_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError("cannot create alignment.store_dir '" + store_dir + "': " + ec.message());
  }
  const std::string lease_path = store_dir + "/" + job_id + ".lease";
  const std::string job_dir = JobDir(store_dir, job_id);
  const int fd = open(lease_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    return absl::PermissionDeniedError("cannot open the rendezvous lease " + lease_path + ": " +
                                       std::strerror(errno));
  }
  bool removed_stale = false;
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
    // No live daemon of this job id: whatever is in its directory is a
    // previous run's, and nobody of this run has written there yet (they
    // write only under the shared lock, which waits for this one).
    if (std::filesystem::exists(job_dir, ec)) {
      std::filesystem::remove_all(job_dir, ec);
      if (ec) {
        close(fd);
        return absl::FailedPreconditionError("cannot remove the stale rendezvous directory " + job_dir +
                                             " of a previous run of job '" + job_id + "': " + ec.message());
      }
      removed_stale = true;
    }
  }
  // Shared from here on (a conversion when the exclusive lock was taken). It
  // waits while another daemon of the job removes stale keys.
  while (flock(fd, LOCK_SH) != 0) {
    if (errno != EINTR) {
      const std::string why = std::strerror(errno);
      close(fd);
      return absl::UnavailableError("cannot lock the rendezvous lease " + lease_path + ": " + why);
    }
  }
  std::filesystem::create_directories(job_dir, ec);
  if (ec) {
    close(fd);
    return absl::FailedPreconditionError("cannot create the rendezvous directory " + job_dir + ": " +
                                         ec.message());
  }
  // One marker per rank, created exclusively: a second daemon for a rank of a
  // live job id is refused here instead of failing inside Gloo.
  const std::string marker = job_dir + "/odbd-rank-" + std::to_string(rank) + ".pid";
  const int m = open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (m < 0) {
    const int err = errno;
    close(fd);
    if (err != EEXIST) {
      return absl::PermissionDeniedError("cannot create " + marker + ": " + std::strerror(err));
    }
    std::string holder = ReadSmallFile(marker);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    const bool alive = PidAlive(holder);
    return absl::AlreadyExistsError(
        "job id '" + job_id + "' is in use: rank " + std::to_string(rank) + " of a job with this id is already " +
        "registered in " + job_dir + " by odbd pid " + (holder.empty() ? "unknown" : holder) +
        (alive ? " (still running)" : " (gone, but other daemons of that job id are still running)") +
        ". Two jobs share one job id and run_dir: give this job its own --job-id (odb.launch and "
        "odb.spawn_daemon pick a fresh one when none is given), or stop the other job first");
  }
  const std::string pid = std::to_string(getpid()) + "\n";
  (void)!write(m, pid.data(), pid.size());
  close(m);
  return std::unique_ptr<StoreLease>(new StoreLease(fd, job_dir, marker, removed_stale));
}

StoreLease::~StoreLease() {
  std::error_code ec;
  std::filesystem::remove(marker_, ec);
  // The last daemon of the job out removes its keys: the next run with this
  // id starts from an empty directory even without the start-up cleanup.
  if (flock(fd_, LOCK_EX | LOCK_NB) == 0) std::filesystem::remove_all(job_dir_, ec);
  close(fd_);  // drops the lock
}

}  // namespace odb
