#ifndef ODB_DAEMON_CONFIG_H_
#define ODB_DAEMON_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/align/gloo_peer_group.h"
#include "src/align/planner.h"
#include "src/balance/global_planner.h"
#include "src/balance/phase_plan.h"
#include "src/collate/collator.h"
#include "src/emit/step_builder_options.h"
#include "src/emit/trainer_channel_options.h"
#include "src/exchange/exchange_options.h"
#include "src/grouping/budget.h"
#include "src/ingest/ingest_options.h"

namespace odb {

enum class StoreKind { kFile, kRedis };

enum class PlannerKind { kLocal, kGlobal };
// grouping.mix_lengths (docs/config.md, "Length-mixed steps"): groups of mixed
// lengths (kGroups, `true`), length-sorted groups dealt into steps across
// lengths (kSteps, `steps`), neither (kOff, `false`); kAuto: steps with the
// global planner (which alone deals groups into steps), and with the local
// planner groups under the packed cost model (where they cost no padding),
// nothing under padded.
enum class LengthMix { kAuto, kOff, kGroups, kSteps };

// The daemon's whole configuration: parsed once from YAML, validated at start
// with an error naming the field.
//
// A knob that one I/O stage alone reads is a field of that stage's options
// struct (declared beside the stage, with its default there and nowhere
// else); the parser writes it straight into the member below (`ingest`,
// `trainer`, `steps`, `exchange`), so adding one touches the stage's options,
// the parser and the doc only. The fields at the top level are read by more
// than one part of the daemon (the planner, the shared buffer, several
// stages); src/daemon/stage_options.cc copies those a stage needs into its
// options (the fields marked "derived" there), in that one place.
// tools/check_stage_options.py (tests/test_stage_options.py) enforces this.
// Top-level defaults are the values below; a setting that the daemon copies
// into the planner's or the Gloo peer group's options takes its default from
// that struct (written there once; tools/check_stage_options.py checks it).
struct DaemonConfig {
  // --- the I/O stages' own knobs, defaults in their options structs (the
  // "derived" fields of these are left unset: the stages get them from
  // stage_options.cc).
  ingest::IngestOptions ingest;
  emit::TrainerChannelOptions trainer;
  emit::StepBuilderOptions steps;
  exchange::ExchangeOptions exchange;

  // --- identity (-1: from RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE, else 0 / 1)
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  int local_world_size = -1;

  // --- sockets: "{rank}" in ingest.endpoints, trainer.endpoint, store_dir
  // and metrics_endpoint is replaced by the rank, "{run}" by run_dir.
  // Directory for ipc sockets and the FileStore; created if missing.
  std::string run_dir = "/tmp/odb";

  // --- shared-memory data plane (docs/shm.md): local producers register an
  // arena (a memfd) on <ingest socket>.arena next to each ipc:// ingest
  // endpoint and send (offset, length) descriptors instead of payload frames.
  // false: no registration socket; every producer sends over ZeroMQ.
  bool shm_producer_arenas = true;
  // Arenas registered at once (each maps the producer's arena, up to its
  // capacity, into the daemon's address space); more are refused and those
  // producers send over ZeroMQ.
  uint32_t shm_max_arenas = 1024;

  // --- buffer: bounded by both; when full, ingest stops reading (back-pressure).
  uint64_t buffer_max_bytes = 1ull << 30;  // 1 GiB of payload
  uint64_t buffer_max_samples = 65536;
  // Runs of seqs / ids the exactly-once check keeps for the open epochs
  // (~20 B each); a sample that would start one more is refused TOO_LARGE
  // (src/buffer/sample_buffer.h, docs/architecture.md).
  uint64_t buffer_max_id_runs = uint64_t{1} << 22;

  // --- grouping
  grouping::Budget budget;               // cost_model, max_tokens (4096), ...
  grouping::StepTimeModel step_time;     // objective for the grouper
  // Samples per rank gathered before a round is planned. Larger windows group
  // better (less padding) but add latency and memory.
  uint32_t window = align::PlannerConfig{}.window;
  // grouping.mix_lengths: groups of length-mixed samples (align::PlannerConfig;
  // MixesLengths resolves auto).
  LengthMix mix_lengths = LengthMix::kAuto;

