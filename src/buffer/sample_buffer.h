#ifndef ODB_BUFFER_SAMPLE_BUFFER_H_
#define ODB_BUFFER_SAMPLE_BUFFER_H_

#include <cstdint>
#include <cstddef>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "proto/odb.pb.h"
#include "src/buffer/id_set.h"
#include "src/common/sample.h"

namespace odb::buffer {

// Samples waiting to be planned into steps, per epoch, bounded by payload
// bytes and by count. The bound is enforced by the caller checking Full()
// before reading more input (so back-pressure reaches producers through ZMQ);
// one message in flight may overshoot it by its own size. Nothing is evicted:
// samples leave only through Take(). Not thread-safe; the daemon guards it.
class SampleBuffer {
 public:
  // At most this many runs of seqs and ids, all epochs together (IdSet:
  // ~20 bytes each, so ~100 MB). Producers that count up, OdbDataLoader's
  // workers (each a stride of the rank's list) and shuffled ids of epochs up
  // to ~10^7 samples stay far below it; a producer that spreads seqs (or ids
  // without seq) apart on purpose, every other one, reaches it and its
  // samples that would start a run are refused (TOO_LARGE) instead of
  // growing the daemon without bound.
  static constexpr size_t kDefaultMaxRuns = size_t{1} << 22;

  SampleBuffer(uint64_t max_bytes, uint64_t max_samples, size_t max_runs = kDefaultMaxRuns)
      : max_bytes_(max_bytes), max_samples_(max_samples), max_runs_(max_runs) {}
  SampleBuffer(const SampleBuffer&) = delete;
  SampleBuffer& operator=(const SampleBuffer&) = delete;

  // Adds the sample, exactly once per position of its epoch:
  // - a sample with a seq (its position in the rank's list) is checked by
  //   seq only (DUPLICATE_ID naming the seq on a repeat), unless `seq_noted`:
  //   the caller already noted it with NoteSeq, which said it was new. Its id
  //   is not checked: two positions may carry one dataset index (a sampler
  //   with replacement). The seqs are kept as runs: O(seqs arriving out of
  //   order), independent of the epoch's length.
  // - a sample without seq is checked by id (DUPLICATE_ID on a repeat, also
  //   after the first one was taken), the ids kept as runs (see IdSet): O(1)
  //   per producer whose ids count up, up to one run per id in no order.
  // The sample is then keyed (meta.id) by its id, or, when a sample the
  // buffer holds already has that key, by another number unique among them
  // (Sample::user_id keeps the producer's id; see RekeyedId).
  // TOO_LARGE when its seq (or id) would start a run past max_runs: it is
  // then not noted (it may be sent again once the gaps fill).
  std::optional<wire::Rejection> Add(Sample&& sample, bool seq_noted = false);

  bool Full() const { return bytes_ >= max_bytes_ || count_ >= max_samples_; }
  // What may still be added before Full(); 0 when full.
  uint64_t RoomBytes() const { return bytes_ < max_bytes_ ? max_bytes_ - bytes_ : 0; }
  uint64_t RoomSamples() const { return count_ < max_samples_ ? max_samples_ - count_ : 0; }
  uint64_t bytes() const { return bytes_; }
  uint64_t count() const { return count_; }
  uint64_t CountInEpoch(uint32_t epoch) const;
  // Payload bytes buffered for epochs other than `epoch`.
  uint64_t BytesOutsideEpoch(uint32_t epoch) const;

  // Metadata of the epoch's buffered samples in arrival order, at most `limit`.
  std::vector<SampleMeta> Pending(uint32_t epoch, size_t limit = SIZE_MAX) const;

