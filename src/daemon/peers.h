#ifndef ODB_DAEMON_PEERS_H_
#define ODB_DAEMON_PEERS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "src/align/peer_group.h"
#include "src/daemon/config.h"

namespace odb {

// The peer group for this rank: no network for W = 1, else a Gloo context
// through the configured store (FileStore or RedisStore).
absl::StatusOr<std::unique_ptr<align::PeerGroup>> ConnectPeers(const DaemonConfig& config);

}  // namespace odb

#endif  // ODB_DAEMON_PEERS_H_
