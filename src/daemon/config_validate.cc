// Start-up validation of the daemon's config: everything that can be known
// wrong from the config alone is an error here, naming the field, the value
// and what to do, rather than a failure later (every sample rejected, a
// planner computing with NaN, a bind that fails).
#include "src/daemon/config_validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "src/collate/collator.h"
#include "src/common/dtype.h"
#include "src/common/status_macros.h"
#include "src/wire/tensor_codec.h"

namespace odb::config_internal {

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError("config field '" + field + "': " + why);
}

// Bounds on strings a user types. Generous for real use, small enough that a
// pasted blob or a runaway template is an error and not a 1 MB log line.
constexpr size_t kMaxPathLength = 4095;    // PATH_MAX - 1
constexpr size_t kMaxIpcPathLength = 107;  // sizeof(sockaddr_un::sun_path) - 1
constexpr size_t kMaxEndpointLength = 1024;
constexpr size_t kMaxHostLength = 253;  // DNS name limit
constexpr size_t kMaxIfaceLength = 15;  // IFNAMSIZ - 1
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
  return std::all_of(text.begin(), text.end(), [](unsigned char ch) { return ch > 0x20 && ch < 0x7f; });
}

absl::Status CheckLength(const std::string& field, const std::string& value, size_t max_length,
                         const std::string& hint) {
  if (value.size() > max_length) {
    return Invalid(field, "'" + Shorten(value) + "' is " + std::to_string(value.size()) +
                              " bytes long, more than the " + std::to_string(max_length) + " allowed; " +
                              hint);
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
  const std::string kinds =
      allow_ipc_inproc ? "ipc://path, tcp://host:port or inproc://name" : "tcp://host:port";
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
    return Invalid("ingest_endpoints", std::to_string(ingest.size()) + " endpoints; at most " +
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
    return Invalid("trainer_endpoint",
                   "'" + Shorten(trainer) + "' is also an ingest endpoint; give the trainer its own");
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
    return Invalid("shm.max_arenas", std::to_string(c.shm_max_arenas) +
                                         " must be in 1..65536 (shm.producer_arenas: false "
                                         "turns arenas off)");
  }
  if (c.trainer.step_arena_bytes < (uint64_t{1} << 20) || c.trainer.step_arena_bytes > (uint64_t{1} << 40)) {
    return Invalid("shm.step_arena_bytes",
                   std::to_string(c.trainer.step_arena_bytes) +
                       " must be in 1 MiB..1 TiB (shm.trainer_data_plane: zmq turns the arena off)");
  }
  if (c.steps.step_arena_wait_ms == 0) return Invalid("shm.step_arena_wait_ms", "must be > 0");
  if (c.trainer.step_arena_required && trainer.rfind("ipc://", 0) != 0) {
    return Invalid(
        "shm.trainer_data_plane",
        "'shm' needs an ipc:// trainer_endpoint (a local trainer), not '" + trainer + "'; use auto or zmq");
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
  ODB_RETURN_IF_ERROR(CheckFinite("grouping.step_time.per_padded_token", c.step_time.per_padded_token, 0.0,
                                  kMaxCostCoefficient, coefficient));
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
  ODB_RETURN_IF_ERROR(CheckFinite("alignment.memory_cap_margin", c.memory_cap_margin, 0.0, 10.0,
                                  "a finite number in [0, 10]"));
  ODB_RETURN_IF_ERROR(CheckFinite("alignment.memory_peak_ratio", c.memory_peak_ratio, 0.0, 10.0,
                                  "0 (off) or a finite number in [1, 10]"));
  if (c.memory_peak_ratio > 0 && c.memory_peak_ratio < 1) {
    return Invalid("alignment.memory_peak_ratio",
                   Num(c.memory_peak_ratio) + " is below 1 (a max over a mean); use 0 (off) or [1, 10]");
  }
  ODB_RETURN_IF_ERROR(CheckFinite("alignment.memory_time_floor", c.memory_time_floor, 0.0, 1.0,
                                  "0 (off) or a finite number in [0.5, 1)"));
  if ((c.memory_time_floor > 0 && c.memory_time_floor < 0.5) || c.memory_time_floor >= 1) {
    return Invalid("alignment.memory_time_floor",
                   Num(c.memory_time_floor) +
                       " is outside [0.5, 1) (a fraction of the encoders' bound); use 0 "
                       "(off) or [0.5, 1)");
  }
  ODB_RETURN_IF_ERROR(
      CheckFinite("alignment.memory_llm_slack", c.memory_llm_slack, 0.0, 10.0, "a finite number in [0, 10]"));
  ODB_RETURN_IF_ERROR(
      CheckFinite("optimizer.window_spread", c.window_spread, 0.0, 3.0, "a finite number in [0, 3]"));
  ODB_RETURN_IF_ERROR(
      CheckFinite("alignment.llm_cost_seconds", c.llm_cost_seconds, 0.0, kMaxCostCoefficient,
                  "a finite number >= 0 and <= 1e12 (seconds per unit of grouping.step_time)"));
  if (c.phase_plans && c.steps.encoder_fields.empty()) {
    return Invalid("alignment.phase_plans", "needs collate.encoder_fields (e.g. [pixel_values])");
  }
  if (c.store == StoreKind::kFile) ODB_RETURN_IF_ERROR(CheckPath("alignment.store_dir", c.store_dir));
  if (c.store == StoreKind::kRedis) {
    if (c.redis_host.empty()) return Invalid("alignment.redis_host", "must not be empty with store: redis");
    ODB_RETURN_IF_ERROR(
        CheckLength("alignment.redis_host", c.redis_host, kMaxHostLength, "use a host name or address"));
    if (!IsPrintableToken(c.redis_host)) {
      return Invalid("alignment.redis_host",
                     "'" + Shorten(c.redis_host) + "' contains spaces or control characters");
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
  ODB_RETURN_IF_ERROR(
      CheckLength("alignment.gloo_hostname", c.gloo_hostname, kMaxHostLength, "use a host name or address"));
  if (!IsPrintableToken(c.gloo_hostname)) {
    return Invalid("alignment.gloo_hostname",
                   "'" + Shorten(c.gloo_hostname) + "' contains spaces or control characters");
  }
  ODB_RETURN_IF_ERROR(CheckLength("alignment.gloo_iface", c.gloo_iface, kMaxIfaceLength,
                                  "use an interface name as `ip link` shows it (e.g. eth0)"));
  if (!IsPrintableToken(c.gloo_iface)) {
    return Invalid("alignment.gloo_iface",
                   "'" + Shorten(c.gloo_iface) + "' contains spaces or control characters");
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
    return Invalid(field,
                   "NaN is not a usable pad value for field '" + f.name + "'; use a number (0, -100, ...)");
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
      return Invalid("collate.length_field", std::string("must name the token tensor (e.g. input_ids): ") +
                                                 (o.packed ? "packed mode" : "attention_mask") +
                                                 " is built from it");
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
      return Invalid(
          "collate.fields[" + std::to_string(i) + "].name",
          "'" + o.fields[i].name + "' is also the name of a tensor the collator adds; rename the field");
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
    return Invalid("collate.audio_fields",
                   "needs alignment.phase_plans: true (the audio phase is a per-phase plan)");
  }
  // With phase plans, encoder fields leave the LLM batch; the LLM batch then
  // cannot build its mask / cu_seqlens from one of them.
  if (c.phase_plans && needs_length && (encoder.count(o.length_field) || audio.count(o.length_field))) {
    const char* list = encoder.count(o.length_field) ? "encoder_fields" : "audio_fields";
    return Invalid(
        "collate.length_field",
        "'" + o.length_field + "' is also in collate." + list +
            ", which phase_plans moves to an encoder batch; the LLM batch needs it: remove it from " + list);
  }
  return absl::OkStatus();
}

}  // namespace odb::config_internal