  // --- alignment across ranks
  // alignment.mode every_sample (kJoin): every sample of the epoch is emitted
  // exactly once; first_dry (kNonJoin): the epoch ends when the first rank
  // runs dry and the rest is reported.
  align::EpochMode mode = align::PlannerConfig{}.mode;
  uint64_t seed = align::PlannerConfig{}.seed;  // shared by all ranks: group order is a seeded shuffle
  // local: each rank groups its own samples (ODB). global: groups across all
  // ranks and moves samples between daemons so every rank of a step costs
  // alike (OrchMLLM post-balancing; see docs/balancing.md).
  PlannerKind planner = PlannerKind::kGlobal;
  // global only: 0 = balance first, 1 = keep every sample on its rank.
  double locality = balance::GlobalPlannerConfig{}.locality;
  // global only: plan in blocks of this many ranks (rounded up to whole nodes), 0 = one pool
  // (docs/balancing.md); unset (YAML `auto`, the default): PartitionRanks resolves it from the
  // world size.
  std::optional<uint32_t> partition_ranks;
  // Multimodal: balance the encoder phase separately from the LLM phase and
  // ship the route between them in each step header (docs/balancing.md). The
  // collate.encoder_fields go to the encoder batch ("enc.<name>") of the rank
  // chosen to encode the sample. Each encoder phase is balanced on its own
  // cost model (alignment.vision_cost / audio_cost, the shape of
  // balance::PhaseCost): per_sample + per_unit * u + per_unit_sq * u^2 for a
  // sample with u > 0 patches (frames), 0 without. encoder_cost_per_patch is
  // the vision per_unit's default (its older name).
  bool phase_plans = false;
  double encoder_cost_per_patch = 1.0;
  balance::PhaseCost vision_cost;
  balance::PhaseCost audio_cost;
  // Activation memory a sample holds until the step's backward, per phase
  // (alignment.vision_memory / audio_memory / llm_memory, the shape of
  // balance::PhaseCost, any one unit; default 0: off). When any is set, each
  // encoder phase puts its items, within its minimax time capacity, on the
  // ranks holding the least memory in that step (balance::BalancePhaseMemory).
  balance::PhaseCost vision_memory{0.0, 0.0, 0.0};
  balance::PhaseCost audio_memory{0.0, 0.0, 0.0};
  balance::PhaseCost llm_memory{0.0, 0.0, 0.0};  // u = tokens (padded: the rank's longest)
  // ... and may let a phase's slowest rank take up to (1 + memory_slack) x the
  // minimax time to hold less memory (0: memory only within the time balance).
  double memory_slack = 0.0;
  // An encoder phase keeps its time layout unless it puts a rank above the
  // job's peak so far and above the step's memory bound (max of the mean and
  // the largest single holding) times 1 + memory_cap_margin: the memory a
  // phase may add to keep its time balance (balance::EncoderStepPlanner).
  double memory_cap_margin = 0.05;
  // The encoder layouts' ranks relabeled (their time unchanged) so the most
  // memory lands on the ranks whose peaks over the run are lowest: at W <= 8
  // the step's layouts together, for the most even run peaks within 1% of the
  // least maximum (balance::RelabelForRunPeaks); above, each phase's never
  // raising the step's peak.
  bool even_memory_peaks = true;
  // > 0 (in [1, 10]): the max / mean over ranks of their activation peaks over
  // the job that the encoder placement keeps to where encoder time can buy it:
  // a step whose layouts at the margin cap would leave the ranks' forecast
  // peaks (each at least the job's peak so far and the step's second-largest
  // holding) more uneven than this gets the loosest lower cap that does not
  // (balance::EncoderPlanConfig::peak_ratio, forecast_peaks). 0: off.
  double memory_peak_ratio = 0.0;
  // With memory_peak_ratio: the ratio kept over each planned round instead of
  // per step against a forecast: the round's steps' memory caps chosen
  // together for the ranks' run peaks after the round (the run so far at its
  // end; balance::EncoderPlanConfig::round_joint).
  bool memory_peak_round = false;
  // In (0, 1): the encoder time the memory placement spends (memory_slack)
  // is a budget over the job: each encoder phase's slowest rank, summed over
  // the steps so far, stays within (their bounds' sum) / this where its time
  // layouts allow; 0 (default): memory_slack per step, no job budget
  // (balance::EncoderPlanConfig::time_floor).
  double memory_time_floor = 0.0;
  // With memory_peak_round: > 0 lets the LLM's layout serve memory, before
  // the encoder caps and where they cannot keep the ratio (a large image on
  // top of a full LLM share): the LLM samples of the step that set the highest run peak move
  // off that rank, one at a time, while the round's peaks fall, each
  // receiving rank within the budget and its LLM time within 1 + this of the
  // step's slowest LLM rank (balance::EncoderPlanConfig::llm_slack); 0
  // (default): the LLM layout is the round plan's.
  double memory_llm_slack = 0.0;
  // Seconds per unit of grouping.step_time (the LLM's cost), with phase_plans
  // and the global planner: > 0, the round planner composes steps with the
  // encoder phases in view (balance::StepPhaseCosts: the sum over steps of the
  // LLM's cost plus each encoder phase's bound, so large encoder items share
  // steps on different ranks); 0 (default): steps composed on the LLM only.
  double llm_cost_seconds = 0.0;
  // Reproducible epochs (docs/resume.md): the step sequence depends only on
  // the seed and the samples, never on timing. Each rank plans from the next
  // `window` samples of its list in list order (every sample carries its
  // position, `seq`), waits for them however long it takes (max_wait_ms does
  // not apply), and rounds plan as many steps as the window gives (the
  // trainer's credit only delays them). Costs some throughput (docs/benchmarks.md, evidence table).
  bool deterministic = align::PlannerConfig{}.deterministic;
  // optimizer.tokens_per_step: all ranks' loss tokens per optimizer step
  // (accumulation windows, docs/python.md); 0 = one optimizer step per step.
  uint64_t tokens_per_step = align::PlannerConfig{}.tokens_per_step;
  // optimizer.window_spread: windows may end within this many standard
  // deviations of a random batch's loss tokens from their target when that
  // saves micro-steps (docs/config.md); 0 = the nearest ends.
  double window_spread = align::PlannerConfig{}.window_spread;
  // How long a rank with fewer than `window` samples (and an open stream) waits
  // before planning a round anyway.
  uint32_t max_wait_ms = 200;
  // The same bound for a rank that has received nothing of the epoch yet
  // (its data workers are starting): the other ranks wait for it rather than
  // run a burst of steps with it IDLE (which it would repay by idling them at
  // the epoch's end). Longer than worker start-up; 0 = use max_wait_ms.
  uint32_t start_wait_ms = 60000;
  StoreKind store = StoreKind::kFile;
  std::string store_dir = "{run}/store";  // FileStore directory (shared by all ranks)
  std::string redis_host = align::GlooPeerGroupOptions{}.redis_host;
  int redis_port = align::GlooPeerGroupOptions{}.redis_port;
  std::string job_id =
      align::GlooPeerGroupOptions{}.job_id;  // key prefix in the store: use a new one per job
  std::string gloo_hostname = "127.0.0.1";  // address this rank's Gloo listens on
  std::string gloo_iface;  // network interface for Gloo (e.g. "eth0"); wins over gloo_hostname
  uint32_t connect_timeout_ms = static_cast<uint32_t>(align::GlooPeerGroupOptions{}.connect_timeout.count());
  // a dead peer is an error after this
  uint32_t collective_timeout_ms =
      static_cast<uint32_t>(align::GlooPeerGroupOptions{}.collective_timeout.count());

