#include "src/common/fd_budget.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace odb {
namespace {

int UnixListener(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  REQUIRE(fd >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
  unlink(path.c_str());
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(listen(fd, 512) == 0);
  return fd;
}

int Client(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

std::string TempPath(const char* name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name + std::to_string(getpid());
}

TEST_CASE("the budget keeps a reserve and raising the limit reaches the hard one") {
  CHECK(BudgetFor(256).reserve == 32);
  CHECK(BudgetFor(256).max_connections == 224);
  CHECK(BudgetFor(1024).max_connections == 896);
  CHECK(BudgetFor(10).max_connections == 0);
  auto limit = RaiseDescriptorLimit();
  REQUIRE(limit.ok());
  CHECK(limit->soft == limit->hard);
  CHECK(limit->soft >= limit->soft_before);
  CHECK(OpenDescriptors() >= 3);
}

TEST_CASE("accepting never exhausts descriptors: over budget or with none left, a connection is refused") {
  const std::string path = TempPath("fdguard");
  const int listener = UnixListener(path);
  // Budget of 64: connections whose descriptor would be numbered 32 or more
  // are refused, whatever the kernel limit is.
  InstallAcceptGuard(BudgetFor(64));
  std::vector<int> clients, accepted;
  int refused = 0;
  const uint64_t refused_before = ConnectionsRefusedForDescriptors();
  for (int i = 0; i < 40; ++i) {
    clients.push_back(Client(path));
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      CHECK(fd < 32);
      accepted.push_back(fd);
    } else {
      CHECK(errno == ECONNABORTED);
      ++refused;
    }
  }
  CHECK(refused > 0);
  CHECK(ConnectionsRefusedForDescriptors() - refused_before == static_cast<uint64_t>(refused));
  for (int fd : accepted) close(fd);
  for (int fd : clients) close(fd);

  // No descriptor left at all: the kernel says EMFILE, the caller sees a
  // refused connection, and the connection left the backlog (its client
  // reads end-of-stream, the listener is not readable again).
  InstallAcceptGuard(BudgetFor(1 << 20));
  const int waiting = Client(path);
  rlimit saved{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &saved) == 0);
  rlimit low = saved;
  low.rlim_cur = 256;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<int> fillers;
  while (true) {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    fillers.push_back(fd);
  }
  errno = 0;
  const int got = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  const int got_errno = errno;
  const int again = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  const int again_errno = errno;
  for (int fd : fillers) close(fd);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &saved) == 0);
  CHECK(got == -1);
  CHECK(got_errno == ECONNABORTED);
  CHECK(again == -1);
  CHECK(again_errno == EAGAIN);  // the backlog is empty: no spinning listener
  char byte;
  CHECK(recv(waiting, &byte, 1, 0) == 0);
  close(waiting);
  close(listener);
  unlink(path.c_str());
}

}  // namespace
}  // namespace odb
