#ifndef ODB_CLIENT_CONSUMER_H_
#define ODB_CLIENT_CONSUMER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "odb/types.h"
#include "proto/step_fields.h"

namespace odb::client {

// A batch tensor as a view over the received frame (no copy). Valid while the
// Delivery that holds it is alive.
struct TensorView {
  std::string name;
  DType dtype = DType::kInt64;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t size_bytes = 0;
};

struct Rejection {
  std::string code;  // e.g. "ZERO_LENGTH"
  bool has_sample_id = false;
  uint64_t sample_id = 0;
  std::string producer_id;
  std::string message;
};

// A step's header: every field of the one list (proto/step_fields.h): the
// planned scalars (step_index, idle, real_tokens, loss_weight, the window
// fields, ...), the job's flags, the per-sample lists (sample_ids, lengths,
// owner_ranks, seqs: nullopt for a sample sent without a seq) and the
// per-phase route lists (empty unless the daemon runs
// alignment.phase_plans: this rank encodes enc_sample_ids, the rows of its
// "enc.*" tensors; encoder sample i's output goes to rank enc_dest_rank[i] as
// its sample number enc_dest_index[i]; llm_src_rank[j] is the rank that
// encodes sample_ids[j]; the audio_* lists likewise for "audio.*"), and the
// epoch and the rejections since the previous step.
struct StepInfo : StepHeader {
  uint32_t epoch = 0;
  std::vector<Rejection> rejections;
#define ODB_STEP_JOB_MEMBER(type, name, dflt, doc) type name = dflt;
#define ODB_STEP_SAMPLE_MEMBER(type, name, value, always, doc) std::vector<type> name;
#define ODB_STEP_OPTIONAL_SAMPLE_MEMBER(type, name, present, value, doc) \
  std::vector<std::optional<type>> name;
#define ODB_STEP_ROUTE_MEMBERS(type, vision, audio, llm_order, value, doc) std::vector<type> vision, audio;
  ODB_STEP_JOB_FIELDS(ODB_STEP_JOB_MEMBER)
  ODB_STEP_SAMPLE_FIELDS(ODB_STEP_SAMPLE_MEMBER, ODB_STEP_OPTIONAL_SAMPLE_MEMBER)
  ODB_STEP_ROUTE_FIELDS(ODB_STEP_ROUTE_MEMBERS)
#undef ODB_STEP_ROUTE_MEMBERS
#undef ODB_STEP_OPTIONAL_SAMPLE_MEMBER
#undef ODB_STEP_SAMPLE_MEMBER
#undef ODB_STEP_JOB_MEMBER
};

struct EpochSummary {
  uint32_t epoch = 0;
  uint64_t received = 0;
  uint64_t emitted = 0;
  uint64_t rejected = 0;
  uint64_t steps = 0;
  uint64_t idle_steps = 0;
  uint64_t real_tokens = 0;
  uint64_t padded_tokens = 0;
  std::vector<Rejection> rejections;
  std::vector<uint64_t> not_emitted_ids;
  bool rejections_are_errors = false;
};

// The daemon's settings a trainer must agree with, from the session's
// acknowledgement (docs/protocol.md, "Job settings").
struct JobSettings {
  uint64_t tokens_per_step = 0;         // optimizer.tokens_per_step: the window target (0: no windows)
  bool packed = false;                  // collate.packed
  std::string trainer_data_plane;       // shm.trainer_data_plane: "auto", "shm" or "zmq"
  std::string length_field;             // collate.length_field
  std::optional<int64_t> ignore_index;  // the collated labels' pad value; nullopt without labels
};

// What Next() returns: a step (with tensors) or the end of the epoch.
struct Delivery {
  enum class Kind { kStep, kEpochEnd, kSessionAck };  // kSessionAck: skipped by Consumer::Next
  Kind kind = Kind::kStep;
  StepInfo step;
  EpochSummary summary;
  // kSessionAck: the job's settings; nullopt from a daemon older than them.
  std::optional<JobSettings> settings;
  std::vector<TensorView> tensors;
  // Owns the received frames the views point into.
  std::shared_ptr<void> frames;

