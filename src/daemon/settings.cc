#include "src/daemon/settings.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <tuple>

#include "src/common/dtype.h"
#include "src/common/status_macros.h"
#include "src/daemon/yaml_read.h"

namespace odb {
namespace {

using config_internal::ChoiceName;
using config_internal::Choices;
using config_internal::FlowYaml;
using config_internal::ReadChoice;
using config_internal::ReadValue;
using config_internal::Section;

// The field a row reads: an accessor that works on a const and a mutable config.
#define ODB_FIELD(member) \
  [](auto& c) -> auto& { return c.member; }

constexpr Scope kRank = Scope::kRank;
constexpr Scope kJob = Scope::kJob;

Setting Row(std::string path, Scope scope, std::string doc = "", std::string heading = "") {
  Setting s;
  s.path = std::move(path);
  s.scope = scope;
  s.doc = std::move(doc);
  s.heading = std::move(heading);
  return s;
}

template <typename Get>
Setting Field(std::string path, Scope scope, Get get, std::string doc = "", std::string heading = "") {
  Setting s = Row(path, scope, std::move(doc), std::move(heading));
  s.read = [get, path](const YAML::Node& v, DaemonConfig& c) { return ReadValue(v, path, get(c)); };
  s.show = [get](const DaemonConfig& c) { return FlowYaml(get(c)); };
  return s;
}

template <typename Get, typename E>
Setting Choice(std::string path, Scope scope, Get get, Choices<E> choices, std::string doc = "",
               std::string heading = "") {
  Setting s = Row(path, scope, std::move(doc), std::move(heading));
  s.read = [get, path, choices](const YAML::Node& v, DaemonConfig& c) {
    return ReadChoice(v, path, choices, get(c));
  };
  s.show = [get, choices](const DaemonConfig& c) { return ChoiceName(choices, get(c)); };
  return s;
}

Setting Group(std::string path, std::string doc = "", std::string heading = "") {
  Setting s = Row(std::move(path), kRank, std::move(doc), std::move(heading));
  s.is_section = true;
  return s;
}

// Three rows of a balance::PhaseCost under `path`; the doc lines go one per row.
template <typename Get>
void PhaseCostRows(std::vector<Setting>& t, const std::string& path, Get get, const std::string& doc,
                   const std::vector<std::string>& row_docs) {
  t.push_back(Group(path, doc));
  const std::vector<std::pair<const char*, double balance::PhaseCost::*>> parts = {
      {"per_sample", &balance::PhaseCost::per_sample},
      {"per_unit", &balance::PhaseCost::per_unit},
      {"per_unit_sq", &balance::PhaseCost::per_unit_sq}};
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto member = parts[i].second;
    t.push_back(Field(
        path + "." + parts[i].first, kJob, [ get, member ](auto& c) -> auto& { return get(c).*member; },
        i < row_docs.size() ? row_docs[i] : ""));
  }
}

// shm.trainer_data_plane: how steps reach the trainer (docs/shm.md, "Step
// arena"). auto: through a shared-memory step arena when the trainer endpoint
// is ipc:// and the trainer maps it, frames over ZeroMQ otherwise; shm: the
// same, but a trainer endpoint that is not ipc:// is a config error and an
// arena that cannot be created or offered is fatal; zmq: frames only.
Setting DataPlaneRow() {
  using Plane = std::pair<bool, bool>;  // (step_arena, step_arena_required)
  static const Choices<Plane> kPlanes = {
      {"auto", {true, false}}, {"shm", {true, true}}, {"zmq", {false, false}}};
  Setting s =
      Row("shm.trainer_data_plane", kRank,
          "auto: steps reach a local trainer through the daemon's step arena (shared memory), else frames "
          "| shm | zmq");
  s.read = [path = s.path](const YAML::Node& v, DaemonConfig& c) {
    Plane plane{c.trainer.step_arena, c.trainer.step_arena_required};
    ODB_RETURN_IF_ERROR(ReadChoice(v, path, kPlanes, plane));
    std::tie(c.trainer.step_arena, c.trainer.step_arena_required) = plane;
    return absl::OkStatus();
  };
  s.show = [](const DaemonConfig& c) {
    return ChoiceName(kPlanes, Plane{c.trainer.step_arena, c.trainer.step_arena_required});
  };
  return s;
}

// alignment.encoder_cost_per_patch: the vision cost's per_unit default (its
// older name); alignment.vision_cost.per_unit, read after it, wins.
Setting EncoderCostRow() {
  Setting s = Field("alignment.encoder_cost_per_patch", kJob, ODB_FIELD(encoder_cost_per_patch),
                    "encoder-phase cost of one vision patch (relative to one LLM token); finite, [0, 1e12]");
  s.read = [path = s.path](const YAML::Node& v, DaemonConfig& c) {
    ODB_RETURN_IF_ERROR(ReadValue(v, path, c.encoder_cost_per_patch));
    c.vision_cost.per_unit = c.encoder_cost_per_patch;
    return absl::OkStatus();
  };
  return s;
}

// alignment.partition_ranks: auto (unset, PartitionRanks resolves it from the
// world size) or a number of ranks per block.
Setting PartitionRanksRow() {
  Setting s = Row("alignment.partition_ranks", kJob,
                  "global only: plan in blocks of this many ranks (whole nodes; samples stay in their block), "
                  "0 = all ranks as one pool, auto = one pool up to " +
                      std::to_string(kAutoPartitionMaxBlock) + " ranks, equal blocks of at most " +
                      std::to_string(kAutoPartitionMaxBlock) +
                      " above; windows are cut from the world-wide step totals (docs/balancing.md)");
  s.read = [path = s.path](const YAML::Node& v, DaemonConfig& c) {
    if (!v) return absl::OkStatus();
    if (v.IsScalar() && v.Scalar() == "auto") {
      c.partition_ranks.reset();
      return absl::OkStatus();
    }
    uint32_t ranks = 0;
    if (absl::Status st = ReadValue(v, path, ranks); !st.ok()) {
      return v.IsNull() ? st : absl::InvalidArgumentError(std::string(st.message()) + ", or auto");
    }
    c.partition_ranks = ranks;
    return absl::OkStatus();
  };
  s.show = [](const DaemonConfig& c) {
    return c.partition_ranks.has_value() ? FlowYaml(*c.partition_ranks) : std::string("auto");
  };
  return s;
}

const Choices<collate::FieldRule> kRules = {
    {std::string(collate::RuleName(collate::FieldRule::kPad)), collate::FieldRule::kPad},
    {std::string(collate::RuleName(collate::FieldRule::kStack)), collate::FieldRule::kStack},
    {std::string(collate::RuleName(collate::FieldRule::kConcat)), collate::FieldRule::kConcat}};

absl::Status ReadFieldSpec(const YAML::Node& node, const std::string& path, collate::FieldSpec& spec) {
  Section f(node, path);
  ODB_RETURN_IF_ERROR(f.Get("name", spec.name));
  if (spec.name.empty())
    return absl::InvalidArgumentError("config field '" + f.Path("name") + "' is required");
  ODB_RETURN_IF_ERROR(f.GetEnum("rule", kRules, spec.rule));
  ODB_RETURN_IF_ERROR(f.Get("pad_value", spec.pad_value));
  std::string dtype_name;
  ODB_RETURN_IF_ERROR(f.Get("dtype", dtype_name));
  if (f.node()["dtype"]) {
    const std::optional<DType> dtype = DTypeFromName(dtype_name);
    if (!dtype.has_value() || *dtype == DType::kUnspecified) {
      return absl::InvalidArgumentError(
          "config field '" + f.Path("dtype") + "': '" + dtype_name +
          "' is not one of: uint8, int8, int16, int32, int64, float16, bfloat16, "
          "float32, float64, bool");
    }
    spec.dtype = dtype;
  }
  ODB_RETURN_IF_ERROR(f.GetEnum<collate::PadSide>(
      "pad_side", {{"right", collate::PadSide::kRight}, {"left", collate::PadSide::kLeft}}, spec.pad_side));
  return f.CheckNoUnknownKeys();
}

// collate.fields: a list of per-field rules. Labels pad with cross-entropy's
// ignore index unless the list names them (ApplyImpliedDefaults).
Setting CollateFieldsRow() {
  Setting s =
      Row("collate.fields", kRank,
          "labels pad with -100 (cross-entropy's ignore index) even when not listed here, as long\n"
          "as default_rule is pad; list labels to choose another pad_value; more, e.g.\n"
          "[{name: labels, rule: pad, pad_value: -100, pad_side: right},\n"
          " {name: logits_mask, pad_value: -.inf, dtype: float32}]: pad_value must be an\n"
          "integer unless the field declares a floating dtype (float16 | bfloat16 | float32 |\n"
          "float64); a declared dtype (also uint8 .. int64, bool) must represent it; NaN is refused.");
  s.read = [](const YAML::Node& fields, DaemonConfig& c) {
    if (!fields.IsSequence())
      return absl::InvalidArgumentError("config field 'collate.fields' must be a list");
    for (size_t i = 0; i < fields.size(); ++i) {
      collate::FieldSpec spec;
      ODB_RETURN_IF_ERROR(ReadFieldSpec(fields[i], "collate.fields[" + std::to_string(i) + "]", spec));
      c.collate.fields.push_back(spec);
    }
    return absl::OkStatus();
  };
  s.show = [](const DaemonConfig& c) {
    std::string out = "[";
    for (const collate::FieldSpec& f : c.collate.fields) {
      YAML::Node n;
      n["name"] = f.name;
      if (f.rule != collate::FieldRule::kPad) n["rule"] = ChoiceName(kRules, f.rule);
      n["pad_value"] = f.pad_value;
      if (f.dtype.has_value()) n["dtype"] = std::string(DTypeName(*f.dtype));
      if (f.pad_side == collate::PadSide::kLeft) n["pad_side"] = "left";
      YAML::Emitter e;
      e << YAML::Flow << n;
      out += (out.size() > 1 ? ", " : "") + std::string(e.c_str());
    }
    return out + "]";
  };
  return s;
}

std::vector<Setting> BuildTable() {
  std::vector<Setting> t;
  auto add = [&t](Setting s) { t.push_back(std::move(s)); };

  const std::string identity =
      "\nIdentity: -1 takes RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE from the\n"
      "launcher's environment (torchrun, Slurm via deploy/), else 0 / 1.";
  add(Field("rank", kRank, ODB_FIELD(rank), "", identity));
  add(Field("world_size", kJob, ODB_FIELD(world_size)));
  add(Field("local_rank", kRank, ODB_FIELD(local_rank)));
  add(Field("local_world_size", kRank, ODB_FIELD(local_world_size)));

  add(Field("run_dir", kRank, ODB_FIELD(run_dir),
            "$ODB_RUN_DIR overrides it, --run-dir both; at most 4095 bytes; ipc:// socket paths at most 107 "
            "bytes after expansion",
            "\nSockets. {run} = run_dir, {rank} = rank. Producers PUSH to ingest_endpoints;\n"
            "the trainer client connects to trainer_endpoint."));
  add(Field("ingest_endpoints", kRank, ODB_FIELD(ingest.endpoints)));
  add(Field("trainer_endpoint", kRank, ODB_FIELD(trainer.endpoint),
            "ipc://path | tcp://host:port (port or *) | inproc://name; not also an ingest endpoint"));
  add(Field("ingest_hwm", kRank, ODB_FIELD(ingest.hwm),
            "ZMQ receive high-water mark (messages); flow control is by credit, see docs/protocol.md"));

  add(Group("shm", "",
            "\nShared-memory data plane (docs/shm.md): local producers register a memfd arena\n"
            "on <ingest socket>.arena (next to each ipc:// ingest endpoint) and send\n"
            "(offset, length) descriptors instead of payload frames."));
  add(Field("shm.producer_arenas", kRank, ODB_FIELD(shm_producer_arenas),
            "false: no registration socket, every producer sends over ZeroMQ"));
  add(Field("shm.max_arenas", kRank, ODB_FIELD(shm_max_arenas),
            "arenas registered at once (1..65536); more producers send over ZeroMQ"));
  add(DataPlaneRow());
  add(Field("shm.step_arena_bytes", kRank, ODB_FIELD(trainer.step_arena_bytes),
            "the step arena's capacity (1 MiB..1 TiB of address space; pages as used)"));
  add(Field(
      "shm.step_arena_wait_ms", kRank, ODB_FIELD(steps.step_arena_wait_ms),
      "a full step arena (the trainer holds too many steps) waits this long, then a fatal naming the cause"));

  add(Group("buffer", "", "\n"));
  add(Field("buffer.max_bytes", kRank, ODB_FIELD(buffer_max_bytes),
            "payload bytes buffered plus credit granted to producers; one sample may be at most half of it "
            "(arena samples count too)"));
  add(Field("buffer.max_samples", kRank, ODB_FIELD(buffer_max_samples),
            "samples buffered before ingest stops reading"));
  add(Field("buffer.max_id_runs", kRank, ODB_FIELD(buffer_max_id_runs),
            "runs of seqs/ids kept for exactly-once (~20 B each); one more is refused TOO_LARGE"));

  add(Group("grouping", "", "\n"));
  add(Choice("grouping.cost_model", kJob, ODB_FIELD(budget.model),
             Choices<grouping::CostModel>{{"padded", grouping::CostModel::kPadded},
                                          {"packed", grouping::CostModel::kPacked}},
             "padded: n * longest <= max_tokens; packed: sum <= max_tokens"));
  add(Field("grouping.max_tokens", kJob, ODB_FIELD(budget.max_tokens), "L_max per step"));
  add(Field("grouping.quadratic_q", kJob, ODB_FIELD(budget.quadratic_q),
            "0 = off; >= 1: effective length = len + len^2 / q (attention cost)"));
  add(Field("grouping.max_group_size", kJob, ODB_FIELD(budget.max_group_size), "0 = unbounded"));
  add(Field("grouping.max_vision_patches", kJob, ODB_FIELD(budget.max_vision_patches),
            "per-step budget on summed vision patches, 0 = unbounded"));
  add(Field("grouping.max_audio_frames", kJob, ODB_FIELD(budget.max_audio_frames),
            "per-step budget on summed audio frames, 0 = unbounded"));
  add(Field("grouping.window", kJob, ODB_FIELD(window),
            "samples per rank considered per round (larger: less padding, more latency)"));
  add(Choice(
      "grouping.mix_lengths", kJob, ODB_FIELD(mix_lengths),
      Choices<LengthMix>{{"auto", LengthMix::kAuto},
                         {"true", LengthMix::kGroups},
                         {"steps", LengthMix::kSteps},
                         {"false", LengthMix::kOff}},
      "so that optimizer steps mix lengths as random batches do: true = groups of samples drawn across "
      "lengths (packed: about free; padded: more steps); steps = length-sorted groups dealt into steps "
      "across lengths (the same padding; global planner only); auto: steps with the global planner, with the "
      "local one true under cost_model packed, false under padded"));
  add(Choice("grouping.over_budget", kJob, ODB_FIELD(ingest.reject_over_budget),
             Choices<bool>{{"isolate", false}, {"reject", true}},
             "isolate (own step, flagged) | reject (reported error)"));
  add(Group("grouping.step_time",
            "grouping objective: per_step + per_padded_token*padded + per_len_sq*sum(len^2)"));
  add(Field("grouping.step_time.per_step", kJob, ODB_FIELD(step_time.per_step),
            "each finite, in [0, 1e12] (units of one padded token); not all three 0"));
  add(Field("grouping.step_time.per_padded_token", kJob, ODB_FIELD(step_time.per_padded_token)));
  add(Field("grouping.step_time.per_len_sq", kJob, ODB_FIELD(step_time.per_len_sq)));

  add(Group("alignment", "", "\n"));
  add(Choice("alignment.mode", kJob, ODB_FIELD(mode),
             Choices<align::EpochMode>{
                 {align::EpochModeName(align::EpochMode::kJoin), align::EpochMode::kJoin},
                 {align::EpochModeName(align::EpochMode::kNonJoin), align::EpochMode::kNonJoin},
                 {"join", align::EpochMode::kJoin},  // the older names
                 {"non_join", align::EpochMode::kNonJoin}},
             "every_sample: every sample exactly once | first_dry: end with the first dry rank, report\n"
             "the rest (older names: join | non_join)"));
  add(Field("alignment.seed", kJob, ODB_FIELD(seed), "shared seed of the group-order shuffle"));
  add(Choice("alignment.planner", kJob, ODB_FIELD(planner),
             Choices<PlannerKind>{{"local", PlannerKind::kLocal}, {"global", PlannerKind::kGlobal}},
             "global: balance across ranks, moving samples | local: each rank groups its own samples (no "
             "payload leaves its rank)"));
  add(Field(
      "alignment.locality", kJob, ODB_FIELD(locality),
      "global only: 0 = balance first .. 1 = never move a sample; l lets a step cost up to 1/(1-l) x its "
      "balanced max to keep samples home (0.1: ~28% fewer bytes moved, docs/balancing.md)"));
  add(PartitionRanksRow());
  add(Field("alignment.phase_plans", kJob, ODB_FIELD(phase_plans),
            "multimodal: balance the encoder phase separately; route in the step header"));
  add(EncoderCostRow());
  PhaseCostRows(t, "alignment.vision_cost", ODB_FIELD(vision_cost),
                "phase_plans: the vision encoder's cost of a sample with u > 0 patches (0 without):",
                {"  per_sample + per_unit * u + per_unit_sq * u^2; each finite, [0, 1e12]; only",
                 "  ratios matter (default per_unit: encoder_cost_per_patch); fit from measured",
                 "  times: docs/balancing.md \"Per-phase cost models\""});
  PhaseCostRows(t, "alignment.audio_cost", ODB_FIELD(audio_cost),
                "phase_plans + collate.audio_fields: the same for the audio encoder, u = audio_frames", {});
  PhaseCostRows(t, "alignment.vision_memory", ODB_FIELD(vision_memory),
                "phase_plans: activation memory of a sample in the vision encoder (same shape, any",
                {"  one unit for the three *_memory); any set: each encoder phase places its items,",
                 "  within its balanced time, on the ranks holding the least memory that step",
                 "  (docs/balancing.md \"Per-phase cost models\"); all 0: off"});
  PhaseCostRows(t, "alignment.audio_memory", ODB_FIELD(audio_memory),
                "... in the audio encoder (u = audio_frames)", {});
  PhaseCostRows(t, "alignment.llm_memory", ODB_FIELD(llm_memory),
                "... in the LLM (u = tokens; cost_model padded: the rank's longest sample in the step)", {});
  add(Field("alignment.memory_slack", kJob, ODB_FIELD(memory_slack),
            "*_memory set: a phase's slowest rank may take up to (1 + this) x its balanced time to hold less "
            "memory; [0, 10]"));
  add(Field("alignment.memory_cap_margin", kJob, ODB_FIELD(memory_cap_margin),
            "*_memory set: an encoder phase keeps its time layout unless a rank goes above the job's peak so "
            "far and (1 + this) x the step's memory bound; more: faster encoders, higher peaks; [0, 10]"));
  add(Field(
      "alignment.llm_cost_seconds", kJob, ODB_FIELD(llm_cost_seconds),
      "phase_plans + global planner: seconds per unit of grouping.step_time; > 0: steps composed on the "
      "LLM's cost plus each encoder phase's bound (*_cost in seconds), so large encoder items share a "
      "step on different ranks; 0 = LLM only; [0, 1e12]"));
  add(Field("alignment.even_memory_peaks", kJob, ODB_FIELD(even_memory_peaks),
            "*_memory set: relabel each encoder layout's ranks (time unchanged) so the most memory goes to "
            "the ranks with the lowest peaks so far"));
  add(Field("alignment.memory_peak_ratio", kJob, ODB_FIELD(memory_peak_ratio),
            "*_memory set: > 0 keeps the ranks' activation peaks over the job within this max/mean where "
            "encoder time (within memory_slack) can: a step that would leave them, forecast (each rank at "
            "least the job's peak so far and the step's second-largest holding), more uneven gets the "
            "loosest lower memory cap that does not; 0 = off; 0 or [1, 10]"));
  add(Field("alignment.memory_peak_round", kJob, ODB_FIELD(memory_peak_round),
            "memory_peak_ratio > 0: true keeps the ratio over each planned round instead (the round's steps' "
            "memory caps chosen together for the ranks' peaks after it, the job so far at its end; "
            "docs/balancing.md, Peak ratio)"));
  add(Field("alignment.memory_time_floor", kJob, ODB_FIELD(memory_time_floor),
            "*_memory set: > 0 makes memory_slack a budget over the job: each encoder phase's slowest rank, "
            "summed over the steps, stays within the sum of its bounds / this (a step spends on memory only "
            "what earlier steps saved); 0 = memory_slack per step; 0 or [0.5, 1)"));
  add(Field("alignment.memory_llm_slack", kJob, ODB_FIELD(memory_llm_slack),
            "memory_peak_round: > 0 lets LLM samples move off the rank that sets the round's highest memory "
            "peak (where the encoder caps cannot keep memory_peak_ratio), each receiving rank within the "
            "budget and its LLM time within 1 + this of the step's slowest; 0 = off; [0, 10]"));
  add(Field(
      "alignment.deterministic", kJob, ODB_FIELD(deterministic),
      "true: the same steps on every run and after a resume, whatever the workers' timing "
      "(docs/resume.md); waits for samples in list order, max_wait_ms unused; buffer.max_samples >= 4 x "
      "window"));
  add(Field("alignment.max_wait_ms", kRank, ODB_FIELD(max_wait_ms),
            "a rank short of a window waits at most this long per round"));
  add(Field(
      "alignment.start_wait_ms", kRank, ODB_FIELD(start_wait_ms),
      "... and this long while nothing of the epoch reached it yet (workers starting; 0 = max_wait_ms)"));
  add(Choice("alignment.store", kRank, ODB_FIELD(store),
             Choices<StoreKind>{{"file", StoreKind::kFile}, {"redis", StoreKind::kRedis}},
             "file (shared directory) | redis"));
  add(Field("alignment.store_dir", kRank, ODB_FIELD(store_dir)));
  add(Field("alignment.redis_host", kRank, ODB_FIELD(redis_host)));
  add(Field("alignment.redis_port", kRank, ODB_FIELD(redis_port)));
  add(Field("alignment.job_id", kRank, ODB_FIELD(job_id),
            "the job's rendezvous namespace, the same on every rank (<= 128 printable bytes, no '/' or\n"
            "spaces); a rerun with the same id and run_dir works (its first daemon removes the previous\n"
            "run's keys); two live jobs with one id and store are refused at start, naming the other"));
  add(Field("alignment.gloo_hostname", kRank, ODB_FIELD(gloo_hostname),
            "address this rank's Gloo (and payload exchange) listens on; multi-host: this host's IP.\n"
            "$ODB_GLOO_HOSTNAME overrides it, odbd --gloo-hostname overrides both; python -m odb.launch\n"
            "sets it to the host's address toward $MASTER_ADDR when the job spans hosts"));
  add(Field("alignment.gloo_iface", kRank, ODB_FIELD(gloo_iface),
            "network interface for Gloo, e.g. eth0 (wins over gloo_hostname; <= 15 bytes; $ODB_GLOO_IFACE, "
            "--gloo-iface)"));
  add(Field("alignment.connect_timeout_ms", kRank, ODB_FIELD(connect_timeout_ms),
            "rendezvous, connecting every pair of ranks and the hello, end to end"));
  add(Field("alignment.collective_timeout_ms", kRank, ODB_FIELD(collective_timeout_ms),
            "each collective between the daemons; a dead peer is an error after this"));

  add(Group("optimizer", "", "\n"));
  add(Field("optimizer.tokens_per_step", kJob, ODB_FIELD(tokens_per_step),
            "all ranks' loss tokens per optimizer step: steps form accumulation windows of about this many "
            "(docs/python.md); 0 = every step is an optimizer step"));
  add(Field("optimizer.window_spread", kJob, ODB_FIELD(window_spread),
            "a window may end up to this many standard deviations of a random batch's loss tokens from its "
            "target when that runs fewer micro-steps, still holding the target on average (docs/config.md); "
            "0 = the nearest ends; [0, 3]"));

  add(Group("emit", "", "\n"));
  add(Field("emit.outstanding_depth", kRank, ODB_FIELD(trainer.outstanding_depth),
            "D: steps sent ahead of what the trainer consumed"));
  add(Field("emit.queue_steps", kJob, ODB_FIELD(queue_steps),
            "collated steps held ready; a round waits until half are free, then plans at most that many "
            "(pairing vs memory)"));
  add(Field("emit.expected_producers", kRank, ODB_FIELD(expected_producers),
            "producers per epoch (the trainer's StartEpoch overrides it)"));
  add(Field("emit.producer_timeout_ms", kRank, ODB_FIELD(ingest.producer_timeout_ms),
            "no producer message this long while input is open and some producer holds credit: fatal, names "
            "the open streams (0 = never)"));
  add(Field(
      "emit.trainer_timeout_ms", kRank, ODB_FIELD(trainer.trainer_timeout_ms),
      "trainer session gone mid-epoch this long: fatal, daemon exits (0 = never); one trainer per daemon"));
  add(Field("emit.exit_when_trainer_done", kRank, ODB_FIELD(exit_when_trainer_done),
            "true (sidecars): exit 0 once the trainer session ended between epochs and no trainer came back "
            "within max(trainer_timeout_ms, 2 s)"));

  add(Group("collate", "", "\n"));
  add(Field("collate.packed", kRank, ODB_FIELD(collate.packed),
            "true: one row per step with cu_seqlens / position_ids"));
  add(Field("collate.attention_mask", kRank, ODB_FIELD(collate.attention_mask),
            "padded mode: add attention_mask [B, Lmax]"));
  add(Field("collate.length_field", kRank, ODB_FIELD(collate.length_field),
            "the field whose dim 0 is the sample's token length (required when packed or attention_mask)"));
  add(Choice("collate.default_rule", kRank, ODB_FIELD(collate.default_rule), kRules,
             "pad | stack | concat, for fields not listed below"));
  add(CollateFieldsRow());
  add(Field("collate.encoder_fields", kRank, ODB_FIELD(steps.encoder_fields),
            "phase_plans: fields collated into the encoder batch as enc.<name> (not length_field)"));
  add(Field("collate.audio_fields", kJob, ODB_FIELD(audio_fields),
            "phase_plans: fields of the audio encoder batch, audio.<name> (balanced on audio_frames)"));

  add(Choice("bad_input", kRank, ODB_FIELD(steps.rejections_are_errors),
             Choices<bool>{{"error", true}, {"skip_and_report", false}},
             "error: the trainer client raises | skip_and_report: it logs; both report ids", "\n"));
  add(Field("log_level", kRank, ODB_FIELD(log_level)));
  add(Field("metrics_endpoint", kRank, ODB_FIELD(metrics_endpoint),
            "e.g. tcp://0.0.0.0:9400: Prometheus text over HTTP on a thread of its own (\"\" = off)"));
  add(Field("round_trace", kRank, ODB_FIELD(round_trace),
            "diagnostic: a file getting \"round entry_ns exit_ns cpu_ns\" per round (\"\" = off)"));
  return t;
}

#undef ODB_FIELD

// The template's comment column.
constexpr size_t kDocColumn = 28;

std::string Indent(const std::string& path) {
  return std::string(2 * static_cast<size_t>(std::count(path.begin(), path.end(), '.')), ' ');
}

// `line` with the doc's lines as comments from kDocColumn on.
void AppendWithDoc(std::ostringstream& out, std::string line, const std::string& doc) {
  if (doc.empty()) {
    out << line << "\n";
    return;
  }
  std::istringstream lines(doc);
  std::string first;
  std::getline(lines, first);
  line += line.size() < kDocColumn ? std::string(kDocColumn - line.size(), ' ') : std::string("  ");
  out << line << "# " << first << "\n";
  for (std::string more; std::getline(lines, more);)
    out << std::string(kDocColumn, ' ') << "# " << more << "\n";
}

}  // namespace

