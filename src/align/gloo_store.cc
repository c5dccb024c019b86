#include "src/align/gloo_store.h"

#include <gloo/rendezvous/file_store.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
// Debian installs hiredis under <hiredis/hiredis.h>.
#ifndef HIREDIS_NESTED_INCLUDE
#define HIREDIS_NESTED_INCLUDE
#endif
#include <gloo/rendezvous/redis_store.h>

namespace odb::align::internal {

absl::Status ProbeTcp(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string where = host + ":" + std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError("redis store " + where + ": cannot resolve host: " + gai_strerror(rc));
  }
  std::string last = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = poll(&p, 1, static_cast<int>(timeout.count()));
      if (rc == 0) {
        last = "connect timed out after " + std::to_string(timeout.count()) + " ms";
        close(fd);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      close(fd);
      freeaddrinfo(res);
      return absl::OkStatus();
    }
    last = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(res);
  return absl::UnavailableError("redis store " + where + " unreachable: " + last);
}

std::unique_ptr<gloo::rendezvous::Store> OpenStore(const GlooPeerGroupOptions& o) {
  if (o.store == GlooPeerGroupOptions::StoreKind::kRedis) {
    return std::make_unique<gloo::rendezvous::RedisStore>(o.redis_host, o.redis_port);
  }
  return std::make_unique<gloo::rendezvous::FileStore>(o.file_store_dir);
}

}  // namespace odb::align::internal
