#include "src/daemon/endpoint_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace odb {

EndpointLock::~EndpointLock() { Release(); }

void EndpointLock::Release() {
  for (int fd : fds_) close(fd);  // closing drops the flock
  fds_.clear();
}

std::vector<std::string> EndpointLock::PathsFor(const std::string& run_dir, int rank,
                                                const std::vector<std::string>& endpoints) {
  std::vector<std::string> paths = {run_dir + "/odbd-rank-" + std::to_string(rank) + ".lock"};
  for (const auto& e : endpoints) {
    if (e.rfind("ipc://", 0) == 0) paths.push_back(e.substr(6) + ".lock");
  }
  return paths;
}

absl::Status EndpointLock::Acquire(const std::vector<std::string>& lock_paths) {
  for (const auto& path : lock_paths) {
    std::error_code ignored;
    std::filesystem::path p(path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ignored);
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      Release();
      return absl::PermissionDeniedError("cannot open the lock file " + path + ": " + std::strerror(errno));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      char holder[32] = {0};
      (void)!pread(fd, holder, sizeof(holder) - 1, 0);
      close(fd);
      Release();
      return absl::AlreadyExistsError("another odbd (pid " + std::string(holder[0] ? holder : "unknown") +
                                      ") holds " + path +
                                      ": it serves the same rank in this run_dir or binds the same socket; "
                                      "stop it, or give this daemon its own --run-dir / --rank");
    }
    const std::string pid = std::to_string(getpid());
    if (ftruncate(fd, 0) == 0) (void)!pwrite(fd, pid.data(), pid.size(), 0);
    fds_.push_back(fd);
  }
  return absl::OkStatus();
}

}  // namespace odb
