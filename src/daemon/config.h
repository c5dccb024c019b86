#ifndef ODB_DAEMON_CONFIG_H_
#define ODB_DAEMON_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/align/planner.h"
#include "src/collate/collator.h"
#include "src/grouping/budget.h"

namespace odb {

// What happens to a sample that fits no budget on its own.
enum class OverBudgetPolicy {
  kIsolate,  // emitted alone in its own step, flagged over_budget in the header
  kReject,   // rejected with OVER_BUDGET (reported like any bad input)
};

// What the trainer client does with rejected inputs. Nothing is ever dropped
// silently: both policies report every rejection with its sample id.
enum class BadInputPolicy {
  kError,          // the client raises on the first step that carries a rejection
  kSkipAndReport,  // the client logs it; the epoch summary lists it
};

enum class StoreKind { kFile, kRedis };

enum class PlannerKind { kLocal, kGlobal };

// shm.trainer_data_plane (auto|shm|zmq): how steps reach the trainer (docs/shm.md, "Step arena").
//  kAuto: through a shared-memory step arena when the trainer endpoint is
//         ipc:// and the trainer maps it; frames over ZeroMQ otherwise.
//  kOn:   the same, but a trainer endpoint that is not ipc:// is a config error.
//  kOff:  frames over ZeroMQ only.
enum class StepArenaMode { kAuto, kOn, kOff };

// The daemon's whole configuration: parsed once from YAML, validated at start
// with an error naming the field. Defaults are the values below.
struct DaemonConfig {
  // --- identity (-1: from RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE, else 0 / 1)
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  int local_world_size = -1;

  // --- sockets; "{rank}" is replaced by the rank, "{run}" by run_dir.
  // Producers PUSH samples here (several endpoints allowed: ipc:// and tcp://).
  std::vector<std::string> ingest_endpoints = {"ipc://{run}/odb-{rank}-in.sock"};
  // The trainer connects here (DEALER); steps go out, credits come in.
  std::string trainer_endpoint = "ipc://{run}/odb-{rank}-out.sock";
  // Directory for ipc sockets and the FileStore; created if missing.
  std::string run_dir = "/tmp/odb";
  // ZMQ receive high-water mark on the ingest socket (messages). Lower = less
  // memory held in ZMQ queues when the buffer is full; higher = smoother bursts.
  int ingest_hwm = 1000;

  // --- shared-memory data plane (docs/shm.md): local producers register an
  // arena (a memfd) on <ingest socket>.arena next to each ipc:// ingest
  // endpoint and send (offset, length) descriptors instead of payload frames.
  // false: no registration socket; every producer sends over ZeroMQ.
  bool shm_producer_arenas = true;
  // Arenas registered at once (each maps the producer's arena, up to its
  // capacity, into the daemon's address space); more are refused and those
  // producers send over ZeroMQ.
  uint32_t shm_max_arenas = 1024;
  // Step arena (daemon -> trainer over shared memory), per trainer session.
  StepArenaMode shm_step_arena = StepArenaMode::kAuto;
  // Its capacity: a memfd whose pages are allocated as first written, so this
  // is an upper bound, not a reservation. It must hold the steps queued in
  // the daemon, in flight and held by the trainer; a step larger than it
  // goes as frames.
  uint64_t shm_step_arena_bytes = uint64_t{1} << 30;
  // A full arena makes the planner wait for the trainer to release steps;
  // after this long the daemon fails naming the cause (the trainer keeps
  // steps' tensors alive).
  uint32_t shm_step_arena_wait_ms = 120000;

  // --- buffer: bounded by both; when full, ingest stops reading (back-pressure).
  uint64_t buffer_max_bytes = 1ull << 30;  // 1 GiB of payload
  uint64_t buffer_max_samples = 65536;

  // --- grouping
  grouping::Budget budget;               // cost_model, max_tokens (4096), ...
  grouping::StepTimeModel step_time;     // objective for the grouper
  // Samples per rank gathered before a round is planned. Larger windows group
  // better (less padding) but add latency and memory.
  uint32_t window = 512;
  OverBudgetPolicy over_budget = OverBudgetPolicy::kIsolate;