  const TensorView* Find(const std::string& name) const;
};

struct ConsumerOptions {
  std::string endpoint;  // the daemon's trainer endpoint
  // Next() waiting longer than this fails with DeadlineExceeded naming the
  // endpoint (dead or unreachable daemon): an error, never a hang.
  int receive_timeout_ms = 120000;
  // How steps arrive (docs/shm.md, "Step arena"):
  //  "auto": through the daemon's shared-memory step arena when it offers one
  //          (an ipc:// endpoint, shm.trainer_data_plane not zmq) and it can
  //          be mapped; frames over ZeroMQ otherwise;
  //  "shm":  the same, but an offer that cannot be mapped is an error from
  //          Next(), and the endpoint must be ipc://;
  //  "zmq":  frames only (the offer is declined).
  // A step's tensors are views of its arena block (64-byte aligned, no copy);
  // the block goes back to the daemon when the Delivery (every copy of its
  // `frames`) is destroyed, from any thread.
  std::string data_plane = "auto";
};

struct StepArenaStats {
  uint64_t generation = 0;
  uint64_t capacity_bytes = 0;
  uint64_t held_steps = 0;       // steps whose block this process still holds
  uint64_t returned_steps = 0;   // blocks handed back
  uint64_t return_failures = 0;  // the daemon had given the arena up
};

// Receives aligned steps from one daemon and grants credits. Not thread-safe.
// Like Producer, it belongs to the process that created it: in a forked child
// its calls fail with FailedPrecondition and its destruction is a no-op.
class Consumer {
 public:
  static absl::StatusOr<std::unique_ptr<Consumer>> Connect(const ConsumerOptions& options);
  ~Consumer();
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // Asks the daemon for an epoch; expected_producers = 0 keeps the daemon's config.
  // first_round / first_step: resume a deterministic epoch at that round
  // (docs/resume.md); 0 = from its start.
  absl::Status StartEpoch(uint32_t epoch, uint32_t expected_producers = 0, uint64_t first_round = 0,
                          uint64_t first_step = 0);
  // Test seams (tests/python/test_py_reconnect.py) for a connection blip:
  // ReconnectForTest drops the connection to the daemon and connects again,
  // as ZeroMQ does by itself after a network blip; StartEpochLostForTest
  // records an epoch request as sent without sending it, which is what the
  // daemon makes of a start_epoch it reads after the connection it came on
  // closed (it ignores it).
  absl::Status ReconnectForTest();
  absl::Status StartEpochLostForTest(uint32_t epoch, uint32_t expected_producers = 0,
                                     uint64_t first_round = 0, uint64_t first_step = 0);
  // Reconnects seen so far. After each the client announces its session
  // again and re-sends the epoch requests not yet answered (a step or the
  // summary of that epoch).
  uint64_t reconnects() const;
  // The next step or end of epoch. Each call (after the first step) returns one
  // credit to the daemon for the step delivered before. A fatal daemon error
  // (dead peer, version mismatch) comes back as an error Status with its text.
  absl::StatusOr<Delivery> Next();
  // The trainer's time blocked waiting for the step Next() just delivered
  // (e.g. in next(loader)); it rides on the credit the next Next() returns, and
  // the daemon exports the sum (odb_trainer_data_wait_microseconds_total).
  // Reports add up until then; negative values count as 0.
  void ReportDataWait(std::chrono::microseconds wait);

  // The daemon's job settings, from the acknowledgement of this session
  // (the first message of a session: ask before the first epoch, e.g. for a
  // schedule). Waits for it at most `timeout_ms` (default: receive_timeout_ms)
  // if it has not come yet; what arrives meanwhile is kept for Next().
  // nullopt: a daemon older than the settings. A refused session
  // (SESSION_REFUSED) is an error.
  absl::StatusOr<std::optional<JobSettings>> job_settings(std::optional<int> timeout_ms = std::nullopt);

  // "shm" once the session's step arena is mapped, else "zmq".
  std::string data_plane() const;
  // Why an offered step arena is not used (empty otherwise).
  const std::string& arena_note() const;
  // The mapped step arena's counters; nullopt without one.
  std::optional<StepArenaStats> step_arena_stats() const;

 private:
  struct Impl;
  explicit Consumer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace odb::client

#endif  // ODB_CLIENT_CONSUMER_H_
