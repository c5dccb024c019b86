#ifndef ODB_ALIGN_PEER_WIRE_H_
#define ODB_ALIGN_PEER_WIRE_H_

// The one format of the messages between the daemons of a job: the protobuf
// messages of proto/peer.proto, written by EncodePeerMessage and read by
// ParsePeerMessage (docs/protocol.md, "Peer messages").

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace odb::align {

// Version of the peer protocol: every message of proto/peer.proto and the
// planner's rules. Daemons of one job must agree on it (the hello checks it
// first); bump it on any change that could make two ranks read a message or
// plan differently. 1: the hand-written formats before proto/peer.proto.
// 3 (2026-12-06): the window-ends offers carry merge bits, partitioned
// windows are laid out again per block, and `auto` settings resolve anew
// (partition_ranks, mix_lengths), so a version-2 rank would plan otherwise.
inline constexpr uint32_t kPeerProtocolVersion = 3;

// `m` with its version set, serialized (the version is its last field, so the
// bytes end with 0x78, kPeerProtocolVersion).
template <typename M>
std::string EncodePeerMessage(M& m) {
  m.set_version(kPeerProtocolVersion);
  return m.SerializeAsString();
}

namespace internal {
absl::Status CheckPeerMessage(std::string_view bytes, std::string_view what, bool parsed, uint32_t version,
                              bool unknown_fields);
}  // namespace internal

// Parses `bytes` into `m`; `what` names the message in errors ("round
// metadata"). Refuses, each with its own error: bytes protobuf cannot parse
// (DataLoss), a message without its version at its end (truncated, or not a
// peer message: DataLoss), another protocol version (FailedPrecondition,
// naming both versions), bytes after the version (DataLoss) and fields this
// build does not know (DataLoss). What the fields may hold is the caller's
// to check.
template <typename M>
absl::Status ParsePeerMessage(std::string_view bytes, std::string_view what, M& m) {
  const bool parsed =
      bytes.size() <= (1u << 30) && m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  return internal::CheckPeerMessage(bytes, what, parsed, parsed ? m.version() : 0,
                                    parsed && !m.GetReflection()->GetUnknownFields(m).empty());
}

}  // namespace odb::align

#endif  // ODB_ALIGN_PEER_WIRE_H_
