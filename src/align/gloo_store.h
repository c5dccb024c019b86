// The rendezvous store of a Gloo peer group: opening one (FileStore or
// RedisStore) and a bounded reachability check of a Redis host first.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "src/align/gloo_peer_group.h"

namespace gloo::rendezvous {
class Store;
}  // namespace gloo::rendezvous

namespace odb::align::internal {

// Bounded TCP reachability check: hiredis' connect has no timeout of its own.
absl::Status ProbeTcp(const std::string& host, int port, std::chrono::milliseconds timeout);

// A store connection of its own (a RedisStore's connection is not shared across threads).
std::unique_ptr<gloo::rendezvous::Store> OpenStore(const GlooPeerGroupOptions& o);

}  // namespace odb::align::internal