  // --- alignment across ranks
  // join: every sample of the epoch is emitted exactly once; non_join: the
  // epoch ends when the first rank runs dry and the rest is reported.
  align::EpochMode mode = align::EpochMode::kJoin;
  uint64_t seed = 0;  // shared by all ranks: group order is a seeded shuffle
  // local: each rank groups its own samples (ODB). global: groups across all
  // ranks and moves samples between daemons so every rank of a step costs
  // alike (OrchMLLM post-balancing; see docs/balancing.md).
  PlannerKind planner = PlannerKind::kGlobal;
  // global only: 0 = balance first, 1 = keep every sample on its rank.
  double locality = 0.0;
  // Multimodal: balance the encoder phase separately from the LLM phase and
  // ship the route between them in each step header (docs/balancing.md). The
  // collate.encoder_fields go to the encoder batch ("enc.<name>") of the rank
  // chosen to encode the sample; encoder cost = encoder_cost_per_patch * patches.
  bool phase_plans = false;
  double encoder_cost_per_patch = 1.0;
  // Reproducible epochs (docs/resume.md): the step sequence depends only on
  // the seed and the samples, never on timing. Each rank plans from the next
  // `window` samples of its list in list order (every sample carries its
  // position, `seq`), waits for them however long it takes (max_wait_ms does
  // not apply), and rounds plan as many steps as the window gives (the
  // trainer's credit only delays them). Costs some throughput (see README).
  bool deterministic = false;
  // optimizer.tokens_per_step: all ranks' loss tokens per optimizer step
  // (accumulation windows, docs/python.md); 0 = one optimizer step per step.
  uint64_t tokens_per_step = 0;
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
  std::string redis_host = "127.0.0.1";
  int redis_port = 6379;
  std::string job_id = "odb";  // key prefix in the store: use a new one per job
  std::string gloo_hostname = "127.0.0.1";  // address this rank's Gloo listens on
  std::string gloo_iface;  // network interface for Gloo (e.g. "eth0"); wins over gloo_hostname
  uint32_t connect_timeout_ms = 30000;
  uint32_t collective_timeout_ms = 120000;  // a dead peer is an error after this

  // --- emit
  uint32_t outstanding_depth = 4;  // D: steps sent ahead of the trainer's consumption
  // Collated steps the daemon may hold ready beyond those in flight. Rounds
  // plan at most this many steps: deeper = better cross-rank pairing and
  // smoother delivery, at the memory of that many batches.
  uint32_t queue_steps = 32;
  // Producers an epoch waits for (the trainer's StartEpoch may override it).
  uint32_t expected_producers = 1;
  // While an epoch's input is incomplete and the buffer has room, no message
  // from any producer for this long is a fatal PRODUCER_TIMEOUT naming the
  // producers whose streams are still open (0 = never).
  uint32_t producer_timeout_ms = 600000;
  // The trainer disconnecting mid-epoch and not coming back within this long
  // is fatal: the daemon exits so its peers learn it (0 = never).
  uint32_t trainer_timeout_ms = 30000;
  // Deployments that finish (a Kubernetes sidecar, a systemd unit per job):
  // once the trainer session has ended between epochs (its connection closed
  // with no epoch open or requested) and no trainer has come back within
  // max(trainer_timeout_ms, 2 s), Run() returns OK and odbd exits 0. A session
  // lost mid-epoch still fails (exit 1) as above.
  bool exit_when_trainer_done = false;

  // --- collation
  collate::CollateOptions collate;
  // Fields that belong to the encoder phase (alignment.phase_plans).
  std::vector<std::string> encoder_fields;
  // Fields of the audio encoder phase (alignment.phase_plans): balanced on
  // audio_frames, sent in the "audio.*" batch. Empty: no audio phase.
  std::vector<std::string> audio_fields;

  // Prometheus text over plain HTTP, e.g. "tcp://0.0.0.0:9400"; "" = off.
  std::string metrics_endpoint;

  BadInputPolicy bad_input = BadInputPolicy::kError;
  std::string log_level = "info";
};

// Parses YAML text. Unknown keys are errors (a typo must not be ignored).
absl::StatusOr<DaemonConfig> ParseConfig(const std::string& yaml_text);
absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path);

// Fills rank/world from the environment where unset, expands {rank}/{run} and
// checks every field. Returns an error naming the field.
absl::Status FinalizeConfig(DaemonConfig& config,
                            const std::map<std::string, std::string>& env);

// Every field the parser reads ("alignment.job_id", ...) with its default as
// flow YAML, in parse order (odbd --print-default-config; the test that keeps
// configs/odbd.yaml complete).
std::vector<std::pair<std::string, std::string>> ConfigFieldDefaults();

// The process environment as a map (for FinalizeConfig).
std::map<std::string, std::string> ProcessEnvironment();

// One line per field, for the startup log.
std::string DescribeConfig(const DaemonConfig& config);

}  // namespace odb

#endif  // ODB_DAEMON_CONFIG_H_
