#include "src/daemon/config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "src/common/status_macros.h"
#include "src/daemon/config_validate.h"
#include "src/daemon/settings.h"
#include "yaml-cpp/yaml.h"

extern char** environ;

namespace odb {
namespace {

using config_internal::CheckPath;
using config_internal::Invalid;
using config_internal::Num;
using config_internal::Shorten;
using config_internal::ValidateAlignment;
using config_internal::ValidateBufferAndGrouping;
using config_internal::ValidateCollate;
using config_internal::ValidateEndpoints;

constexpr const char* kLabelsField = "labels";
constexpr int kLabelsPadValue = -100;  // torch.nn.CrossEntropyLoss's ignore index

// Every key of the YAML names a row of the settings table (a typo must not be
// ignored), and a section of the table is a mapping in the YAML.
absl::Status CheckKeys(const YAML::Node& node, const std::string& prefix,
                       const std::map<std::string, const Setting*>& rows) {
  for (const auto& kv : node) {
    const std::string path = (prefix.empty() ? "" : prefix + ".") + kv.first.as<std::string>();
    auto row = rows.find(path);
    if (row == rows.end()) {
      return absl::InvalidArgumentError("config: unknown field '" + path +
                                        "' (check the spelling; see docs/config.md)");
    }
    if (!row->second->is_section) continue;
    if (!kv.second.IsMap())
      return absl::InvalidArgumentError("config field '" + path + "' must be a mapping");
    ODB_RETURN_IF_ERROR(CheckKeys(kv.second, path, rows));
  }
  return absl::OkStatus();
}

// The node at a dotted path; undefined if any part is missing.
YAML::Node Lookup(const YAML::Node& root, const std::string& path) {
  YAML::Node node = root;  // a handle: reset() moves it, `=` would write into the tree
  for (size_t begin = 0; begin <= path.size();) {
    const size_t dot = std::min(path.find('.', begin), path.size());
    const YAML::Node child = static_cast<const YAML::Node&>(node)[path.substr(begin, dot - begin)];
    if (!child) return child;
    node.reset(child);
    begin = dot + 1;
  }
  return node;
}

// Defaults that depend on what the file says. Labels pad with cross-entropy's
// ignore index unless the config lists them: padding with 0 would count every
// pad position as class 0 in the loss, silently. Listing `labels` (any
// pad_value) or another default rule turns this off.
void ApplyImpliedDefaults(DaemonConfig& c) {
  if (c.collate.default_rule == collate::FieldRule::kPad &&
      std::none_of(c.collate.fields.begin(), c.collate.fields.end(),
                   [](const collate::FieldSpec& f) { return f.name == kLabelsField; })) {
    collate::FieldSpec labels;
    labels.name = kLabelsField;
    labels.pad_value = kLabelsPadValue;
    c.collate.fields.push_back(labels);
  }
}

absl::StatusOr<DaemonConfig> ParseRoot(const YAML::Node& root) {
  DaemonConfig c;
  if (root && !root.IsNull()) {  // an empty file is every default
    if (!root.IsMap()) return absl::InvalidArgumentError("config: the top level must be a mapping");
    std::map<std::string, const Setting*> rows;
    for (const Setting& s : Settings()) rows[s.path] = &s;
    ODB_RETURN_IF_ERROR(CheckKeys(root, "", rows));
    for (const Setting& s : Settings()) {
      if (s.is_section) continue;
      if (const YAML::Node value = Lookup(root, s.path); value) ODB_RETURN_IF_ERROR(s.read(value, c));
    }
  }
  ApplyImpliedDefaults(c);
  return c;
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  for (size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, pos + to.size())) {
    text.replace(pos, from.size(), to);
  }
  return text;
}

absl::Status IntFromEnv(const std::map<std::string, std::string>& env, const std::string& name,
                        int fallback, int& out) {
  if (out >= 0) return absl::OkStatus();
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) {
    out = fallback;
    return absl::OkStatus();
  }
  // Decimal digits only, and within int: strtol alone would take " 1" and
  // "+1", clamp 10^20 to LONG_MAX, and a cast would wrap 2^32 to rank 0 (two
  // daemons of one job both rank 0) or LONG_MAX to -1.
  const std::string& text = it->second;
  constexpr size_t kMaxDigits = 10;  // INT_MAX = 2147483647
  const bool digits = text.size() <= kMaxDigits &&
                      std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  const long long value = digits ? std::stoll(text) : -1;
  if (!digits || value > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError("environment variable " + name + "='" + Shorten(text) +
                                      "' is not a decimal integer in 0.." +
                                      std::to_string(std::numeric_limits<int>::max()) +
                                      "; set it to this process's " + name + " or unset it");
  }
  out = static_cast<int>(value);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DaemonConfig> ParseConfig(const std::string& yaml_text) {
  try {
    return ParseRoot(YAML::Load(yaml_text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(std::string("config is not valid YAML: ") + e.what());
  }
}

absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path) {
  // A path is only ever read as a file: a missing one or a directory is an
  // error naming it, never an empty (all defaults) config.
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError("config file '" + path + "' does not exist (check the --config path)");
  }
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError("config file '" + path + "' is a directory; give the YAML file in it");
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot open config file '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  auto config = ParseConfig(text.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(), path + ": " + std::string(config.status().message()));
  }
  return config;
}

