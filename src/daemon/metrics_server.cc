#include "src/daemon/metrics_server.h"

#include <httplib.h>

namespace odb {

MetricsServer::MetricsServer(DaemonMetrics& metrics, int rank)
    : metrics_(metrics), rank_(rank), server_(std::make_unique<httplib::Server>()) {}

MetricsServer::~MetricsServer() { Stop(); }

absl::StatusOr<std::string> MetricsServer::Start(const std::string& endpoint) {
  std::string rest = endpoint;
  if (rest.rfind("tcp://", 0) == 0) rest = rest.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError("metrics_endpoint '" + endpoint + "' is not tcp://HOST:PORT");
  }
  const std::string host = rest.substr(0, colon);
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
  // Slow or silent clients are cut off quickly; a few threads serve scrapes.
  server_->set_read_timeout(2, 0);
  server_->set_write_timeout(2, 0);
  server_->set_keep_alive_max_count(10);
  server_->set_payload_max_length(64 << 10);
  server_->new_task_queue = [] { return new httplib::ThreadPool(2); };
  auto handler = [this](const httplib::Request&, httplib::Response& res) {
    metrics_.metrics_scrapes.fetch_add(1);
    res.set_content(RenderPrometheus(metrics_, PublishedGauges(metrics_), rank_),
                    "text/plain; version=0.0.4");
  };
  server_->Get(R"(/.*)", handler);
  int bound = port;
  if (port == 0) {
    bound = server_->bind_to_any_port(host);
  } else if (!server_->bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound < 0) {
    return absl::UnavailableError("cannot listen on metrics_endpoint " + endpoint +
                                  " (address in use or not local?)");
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return "tcp://" + host + ":" + std::to_string(bound);
}

void MetricsServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace odb
