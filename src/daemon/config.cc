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
#include "src/wire/tensor_codec.h"
#include "yaml-cpp/yaml.h"

extern char** environ;

namespace odb {
namespace {

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

std::string Shorten(const std::string& text);

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

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError("config field '" + field + "': " + why);
}

// --- Start-up validation ----------------------------------------------------
// Everything that can be known wrong from the config alone is an error here,
// naming the field, the value and what to do, rather than a failure later
// (every sample rejected, a planner computing with NaN, a bind that fails).

// Bounds on strings a user types. Generous for real use, small enough that a
// pasted blob or a runaway template is an error and not a 1 MB log line.
constexpr size_t kMaxPathLength = 4095;        // PATH_MAX - 1
constexpr size_t kMaxIpcPathLength = 107;      // sizeof(sockaddr_un::sun_path) - 1
constexpr size_t kMaxEndpointLength = 1024;
constexpr size_t kMaxHostLength = 253;         // DNS name limit
constexpr size_t kMaxIfaceLength = 15;         // IFNAMSIZ - 1
constexpr size_t kMaxJobIdLength = 128;
constexpr size_t kMaxFieldNameLength = 255;
constexpr size_t kMaxFields = 1024;
constexpr size_t kMaxIngestEndpoints = 64;
// Step-time coefficients and per-patch costs are in units of one padded token;
// beyond this they are surely a typo, and sums over a window could overflow.
constexpr double kMaxCostCoefficient = 1e12;

// A user string in an error message: quoted, and cut if long.
std::string Shorten(const std::string& text) {
  constexpr size_t kShown = 64;
  if (text.size() <= kShown) return text;
  return text.substr(0, kShown) + "... [" + std::to_string(text.size()) + " bytes]";
}

std::string Num(double value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return out.str();
}
std::string Num(int value) { return std::to_string(value); }

// True when every byte is a printable, non-space ASCII character.
bool IsPrintableToken(const std::string& text) {
  return std::all_of(text.begin(), text.end(),
                     [](unsigned char ch) { return ch > 0x20 && ch < 0x7f; });
}

absl::Status CheckLength(const std::string& field, const std::string& value, size_t max_length,
                         const std::string& hint) {
  if (value.size() > max_length) {
    return Invalid(field, "'" + Shorten(value) + "' is " + std::to_string(value.size()) +
                              " bytes long, more than the " + std::to_string(max_length) +
                              " allowed; " + hint);
  }
  return absl::OkStatus();
}

absl::Status CheckPath(const std::string& field, const std::string& path) {
  if (path.empty()) return Invalid(field, "must not be empty");
  if (path.find('\0') != std::string::npos) return Invalid(field, "must not contain a NUL byte");
  return CheckLength(field, path, kMaxPathLength, "use a shorter path");
}

// A finite double in [lo, hi] (hi may be +inf for "no upper bound").
absl::Status CheckFinite(const std::string& field, double value, double lo, double hi,
                         const std::string& what) {
  if (!std::isfinite(value)) {
    return Invalid(field, Num(value) + " is not a finite number; use " + what);
  }
  if (value < lo || value > hi) return Invalid(field, Num(value) + " is out of range; use " + what);
  return absl::OkStatus();
}

// "tcp://host:port" (port a number or '*'), "ipc://path" (short enough for a
// Unix socket address) or "inproc://name", as ZeroMQ binds them.
absl::Status CheckEndpoint(const std::string& field, const std::string& e, bool allow_ipc_inproc) {
  ODB_RETURN_IF_ERROR(CheckLength(field, e, kMaxEndpointLength, "use a shorter endpoint"));
  if (!IsPrintableToken(e)) {
    return Invalid(field, "'" + Shorten(e) + "' contains spaces or control characters");
  }
  const std::string kinds = allow_ipc_inproc ? "ipc://path, tcp://host:port or inproc://name"
                                             : "tcp://host:port";
  if (e.rfind("tcp://", 0) == 0) {
    const std::string rest = e.substr(6);
    const size_t colon = rest.rfind(':');
    const std::string host = colon == std::string::npos ? "" : rest.substr(0, colon);
    const std::string port = colon == std::string::npos ? "" : rest.substr(colon + 1);
    bool port_ok = port == "*";
    if (!port_ok && !port.empty() && port.size() <= 5 &&
        std::all_of(port.begin(), port.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      port_ok = std::stoi(port) <= 65535;
    }
    if (host.empty() || !port_ok) {
      return Invalid(field, "'" + Shorten(e) + "' must be tcp://host:port with a port 0-65535 or *");
    }
    return absl::OkStatus();
  }
  if (allow_ipc_inproc && e.rfind("ipc://", 0) == 0) {
    const std::string path = e.substr(6);
    if (path.empty()) return Invalid(field, "'" + e + "' has no socket path");
    if (path.size() > kMaxIpcPathLength) {
      return Invalid(field, "'" + Shorten(e) + "': the socket path is " + std::to_string(path.size()) +
                                " bytes, more than the " + std::to_string(kMaxIpcPathLength) +
                                " a Unix socket allows; use a shorter run_dir or path");
    }
    return absl::OkStatus();
  }
  if (allow_ipc_inproc && e.rfind("inproc://", 0) == 0 && e.size() > 9) return absl::OkStatus();
  return Invalid(field, "'" + Shorten(e) + "' must be " + kinds);
}

absl::Status ValidateEndpoints(const DaemonConfig& c) {
  const std::vector<std::string>& ingest = c.ingest.endpoints;
  const std::string& trainer = c.trainer.endpoint;
  if (ingest.empty()) return Invalid("ingest_endpoints", "needs at least one endpoint");
  if (ingest.size() > kMaxIngestEndpoints) {
    return Invalid("ingest_endpoints", std::to_string(ingest.size()) +
                                           " endpoints; at most " +
                                           std::to_string(kMaxIngestEndpoints) + " are allowed");
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < ingest.size(); ++i) {
    const std::string& e = ingest[i];
    ODB_RETURN_IF_ERROR(CheckEndpoint("ingest_endpoints[" + std::to_string(i) + "]", e, true));
    if (!seen.insert(e).second) {
      return Invalid("ingest_endpoints", "'" + Shorten(e) + "' is listed twice; list each endpoint once");
    }
  }
  ODB_RETURN_IF_ERROR(CheckEndpoint("trainer_endpoint", trainer, true));
  if (seen.count(trainer)) {
    return Invalid("trainer_endpoint", "'" + Shorten(trainer) +
                                           "' is also an ingest endpoint; give the trainer its own");
  }
  if (!c.metrics_endpoint.empty()) {
    ODB_RETURN_IF_ERROR(CheckEndpoint("metrics_endpoint", c.metrics_endpoint, false));
    if (seen.count(c.metrics_endpoint) || c.metrics_endpoint == trainer) {
      return Invalid("metrics_endpoint", "'" + Shorten(c.metrics_endpoint) +
                                             "' is also an ingest or trainer endpoint; use another port");
    }
  }
  if (c.ingest.hwm < 1) return Invalid("ingest_hwm", Num(c.ingest.hwm) + " must be >= 1");
  if (c.shm_max_arenas < 1 || c.shm_max_arenas > 65536) {
    return Invalid("shm.max_arenas", std::to_string(c.shm_max_arenas) + " must be in 1..65536 (shm.producer_arenas: false "
                                                            "turns arenas off)");
  }
  if (c.trainer.step_arena_bytes < (uint64_t{1} << 20) || c.trainer.step_arena_bytes > (uint64_t{1} << 40)) {
    return Invalid("shm.step_arena_bytes", std::to_string(c.trainer.step_arena_bytes) +
                                               " must be in 1 MiB..1 TiB (shm.trainer_data_plane: zmq turns the arena off)");
  }
  if (c.steps.step_arena_wait_ms == 0) return Invalid("shm.step_arena_wait_ms", "must be > 0");
  if (c.trainer.step_arena_required && trainer.rfind("ipc://", 0) != 0) {
    return Invalid("shm.trainer_data_plane", "'shm' needs an ipc:// trainer_endpoint (a local trainer), not '" +
                                         trainer + "'; use auto or zmq");
  }
  return absl::OkStatus();
}

absl::Status ValidateBufferAndGrouping(const DaemonConfig& c) {
  // A sample may take half the buffer and is charged its bytes plus the
  // bookkeeping of each tensor: below this, not even a one-byte sample fits.
  constexpr uint64_t kSmallestSample = wire::kBookkeepingBytesPerTensor + 1;
  if (c.buffer_max_bytes / 2 < kSmallestSample) {
    return Invalid("buffer.max_bytes", "(" + std::to_string(c.buffer_max_bytes) + ") must be at least " +
                                           std::to_string(2 * kSmallestSample) +
                                           ": a sample may take half of it and is charged " +
                                           std::to_string(wire::kBookkeepingBytesPerTensor) +
                                           " bytes per tensor besides its payload, so no sample could be "
                                           "admitted (the default is 1 GiB)");
  }
  if (c.buffer_max_samples == 0) return Invalid("buffer.max_samples", "must be > 0");
  // One run per buffered sample at least (every buffered sample may stand
  // apart), and no more than 2^32 (~80 GiB of bookkeeping).
  if (c.buffer_max_id_runs < c.buffer_max_samples || c.buffer_max_id_runs > (uint64_t{1} << 32)) {
    return Invalid("buffer.max_id_runs", std::to_string(c.buffer_max_id_runs) +
                                             " must be between buffer.max_samples (" +
                                             std::to_string(c.buffer_max_samples) + ") and 2^32");
  }
  if (c.budget.max_tokens == 0) return Invalid("grouping.max_tokens", "must be > 0");
  // 0 disables the quadratic term. Below one token, len*len/q dwarfs len and
  // tiny values overflow to inf: every sample would be over budget.
  const double q = c.budget.quadratic_q;
  if (!(q == 0.0 || (std::isfinite(q) && q >= 1.0))) {
    return Invalid("grouping.quadratic_q",
                   Num(q) + " must be 0 (off) or a finite number of tokens >= 1 (e.g. 2048)");
  }
  if (c.window == 0) return Invalid("grouping.window", "must be > 0");
  if (c.window > c.buffer_max_samples) {
    return Invalid("grouping.window", "(" + std::to_string(c.window) +
                                          ") must not exceed buffer.max_samples (" +
                                          std::to_string(c.buffer_max_samples) + ")");
  }
  if (c.deterministic && c.buffer_max_samples < 4ull * c.window) {
    return Invalid("buffer.max_samples",
                   "(" + std::to_string(c.buffer_max_samples) + ") must be at least 4 x grouping.window (" +
                       std::to_string(4ull * c.window) +
                       ") with alignment.deterministic: a rank holds one window in order, up to one "
                       "window of later samples, and the producers' credit");
  }
  const std::string coefficient = "a finite number >= 0 and <= 1e12 (units of one padded token)";
  ODB_RETURN_IF_ERROR(CheckFinite("grouping.step_time.per_step", c.step_time.per_step, 0.0,
                                  kMaxCostCoefficient, coefficient));
  ODB_RETURN_IF_ERROR(CheckFinite("grouping.step_time.per_padded_token",
                                  c.step_time.per_padded_token, 0.0, kMaxCostCoefficient,
                                  coefficient));
  ODB_RETURN_IF_ERROR(CheckFinite("grouping.step_time.per_len_sq", c.step_time.per_len_sq, 0.0,
                                  kMaxCostCoefficient, coefficient));
  if (c.step_time.per_step == 0 && c.step_time.per_padded_token == 0 && c.step_time.per_len_sq == 0) {
    return Invalid("grouping.step_time",
                   "per_step, per_padded_token and per_len_sq are all 0: every grouping would cost "
                   "nothing; set at least one above 0 (defaults 512, 1, 0)");
  }
  return absl::OkStatus();
}

absl::Status ValidateAlignment(const DaemonConfig& c) {
  if (!(c.locality >= 0.0 && c.locality <= 1.0)) {
    return Invalid("alignment.locality", Num(c.locality) + " must be a number in [0, 1]");
  }
  ODB_RETURN_IF_ERROR(CheckFinite("alignment.encoder_cost_per_patch", c.encoder_cost_per_patch, 0.0,
                                  kMaxCostCoefficient,
                                  "a finite number >= 0 and <= 1e12 (units of one padded token)"));
  for (auto [name, cost] :
       {std::pair<std::string, const balance::PhaseCost*>{"vision_cost", &c.vision_cost},
        std::pair<std::string, const balance::PhaseCost*>{"audio_cost", &c.audio_cost},
        std::pair<std::string, const balance::PhaseCost*>{"vision_memory", &c.vision_memory},
        std::pair<std::string, const balance::PhaseCost*>{"audio_memory", &c.audio_memory},
        std::pair<std::string, const balance::PhaseCost*>{"llm_memory", &c.llm_memory}}) {
    for (auto [term, value] : {std::pair<const char*, double>{"per_sample", cost->per_sample},
                               std::pair<const char*, double>{"per_unit", cost->per_unit},
                               std::pair<const char*, double>{"per_unit_sq", cost->per_unit_sq}}) {
      ODB_RETURN_IF_ERROR(CheckFinite("alignment." + name + "." + term, value, 0.0, kMaxCostCoefficient,
                                      "a finite number >= 0 and <= 1e12 (any unit: only ratios matter)"));
    }
  }
  ODB_RETURN_IF_ERROR(
      CheckFinite("alignment.memory_slack", c.memory_slack, 0.0, 10.0, "a finite number in [0, 10]"));
  if (c.partition_ranks != 0 && c.tokens_per_step != 0) {
    return Invalid("alignment.partition_ranks", "needs optimizer.tokens_per_step 0 (accumulation windows span all ranks)");
  }
  if (c.phase_plans && c.steps.encoder_fields.empty()) {
    return Invalid("alignment.phase_plans", "needs collate.encoder_fields (e.g. [pixel_values])");
  }
  if (c.store == StoreKind::kFile) ODB_RETURN_IF_ERROR(CheckPath("alignment.store_dir", c.store_dir));
  if (c.store == StoreKind::kRedis) {
    if (c.redis_host.empty()) return Invalid("alignment.redis_host", "must not be empty with store: redis");
    ODB_RETURN_IF_ERROR(CheckLength("alignment.redis_host", c.redis_host, kMaxHostLength,
                                    "use a host name or address"));
    if (!IsPrintableToken(c.redis_host)) {
      return Invalid("alignment.redis_host", "'" + Shorten(c.redis_host) + "' contains spaces or control characters");
    }
  }
  if (c.redis_port <= 0 || c.redis_port > 65535) {
    return Invalid("alignment.redis_port", Num(c.redis_port) + " is out of range; use 1-65535");
  }
  // The job id is a key prefix in the store and a directory name in the
  // FileStore; gloo's peer group refuses '/'.
  if (c.job_id.empty()) return Invalid("alignment.job_id", "must not be empty");
  ODB_RETURN_IF_ERROR(CheckLength("alignment.job_id", c.job_id, kMaxJobIdLength,
                                  "use a short id unique per job (e.g. the scheduler's job id)"));
  if (!IsPrintableToken(c.job_id) || c.job_id.find('/') != std::string::npos || c.job_id == "." ||
      c.job_id == "..") {
    return Invalid("alignment.job_id", "'" + Shorten(c.job_id) +
                                           "' must be printable ASCII without spaces or '/' and "
                                           "not '.' or '..' (it names a store directory)");
  }
  if (c.gloo_hostname.empty()) return Invalid("alignment.gloo_hostname", "must not be empty");
  ODB_RETURN_IF_ERROR(CheckLength("alignment.gloo_hostname", c.gloo_hostname, kMaxHostLength,
                                  "use a host name or address"));
  if (!IsPrintableToken(c.gloo_hostname)) {
    return Invalid("alignment.gloo_hostname", "'" + Shorten(c.gloo_hostname) + "' contains spaces or control characters");
  }
  ODB_RETURN_IF_ERROR(CheckLength("alignment.gloo_iface", c.gloo_iface, kMaxIfaceLength,
                                  "use an interface name as `ip link` shows it (e.g. eth0)"));
  if (!IsPrintableToken(c.gloo_iface)) {
    return Invalid("alignment.gloo_iface", "'" + Shorten(c.gloo_iface) + "' contains spaces or control characters");
  }
  if (c.connect_timeout_ms == 0) return Invalid("alignment.connect_timeout_ms", "must be > 0");
  if (c.collective_timeout_ms == 0) return Invalid("alignment.collective_timeout_ms", "must be > 0");
  return absl::OkStatus();
}

// With a declared dtype, the collator's conversion rule (collate::CheckPadValue:
// integers an integer in range, bool 0 or 1, float16 / bfloat16 / float32 no
// finite overflow, +-inf kept). NaN is refused for every dtype: padding with
// NaN poisons every reduction.
// Without a declared dtype, the value must be an integer exactly representable
// as a double (it is converted to whatever integer dtype the samples carry).
absl::Status CheckPadValue(const collate::FieldSpec& f, const std::string& path) {
  const std::string field = path + ".pad_value";
  const double v = f.pad_value;
  const std::string value = Num(v);
  if (std::isnan(v)) {
    return Invalid(field, "NaN is not a usable pad value for field '" + f.name +
                              "'; use a number (0, -100, ...)");
  }
  if (!f.dtype.has_value()) {
    constexpr double kExact = 9007199254740992.0;  // 2^53
    if (!std::isfinite(v) || v != std::trunc(v)) {
      return Invalid(field, value + " of field '" + f.name +
                                "' is not an integer; declare the field's floating dtype "
                                "(e.g. `dtype: float32`) or use an integer pad value");
    }
    if (std::fabs(v) > kExact) {
      return Invalid(field, value + " of field '" + f.name +
                                "' is beyond +-2^53 and not exact; declare the field's dtype "
                                "(e.g. `dtype: int64`) and use a smaller value");
    }
    return absl::OkStatus();
  }
  // The collator's own rule for the declared dtype (the same check Collate
  // makes once it sees the samples' dtype).
  const absl::Status s = collate::CheckPadValue(v, *f.dtype, f.name);
  if (!s.ok()) return Invalid(field, std::string(s.message()) + " (or declare another dtype)");
  return absl::OkStatus();
}

absl::Status CheckFieldName(const std::string& field, const std::string& name) {
  if (name.empty()) return Invalid(field, "must not be empty");
  ODB_RETURN_IF_ERROR(CheckLength(field, name, kMaxFieldNameLength, "use the tensor's name"));
  if (!IsPrintableToken(name)) {
    return Invalid(field, "'" + Shorten(name) + "' contains spaces or control characters");
  }
  return absl::OkStatus();
}

absl::Status ValidateCollate(const DaemonConfig& c) {
  const collate::CollateOptions& o = c.collate;
  const bool needs_length = o.packed || o.attention_mask;
  if (needs_length) {
    if (o.length_field.empty()) {
      return Invalid("collate.length_field",
                     std::string("must name the token tensor (e.g. input_ids): ") +
                         (o.packed ? "packed mode" : "attention_mask") + " is built from it");
    }
    ODB_RETURN_IF_ERROR(CheckFieldName("collate.length_field", o.length_field));
  }
  if (o.fields.size() > kMaxFields) {
    return Invalid("collate.fields", std::to_string(o.fields.size()) + " entries; at most " +
                                         std::to_string(kMaxFields) + " are allowed");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < o.fields.size(); ++i) {
    const collate::FieldSpec& f = o.fields[i];
    const std::string path = "collate.fields[" + std::to_string(i) + "]";
    ODB_RETURN_IF_ERROR(CheckFieldName(path + ".name", f.name));
    if (!names.insert(f.name).second) {
      return Invalid("collate.fields", "field '" + f.name + "' listed twice; keep one entry");
    }
    ODB_RETURN_IF_ERROR(CheckPadValue(f, path));
  }
  // Names the collator derives; a configured field of the same name would
  // make every step fail to collate.
  std::set<std::string> derived;
  for (const std::string& name : collate::DerivedTensorNames(o)) derived.insert(name);
  for (const auto& f : o.fields) {
    if (f.rule == collate::FieldRule::kConcat) derived.insert(collate::OffsetsName(f.name));
  }
  for (size_t i = 0; i < o.fields.size(); ++i) {
    if (derived.count(o.fields[i].name)) {
      return Invalid("collate.fields[" + std::to_string(i) + "].name",
                     "'" + o.fields[i].name +
                         "' is also the name of a tensor the collator adds; rename the field");
    }
  }
  std::set<std::string> encoder;
  const std::vector<std::string>& encoder_fields = c.steps.encoder_fields;
  for (size_t i = 0; i < encoder_fields.size(); ++i) {
    const std::string path = "collate.encoder_fields[" + std::to_string(i) + "]";
    ODB_RETURN_IF_ERROR(CheckFieldName(path, encoder_fields[i]));
    if (!encoder.insert(encoder_fields[i]).second) {
      return Invalid(path, "'" + encoder_fields[i] + "' is listed twice; keep one entry");
    }
  }
  std::set<std::string> audio;
  for (size_t i = 0; i < c.audio_fields.size(); ++i) {
    const std::string path = "collate.audio_fields[" + std::to_string(i) + "]";
    ODB_RETURN_IF_ERROR(CheckFieldName(path, c.audio_fields[i]));
    if (!audio.insert(c.audio_fields[i]).second) {
      return Invalid(path, "'" + c.audio_fields[i] + "' is listed twice; keep one entry");
    }
    if (encoder.count(c.audio_fields[i])) {
      return Invalid(path, "'" + c.audio_fields[i] +
                               "' is also in collate.encoder_fields; a field goes to one encoder phase");
    }
  }
  if (!c.audio_fields.empty() && !c.phase_plans) {
    return Invalid("collate.audio_fields", "needs alignment.phase_plans: true (the audio phase is a per-phase plan)");
  }
  // With phase plans, encoder fields leave the LLM batch; the LLM batch then
  // cannot build its mask / cu_seqlens from one of them.
  if (c.phase_plans && needs_length && (encoder.count(o.length_field) || audio.count(o.length_field))) {
    const char* list = encoder.count(o.length_field) ? "encoder_fields" : "audio_fields";
    return Invalid("collate.length_field",
                   "'" + o.length_field + "' is also in collate." + list +
                       ", which phase_plans moves to an encoder batch; the LLM batch needs it: remove it from " +
                       list);
  }
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
