// Start-up validation of DaemonConfig, by section (config.cc's FinalizeConfig
// calls them), and the helpers its own checks share.
#ifndef ODB_DAEMON_CONFIG_VALIDATE_H_
#define ODB_DAEMON_CONFIG_VALIDATE_H_

#include <string>

#include "absl/status/status.h"
#include "src/daemon/config.h"

namespace odb::config_internal {

// "config field '<field>': <why>".
absl::Status Invalid(const std::string& field, const std::string& why);
// A user string in an error message: quoted, and cut if long.
std::string Shorten(const std::string& text);
// A number as an error message shows it.
std::string Num(double value);
std::string Num(int value);
// A path a user typed: not empty, not too long, no control characters.
absl::Status CheckPath(const std::string& field, const std::string& path);

absl::Status ValidateEndpoints(const DaemonConfig& c);
absl::Status ValidateBufferAndGrouping(const DaemonConfig& c);
absl::Status ValidateAlignment(const DaemonConfig& c);
absl::Status ValidateCollate(const DaemonConfig& c);

}  // namespace odb::config_internal

#endif  // ODB_DAEMON_CONFIG_VALIDATE_H_
