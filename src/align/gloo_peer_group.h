#ifndef ODB_ALIGN_GLOO_PEER_GROUP_H_
#define ODB_ALIGN_GLOO_PEER_GROUP_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/align/hello.h"
#include "src/align/peer_group.h"
#include "src/common/mutex.h"

namespace gloo::rendezvous {
class Context;
class Store;
}  // namespace gloo::rendezvous
namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace odb::align {

struct GlooPeerGroupOptions {
  int rank = 0;
  int world_size = 1;
  // Keys live under "<job_id>/<generation>" in the store, so a restarted job
  // (bump generation) never reads a previous run's keys.
  std::string job_id = "odb";
  uint64_t generation = 0;

  enum class StoreKind { kFile, kRedis };
  StoreKind store = StoreKind::kFile;  // default: FileStore (single host, shared dir)
  std::string file_store_dir;          // must exist; shared by all ranks
  std::string redis_host = "127.0.0.1";
  int redis_port = 6379;

  // TCP transport: `iface` (e.g. "eth0", "lo") wins over `hostname`; with
  // neither, Gloo resolves this host's name.
  std::string iface;
  std::string hostname;

  // Rendezvous + full-mesh connect + hello, end to end (alignment.connect_timeout_ms).
  std::chrono::milliseconds connect_timeout{30000};
  // Each all-gather (alignment.collective_timeout_ms).
  std::chrono::milliseconds collective_timeout{120000};
  // Groups of at least this many ranks all-gather with Bruck's algorithm
  // (ceil(log2 W) rounds of one send and one receive on Gloo's point-to-point
  // buffers); smaller ones use Gloo's ring (W - 1 hops). Both move the same
  // bytes per rank; the log all-gather pays fewer latencies from 3 ranks up
  // (docs/benchmarks.md, "Partitioned rounds"). 0 or 1: always Bruck; a
  // value above every W: always the ring.
  int log_allgather_min_ranks = 3;

  // What a rank may announce in its all-gather size header: one message at
  // most max_message_bytes, all ranks' together at most max_gather_bytes (a
  // round's message is a window of compact records, kilobytes: see
  // meta_codec.h). A header past either is corrupt or from a peer not running
  // this odbd: the all-gather fails on every rank (they all read the same
  // headers) before anything is sized from it, so a garbage size never
  // becomes an allocation. Must be equal on every rank.
  size_t max_message_bytes = size_t{64} << 20;
  size_t max_gather_bytes = size_t{1} << 30;

  // Checked at connect on every rank (see hello.h); empty = only the protocol
  // version and world size are compared.
  HelloFields hello;
};

// PeerGroup over a dedicated Gloo context (TCP transport), never the
// trainer's NCCL group. Every Gloo exception is caught here and becomes a
// Status; after the first failure the group stays failed.
//
// A failed collective's error says what happened, as far as the ranks can
// tell together: every rank that fails leaves a report in the store (did it
// time out, and did its own process stop running), then waits briefly for the
// others'. So a rank that timed out names the rank it was waiting for — the
// one that left no report (alive but unresponsive, or dead), or the one that
// reports it was not running — and a rank whose whole process was stopped
// (SIGSTOP, a debugger, a paused VM) says so when it resumes, instead of
// blaming the network. A background thread notices such stops: it wakes every
// 100 ms, and a wake-up seconds late means no thread of the process ran (the
// steady clock keeps running while the process is stopped).
// The process must ignore SIGPIPE (odbd's main does): Gloo's TCP transport
// writes to the sockets of peers that may have died, and a write to a closed
// socket otherwise kills the process instead of failing the collective.
class GlooPeerGroup final : public PeerGroup {
 public:
  using Clock = std::chrono::steady_clock;
  // Rendezvous, connect and hello. Fails (never hangs) within
  // connect_timeout when the store is unreachable, a rank does not show up,
  // or a rank's hello mismatches (the error names the rank and field).
  static absl::StatusOr<std::unique_ptr<GlooPeerGroup>> Connect(const GlooPeerGroupOptions& options);

  ~GlooPeerGroup() override;
  GlooPeerGroup(const GlooPeerGroup&) = delete;
  GlooPeerGroup& operator=(const GlooPeerGroup&) = delete;

  int Rank() const override { return options_.rank; }
  int Size() const override { return options_.world_size; }
  // One fixed-size all-gather in the common case: every rank sends a slot
  // of the same size (an 8-byte size header, then its bytes, padded). The
  // slot's size comes from the recent calls' sizes, which every rank knows,
  // so all ranks agree on it without talking. When some rank's bytes do not
  // fit, every rank sees that in the headers and the remainders follow in a
  // second all-gather of known sizes (only then). Each of the two is Bruck's
  // log all-gather from log_allgather_min_ranks ranks up, Gloo's ring
  // (allgather, allgatherv) below; the result is the same: every rank's
  // bytes, in rank order, on every rank.
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view bytes) override;
  // A new Gloo context per color over the same store (keys under this group's
  // prefix, "split<n>_c<color>") and TCP device, connected full mesh within
  // connect_timeout, with this group's collective_timeout. The colors travel
  // in one AllGather of this group. The new group has no hello (this group's
  // already checked the configuration). A failure to connect the new group
  // is returned and leaves this group usable.
  absl::StatusOr<std::unique_ptr<PeerGroup>> Split(int color) override;
  // Writes "odb_cause_<rank>" (rank in the root group) under the root group's prefix, through a
  // store connection of its own (the planner thread may be using this group's). A split group's
  // diagnosis reads its members' causes there too.
  void ReportFailure(const std::string& cause) override;

  // The payload bytes a rank's slot holds in the next AllGather (for tests
  // and the benchmark: sizes up to it take one collective).
  size_t SlotBytes() const { return slot_bytes_; }
  // How many AllGathers needed the second collective (a rank's bytes did not fit the slot).
  uint64_t Overflows() const { return overflows_; }
  // Whether this group's all-gathers run Bruck's algorithm (else Gloo's ring).
  bool UsesLogAllGather() const {
    return options_.world_size >= std::max(1, options_.log_allgather_min_ranks);
  }

  // Bounds of the slot's payload: at least kMinSlotBytes; past kMaxSlotBytes
  // the rest goes through the allgatherv, so that one rank's large message
  // never makes every rank send W padded copies of its size.
  static constexpr size_t kMinSlotBytes = 256;
  static constexpr size_t kMaxSlotBytes = size_t{1} << 20;
  // The slots of all ranks together hold at most this many times the bytes
  // of the call they were sized for (plus kMinSlotBytes each): a rank whose
  // message is far above the others' overflows rather than padding every
  // rank's slot.
  static constexpr size_t kPaddingFactor = 4;
  // The slot fits the largest of the last kSlotMemory calls' messages (each
  // within its call's padding cap), so a group whose calls alternate between
  // sizes (a partitioned round's summaries, then its token totals) keeps one
  // collective for each instead of shrinking for one and overflowing on the
  // next.
  static constexpr size_t kSlotMemory = 4;
  // Test seam: the next AllGathers announce `size` in this rank's header
  // instead of its message's true size (a peer running other code); nullopt
  // restores the truth. Its bytes are sent as they are.
  void AnnounceSizeForTest(std::optional<uint64_t> size) { announce_for_test_ = size; }

  // "file:/dir job/gen" or "redis:host:port job/gen", for messages.
  std::string Describe() const;

 private:
  class RunGapWatch;

  explicit GlooPeerGroup(GlooPeerGroupOptions options);
  absl::Status ConnectImpl();
  // The next call's slot: what this call's largest message wants (with a
  // quarter of headroom, but no more than kPaddingFactor x the mean message),
  // the largest such want of the last kSlotMemory calls. Grows at once;
  // shrinks once kSlotMemory calls in a row wanted less.
  void ResizeSlot(size_t largest, size_t total);
  // Every rank's block (sizes[r] bytes, known on every rank; `mine` is this
  // rank's) into `out` in rank order, with Bruck's algorithm: ceil(log2 W)
  // rounds; in round k this rank sends the 2^k blocks it holds (or the
  // W - 2^k it lacks, if fewer) to rank - 2^k and receives as many from
  // rank + 2^k. All receives are posted first; each send waits only for the
  // receive it forwards. Throws Gloo's exceptions (timeouts included).
  void BruckAllGather(uint32_t tag, std::string_view mine, const std::vector<size_t>& sizes, char* out,
                      Clock::time_point deadline);
  // After a failed collective: what happened (this process stopped, a peer
  // that did not answer or is gone, or every rank failed), as text for the
  // error. `timed_out`: this rank's collective ran out of collective_timeout.
  // Leaves this rank's report in the store and drops the connections.
  std::string DiagnoseFailure(bool timed_out);

  // A peer's cause of failure (ReportFailure), read from the root group's keys; "" when it left none.
  std::string PeerCause(int rank_here);

  // This process's first cause of failure, shared by a group and the groups split from it.
  struct CauseBoard {
    Mutex mu;
    std::string cause ABSL_GUARDED_BY(mu);
  };

  GlooPeerGroupOptions options_;
  std::shared_ptr<CauseBoard> causes_ = std::make_shared<CauseBoard>();
  std::string root_prefix_;       // the root group's prefix ("<job_id>/<generation>")
  std::vector<int> root_ranks_;   // this group's ranks as ranks of the root group
  std::unique_ptr<RunGapWatch> run_gaps_;
  // Start of the last collective that succeeded (or of Connect): a stop of
  // this process since then can explain the failure of the current one.
  std::chrono::steady_clock::time_point last_ok_start_;
  // Shared with the groups Split makes (they live under this one's prefix).
  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::string prefix_;  // this group's keys: "<job_id>/<generation>[/split<n>_c<color>...]"
  std::unique_ptr<gloo::rendezvous::Store> prefix_store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t next_tag_ = 1;
  uint64_t ops_ = 0;
  uint64_t splits_ = 0;
  size_t slot_bytes_ = kMinSlotBytes;
  std::vector<size_t> recent_wants_;  // the last kSlotMemory calls' slots, oldest first
  uint64_t overflows_ = 0;
  std::optional<uint64_t> announce_for_test_;
  absl::Status broken_;
};

}  // namespace odb::align

#endif  // ODB_ALIGN_GLOO_PEER_GROUP_H_
