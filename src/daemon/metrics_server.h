#ifndef ODB_DAEMON_METRICS_SERVER_H_
#define ODB_DAEMON_METRICS_SERVER_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "src/state/metrics.h"

namespace odb {

// Serves the daemon's counters as Prometheus text (GET or HEAD, any path) on
// a thread of its own: nothing HTTP runs on the data-plane loop.
//
// One poll() loop serves every connection, so no client can hold a worker:
// each connection has an absolute deadline (MetricsServerLimits::deadline)
// for its whole request and response, however it trickles bytes; at most
// max_connections are open at once, and a new connection then displaces the
// oldest (whose deadline is nearest). Connections are accepted in bursts of a
// quarter of that, so each is read before newer ones can displace it. A crowd
// of silent or slow clients never blinds a scraper: the one loop serves it
// alongside them. Requests are bounded (max_request_bytes); responses close
// the connection. Reads only atomics that the stages publish.
struct MetricsServerLimits {
  std::chrono::milliseconds deadline{10000};
  size_t max_connections = 64;
  size_t max_request_bytes = 8 << 10;
};

class MetricsServer {
 public:
  MetricsServer(DaemonMetrics& metrics, int rank, MetricsServerLimits limits = {});
  ~MetricsServer();  // stops and joins
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // `endpoint` is "tcp://HOST:PORT" (PORT may be 0 or * for any). Returns
  // the bound endpoint with the real port.
  absl::StatusOr<std::string> Start(const std::string& endpoint);
  void Stop();

  // Connections closed before they were answered: deadline passed, displaced
  // by a newer one, or a request that is too large or not HTTP.
  uint64_t dropped() const { return metrics_.metrics_connections_dropped.load(); }

 private:
  void Loop();

  DaemonMetrics& metrics_;  // reads the published values; counts scrapes
  int rank_;
  MetricsServerLimits limits_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace odb

#endif  // ODB_DAEMON_METRICS_SERVER_H_