const std::vector<Setting>& Settings() {
  static const std::vector<Setting> table = BuildTable();
  return table;
}

std::vector<std::pair<std::string, std::string>> JobWideSettings(const DaemonConfig& config) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Setting& s : Settings()) {
    if (!s.is_section && s.scope == Scope::kJob) out.emplace_back(s.path, s.show(config));
  }
  return out;
}

std::string ConfigTemplate() {
  absl::StatusOr<DaemonConfig> defaults = ParseConfig("");
  std::ostringstream out;
  out << "# odbd configuration: every field with its default. Copy and edit what you need;\n"
         "# unknown keys are an error (a typo is never ignored). See docs/config.md.\n"
         "# Made by `odbd --print-config-template` from the table in src/daemon/settings.cc.\n";
  for (const Setting& s : Settings()) {
    const std::string indent = Indent(s.path);
    if (!s.heading.empty()) {
      std::istringstream lines(s.heading);
      for (std::string line; std::getline(lines, line);)
        out << (line.empty() ? "" : indent + "# " + line) << "\n";
    }
    const std::string leaf =
        s.path.substr(s.path.rfind('.') == std::string::npos ? 0 : s.path.rfind('.') + 1);
    AppendWithDoc(out, indent + leaf + ":" + (s.is_section ? "" : " " + s.show(*defaults)), s.doc);
  }
  return out.str();
}

}  // namespace odb
