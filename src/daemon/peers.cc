#include "src/daemon/peers.h"

#include <filesystem>

#include "src/align/gloo_peer_group.h"
#include "src/align/hello.h"
#include "src/daemon/aligned_round_runner.h"

namespace odb {

absl::StatusOr<std::unique_ptr<align::PeerGroup>> ConnectPeers(const DaemonConfig& config) {
  if (config.world_size == 1) return std::unique_ptr<align::PeerGroup>(new align::SoloPeerGroup());
  align::GlooPeerGroupOptions o;
  o.rank = config.rank;
  o.world_size = config.world_size;
  o.job_id = config.job_id;
  if (config.store == StoreKind::kFile) {
    o.store = align::GlooPeerGroupOptions::StoreKind::kFile;
    o.file_store_dir = config.store_dir;
    std::error_code ec;
    std::filesystem::create_directories(config.store_dir, ec);
    if (ec) {
      return absl::FailedPreconditionError("cannot create alignment.store_dir '" + config.store_dir +
                                           "': " + ec.message());
    }
  } else {
    o.store = align::GlooPeerGroupOptions::StoreKind::kRedis;
    o.redis_host = config.redis_host;
    o.redis_port = config.redis_port;
  }
  o.hostname = config.gloo_hostname;
  o.iface = config.gloo_iface;
  o.connect_timeout = std::chrono::milliseconds(config.connect_timeout_ms);
  o.collective_timeout = std::chrono::milliseconds(config.collective_timeout_ms);
  o.hello = align::AlignmentHelloFields(*MakePlanner(config), config.world_size);
  auto group = align::GlooPeerGroup::Connect(o);
  if (!group.ok()) return group.status();
  return std::unique_ptr<align::PeerGroup>(std::move(*group));
}

}  // namespace odb
