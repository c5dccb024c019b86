#include "src/shm/fd_passing.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/time.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

namespace odb::shm {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

}  // namespace

absl::Status SendFds(int sock, std::span<const int> fds, std::string_view payload) {
  if (fds.size() > kMaxFdsPerMessage) {
    return absl::InvalidArgumentError("SendFds: " + std::to_string(fds.size()) + " descriptors, at most " +
                                      std::to_string(kMaxFdsPerMessage) + " per message");
  }
  static const char kEmpty = '\0';
  iovec iov{};
  iov.iov_base = const_cast<char*>(payload.empty() ? &kEmpty : payload.data());
  iov.iov_len = payload.empty() ? 1 : payload.size();
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0)
    return absl::UnavailableError("SendFds: sendmsg on socket " + std::to_string(sock) + ": " + ErrnoText(errno));
  if (static_cast<size_t>(n) != iov.iov_len) {
    // The descriptors went with the first byte; a short write of a stream
    // socket would split the payload, which the receiver cannot reassemble.
    return absl::DataLossError("SendFds: sent " + std::to_string(n) + " of " + std::to_string(iov.iov_len) +
                               " payload bytes; use a SOCK_SEQPACKET socket or a smaller payload");
  }
  return absl::OkStatus();
}

absl::StatusOr<ReceivedFds> RecvFds(int sock, size_t max_payload) {
  ReceivedFds out;
  std::string buf(max_payload + 1, '\0');  // one spare byte detects an oversized payload
  iovec iov{buf.data(), buf.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0)
    return absl::UnavailableError("RecvFds: recvmsg on socket " + std::to_string(sock) + ": " + ErrnoText(errno));
  // Take ownership of whatever arrived before judging the message.
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(fd);
    }
  }
  if (n == 0 && out.fds.empty()) {
    return absl::UnavailableError("RecvFds: the peer closed socket " + std::to_string(sock));
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    return absl::DataLossError(
        "RecvFds: more than " + std::to_string(kMaxFdsPerMessage) +
        " descriptors in one message (control data truncated); the extra ones are lost");
  }
  if ((msg.msg_flags & MSG_TRUNC) || static_cast<size_t>(n) > max_payload) {
    return absl::InvalidArgumentError("RecvFds: payload longer than " + std::to_string(max_payload) +
                                      " bytes");
  }
  buf.resize(static_cast<size_t>(n));
  if (buf.size() == 1 && buf[0] == '\0') buf.clear();
  out.payload = std::move(buf);
  return out;
}

absl::StatusOr<UniqueFd> RecvFd(int sock, std::string* payload, size_t max_payload) {
  absl::StatusOr<ReceivedFds> got = RecvFds(sock, max_payload);
  if (!got.ok()) return got.status();
  if (got->fds.size() != 1) {
    return absl::InvalidArgumentError("RecvFd: expected one descriptor, the message carried " +
                                      std::to_string(got->fds.size()));
  }
  if (payload != nullptr) *payload = std::move(got->payload);
  return std::move(got->fds[0]);
}

absl::StatusOr<UniqueFd> ConnectSeqpacket(const std::string& path, int timeout_ms) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError("the socket path '" + path + "' is empty or too long");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return absl::InternalError(std::string("socket(): ") + std::strerror(errno));
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(std::strerror(errno));
  }
  return sock;
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::FailedPreconditionError("SO_PEERCRED on socket " + std::to_string(sock) + ": " +
                                         ErrnoText(errno));
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

}  // namespace odb::shm
