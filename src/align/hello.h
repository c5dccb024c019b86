#ifndef ODB_ALIGN_HELLO_H_
#define ODB_ALIGN_HELLO_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "src/align/peer_group.h"
#include "src/align/peer_wire.h"
#include "src/align/planner.h"

namespace odb::align {

// Named values that must be identical on every rank ("budget.max_tokens" ->
// "4096"). Order matters only for the fingerprint; keep it fixed.
using HelloFields = std::vector<std::pair<std::string, std::string>>;

// The alignment-relevant configuration: budget, step model, epoch mode, seed,
// window, wait rounds, planner name and world size.
HelloFields AlignmentHelloFields(const Planner& planner, int world_size);

// FNV-1a over the fields: a one-line log summary, and (CheckHellos) the check
// that a hello's fields arrived as they were sent.
uint64_t HelloFingerprint(const HelloFields& fields);

// Hello message: "ODBH", u32 little-endian kPeerProtocolVersion (the prefix
// every odbd has sent first, so daemons of different versions name both),
// then peer.proto's Hello: rank, world size, fingerprint and the fields.
std::string EncodeHello(int rank, int world_size, const HelloFields& fields);

// Compares every rank's hello with rank 0's; the result is the same on every
// rank (same gathered input). The error names each mismatching rank and field,
// and a rank of another protocol version with both versions.
absl::Status CheckHellos(const std::vector<std::string>& hellos);

// All-gathers this rank's hello and checks it. Every rank refuses a mismatch.
absl::Status ExchangeHello(PeerGroup& peers, const HelloFields& fields);

}  // namespace odb::align

#endif  // ODB_ALIGN_HELLO_H_
