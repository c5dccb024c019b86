#ifndef ODB_CLIENT_CPP_SRC_DAEMON_PROBE_H_
#define ODB_CLIENT_CPP_SRC_DAEMON_PROBE_H_

// Is a daemon behind an ipc:// endpoint? ZeroMQ connects lazily, so a client
// facing a socket file that no daemon serves (a daemon that was SIGKILLed
// leaves it behind) would only learn it from a receive timeout (30 s by
// default). The probe tells it at once, as the Python loader's
// check_reachable does:
// - at connect: connect(2) on the Unix socket; ECONNREFUSED means a stale
//   file, ENOENT no daemon at all;
// - while waiting: the pid in "<socket path>.lock", which the daemon holds
//   (flock) for its life and writes its pid into (src/daemon/endpoint_lock.h):
//   a dead pid, or a lock file that is gone, means the daemon is gone.
// tcp:// endpoints are not probed (a remote daemon: the timeouts apply).
// Header-only: the pip build compiles client/cpp/src/*.cc from a fixed list.

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace odb::client_internal {

// The socket path of an ipc:// endpoint; nullopt for other transports.
inline std::optional<std::string> IpcPath(const std::string& endpoint) {
  static const std::string kIpc = "ipc://";
  if (endpoint.rfind(kIpc, 0) != 0) return std::nullopt;
  return endpoint.substr(kIpc.size());
}

// 0 when something accepts connections on the Unix socket `path`, else errno.
inline int UnixConnectErrno(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return ENAMETOOLONG;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = rc == 0 ? 0 : errno;
  ::close(fd);
  // A full backlog (EAGAIN) or a connection under way still means a live daemon.
  return err == EAGAIN || err == EINPROGRESS ? 0 : err;
}

// OK when a daemon may be listening at `endpoint`; otherwise an error that
// names the endpoint, the socket file and what to do.
inline absl::Status CheckDaemonReachable(const std::string& endpoint) {
  const std::optional<std::string> path = IpcPath(endpoint);
  if (!path) return absl::OkStatus();
  const std::string fix =
      "start the daemon (odbd, python -m odb.launch, systemd odbd@RANK) or fix the endpoint / ODB_RUN_DIR";
  const int err = UnixConnectErrno(*path);
  if (err == 0) return absl::OkStatus();
  if (err == ENOENT) {
    return absl::UnavailableError("no odbd listens at " + endpoint + " (socket file " + *path +
                                  " does not exist): " + fix);
  }
  if (err == ECONNREFUSED) {
    return absl::UnavailableError("no odbd listens at " + endpoint + ": the socket file " + *path +
                                  " is stale (nothing accepts connections on it; the daemon that made it has "
                                  "exited): " +
                                  fix);
  }
  if (err == EACCES || err == EPERM) {
    return absl::PermissionDeniedError("cannot connect to odbd at " + endpoint + ": permission denied on " +
                                       *path +
                                       " (the daemon runs as another user: run the trainer in the "
                                       "daemon's group, or the daemon as the trainer's user)");
  }
  return absl::UnavailableError("cannot connect to odbd at " + endpoint + " (" + *path +
                                "): " + std::strerror(err));
}

// The pid the daemon serving `endpoint` wrote into its lock file; nullopt when
// the endpoint is not ipc://, or the file is missing or unreadable.
inline std::optional<pid_t> DaemonPid(const std::string& endpoint) {
  const std::optional<std::string> path = IpcPath(endpoint);
  if (!path) return std::nullopt;
  const int fd = ::open((*path + ".lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[32] = {};
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  char* end = nullptr;
  const long pid = std::strtol(buf, &end, 10);
  if (end == buf || pid <= 0) return std::nullopt;
  return static_cast<pid_t>(pid);
}

inline bool PidAlive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// An error when the daemon that served `endpoint` (pid `pid`, read at
// connect) is gone: its pid is dead and no live daemon holds the lock now
// (a daemon restarted on the same endpoint is alive).
inline absl::Status CheckDaemonAlive(const std::string& endpoint, pid_t pid) {
  if (PidAlive(pid)) return absl::OkStatus();
  const std::optional<pid_t> now = DaemonPid(endpoint);
  if (now && *now != pid && PidAlive(*now)) return absl::OkStatus();
  return absl::UnavailableError("odbd (pid " + std::to_string(pid) + ") serving " + endpoint +
                                " is gone (exited or killed): see its log (odbd-<rank>.log in its run "
                                "directory)");
}

}  // namespace odb::client_internal

#endif  // ODB_CLIENT_CPP_SRC_DAEMON_PROBE_H_
