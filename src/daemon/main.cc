// odbd: the per-rank collation daemon. Parses the config, builds the
// components, installs the signal handlers and runs.
#include <google/protobuf/stubs/logging.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <limits>
#include <tuple>

#include "src/common/fd_budget.h"
#include "src/daemon/aligned_round_runner.h"
#include "src/daemon/config.h"
#include "src/daemon/daemon.h"
#include "src/daemon/peers.h"
#include "src/daemon/settings.h"
#include "src/daemon/store_lease.h"

namespace {

std::atomic<odb::Daemon*> g_daemon{nullptr};
std::atomic<int> g_signal{0};

// libprotobuf logs some parse problems of producer input (e.g. invalid UTF-8
// in a string field) straight to stderr: a bad producer could flood the log
// at message rate. Its lines go through spdlog, at most a few a second; the
// input itself is rejected and counted by the ingest channel.
void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  static std::atomic<int64_t> window{0};
  static std::atomic<int> in_window{0};
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  if (window.exchange(now) != now) in_window.store(0);
  if (in_window.fetch_add(1) >= 5) return;
  spdlog::log(level >= google::protobuf::LOGLEVEL_ERROR ? spdlog::level::err : spdlog::level::warn,
              "protobuf ({}:{}): {}", file, line, message);
}

