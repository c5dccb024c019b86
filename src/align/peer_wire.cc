#include "src/align/peer_wire.h"

namespace odb::align {
namespace internal {

absl::Status CheckPeerMessage(std::string_view bytes, std::string_view what, bool parsed, uint32_t version,
                              bool unknown_fields) {
  // The version field (number 15, varint: tag 0x78) is the last one written.
  constexpr char kVersionTag = 0x78;
  const bool ends_with_version = bytes.size() >= 2 && bytes[bytes.size() - 2] == kVersionTag &&
                                 static_cast<uint8_t>(bytes.back()) == kPeerProtocolVersion;
  if (parsed && version == kPeerProtocolVersion && ends_with_version && !unknown_fields)
    return absl::OkStatus();
  const std::string name(what);
  const std::string size = std::to_string(bytes.size()) + " bytes";
  if (!parsed) {
    return absl::DataLossError(name + ": unreadable (" + size +
                               ": truncated or garbage; is every daemon of the job the same odbd?)");
  }
  if (version == 0) {
    return absl::DataLossError(name + ": no protocol version at its end (" + size +
                               ": truncated, or not an odb peer message)");
  }
  if (version != kPeerProtocolVersion) {
    return absl::FailedPreconditionError(name + ": peer protocol version " + std::to_string(version) +
                                         ", this build speaks " + std::to_string(kPeerProtocolVersion) +
                                         " (all daemons of a job must run the same odb version)");
  }
  if (!ends_with_version) {
    return absl::DataLossError(name + ": " + size + " that do not end with its version (bytes after it?)");
  }
  return absl::DataLossError(name + ": fields this build does not know (" + size +
                             "; is every daemon of the job the same odbd?)");
}

}  // namespace internal
}  // namespace odb::align
