#ifndef ODB_DAEMON_SETTINGS_H_
#define ODB_DAEMON_SETTINGS_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "src/daemon/config.h"
#include "yaml-cpp/yaml.h"

namespace odb {

// The table of the daemon's settings (src/daemon/settings.cc): one row per
// key of the YAML config, in the order configs/odbd.yaml lists them. From it
// come the parser (ParseConfig reads each row's key into its field and
// refuses any key no row names), the defaults print (`odbd
// --print-default-config`), the commented template (`odbd
// --print-config-template`, which configs/odbd.yaml is), the start-up log
// line and the settings every rank of a job must share (JobWideSettings, the
// peers' hello). A row's default is its field's initializer (in DaemonConfig,
// or in the stage's options struct for a stage's own knob): written once.
// Adding a setting: the field, one row, and the code that reads the field.

// kJob: every rank of a job must have the same value (checked when the
// daemons connect, naming the ranks and the key that differ).
enum class Scope { kRank, kJob };

struct Setting {
  std::string path;  // "grouping.window"
  Scope scope = Scope::kRank;
  std::string doc;      // the comment in the template; "\n" continues it on the next line
  std::string heading;  // comment lines printed above the row ("" lines: blank lines)
  // Reads `value` (present, not null) into the config; errors name `path`.
  std::function<absl::Status(const YAML::Node& value, DaemonConfig& config)> read;
  // The field's value as flow YAML.
  std::function<std::string(const DaemonConfig& config)> show;
  // A mapping (not a value): `read` and `show` are unset; the rows under it
  // follow. The template prints "path:" and the doc.
  bool is_section = false;
};

const std::vector<Setting>& Settings();

// Every job-wide setting as (path, value), in table order.
std::vector<std::pair<std::string, std::string>> JobWideSettings(const DaemonConfig& config);

// configs/odbd.yaml: every setting with its default and its doc.
std::string ConfigTemplate();

}  // namespace odb

#endif  // ODB_DAEMON_SETTINGS_H_
