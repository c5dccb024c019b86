#include "src/daemon/peers.h"

#include <filesystem>

#include "src/align/gloo_peer_group.h"
#include "src/align/hello.h"
#include "src/daemon/settings.h"
#include "src/daemon/store_lease.h"

namespace odb {

absl::StatusOr<std::unique_ptr<align::PeerGroup>> ConnectPeers(const DaemonConfig& config) {
  if (config.world_size == 1) return std::unique_ptr<align::PeerGroup>(new align::SoloPeerGroup());
  align::GlooPeerGroupOptions o;
  o.rank = config.rank;
  o.world_size = config.world_size;
  o.job_id = config.job_id;
  if (config.store == StoreKind::kFile) {
    o.store = align::GlooPeerGroupOptions::StoreKind::kFile;
    // One directory per job id (odbd holds a StoreLease on it, see main.cc):
    // Gloo's FileStore keeps its keys flat, named by a hash.
    o.file_store_dir = StoreLease::JobDir(config.store_dir, config.job_id);
    std::error_code ec;
    std::filesystem::create_directories(o.file_store_dir, ec);
    if (ec) {
      return absl::FailedPreconditionError("cannot create the rendezvous directory '" + o.file_store_dir +
                                           "' (alignment.store_dir): " + ec.message());
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
  // What every rank must share: the job-wide rows of the settings table.
  o.hello = JobWideSettings(config);
  auto group = align::GlooPeerGroup::Connect(o);
  if (!group.ok()) return group.status();
  return std::unique_ptr<align::PeerGroup>(std::move(*group));
}

}  // namespace odb