  // Samples may carry `seq`, their position in the rank's list (every
  // sample does under alignment.deterministic). NoteSeq records that `seq`
  // arrived (admitted or rejected): kRepeat if it had already, kNoRoom (not
  // noted) if it would start a run past max_runs (see TooManyRuns). Add
  // notes it too. The frontier is the first seq that has not arrived.
  IdSet::Inserted NoteSeq(uint32_t epoch, uint64_t seq);
  // The rejection (TOO_LARGE) of a sample whose seq (`seq`) or id (no seq)
  // found no room: names both, the limit, and what to do.
  wire::Rejection TooManyRuns(const Sample& sample) const;
  uint64_t Frontier(uint32_t epoch) const;
  // Buffered samples in seq order: those below the frontier (an unbroken
  // prefix of the list), or all of them when `all_arrived` (the stream
  // finished: a gap is a sample that never came). At most `limit`.
  std::vector<SampleMeta> PendingInOrder(uint32_t epoch, size_t limit, bool all_arrived) const;

  // Removes and returns the samples with these keys (meta.id, what Pending
  // lists; the producer's id unless the sample was keyed apart), in the
  // given order. Keys not present are skipped; the caller checks the size.
  std::vector<Sample> Take(uint32_t epoch, const std::vector<uint64_t>& keys);
  // One sample, if buffered.
  std::optional<Sample> TakeOne(uint32_t epoch, uint64_t key);

  // Entries of bookkeeping held for all epochs: buffered samples, their
  // order and seq indexes, runs of seqs that arrived, and runs of admitted
  // ids of samples without seq. O(buffered + out of order) when samples
  // carry seqs (whatever their ids) or their ids count up per producer; what
  // a test bounds (entries, not bytes: the containers' sizes are fixed per entry).
  size_t BookkeepingEntries() const;
  // Runs of ids admitted in the epoch without seq (that check's memory).
  size_t SeenRuns(uint32_t epoch) const;
  // Runs of seqs that arrived in the epoch (the seq check's memory).
  size_t SeqRuns(uint32_t epoch) const;
  // The producer's id of a buffered sample, by its key (meta.id).
  std::optional<uint64_t> UserIdOf(uint32_t epoch, uint64_t key) const;
  // The key of a sample whose id (or a previous candidate) is the key of a
  // sample the buffer holds: a function of (candidate, seq or arrival
  // number), retried until free.
  static uint64_t RekeyedId(uint64_t candidate, uint64_t salt);

  // Forgets the epoch's duplicate-detection set; remaining samples are returned.
  std::vector<Sample> CloseEpoch(uint32_t epoch);

  // What a buffered sample counts against max_bytes: its payload plus
  // kBookkeepingBytesPerTensor per tensor (names, shapes, frame holders), so
  // samples of many empty tensors cannot escape the bound.
  static uint64_t ChargedBytes(const Sample& sample);

  // Fixed bytes of bookkeeping per buffered sample (excluding payload and tensor
  // descriptors), for the memory report.
  static constexpr size_t kOverheadPerSampleEstimate = sizeof(Sample) + 64;

 private:
  struct Epoch {
    // (key, arrival number) in arrival order; may hold taken samples, skipped.
    // A key is free again once its sample is taken (a repeated id keys as
    // its id then), so an entry counts only if the arrival numbers agree.
    std::vector<std::pair<uint64_t, uint64_t>> order;
    struct Held {
      Sample sample;
      uint64_t arrival = 0;
    };
    std::unordered_map<uint64_t, Held> samples;  // by key (meta.id)
    IdSet seen;  // every id of the epoch's samples without seq, for duplicates, as runs
    IdSet seqs;  // every seq that arrived (admitted or rejected), as runs; frontier = PrefixEnd()
    uint64_t bytes = 0;                   // payload bytes buffered now
    std::map<uint64_t, uint64_t> by_seq;  // seq -> key of buffered samples that have one
    uint64_t arrivals = 0;                // samples added: arrival numbers, the salt of a rekeyed sample without seq
  };

  // Whether a new run fits under max_runs_ (all epochs' seq and id runs).
  bool RunsHaveRoom() const;

  uint64_t max_bytes_;
  uint64_t max_samples_;
  size_t max_runs_;
  uint64_t bytes_ = 0;
  uint64_t count_ = 0;
  std::map<uint32_t, Epoch> epochs_;
};

}  // namespace odb::buffer

#endif  // ODB_BUFFER_SAMPLE_BUFFER_H_
