#ifndef ODB_DAEMON_METRICS_SERVER_H_
#define ODB_DAEMON_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "src/daemon/metrics.h"

namespace httplib {
class Server;
}

namespace odb {

// Serves the daemon's counters as Prometheus text (GET /metrics, or any
// path) with cpp-httplib on threads of its own: nothing HTTP runs on the
// data-plane loop, and a client that sends garbage, a partial request or hangs
// up early costs one of the server's threads until its read timeout, never the
// daemon. Reads only atomics that the stages publish.
class MetricsServer {
 public:
  MetricsServer(DaemonMetrics& metrics, int rank);
  ~MetricsServer();  // stops and joins
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // `endpoint` is "tcp://HOST:PORT" (PORT may be 0 or * for any). Returns
  // the bound endpoint with the real port.
  absl::StatusOr<std::string> Start(const std::string& endpoint);
  void Stop();

 private:
  DaemonMetrics& metrics_;  // reads the published values; counts scrapes
  int rank_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace odb

#endif  // ODB_DAEMON_METRICS_SERVER_H_
