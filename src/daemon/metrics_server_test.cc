#include "src/daemon/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace odb {
namespace {

int PortOf(const std::string& endpoint) { return std::stoi(endpoint.substr(endpoint.rfind(':') + 1)); }

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  timeval tv{10, 0};  // a failing test ends, it never hangs
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

// Sends `request` and reads the answer to its end (the server closes).
std::string Exchange(int port, const std::string& request) {
  int fd = Connect(port);
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST_CASE("answers GET and HEAD, refuses other methods and non-HTTP with a status") {
  DaemonMetrics metrics;
  MetricsServer server(metrics, 3);
  auto bound = server.Start("tcp://127.0.0.1:0");
  REQUIRE(bound.ok());
  const int port = PortOf(*bound);
  const std::string get = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(get.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(get.find("odb_samples_received_total{rank=\"3\"}") != std::string::npos);
  const std::string head = Exchange(port, "HEAD / HTTP/1.1\r\n\r\n");
  CHECK(head.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(head.find("odb_samples_received_total") == std::string::npos);
  CHECK(Exchange(port, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0) == 0);
  CHECK(Exchange(port, "\x01\x02\x03\r\n\r\n").rfind("HTTP/1.1 400", 0) == 0);
  CHECK(Exchange(port, "GET /" + std::string(20000, 'a')).rfind("HTTP/1.1 431", 0) == 0);
  CHECK(metrics.metrics_scrapes.load() == 2);
}

TEST_CASE("silent and trickling clients never blind the endpoint") {
  DaemonMetrics metrics;
  MetricsServerLimits limits;
  limits.max_connections = 8;
  limits.deadline = std::chrono::milliseconds(500);
  MetricsServer server(metrics, 0, limits);
  auto bound = server.Start("tcp://127.0.0.1:*");
  REQUIRE(bound.ok());
  const int port = PortOf(*bound);

  // Three clients send a request a byte at a time, forever; twenty more
  // connect and say nothing: more than the server keeps open.
  std::atomic<bool> stop{false};
  std::vector<std::thread> tricklers;
  std::atomic<int> cut_off{0};
  for (int t = 0; t < 3; ++t) {
    tricklers.emplace_back([&] {
      int fd = Connect(port);
      const std::string request = "GET /metrics HTTP/1.1\r\nX-Slow: ";
      for (size_t i = 0; !stop.load(); ++i) {
        const char byte = request[std::min(i, request.size() - 1)];
        if (send(fd, &byte, 1, MSG_NOSIGNAL) != 1) {
          cut_off.fetch_add(1);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the client's pace, not a sync
      }
      close(fd);
    });
  }
  std::vector<int> silent;
  for (int i = 0; i < 20; ++i) silent.push_back(Connect(port));

  // Scrapes are answered, several times over, while all of them hold on.
  for (int i = 0; i < 5; ++i) {
    const std::string got = Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n");
    REQUIRE(got.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  }
  // The tricklers are cut off by their deadline, however steadily they send.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (cut_off.load() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop.store(true);
  for (auto& t : tricklers) t.join();
  for (int fd : silent) close(fd);
  CHECK(cut_off.load() == 3);
  CHECK(server.dropped() >= 3);
}

}  // namespace
}  // namespace odb