std::vector<std::pair<std::string, std::string>> ConfigFieldDefaults() {
  const DaemonConfig defaults = *ParseConfig("");
  std::vector<std::pair<std::string, std::string>> fields;
  for (const Setting& s : Settings()) {
    if (!s.is_section) fields.emplace_back(s.path, s.show(defaults));
  }
  return fields;
}

std::map<std::string, std::string> ProcessEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

absl::Status FinalizeConfig(DaemonConfig& c, const std::map<std::string, std::string>& env) {
  // -1 means "from the environment"; anything below is a typo, not "unset".
  if (c.rank < -1) return Invalid("rank", Num(c.rank) + " must be >= 0 (or omit it to use $RANK)");
  if (c.world_size < -1 || c.world_size == 0) {
    return Invalid("world_size", Num(c.world_size) + " must be >= 1 (or omit it to use $WORLD_SIZE)");
  }
  if (c.local_rank < -1) return Invalid("local_rank", Num(c.local_rank) + " must be >= 0 (or omit it)");
  if (c.local_world_size < -1 || c.local_world_size == 0) {
    return Invalid("local_world_size", Num(c.local_world_size) + " must be >= 1 (or omit it)");
  }
  ODB_RETURN_IF_ERROR(IntFromEnv(env, "RANK", 0, c.rank));
  ODB_RETURN_IF_ERROR(IntFromEnv(env, "WORLD_SIZE", 1, c.world_size));
  ODB_RETURN_IF_ERROR(IntFromEnv(env, "LOCAL_RANK", c.rank, c.local_rank));
  ODB_RETURN_IF_ERROR(IntFromEnv(env, "LOCAL_WORLD_SIZE", c.world_size, c.local_world_size));
  if (c.world_size < 1) return Invalid("world_size", "must be >= 1");
  if (c.rank >= c.world_size) {
    return Invalid("rank", std::to_string(c.rank) + " is not below world_size " +
                               std::to_string(c.world_size));
  }
  if (c.local_world_size < 1) return Invalid("local_world_size", "must be >= 1");
  ODB_RETURN_IF_ERROR(CheckPath("run_dir", c.run_dir));
  auto expand = [&](std::string s) {
    return Replace(Replace(s, "{run}", c.run_dir), "{rank}", std::to_string(c.rank));
  };
  for (auto& e : c.ingest.endpoints) e = expand(e);
  c.trainer.endpoint = expand(c.trainer.endpoint);
  c.store_dir = expand(c.store_dir);
  c.metrics_endpoint = expand(c.metrics_endpoint);
  if (!c.round_trace.empty()) {
    c.round_trace = expand(c.round_trace);
    ODB_RETURN_IF_ERROR(CheckPath("round_trace", c.round_trace));
  }
  ODB_RETURN_IF_ERROR(ValidateEndpoints(c));
  ODB_RETURN_IF_ERROR(ValidateBufferAndGrouping(c));
  ODB_RETURN_IF_ERROR(ValidateAlignment(c));
  if (c.trainer.outstanding_depth == 0) return Invalid("emit.outstanding_depth", "must be >= 1");
  if (c.queue_steps == 0) return Invalid("emit.queue_steps", "must be >= 1");
  if (c.expected_producers == 0) return Invalid("emit.expected_producers", "must be >= 1");
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (!kLevels.count(c.log_level)) {
    return Invalid("log_level", "'" + Shorten(c.log_level) +
                                    "' is not one of trace, debug, info, warn, error, critical, off");
  }
  return ValidateCollate(c);
}

std::string DescribeConfig(const DaemonConfig& c) {
  std::ostringstream out;
  out << "rank=" << c.rank << "/" << c.world_size << " local=" << c.local_rank << "/"
      << c.local_world_size << " ingest=";
  for (const auto& e : c.ingest.endpoints) out << e << " ";
  out << "trainer=" << c.trainer.endpoint << " " << grouping::DescribeBudget(c.budget)
      << " window=" << c.window << " mode=" << align::EpochModeName(c.mode)
      << " depth=" << c.trainer.outstanding_depth << " buffer=" << c.buffer_max_bytes << "B/" << c.buffer_max_samples
      << " store="
      << (c.store == StoreKind::kFile ? c.store_dir : c.redis_host + ":" + std::to_string(c.redis_port))
      << " packed=" << c.collate.packed
      << " planner=" << (c.planner == PlannerKind::kGlobal ? "global" : "local");
  if (c.planner == PlannerKind::kGlobal) {
    out << " locality=" << c.locality;
    // Blocks of the partitioned planner, as resolved (auto: from the world size).
    if (const uint32_t p = PartitionRanks(c, c.world_size); p > 0) out << " partition_ranks=" << p;
  }
  if (c.deterministic) out << " deterministic=1";
  if (c.tokens_per_step > 0)
    out << " tokens_per_step=" << c.tokens_per_step << " window_spread=" << c.window_spread;
  out << " seed=" << c.seed << " queue_steps=" << c.queue_steps << " max_wait_ms=" << c.max_wait_ms
      << " start_wait_ms=" << c.start_wait_ms;
  if (c.world_size > 1) out << " job_id=" << c.job_id << " gloo=" << (c.gloo_iface.empty() ? c.gloo_hostname : "iface:" + c.gloo_iface);
  return out.str();
}

}  // namespace odb
