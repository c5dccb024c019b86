#include "src/daemon/config.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "src/common/status_macros.h"
#include "yaml-cpp/yaml.h"

extern char** environ;

namespace odb {
namespace {

// Reads a YAML mapping section by section, remembering which keys were used
// so unknown keys (typos) can be reported with their full path.
class Section {
 public:
  Section(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {}

  template <typename T>
  absl::Status Get(const std::string& key, T& out) {
    used_.insert(key);
    const YAML::Node value = node_[key];
    if (!value) return absl::OkStatus();
    try {
      out = value.as<T>();
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError("config field '" + Path(key) + "': cannot read '" +
                                        YAML::Dump(value) + "' as the expected type");
    }
    return absl::OkStatus();
  }

  // A value that must be one of `choices` (mapped to an enum).
  template <typename E>
  absl::Status GetEnum(const std::string& key, const std::vector<std::pair<std::string, E>>& choices,
                       E& out) {
    std::string text;
    bool present = static_cast<bool>(node_[key]);
    if (absl::Status s = Get(key, text); !s.ok()) return s;
    if (!present) return absl::OkStatus();
    std::string allowed;
    for (const auto& [name, value] : choices) {
      if (name == text) {
        out = value;
        return absl::OkStatus();
      }
      allowed += (allowed.empty() ? "" : ", ") + name;
    }
    return absl::InvalidArgumentError("config field '" + Path(key) + "': '" + text +
                                      "' is not one of: " + allowed);
  }

  absl::StatusOr<Section> Child(const std::string& key) {
    used_.insert(key);
    const YAML::Node value = node_[key];
    if (value && !value.IsMap()) {
      return absl::InvalidArgumentError("config field '" + Path(key) + "' must be a mapping");
    }
    return Section(value ? value : YAML::Node(YAML::NodeType::Map), Path(key));
  }

  const YAML::Node& node() const { return node_; }
  std::string Path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  void MarkUsed(const std::string& key) { used_.insert(key); }

  absl::Status CheckNoUnknownKeys() const {
    if (!node_.IsMap()) return absl::OkStatus();
    for (const auto& kv : node_) {
      const std::string key = kv.first.as<std::string>();
      if (!used_.count(key)) {
        return absl::InvalidArgumentError("config: unknown field '" + Path(key) +
                                          "' (check the spelling; see docs/config.md)");
      }
    }
    return absl::OkStatus();
  }

 private:
  YAML::Node node_;
  std::string path_;
  std::set<std::string> used_;
};

absl::Status ParseGrouping(Section& s, DaemonConfig& c) {
  ODB_RETURN_IF_ERROR(s.GetEnum<grouping::CostModel>(
      "cost_model", {{"padded", grouping::CostModel::kPadded}, {"packed", grouping::CostModel::kPacked}},
      c.budget.model));
  ODB_RETURN_IF_ERROR(s.Get("max_tokens", c.budget.max_tokens));
  ODB_RETURN_IF_ERROR(s.Get("quadratic_q", c.budget.quadratic_q));
  ODB_RETURN_IF_ERROR(s.Get("max_group_size", c.budget.max_group_size));
  ODB_RETURN_IF_ERROR(s.Get("max_vision_patches", c.budget.max_vision_patches));
  ODB_RETURN_IF_ERROR(s.Get("max_audio_frames", c.budget.max_audio_frames));
  ODB_RETURN_IF_ERROR(s.Get("window", c.window));
  ODB_RETURN_IF_ERROR(s.GetEnum<OverBudgetPolicy>(
      "over_budget", {{"isolate", OverBudgetPolicy::kIsolate}, {"reject", OverBudgetPolicy::kReject}},
      c.over_budget));
  ODB_ASSIGN_OR_RETURN(Section st, s.Child("step_time"));
  ODB_RETURN_IF_ERROR(st.Get("per_step", c.step_time.per_step));
  ODB_RETURN_IF_ERROR(st.Get("per_padded_token", c.step_time.per_padded_token));
  ODB_RETURN_IF_ERROR(st.Get("per_len_sq", c.step_time.per_len_sq));
  ODB_RETURN_IF_ERROR(st.CheckNoUnknownKeys());
  return s.CheckNoUnknownKeys();
}

absl::Status ParseAlignment(Section& s, DaemonConfig& c) {
  ODB_RETURN_IF_ERROR(s.GetEnum<AlignMode>(
      "mode", {{"join", AlignMode::kJoin}, {"non_join", AlignMode::kNonJoin}}, c.mode));
  ODB_RETURN_IF_ERROR(s.Get("seed", c.seed));
  ODB_RETURN_IF_ERROR(s.GetEnum<PlannerKind>(
      "planner", {{"local", PlannerKind::kLocal}, {"global", PlannerKind::kGlobal}}, c.planner));
  ODB_RETURN_IF_ERROR(s.Get("locality", c.locality));
  ODB_RETURN_IF_ERROR(s.Get("phase_plans", c.phase_plans));
  ODB_RETURN_IF_ERROR(s.Get("encoder_cost_per_patch", c.encoder_cost_per_patch));
  ODB_RETURN_IF_ERROR(s.Get("max_wait_ms", c.max_wait_ms));
  ODB_RETURN_IF_ERROR(s.Get("start_wait_ms", c.start_wait_ms));
  ODB_RETURN_IF_ERROR(s.GetEnum<StoreKind>(
      "store", {{"file", StoreKind::kFile}, {"redis", StoreKind::kRedis}}, c.store));
  ODB_RETURN_IF_ERROR(s.Get("store_dir", c.store_dir));
  ODB_RETURN_IF_ERROR(s.Get("redis_host", c.redis_host));
  ODB_RETURN_IF_ERROR(s.Get("redis_port", c.redis_port));
  ODB_RETURN_IF_ERROR(s.Get("job_id", c.job_id));
  ODB_RETURN_IF_ERROR(s.Get("gloo_hostname", c.gloo_hostname));
  ODB_RETURN_IF_ERROR(s.Get("gloo_iface", c.gloo_iface));
  ODB_RETURN_IF_ERROR(s.Get("connect_timeout_ms", c.connect_timeout_ms));
  ODB_RETURN_IF_ERROR(s.Get("collective_timeout_ms", c.collective_timeout_ms));
  return s.CheckNoUnknownKeys();
}

const std::vector<std::pair<std::string, collate::FieldRule>> kRules = {
    {"pad", collate::FieldRule::kPad},
    {"stack", collate::FieldRule::kStack},
    {"concat", collate::FieldRule::kConcat}};

absl::Status ParseCollate(Section& s, DaemonConfig& c) {
  ODB_RETURN_IF_ERROR(s.Get("packed", c.collate.packed));
  ODB_RETURN_IF_ERROR(s.Get("attention_mask", c.collate.attention_mask));
  ODB_RETURN_IF_ERROR(s.Get("length_field", c.collate.length_field));
  ODB_RETURN_IF_ERROR(s.GetEnum("default_rule", kRules, c.collate.default_rule));
  ODB_RETURN_IF_ERROR(s.Get("encoder_fields", c.encoder_fields));
  s.MarkUsed("fields");
  const YAML::Node fields = s.node()["fields"];
  if (fields && !fields.IsSequence()) {
    return absl::InvalidArgumentError("config field 'collate.fields' must be a list");
  }
  for (size_t i = 0; fields && i < fields.size(); ++i) {
    Section f(fields[i], "collate.fields[" + std::to_string(i) + "]");
    collate::FieldSpec spec;
    ODB_RETURN_IF_ERROR(f.Get("name", spec.name));
    if (spec.name.empty()) {
      return absl::InvalidArgumentError("config field '" + f.Path("name") + "' is required");
    }
    ODB_RETURN_IF_ERROR(f.GetEnum("rule", kRules, spec.rule));
    ODB_RETURN_IF_ERROR(f.Get("pad_value", spec.pad_value));
    ODB_RETURN_IF_ERROR(f.GetEnum<collate::PadSide>(
        "pad_side", {{"right", collate::PadSide::kRight}, {"left", collate::PadSide::kLeft}},
        spec.pad_side));
    ODB_RETURN_IF_ERROR(f.CheckNoUnknownKeys());
    c.collate.fields.push_back(spec);
  }
  return s.CheckNoUnknownKeys();
}

absl::StatusOr<DaemonConfig> ParseRoot(const YAML::Node& root) {
  DaemonConfig c;
  if (!root || root.IsNull()) return c;
  if (!root.IsMap()) return absl::InvalidArgumentError("config: the top level must be a mapping");
  Section s(root, "");
  ODB_RETURN_IF_ERROR(s.Get("rank", c.rank));
  ODB_RETURN_IF_ERROR(s.Get("world_size", c.world_size));
  ODB_RETURN_IF_ERROR(s.Get("local_rank", c.local_rank));
  ODB_RETURN_IF_ERROR(s.Get("local_world_size", c.local_world_size));
  ODB_RETURN_IF_ERROR(s.Get("ingest_endpoints", c.ingest_endpoints));
  ODB_RETURN_IF_ERROR(s.Get("trainer_endpoint", c.trainer_endpoint));
  ODB_RETURN_IF_ERROR(s.Get("run_dir", c.run_dir));
  ODB_RETURN_IF_ERROR(s.Get("ingest_hwm", c.ingest_hwm));
  ODB_RETURN_IF_ERROR(s.GetEnum<BadInputPolicy>(
      "bad_input", {{"error", BadInputPolicy::kError}, {"skip_and_report", BadInputPolicy::kSkipAndReport}},
      c.bad_input));
  ODB_RETURN_IF_ERROR(s.Get("log_level", c.log_level));
  ODB_RETURN_IF_ERROR(s.Get("metrics_endpoint", c.metrics_endpoint));

  ODB_ASSIGN_OR_RETURN(Section buffer, s.Child("buffer"));
  ODB_RETURN_IF_ERROR(buffer.Get("max_bytes", c.buffer_max_bytes));
  ODB_RETURN_IF_ERROR(buffer.Get("max_samples", c.buffer_max_samples));
  ODB_RETURN_IF_ERROR(buffer.CheckNoUnknownKeys());

  ODB_ASSIGN_OR_RETURN(Section grouping, s.Child("grouping"));
  ODB_RETURN_IF_ERROR(ParseGrouping(grouping, c));
  ODB_ASSIGN_OR_RETURN(Section alignment, s.Child("alignment"));
  ODB_RETURN_IF_ERROR(ParseAlignment(alignment, c));

  ODB_ASSIGN_OR_RETURN(Section emit, s.Child("emit"));
  ODB_RETURN_IF_ERROR(emit.Get("outstanding_depth", c.outstanding_depth));
  ODB_RETURN_IF_ERROR(emit.Get("queue_steps", c.queue_steps));
  ODB_RETURN_IF_ERROR(emit.Get("expected_producers", c.expected_producers));
  ODB_RETURN_IF_ERROR(emit.Get("producer_timeout_ms", c.producer_timeout_ms));
  ODB_RETURN_IF_ERROR(emit.Get("trainer_timeout_ms", c.trainer_timeout_ms));
  ODB_RETURN_IF_ERROR(emit.CheckNoUnknownKeys());

  ODB_ASSIGN_OR_RETURN(Section collate_section, s.Child("collate"));
  ODB_RETURN_IF_ERROR(ParseCollate(collate_section, c));
  ODB_RETURN_IF_ERROR(s.CheckNoUnknownKeys());
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
  char* end = nullptr;
  long value = std::strtol(it->second.c_str(), &end, 10);
  if (*end != '\0' || value < 0) {
    return absl::InvalidArgumentError("environment variable " + name + "='" + it->second +
                                      "' is not a non-negative integer");
  }
  out = static_cast<int>(value);
  return absl::OkStatus();
}

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError("config field '" + field + "': " + why);
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
  if (c.run_dir.empty()) return Invalid("run_dir", "must not be empty");
  auto expand = [&](std::string s) {
    return Replace(Replace(s, "{run}", c.run_dir), "{rank}", std::to_string(c.rank));
  };
  if (c.ingest_endpoints.empty()) return Invalid("ingest_endpoints", "needs at least one endpoint");
  for (auto& e : c.ingest_endpoints) e = expand(e);
  c.trainer_endpoint = expand(c.trainer_endpoint);
  c.store_dir = expand(c.store_dir);
  c.metrics_endpoint = expand(c.metrics_endpoint);
  if (!c.metrics_endpoint.empty() && c.metrics_endpoint.rfind("tcp://", 0) != 0) {
    return Invalid("metrics_endpoint", "'" + c.metrics_endpoint + "' must be tcp://host:port (or empty)");
  }
  for (const auto& e : c.ingest_endpoints) {
    if (e.rfind("ipc://", 0) != 0 && e.rfind("tcp://", 0) != 0 && e.rfind("inproc://", 0) != 0) {
      return Invalid("ingest_endpoints", "'" + e + "' must start with ipc://, tcp:// or inproc://");
    }
  }
  if (c.ingest_hwm < 1) return Invalid("ingest_hwm", "must be >= 1");
  if (c.buffer_max_bytes == 0) return Invalid("buffer.max_bytes", "must be > 0");
  if (c.buffer_max_samples == 0) return Invalid("buffer.max_samples", "must be > 0");
  if (c.budget.max_tokens == 0) return Invalid("grouping.max_tokens", "must be > 0");
  if (c.budget.quadratic_q < 0) return Invalid("grouping.quadratic_q", "must be >= 0 (0 disables it)");
  if (c.window == 0) return Invalid("grouping.window", "must be > 0");
  if (c.window > c.buffer_max_samples) {
    return Invalid("grouping.window", "(" + std::to_string(c.window) +
                                          ") must not exceed buffer.max_samples (" +
                                          std::to_string(c.buffer_max_samples) + ")");
  }
  if (c.step_time.per_step < 0 || c.step_time.per_padded_token < 0 || c.step_time.per_len_sq < 0) {
    return Invalid("grouping.step_time", "coefficients must be >= 0");
  }
  if (c.outstanding_depth == 0) return Invalid("emit.outstanding_depth", "must be >= 1");
  if (c.queue_steps == 0) return Invalid("emit.queue_steps", "must be >= 1");
  if (c.expected_producers == 0) return Invalid("emit.expected_producers", "must be >= 1");
  if (c.redis_port <= 0 || c.redis_port > 65535) return Invalid("alignment.redis_port", "out of range");
  if (c.job_id.empty()) return Invalid("alignment.job_id", "must not be empty");
  if (!(c.locality >= 0.0 && c.locality <= 1.0)) return Invalid("alignment.locality", "must be in [0, 1]");
  if (c.phase_plans && c.encoder_fields.empty()) {
    return Invalid("alignment.phase_plans", "needs collate.encoder_fields (e.g. [pixel_values])");
  }
  if (c.encoder_cost_per_patch < 0) return Invalid("alignment.encoder_cost_per_patch", "must be >= 0");
  if (c.connect_timeout_ms == 0) return Invalid("alignment.connect_timeout_ms", "must be > 0");
  if (c.collective_timeout_ms == 0) return Invalid("alignment.collective_timeout_ms", "must be > 0");
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (!kLevels.count(c.log_level)) {
    return Invalid("log_level", "'" + c.log_level + "' is not one of trace, debug, info, warn, error, critical, off");
  }
  std::set<std::string> names;
  for (const auto& f : c.collate.fields) {
    if (!names.insert(f.name).second) return Invalid("collate.fields", "field '" + f.name + "' listed twice");
  }
  return absl::OkStatus();
}

std::string DescribeConfig(const DaemonConfig& c) {
  std::ostringstream out;
  out << "rank=" << c.rank << "/" << c.world_size << " local=" << c.local_rank << "/"
      << c.local_world_size << " ingest=";
  for (const auto& e : c.ingest_endpoints) out << e << " ";
  out << "trainer=" << c.trainer_endpoint << " " << grouping::DescribeBudget(c.budget)
      << " window=" << c.window << " mode=" << (c.mode == AlignMode::kJoin ? "join" : "non_join")
      << " depth=" << c.outstanding_depth << " buffer=" << c.buffer_max_bytes << "B/"
      << c.buffer_max_samples << " store=" << (c.store == StoreKind::kFile ? c.store_dir : c.redis_host + ":" + std::to_string(c.redis_port))
      << " packed=" << c.collate.packed
      << " planner=" << (c.planner == PlannerKind::kGlobal ? "global" : "local");
  if (c.planner == PlannerKind::kGlobal) out << " locality=" << c.locality;
  out << " seed=" << c.seed << " queue_steps=" << c.queue_steps << " max_wait_ms=" << c.max_wait_ms
      << " start_wait_ms=" << c.start_wait_ms;
  return out.str();
}

}  // namespace odb