  // --- emit
  // Collated steps the daemon may hold ready beyond those in flight. Rounds
  // plan at most this many steps: deeper = better cross-rank pairing and
  // smoother delivery, at the memory of that many batches.
  uint32_t queue_steps = 32;
  // Producers an epoch waits for (the trainer's StartEpoch may override it).
  uint32_t expected_producers = 1;
  // Deployments that finish (a Kubernetes sidecar, a systemd unit per job):
  // once the trainer session has ended between epochs (its connection closed
  // with no epoch open or requested) and no trainer has come back within
  // max(emit.trainer_timeout_ms, 2 s), Run() returns OK and odbd exits 0. A
  // session lost mid-epoch still fails (exit 1) after emit.trainer_timeout_ms.
  bool exit_when_trainer_done = false;

  // --- collation
  collate::CollateOptions collate;
  // Fields of the audio encoder phase (alignment.phase_plans): balanced on
  // audio_frames, sent in the "audio.*" batch. Empty: no audio phase. Read by
  // the round runner (whether there is an audio phase) and the step builder.
  std::vector<std::string> audio_fields;

  // Prometheus text over plain HTTP, e.g. "tcp://0.0.0.0:9400"; "" = off.
  std::string metrics_endpoint;
  // A diagnostic for benchmarks (bench/real_rounds.py): one line per
  // alignment round, "round entry_ns exit_ns cpu_ns": entry and exit on the
  // wall clock (CLOCK_REALTIME), so the rounds of daemons on one host (or
  // hosts with synchronised clocks) line up, and the planner thread's CPU
  // time in the round; "" = off. {run} and {rank} expand.
  std::string round_trace;

