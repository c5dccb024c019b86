#include "src/daemon/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "src/common/fd_budget.h"

namespace odb {
namespace {

using Clock = std::chrono::steady_clock;

struct Conn {
  int fd = -1;
  Clock::time_point deadline;
  std::string in;
  std::string out;
  size_t sent = 0;
  bool writing = false;
  bool done = false;      // close now (answered, gone or refused)
  bool answered = false;  // closed after a complete response
};

std::string Response(int code, const char* reason, const std::string& body, bool with_body,
                     const char* extra_headers = "") {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\n";
  r += code == 200 ? "Content-Type: text/plain; version=0.0.4\r\n" : "Content-Type: text/plain\r\n";
  r += "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n";
  r += extra_headers;
  r += "\r\n";
  if (with_body) r += body;
  return r;
}

}  // namespace

MetricsServer::MetricsServer(DaemonMetrics& metrics, int rank, MetricsServerLimits limits)
    : metrics_(metrics), rank_(rank), limits_(limits) {}

MetricsServer::~MetricsServer() {
  Stop();
  for (int& fd : wake_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

absl::StatusOr<std::string> MetricsServer::Start(const std::string& endpoint) {
  std::string rest = endpoint;
  if (rest.rfind("tcp://", 0) == 0) rest = rest.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError("metrics_endpoint '" + endpoint + "' is not tcp://HOST:PORT");
  }
  std::string host = rest.substr(0, colon);
  const std::string port_text = rest.substr(colon + 1);
  int port = 0;
  if (port_text != "*" && !port_text.empty()) {
    try {
      port = std::stoi(port_text);
    } catch (...) {
      port = -1;
    }
    if (port < 0 || port > 65535) {
      return absl::InvalidArgumentError("metrics_endpoint '" + endpoint + "' has an invalid port");
    }
  }
  const std::string lookup =
      host.size() > 1 && host.front() == '[' && host.back() == ']' ? host.substr(1, host.size() - 2) : host;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(lookup.empty() ? nullptr : lookup.c_str(), std::to_string(port).c_str(), &hints,
                           &found);
      rc != 0) {
    return absl::InvalidArgumentError("metrics_endpoint " + endpoint + ": cannot resolve '" + host +
                                      "': " + gai_strerror(rc));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      why = strerror(errno);
      close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) {
    return absl::UnavailableError("cannot listen on metrics_endpoint " + endpoint + " (" + why + ")");
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) {
    close(listen_fd_);
    listen_fd_ = -1;
    return absl::InternalError(std::string("metrics server: cannot create its wake-up pipe: ") +
                               strerror(errno));
  }
  thread_ = std::thread([this] { Loop(); });
  return "tcp://" + host + ":" + std::to_string(bound_port);
}

void MetricsServer::Stop() {
  if (thread_.joinable()) {
    const char byte = 1;
    if (write(wake_[1], &byte, 1) < 0) {
      // The pipe is non-blocking and the loop reads it; a full pipe already wakes it.
    }
    thread_.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

void MetricsServer::Loop() {
  std::deque<Conn> conns;  // in accept order: the front is the oldest
  Clock::time_point listen_paused_until{};
  uint64_t logged_exhaustion = 0;
  auto drop = [this](Conn& c) {
    if (!c.done) metrics_.metrics_connections_dropped.fetch_add(1);
    c.done = true;
  };
  std::vector<pollfd> fds;
  while (true) {
    const Clock::time_point now = Clock::now();
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    const bool listening = now >= listen_paused_until;
    fds.push_back({listening ? listen_fd_ : -1, POLLIN, 0});
    Clock::time_point next = now + std::chrono::seconds(1);
    if (!listening) next = std::min(next, listen_paused_until);
    for (const Conn& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.writing ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.deadline);
    }
    const int timeout_ms = static_cast<int>(
        std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1));
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      spdlog::error("metrics server: poll failed ({}); metrics endpoint closed", strerror(errno));
      break;
    }
    if (fds[0].revents & POLLIN) break;  // Stop()

    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      const short ev = fds[2 + i].revents;
      if (ev == 0) continue;
      if (!c.writing) {
        char buf[4096];
        while (true) {
          const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
          if (n > 0) {
            c.in.append(buf, static_cast<size_t>(n));
            if (c.in.size() > limits_.max_request_bytes) break;
            continue;
          }
          if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) drop(c);
          if (n < 0 && errno == EINTR) continue;
          break;
        }
        if (c.done) continue;
        const size_t end = c.in.find("\r\n\r\n");
        if (end == std::string::npos) {
          if (c.in.size() > limits_.max_request_bytes) {
            c.out = Response(431, "Request Header Fields Too Large", "request too large\n", true);
            c.writing = true;
            metrics_.metrics_connections_dropped.fetch_add(1);
          }
          continue;
        }
        const std::string method = c.in.substr(0, c.in.find(' '));
        if (method == "GET" || method == "HEAD") {
          metrics_.metrics_scrapes.fetch_add(1);
          c.out = Response(200, "OK", RenderPrometheus(metrics_, rank_), method == "GET");
          c.answered = true;
        } else if (c.in.find(' ') == std::string::npos || c.in.find("HTTP/") == std::string::npos ||
                   c.in.find("HTTP/") > end) {
          c.out = Response(400, "Bad Request", "not an HTTP request\n", true);
          metrics_.metrics_connections_dropped.fetch_add(1);
        } else {
          c.out = Response(405, "Method Not Allowed", "GET or HEAD only\n", true, "Allow: GET, HEAD\r\n");
          metrics_.metrics_connections_dropped.fetch_add(1);
        }
        c.writing = true;
      }
      if (c.writing) {
        while (c.sent < c.out.size()) {
          const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
          if (n > 0) {
            c.sent += static_cast<size_t>(n);
            continue;
          }
          if (n < 0 && errno == EINTR) continue;
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          c.answered = false;
          drop(c);
          break;
        }
        if (!c.done && c.sent == c.out.size()) {
          shutdown(c.fd, SHUT_WR);
          c.done = true;  // answered in full (or refused with a status): not a drop
        }
      }
    }
    // Past its deadline, a connection goes, whatever it was doing.
    const Clock::time_point after = Clock::now();
    for (Conn& c : conns) {
      if (!c.done && after >= c.deadline) drop(c);
    }
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->done) {
        close(it->fd);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }

    if (listening && (fds[1].revents & POLLIN)) {
      // A bounded burst: a connection accepted now is read in the next
      // round before enough newer ones can arrive to displace it (a flood of
      // connections waits in the backlog instead of evicting scrapers unread).
      const size_t burst = std::max<size_t>(1, limits_.max_connections / 4);
      for (size_t accepted = 0; accepted < burst; ++accepted) {
        // Outside the descriptor budget: at most max_connections, and
        // readable while producers exhaust descriptors (see fd_budget.h).
        const int fd = AcceptOutsideBudget(listen_fd_, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          if (conns.size() >= limits_.max_connections) {
            // Full: the oldest connection has had the most of its deadline.
            close(conns.front().fd);
            metrics_.metrics_connections_dropped.fetch_add(1);
            conns.pop_front();
          }
          Conn c;
          c.fd = fd;
          c.deadline = Clock::now() + limits_.deadline;
          conns.push_back(std::move(c));
          continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: give one back (the oldest connection) and
          // wait a little before accepting again, instead of spinning.
          if (logged_exhaustion++ % 1000 == 0) {
            spdlog::warn(
                "metrics server: cannot accept a connection ({}): file descriptors exhausted; "
                "closing the oldest metrics connection and pausing for 100 ms",
                strerror(errno));
          }
          if (!conns.empty()) {
            close(conns.front().fd);
            metrics_.metrics_connections_dropped.fetch_add(1);
            conns.pop_front();
          }
          listen_paused_until = Clock::now() + std::chrono::milliseconds(100);
        }
        break;  // EAGAIN: all accepted
      }
    }
  }
  for (Conn& c : conns) close(c.fd);
}

}  // namespace odb
