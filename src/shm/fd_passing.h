#ifndef ODB_SHM_FD_PASSING_H_
#define ODB_SHM_FD_PASSING_H_

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/shm/unique_fd.h"

namespace odb::shm {

// File descriptors over a UNIX-domain socket (SCM_RIGHTS): how a memfd arena,
// which has no name, reaches the other process. Works on SOCK_STREAM,
// SOCK_SEQPACKET and SOCK_DGRAM sockets; SOCK_SEQPACKET keeps one message per
// call, which is what these helpers assume on the receiving side.

inline constexpr size_t kMaxFdsPerMessage = 8;

// Sends `payload` (at least one byte goes on the wire: an empty payload is sent
// as a single '\0', which RecvFds drops) with `fds` attached. The descriptors
// stay open here; the receiver gets its own duplicates.
absl::Status SendFds(int sock, std::span<const int> fds, std::string_view payload);
inline absl::Status SendFd(int sock, int fd, std::string_view payload) {
  return SendFds(sock, std::span<const int>(&fd, 1), payload);
}

struct ReceivedFds {
  std::string payload;
  std::vector<UniqueFd> fds;  // close-on-exec
};

// Receives one message with up to kMaxFdsPerMessage descriptors. A payload
// longer than `max_payload` or a truncated control message is an error (the
// descriptors that did arrive are closed). The peer closing the socket is
// kUnavailable.
absl::StatusOr<ReceivedFds> RecvFds(int sock, size_t max_payload = 4096);
// One descriptor exactly (more or none is an error).
absl::StatusOr<UniqueFd> RecvFd(int sock, std::string* payload = nullptr, size_t max_payload = 4096);

// A SOCK_SEQPACKET UNIX socket connected to `path`, with `timeout_ms` on its
// sends and receives (how a client reaches a daemon's fd socket). Errors:
// InvalidArgument for an empty or too long path, Unavailable naming
// connect()'s errno (the caller adds what the socket is).
absl::StatusOr<UniqueFd> ConnectSeqpacket(const std::string& path, int timeout_ms);

struct PeerCredentials {
  pid_t pid;
  uid_t uid;
  gid_t gid;
};
// SO_PEERCRED of a connected UNIX socket: who is on the other side, as the
// kernel saw it at connect()/socketpair() time. A daemon checks uid before it
// maps a producer's arena.
absl::StatusOr<PeerCredentials> GetPeerCredentials(int sock);

}  // namespace odb::shm

#endif  // ODB_SHM_FD_PASSING_H_