  std::string log_level = "info";
};

// Parses YAML text by the settings table (src/daemon/settings.h). Unknown keys
// are errors (a typo must not be ignored).
absl::StatusOr<DaemonConfig> ParseConfig(const std::string& yaml_text);
absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path);

// Fills rank/world from the environment where unset, expands {rank}/{run} and
// checks every field. Returns an error naming the field.
absl::Status FinalizeConfig(DaemonConfig& config,
                            const std::map<std::string, std::string>& env);

// Every setting ("alignment.job_id", ...) with its default as flow YAML, in
// the order of the settings table (src/daemon/settings.h; odbd
// --print-default-config).
std::vector<std::pair<std::string, std::string>> ConfigFieldDefaults();

// The process environment as a map (for FinalizeConfig).
std::map<std::string, std::string> ProcessEnvironment();

// grouping.mix_lengths resolved: mixed groups (`true`, or auto with the local
// planner and grouping.cost_model packed) ...
inline bool MixesLengths(const DaemonConfig& config) {
  return config.mix_lengths == LengthMix::kGroups ||
         (config.mix_lengths == LengthMix::kAuto && config.planner == PlannerKind::kLocal &&
          config.budget.model == grouping::CostModel::kPacked);
}

// ... or steps dealt across lengths (`steps`, or auto with the global planner:
// in window mode mixed groups cost packed steps 2-4% of the bound where
// steps cost ~0.2%, at the same loss; docs/config.md, "Length-mixed steps").
inline bool MixesSteps(const DaemonConfig& config) {
  return config.mix_lengths == LengthMix::kSteps ||
         (config.mix_lengths == LengthMix::kAuto && config.planner == PlannerKind::kGlobal);
}

// alignment.partition_ranks `auto` plans one pool up to this many ranks and,
// above, blocks of at most this many (docs/balancing.md, "The default:
// `auto`"; measured with bench/scale_bench).
inline constexpr uint32_t kAutoPartitionMaxBlock = 256;

// alignment.partition_ranks resolved for `world` ranks: the configured value,
// or for `auto` 0 (one pool) up to kAutoPartitionMaxBlock ranks and above it
// the fewest blocks of at most that many, of equal size (ceil(world / blocks);
// balance::BlockRanks then rounds it up to whole nodes).
inline uint32_t PartitionRanks(const DaemonConfig& config, int world) {
  if (config.partition_ranks.has_value()) return *config.partition_ranks;
  if (world <= static_cast<int>(kAutoPartitionMaxBlock)) return 0;
  const uint32_t w = static_cast<uint32_t>(world);
  const uint32_t blocks = (w + kAutoPartitionMaxBlock - 1) / kAutoPartitionMaxBlock;
  return (w + blocks - 1) / blocks;
}

// One line per field, for the startup log.
std::string DescribeConfig(const DaemonConfig& config);

}  // namespace odb

#endif  // ODB_DAEMON_CONFIG_H_
