#include "src/daemon/config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "src/common/dtype.h"
#include "src/common/status_macros.h"
#include "src/daemon/config_validate.h"
#include "src/wire/tensor_codec.h"
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

// While ConfigFieldDefaults() runs: every field the parser reads, with the
// value it holds before reading (its default), in parse order.
thread_local std::vector<std::pair<std::string, std::string>>* g_field_defaults = nullptr;

template <typename T>
std::string FlowYaml(const T& value) {
  YAML::Emitter out;
  out << YAML::Flow << YAML::Node(value);
  return out.c_str();
}

// What a field of type T takes, for the error when a value does not read as
// one (a negative count, 1e30 for an integer, a word for a bool).
template <typename T>
std::string Expected() {
  if constexpr (std::is_same_v<T, bool>) {
    return "true or false";
  } else if constexpr (std::is_integral_v<T>) {
    return std::string("a whole number in ") + std::to_string(std::numeric_limits<T>::min()) + ".." +
           std::to_string(std::numeric_limits<T>::max());
  } else if constexpr (std::is_floating_point_v<T>) {
    return "a number";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "a string";
  } else {
    return "a list of strings";
  }
}

// Reads a YAML mapping section by section, remembering which keys were used
// so unknown keys (typos) can be reported with their full path.
class Section {
 public:
  Section(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {}

  template <typename T>
  absl::Status Get(const std::string& key, T& out) {
    used_.insert(key);
    if (g_field_defaults != nullptr) g_field_defaults->emplace_back(Path(key), FlowYaml(out));
    const YAML::Node value = node_[key];
    if (!value) return absl::OkStatus();
    // A key without a value reads as YAML null, which a string field would
    // take as the text "null": every sample would then fail on it.
    if (value.IsNull()) {
      return absl::InvalidArgumentError("config field '" + Path(key) +
                                        "' has no value; give it one, or leave the key out for the default");
    }
    try {
      out = value.as<T>();
    } catch (const YAML::Exception&) {
      std::string text = YAML::Dump(value);
      if (text.size() > 64) text = text.substr(0, 64) + "... [" + std::to_string(text.size()) + " bytes]";
      return absl::InvalidArgumentError("config field '" + Path(key) + "': cannot read '" + text +
                                        "' as the expected type; use " + Expected<T>());
    }
    return absl::OkStatus();
  }

  // A value that must be one of `choices` (mapped to an enum).
  template <typename E>
  absl::Status GetEnum(const std::string& key, const std::vector<std::pair<std::string, E>>& choices,
                       E& out) {
    std::string text;
    for (const auto& [name, value] : choices) {
      if (value == out) text = name;  // the default, for ConfigFieldDefaults()
    }
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

// shm.trainer_data_plane: how steps reach the trainer (docs/shm.md, "Step
// arena"). auto: through a shared-memory step arena when the trainer endpoint
// is ipc:// and the trainer maps it, frames over ZeroMQ otherwise; shm: the
// same, but a trainer endpoint that is not ipc:// is a config error and an
// arena that cannot be created or offered is fatal; zmq: frames only.
absl::Status GetDataPlane(Section& s, const std::string& key, bool& step_arena, bool& required) {
  using Plane = std::pair<bool, bool>;  // (step_arena, step_arena_required)
  Plane plane{step_arena, required};
  ODB_RETURN_IF_ERROR(
      s.GetEnum<Plane>(key, {{"auto", {true, false}}, {"shm", {true, true}}, {"zmq", {false, false}}}, plane));
  std::tie(step_arena, required) = plane;
  return absl::OkStatus();
}

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
  ODB_RETURN_IF_ERROR(
      s.GetEnum<bool>("over_budget", {{"isolate", false}, {"reject", true}}, c.ingest.reject_over_budget));
  ODB_ASSIGN_OR_RETURN(Section st, s.Child("step_time"));
  ODB_RETURN_IF_ERROR(st.Get("per_step", c.step_time.per_step));
  ODB_RETURN_IF_ERROR(st.Get("per_padded_token", c.step_time.per_padded_token));
  ODB_RETURN_IF_ERROR(st.Get("per_len_sq", c.step_time.per_len_sq));
  ODB_RETURN_IF_ERROR(st.CheckNoUnknownKeys());
  return s.CheckNoUnknownKeys();
}

absl::Status ParseAlignment(Section& s, DaemonConfig& c) {
  ODB_RETURN_IF_ERROR(s.GetEnum<align::EpochMode>(
      "mode",
      {{align::EpochModeName(align::EpochMode::kJoin), align::EpochMode::kJoin},
       {align::EpochModeName(align::EpochMode::kNonJoin), align::EpochMode::kNonJoin}},
      c.mode));
  ODB_RETURN_IF_ERROR(s.Get("seed", c.seed));
  ODB_RETURN_IF_ERROR(s.GetEnum<PlannerKind>(
      "planner", {{"local", PlannerKind::kLocal}, {"global", PlannerKind::kGlobal}}, c.planner));
  ODB_RETURN_IF_ERROR(s.Get("locality", c.locality));
  ODB_RETURN_IF_ERROR(s.Get("partition_ranks", c.partition_ranks));
  ODB_RETURN_IF_ERROR(s.Get("phase_plans", c.phase_plans));
  ODB_RETURN_IF_ERROR(s.Get("encoder_cost_per_patch", c.encoder_cost_per_patch));
  // Per-phase cost models; vision's per_unit defaults to encoder_cost_per_patch.
  c.vision_cost.per_unit = c.encoder_cost_per_patch;
  for (auto [name, cost] : {std::pair<const char*, balance::PhaseCost*>{"vision_cost", &c.vision_cost},
                            std::pair<const char*, balance::PhaseCost*>{"audio_cost", &c.audio_cost},
                            std::pair<const char*, balance::PhaseCost*>{"vision_memory", &c.vision_memory},
                            std::pair<const char*, balance::PhaseCost*>{"audio_memory", &c.audio_memory},
                            std::pair<const char*, balance::PhaseCost*>{"llm_memory", &c.llm_memory}}) {
    ODB_ASSIGN_OR_RETURN(Section pc, s.Child(name));
    ODB_RETURN_IF_ERROR(pc.Get("per_sample", cost->per_sample));
    ODB_RETURN_IF_ERROR(pc.Get("per_unit", cost->per_unit));
    ODB_RETURN_IF_ERROR(pc.Get("per_unit_sq", cost->per_unit_sq));
    ODB_RETURN_IF_ERROR(pc.CheckNoUnknownKeys());
  }
  ODB_RETURN_IF_ERROR(s.Get("memory_slack", c.memory_slack));
  ODB_RETURN_IF_ERROR(s.Get("deterministic", c.deterministic));
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

constexpr const char* kLabelsField = "labels";
constexpr int kLabelsPadValue = -100;  // torch.nn.CrossEntropyLoss's ignore_index

const std::vector<std::pair<std::string, collate::FieldRule>> kRules = {
    {std::string(collate::RuleName(collate::FieldRule::kPad)), collate::FieldRule::kPad},
    {std::string(collate::RuleName(collate::FieldRule::kStack)), collate::FieldRule::kStack},
    {std::string(collate::RuleName(collate::FieldRule::kConcat)), collate::FieldRule::kConcat}};

absl::Status ParseCollate(Section& s, DaemonConfig& c) {
  ODB_RETURN_IF_ERROR(s.Get("packed", c.collate.packed));
  ODB_RETURN_IF_ERROR(s.Get("attention_mask", c.collate.attention_mask));
  ODB_RETURN_IF_ERROR(s.Get("length_field", c.collate.length_field));
  ODB_RETURN_IF_ERROR(s.GetEnum("default_rule", kRules, c.collate.default_rule));
  ODB_RETURN_IF_ERROR(s.Get("encoder_fields", c.steps.encoder_fields));
  ODB_RETURN_IF_ERROR(s.Get("audio_fields", c.audio_fields));
  s.MarkUsed("fields");
  if (g_field_defaults != nullptr) {
    g_field_defaults->emplace_back(s.Path("fields"), "[{name: " + std::string(kLabelsField) +
                                                         ", pad_value: " + std::to_string(kLabelsPadValue) + "}]");
  }
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
    std::string dtype_name;
    ODB_RETURN_IF_ERROR(f.Get("dtype", dtype_name));
    if (f.node()["dtype"]) {
      const std::optional<DType> dtype = DTypeFromName(dtype_name);
      if (!dtype.has_value() || *dtype == DType::kUnspecified) {
        return absl::InvalidArgumentError(
            "config field '" + f.Path("dtype") + "': '" + dtype_name +
            "' is not one of: uint8, int8, int16, int32, int64, float16, bfloat16, float32, "
            "float64, bool");
      }
      spec.dtype = dtype;
    }
    ODB_RETURN_IF_ERROR(f.GetEnum<collate::PadSide>(
        "pad_side", {{"right", collate::PadSide::kRight}, {"left", collate::PadSide::kLeft}},
        spec.pad_side));
    ODB_RETURN_IF_ERROR(f.CheckNoUnknownKeys());
    c.collate.fields.push_back(spec);
  }
  // Labels pad with cross-entropy's ignore index unless the config lists
  // them: padding with 0 would count every pad position as class 0 in the
  // loss, silently. Listing `labels` (any pad_value) or another default rule
  // turns this off.
  if (c.collate.default_rule == collate::FieldRule::kPad &&
      std::none_of(c.collate.fields.begin(), c.collate.fields.end(),
                   [](const collate::FieldSpec& f) { return f.name == kLabelsField; })) {
    collate::FieldSpec labels;
    labels.name = kLabelsField;
    labels.pad_value = kLabelsPadValue;
    c.collate.fields.push_back(labels);
  }
  return s.CheckNoUnknownKeys();
}

absl::StatusOr<DaemonConfig> ParseRoot(const YAML::Node& root) {
  DaemonConfig c;
  // An empty file is every default, the parsed ones (collate's labels) included.
  if (!root || root.IsNull()) return ParseRoot(YAML::Node(YAML::NodeType::Map));
  if (!root.IsMap()) return absl::InvalidArgumentError("config: the top level must be a mapping");
  Section s(root, "");
  ODB_RETURN_IF_ERROR(s.Get("rank", c.rank));
  ODB_RETURN_IF_ERROR(s.Get("world_size", c.world_size));
  ODB_RETURN_IF_ERROR(s.Get("local_rank", c.local_rank));
  ODB_RETURN_IF_ERROR(s.Get("local_world_size", c.local_world_size));
  ODB_RETURN_IF_ERROR(s.Get("ingest_endpoints", c.ingest.endpoints));
  ODB_RETURN_IF_ERROR(s.Get("trainer_endpoint", c.trainer.endpoint));
  ODB_RETURN_IF_ERROR(s.Get("run_dir", c.run_dir));
  ODB_RETURN_IF_ERROR(s.Get("ingest_hwm", c.ingest.hwm));
  // What the trainer client does with rejected inputs; nothing is ever
  // dropped silently: both report every rejection with its sample id.
  ODB_RETURN_IF_ERROR(s.GetEnum<bool>("bad_input", {{"error", true}, {"skip_and_report", false}},
                                      c.steps.rejections_are_errors));
  ODB_RETURN_IF_ERROR(s.Get("log_level", c.log_level));
  ODB_RETURN_IF_ERROR(s.Get("metrics_endpoint", c.metrics_endpoint));
  ODB_RETURN_IF_ERROR(s.Get("round_trace", c.round_trace));

  ODB_ASSIGN_OR_RETURN(Section shm, s.Child("shm"));
  ODB_RETURN_IF_ERROR(shm.Get("producer_arenas", c.shm_producer_arenas));
  ODB_RETURN_IF_ERROR(shm.Get("max_arenas", c.shm_max_arenas));
  ODB_RETURN_IF_ERROR(GetDataPlane(shm, "trainer_data_plane", c.trainer.step_arena, c.trainer.step_arena_required));
  ODB_RETURN_IF_ERROR(shm.Get("step_arena_bytes", c.trainer.step_arena_bytes));
  ODB_RETURN_IF_ERROR(shm.Get("step_arena_wait_ms", c.steps.step_arena_wait_ms));
  ODB_RETURN_IF_ERROR(shm.CheckNoUnknownKeys());

  ODB_ASSIGN_OR_RETURN(Section buffer, s.Child("buffer"));
  ODB_RETURN_IF_ERROR(buffer.Get("max_bytes", c.buffer_max_bytes));
  ODB_RETURN_IF_ERROR(buffer.Get("max_samples", c.buffer_max_samples));
  ODB_RETURN_IF_ERROR(buffer.Get("max_id_runs", c.buffer_max_id_runs));
  ODB_RETURN_IF_ERROR(buffer.CheckNoUnknownKeys());

  ODB_ASSIGN_OR_RETURN(Section grouping, s.Child("grouping"));
  ODB_RETURN_IF_ERROR(ParseGrouping(grouping, c));
  ODB_ASSIGN_OR_RETURN(Section alignment, s.Child("alignment"));
  ODB_RETURN_IF_ERROR(ParseAlignment(alignment, c));

  ODB_ASSIGN_OR_RETURN(Section optimizer, s.Child("optimizer"));
  ODB_RETURN_IF_ERROR(optimizer.Get("tokens_per_step", c.tokens_per_step));
  ODB_RETURN_IF_ERROR(optimizer.CheckNoUnknownKeys());
  ODB_ASSIGN_OR_RETURN(Section emit, s.Child("emit"));
  ODB_RETURN_IF_ERROR(emit.Get("outstanding_depth", c.trainer.outstanding_depth));
  ODB_RETURN_IF_ERROR(emit.Get("queue_steps", c.queue_steps));
  ODB_RETURN_IF_ERROR(emit.Get("expected_producers", c.expected_producers));
  ODB_RETURN_IF_ERROR(emit.Get("producer_timeout_ms", c.ingest.producer_timeout_ms));
  ODB_RETURN_IF_ERROR(emit.Get("trainer_timeout_ms", c.trainer.trainer_timeout_ms));
  ODB_RETURN_IF_ERROR(emit.Get("exit_when_trainer_done", c.exit_when_trainer_done));
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
  std::vector<std::pair<std::string, std::string>> fields;
  g_field_defaults = &fields;
  (void)ParseRoot(YAML::Node(YAML::NodeType::Map));
  g_field_defaults = nullptr;
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
  if (c.planner == PlannerKind::kGlobal) out << " locality=" << c.locality;
  if (c.deterministic) out << " deterministic=1";
  if (c.tokens_per_step > 0) out << " tokens_per_step=" << c.tokens_per_step;
  out << " seed=" << c.seed << " queue_steps=" << c.queue_steps << " max_wait_ms=" << c.max_wait_ms
      << " start_wait_ms=" << c.start_wait_ms;
  if (c.world_size > 1) out << " job_id=" << c.job_id << " gloo=" << (c.gloo_iface.empty() ? c.gloo_hostname : "iface:" + c.gloo_iface);
  return out.str();
}

}  // namespace odb
