#include "src/shm/fd_passing.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>

namespace odb::shm {
namespace {

struct SocketPair {
  SocketPair() { REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) == 0); }
  ~SocketPair() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
  int fds[2] = {-1, -1};
};

TEST_CASE("a descriptor crosses a socketpair to another process and refers to the same file") {
  SocketPair sp;
  int data[2];
  REQUIRE(pipe(data) == 0);
  const pid_t child = fork();
  if (child == 0) {
    // Child: receive the write end of the pipe, write through it.
    std::string payload;
    absl::StatusOr<UniqueFd> fd = RecvFd(sp.fds[1], &payload);
    if (!fd.ok() || payload != "hello") _exit(1);
    const char msg[] = "through a passed fd";
    _exit(write(fd->get(), msg, sizeof(msg)) == static_cast<ssize_t>(sizeof(msg)) ? 0 : 2);
  }
  REQUIRE(SendFd(sp.fds[0], data[1], "hello").ok());
  close(data[1]);
  char buf[64] = {};
  REQUIRE(read(data[0], buf, sizeof(buf)) > 0);
  REQUIRE(std::string(buf) == "through a passed fd");
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  close(data[0]);
}

TEST_CASE("several descriptors in one message, an empty payload, and the peer credentials") {
  SocketPair sp;
  int a[2], b[2];
  REQUIRE(pipe(a) == 0);
  REQUIRE(pipe(b) == 0);
  const int both[] = {a[0], b[0]};
  REQUIRE(SendFds(sp.fds[0], both, "").ok());
  absl::StatusOr<ReceivedFds> got = RecvFds(sp.fds[1]);
  REQUIRE(got.ok());
  REQUIRE(got->payload.empty());
  REQUIRE(got->fds.size() == 2);
  struct stat s1, s2;
  REQUIRE(fstat(got->fds[0].get(), &s1) == 0);
  REQUIRE(fstat(a[0], &s2) == 0);
  REQUIRE(s1.st_ino == s2.st_ino);
  REQUIRE(fcntl(got->fds[1].get(), F_GETFD) & FD_CLOEXEC);
  // RecvFd insists on exactly one.
  REQUIRE(SendFds(sp.fds[0], both, "x").ok());
  absl::StatusOr<UniqueFd> one = RecvFd(sp.fds[1]);
  REQUIRE(one.status().code() == absl::StatusCode::kInvalidArgument);
  absl::StatusOr<PeerCredentials> cred = GetPeerCredentials(sp.fds[1]);
  REQUIRE(cred.ok());
  REQUIRE(cred->pid == getpid());
  REQUIRE(cred->uid == geteuid());
  for (int fd : {a[0], a[1], b[0], b[1]}) close(fd);
}

TEST_CASE("a closed peer and an oversized payload are errors") {
  SocketPair sp;
  REQUIRE(SendFds(sp.fds[0], {}, std::string(100, 'p')).ok());
  absl::StatusOr<ReceivedFds> big = RecvFds(sp.fds[1], 10);
  REQUIRE(big.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(big.status().message()).find("longer than 10") != std::string::npos);
  close(sp.fds[0]);
  sp.fds[0] = -1;
  absl::StatusOr<ReceivedFds> eof = RecvFds(sp.fds[1]);
  REQUIRE(eof.status().code() == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace odb::shm
