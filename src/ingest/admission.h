#ifndef ODB_INGEST_ADMISSION_H_
#define ODB_INGEST_ADMISSION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "proto/odb.pb.h"
#include "src/common/sample.h"
#include "src/grouping/budget.h"

namespace odb::ingest {

// Where the daemon stands on epochs, as admission needs it for one epoch.
// The channel reads it from DaemonState under its mutex.
struct EpochView {
  bool closed = false;              // the epoch is closed (the tracker judges what arrives for it)
  std::optional<uint32_t> trainer;  // the lowest epoch the trainer trains or asked for
  uint32_t first_open = 0;          // the first epoch this daemon has not closed
  std::optional<std::pair<uint32_t, uint32_t>> open_range;  // epochs producers send, before the trainer asks
};

// What becomes of a sample at the door, and how it counts in its producer's
// stream (so that the producer's end_stream total still agrees).
struct Verdict {
  enum class Kind {
    kPass,             // on to the stream, the schema and the buffer
    kRejectUncounted,  // rejected, not counted in any stream (its producer is not its connection's)
    kRejectCounted,    // rejected, counted as received in its stream
    kRefuse,           // outside the epochs held: counted as refused, filed under `filed_epoch`
  };
  Kind kind = Kind::kPass;
  wire::Rejection rejection;
  uint32_t filed_epoch = 0;
};

struct AdmissionOptions {
  int rank = 0;
  bool deterministic = false;       // alignment.deterministic: every sample needs a seq
  bool reject_over_budget = false;  // grouping.over_budget: reject
  grouping::Budget budget;
};

// The admission policy of the ingest channel: sample in, verdict out. Pure
// (no state, no sockets, no clock): what it decides from the daemon's state
// comes in as an EpochView; the checks that change state (the stream
// tracker's duplicate ids, the seq order, the epoch's schema, the buffer's
// room) stay with the channel, which runs them between AtDoor and
// OverBudget, in that order.
class AdmissionPolicy {
 public:
  explicit AdmissionPolicy(AdmissionOptions options) : options_(std::move(options)) {}

  // Samples are held for at most this many epochs past the trainer's (or,
  // before the trainer asks for one, past the lowest one that producers
  // send): a later epoch is refused, since each held epoch costs bookkeeping.
  static constexpr uint32_t kEpochHorizon = 4;

  // Why input of `epoch` is not held now (nullopt: it is): before the
  // trainer's epoch, too far after it, or (before the trainer asks) too far
  // from the epochs producers already send. A closed epoch is the tracker's
  // to judge.
  static std::optional<std::string> EpochRefusal(uint32_t epoch, const EpochView& view);

  // The first checks of a sample that arrived on a connection that said
  // hello as `connection_producer`: its producer id, its epoch, that it
  // does not set daemon_key, and in seq order that it has a seq.
  Verdict AtDoor(const Sample& sample, const std::string& connection_producer, const EpochView& view) const;
  // The rejection of a sample whose seq another sample of its epoch had (in
  // every mode: a sample with a seq is known by it, not by its id).
  wire::Rejection DuplicateSeq(const Sample& sample) const;
  // alignment.deterministic: the rejection (CREDIT_EXCEEDED) of a sample whose
  // seq is at or past `limit`, the seq limit its producer may have been
  // granted (the epoch's `frontier` + the window).
  wire::Rejection SeqBeyondLimit(const Sample& sample, uint64_t limit, uint64_t frontier) const;
  // The last check: a sample that fits no budget alone, when such samples are
  // rejected (grouping.over_budget: reject).
  std::optional<wire::Rejection> OverBudget(const Sample& sample) const;

  // The rejection of an end_stream of an epoch not held (`why`:
  // EpochRefusal's), with how many of its samples were refused for it.
  static wire::Rejection RefuseEndStream(const std::string& producer_id, const std::string& why,
                                         uint64_t refused, uint64_t samples_sent);

 private:
  AdmissionOptions options_;
};

}  // namespace odb::ingest

#endif  // ODB_INGEST_ADMISSION_H_