void OnSignal(int signo) {
  g_signal.store(signo);
  if (odb::Daemon* d = g_daemon.load()) d->Stop();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"odbd: online dynamic batching daemon (one per training rank)"};
  std::string config_path;
  int rank = -1, world_size = -1;
  std::string run_dir, job_id, log_level, ingest, trainer, gloo_hostname, gloo_iface;
  bool print_config = false, print_defaults = false, print_template = false, exit_when_trainer_done = false;
  app.add_option("-c,--config", config_path, "YAML config file (see docs/config.md)");
  // Checked here: a negative value would read as "not given" below and be
  // ignored silently.
  app.add_option("--rank", rank, "this rank (default: $RANK or the config)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  app.add_option("--world-size", world_size, "number of ranks (default: $WORLD_SIZE or the config)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  app.add_option("--run-dir", run_dir, "directory for ipc sockets and the FileStore (default: $ODB_RUN_DIR, else the config's run_dir)");
  app.add_option("--job-id", job_id, "rendezvous key prefix, unique per job");
  app.add_option("--ingest", ingest, "producer endpoint (replaces ingest_endpoints)");
  app.add_option("--trainer", trainer, "trainer endpoint");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  app.add_option("--gloo-hostname", gloo_hostname,
                 "address this rank's Gloo listens on (default: $ODB_GLOO_HOSTNAME, else the config)");
  app.add_option("--gloo-iface", gloo_iface, "network interface for Gloo (default: $ODB_GLOO_IFACE, else the config)");
  app.add_flag("--exit-when-trainer-done", exit_when_trainer_done,
               "exit 0 once the trainer session has ended between epochs (sets emit.exit_when_trainer_done)");
  app.add_flag("--print-config", print_config, "print the effective config and exit");
  app.add_flag("--print-default-config", print_defaults,
               "print every config field the parser knows with its default (one 'path: value' line each) and exit");
  app.add_flag(
      "--print-config-template", print_template,
      "print a YAML config of every field with its default and what it does (configs/odbd.yaml) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help is a success; a bad option is a bad configuration (exit 2, as
    // documented in docs/config.md), not CLI11's own codes.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  google::protobuf::SetLogHandler(&ProtobufLog);
  if (print_defaults) {
    for (const auto& [path, value] : odb::ConfigFieldDefaults()) std::printf("%s: %s\n", path.c_str(), value.c_str());
    return 0;
  }
  if (print_template) {
    std::fputs(odb::ConfigTemplate().c_str(), stdout);
    return 0;
  }

  auto config = config_path.empty() ? odb::ParseConfig("") : odb::LoadConfigFile(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "odbd: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (rank >= 0) config->rank = rank;
  if (world_size >= 0) config->world_size = world_size;
  if (!job_id.empty()) config->job_id = job_id;
  if (!log_level.empty()) config->log_level = log_level;
  if (!ingest.empty()) config->ingest.endpoints = {ingest};
  if (!trainer.empty()) config->trainer.endpoint = trainer;
  if (exit_when_trainer_done) config->exit_when_trainer_done = true;
  // Multi-host addresses come from the launcher's environment (the host's
  // address is not known when a config file is written), the command line wins.
  // So does the run directory: $ODB_RUN_DIR is where the Python client looks
  // for the sockets, so the daemon puts them there too.
  const auto env = odb::ProcessEnvironment();
  for (const auto& [flag, var, field] : {std::tuple{&gloo_hostname, "ODB_GLOO_HOSTNAME", &config->gloo_hostname},
                                         std::tuple{&gloo_iface, "ODB_GLOO_IFACE", &config->gloo_iface},
                                         std::tuple{&run_dir, "ODB_RUN_DIR", &config->run_dir}}) {
    auto it = env.find(var);
    if (!flag->empty()) {
      *field = *flag;
    } else if (it != env.end() && !it->second.empty()) {
      *field = it->second;
    }
  }
  if (absl::Status s = odb::FinalizeConfig(*config, env); !s.ok()) {
    std::fprintf(stderr, "odbd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  spdlog::set_level(spdlog::level::from_str(config->log_level));
  spdlog::set_pattern("[%H:%M:%S.%e] [odbd " + std::to_string(config->rank) + "] [%l] %v");
  if (print_config) {
    std::printf("%s\n", odb::DescribeConfig(*config).c_str());
    return 0;
  }
  spdlog::info("starting: {}", odb::DescribeConfig(*config));
  odb::SetUpDescriptorBudget();  // before anything listens

  // The job's FileStore directory, leased for this daemon's life (stale keys
  // of a previous run with this job id removed, a live duplicate refused).
  std::unique_ptr<odb::StoreLease> lease;
  if (config->world_size > 1 && config->store == odb::StoreKind::kFile) {
    auto l = odb::StoreLease::Acquire(config->store_dir, config->job_id, config->rank);
    if (!l.ok()) {
      spdlog::error("cannot join the peer group: {}", std::string(l.status().message()));
      return 3;
    }
    lease = std::move(*l);
    if (lease->removed_stale()) {
      spdlog::info("removed the rendezvous keys a previous run of job '{}' left in {}", config->job_id,
                   odb::StoreLease::JobDir(config->store_dir, config->job_id));
    }
  }
  auto peers = odb::ConnectPeers(*config);
  if (!peers.ok()) {
    spdlog::error("cannot join the peer group: {}", std::string(peers.status().message()));
    return 3;
  }
  odb::Daemon daemon(*config, std::make_unique<odb::AlignedRoundRunner>(std::move(*peers), *config));
  if (absl::Status s = daemon.Bind(); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 3;
  }
  for (const auto& e : daemon.IngestEndpoints()) spdlog::info("ingest listening on {}", e);
  spdlog::info("trainer endpoint {}", daemon.TrainerEndpoint());
  if (!daemon.PeerEndpoint().empty()) spdlog::info("peer endpoint {}", daemon.PeerEndpoint());
  if (!daemon.MetricsEndpoint().empty()) spdlog::info("metrics endpoint {}", daemon.MetricsEndpoint());

  g_daemon.store(&daemon);
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::Status result = daemon.Run();
  g_daemon.store(nullptr);
  // Remove this daemon's ipc:// socket files (it still holds their locks, so
  // they are its own): a file left behind looks like a daemon to a trainer
  // until connect() is refused.
  std::vector<std::string> bound = daemon.IngestEndpoints();
  bound.push_back(daemon.TrainerEndpoint());
  for (const auto& e : bound) {
    if (e.rfind("ipc://", 0) == 0) ::unlink(e.substr(6).c_str());
  }
  const auto& m = daemon.metrics();
  if (g_signal.load() != 0) {
    spdlog::info("received signal {} ({}); shutting down", g_signal.load(),
                 g_signal.load() == SIGTERM ? "SIGTERM" : "SIGINT");
  }
  spdlog::info("exit: received={} rejected={} emitted={} steps={} idle={} rounds={} peak_buffer_bytes={}",
               m.samples_received.load(), m.samples_rejected.load(), m.samples_emitted.load(),
               m.steps_emitted.load(), m.idle_steps.load(), m.rounds.load(), m.peak_buffer_bytes.load());
  if (!result.ok()) {
    spdlog::error("stopped on error: {}", std::string(result.message()));
    return 1;
  }
  return 0;
}
