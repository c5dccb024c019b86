#include "src/common/fd_budget.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "src/common/mutex.h"

namespace odb {
namespace {

constexpr uint64_t kMinReserve = 32;

std::atomic<int64_t> g_high_water{-1};  // an accepted fd >= this is refused; -1: no guard
std::atomic<uint64_t> g_max_connections{UINT64_MAX};
std::atomic<uint64_t> g_limit{0};
std::atomic<uint64_t> g_reserve{0};
std::atomic<uint64_t> g_refused{0};
std::atomic<int64_t> g_last_log_ms{0};
Mutex g_reserve_mu;
int g_reserve_fd ABSL_GUARDED_BY(g_reserve_mu) = -1;  // freed to take one connection off the backlog

// "ipc:///run/odb/ingest.sock" or "tcp port 5555": which listener refused.
std::string ListenerName(int listen_fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "a listener";
  if (a.ss_family == AF_UNIX) {
    const auto* un = reinterpret_cast<const sockaddr_un*>(&a);
    return std::string("ipc://") + un->sun_path;
  }
  if (a.ss_family == AF_INET)
    return "tcp port " + std::to_string(ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port));
  if (a.ss_family == AF_INET6) {
    return "tcp port " + std::to_string(ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port));
  }
  return "a listener";
}

// One line a second at most: a flood must not flood the log too.
void LogRefusal(int listen_fd, const char* why) {
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
  int64_t last = g_last_log_ms.load();
  if (now_ms - last < 1000 || !g_last_log_ms.compare_exchange_strong(last, now_ms)) return;
  spdlog::warn(
      "file descriptors exhausted: refused a connection on {} ({}; {} open, limit {}, {} kept in reserve); "
      "connected producers and trainers are served on; {} connections refused so far. Raise the hard "
      "limit (ulimit -Hn / LimitNOFILE) for more connections",
      ListenerName(listen_fd), why, OpenDescriptors(), g_limit.load(), g_reserve.load(), g_refused.load());
}

// Turns an exhausted or over-budget accept into a refused connection.
int Guard(int listen_fd, int accepted, int saved_errno, int flags) {
  if (g_high_water.load(std::memory_order_relaxed) < 0) {
    errno = saved_errno;
    return accepted;
  }
  if (accepted >= 0) {
    if (!AcceptGuardRefuses(accepted)) return accepted;
    close(accepted);
    g_refused.fetch_add(1);
    LogRefusal(listen_fd, "over budget");
    errno = ECONNABORTED;
    return -1;
  }
  if (saved_errno != EMFILE && saved_errno != ENFILE) {
    errno = saved_errno;
    return -1;
  }
  // No descriptor at all: free the reserve one, take the connection off the
  // backlog (else the listener stays readable and its thread spins), close it.
  // (The kernel takes a descriptor before it looks at the backlog, so an
  // empty backlog says EMFILE too: that stays "nothing to accept".)
  int retry_errno = EMFILE;
  {
    MutexLock lock(g_reserve_mu);
    pollfd ready{listen_fd, POLLIN, 0};
    if (poll(&ready, 1, 0) != 1) {
      retry_errno = EAGAIN;  // nothing waiting (a blocking listener must not block here)
    } else if (g_reserve_fd >= 0) {
      close(g_reserve_fd);
      const int fd =
          static_cast<int>(syscall(SYS_accept4, listen_fd, nullptr, nullptr, flags | SOCK_CLOEXEC));
      retry_errno = fd >= 0 ? 0 : errno;
      if (fd >= 0) close(fd);
      g_reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
  }
  if (retry_errno == EAGAIN || retry_errno == EWOULDBLOCK || retry_errno == EINTR) {
    errno = retry_errno;
    return -1;
  }
  g_refused.fetch_add(1);
  LogRefusal(listen_fd, saved_errno == EMFILE ? "EMFILE" : "ENFILE");
  errno = ECONNABORTED;
  return -1;
}

}  // namespace

absl::StatusOr<DescriptorLimit> RaiseDescriptorLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) {
    return absl::InternalError(std::string("cannot read RLIMIT_NOFILE: ") + strerror(errno));
  }
  DescriptorLimit out;
  out.soft_before = r.rlim_cur;
  out.hard = r.rlim_max;
  if (r.rlim_cur < r.rlim_max) {
    rlimit raised = r;
    raised.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) r = raised;
  }
  out.soft = r.rlim_cur;
  return out;
}

DescriptorBudget BudgetFor(uint64_t limit) {
  DescriptorBudget b;
  b.limit = limit;
  b.reserve = std::max<uint64_t>(kMinReserve, limit / 8);
  b.max_connections = limit > b.reserve ? limit - b.reserve : 0;
  return b;
}

void InstallAcceptGuard(const DescriptorBudget& budget) {
  {
    MutexLock lock(g_reserve_mu);
    if (g_reserve_fd < 0) g_reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  g_max_connections.store(budget.max_connections);
  g_limit.store(budget.limit);
  g_reserve.store(budget.reserve);
  // Descriptors are numbered lowest-free first: an accepted one numbered at
  // or above limit - reserve means fewer than `reserve` are left.
  g_high_water.store(static_cast<int64_t>(std::min<uint64_t>(budget.max_connections, INT32_MAX)));
}

void SetUpDescriptorBudget() {
  absl::StatusOr<DescriptorLimit> limit = RaiseDescriptorLimit();
  if (!limit.ok()) {
    spdlog::warn("{}; connections are not budgeted", std::string(limit.status().message()));
    return;
  }
  const DescriptorBudget budget = BudgetFor(limit->soft);
  InstallAcceptGuard(budget);
  spdlog::info(
      "file descriptors: limit {} (soft limit was {}, hard limit {}); up to {} connections, {} kept in "
      "reserve; {} open now",
      limit->soft, limit->soft_before, limit->hard, budget.max_connections, budget.reserve,
      OpenDescriptors());
}

uint64_t MaxConnectionsByDescriptors() { return g_max_connections.load(); }
uint64_t ConnectionsRefusedForDescriptors() { return g_refused.load(); }

uint64_t OpenDescriptors() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  uint64_t n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n > 0 ? n - 1 : 0;  // not the directory's own descriptor
}

int AcceptOutsideBudget(int listen_fd, int flags) {
  return static_cast<int>(syscall(SYS_accept4, listen_fd, nullptr, nullptr, flags));
}

bool AcceptGuardRefuses(int fd) {
  const int64_t high = g_high_water.load(std::memory_order_relaxed);
  return high >= 0 && fd >= high;
}

}  // namespace odb

// The process-wide accept()/accept4(): the kernel's, then the guard.
extern "C" int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  const int r = static_cast<int>(syscall(SYS_accept4, fd, addr, len, flags));
  return odb::Guard(fd, r, errno, flags);
}

extern "C" int accept(int fd, sockaddr* addr, socklen_t* len) {
  const int r = static_cast<int>(syscall(SYS_accept4, fd, addr, len, 0));
  return odb::Guard(fd, r, errno, 0);
}
