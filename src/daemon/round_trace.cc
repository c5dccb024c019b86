#include "src/daemon/round_trace.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace odb {
namespace {

constexpr auto kWarningInterval = std::chrono::minutes(1);

std::string Errno(int err) { return std::strerror(err); }

}  // namespace

absl::StatusOr<std::unique_ptr<RoundTrace>> RoundTrace::Open(const std::string& path) {
  const std::string what = "round_trace: cannot write '" + path + "'";
  // O_NONBLOCK: opening a FIFO that nobody reads fails (ENXIO) instead of
  // waiting for a reader. No O_TRUNC yet: the lock comes first.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return absl::FailedPreconditionError(
        what + ": " + Errno(err) +
        (err == ENXIO ? " (a FIFO or socket with no reader; give a regular file)" : ""));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISCHR(st.st_mode))) {
    ::close(fd);
    return absl::FailedPreconditionError(what +
                                         ": not a regular file (a FIFO or socket would block or refuse "
                                         "the writes); give a file path");
  }
  if (S_ISREG(st.st_mode)) {
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::FailedPreconditionError(
          what + ": " +
          (err == EWOULDBLOCK ? std::string("another process writes it (two daemons given the same path? put "
                                            "{rank} in it)")
                              : "cannot lock it: " + Errno(err)));
    }
    if (::ftruncate(fd, 0) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::FailedPreconditionError(what + ": cannot truncate it: " + Errno(err));
    }
  }
  return std::unique_ptr<RoundTrace>(new RoundTrace(fd, path));
}

RoundTrace::~RoundTrace() {
  if (dropped_ > 0) {
    spdlog::warn("round_trace '{}': {} of {} round line(s) could not be written and were dropped", path_,
                 dropped_, dropped_ + written_);
  }
  ::close(fd_);  // the lock goes with it
}

void RoundTrace::Append(uint64_t round, int64_t entry_ns, int64_t exit_ns, int64_t cpu_ns) {
  char line[96];
  const int n = std::snprintf(line, sizeof(line), "%" PRIu64 " %" PRId64 " %" PRId64 " %" PRId64 "\n", round,
                              entry_ns, exit_ns, cpu_ns);
  ssize_t wrote;
  do {
    wrote = ::write(fd_, line, static_cast<size_t>(n));
  } while (wrote < 0 && errno == EINTR);
  if (wrote == n) {
    ++written_;
    return;
  }
  // Dropped (a short write leaves a partial line: the reader skips it).
  const int err = wrote < 0 ? errno : ENOSPC;
  ++dropped_;
  const auto now = std::chrono::steady_clock::now();
  if (!last_warning_ || now - *last_warning_ >= kWarningInterval) {
    last_warning_ = now;
    spdlog::warn(
        "round_trace '{}': round {}'s line not written ({}); the round goes on without it "
        "({} line(s) dropped so far; told at most once a minute)",
        path_, round, Errno(err), dropped_);
  }
}

}  // namespace odb
