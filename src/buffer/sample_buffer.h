#ifndef ODB_BUFFER_SAMPLE_BUFFER_H_
#define ODB_BUFFER_SAMPLE_BUFFER_H_

#include <cstdint>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
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
  SampleBuffer(uint64_t max_bytes, uint64_t max_samples)
      : max_bytes_(max_bytes), max_samples_(max_samples) {}
  SampleBuffer(const SampleBuffer&) = delete;
  SampleBuffer& operator=(const SampleBuffer&) = delete;

  // Adds the sample; a duplicate id within its epoch is rejected (DUPLICATE_ID),
  // also after the first one was taken (the epoch's ids are kept as runs, see IdSet).
  std::optional<wire::Rejection> Add(Sample&& sample);

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

  // alignment.deterministic: samples carry `seq`, their position in the
  // rank's list. NoteSeq records that `seq` arrived (admitted or rejected);
  // false if it had already. Add notes it too. The frontier is the first seq
  // that has not arrived.
  bool NoteSeq(uint32_t epoch, uint64_t seq);
  uint64_t Frontier(uint32_t epoch) const;
  // Buffered samples in seq order: those below the frontier (an unbroken
  // prefix of the list), or all of them when `all_arrived` (the stream
  // finished: a gap is a sample that never came). At most `limit`.
  std::vector<SampleMeta> PendingInOrder(uint32_t epoch, size_t limit, bool all_arrived) const;

  // Removes and returns the samples with these ids (in the given order).
  // Ids not present are skipped; the caller checks the size.
  std::vector<Sample> Take(uint32_t epoch, const std::vector<uint64_t>& ids);
  // One sample, if buffered.
  std::optional<Sample> TakeOne(uint32_t epoch, uint64_t id);

  // Entries of bookkeeping held for all epochs: buffered samples, their
  // order and seq indexes, seqs past the frontier, and runs of admitted ids.
  // O(buffered + out of order) when each producer's ids count up; what a
  // test bounds (entries, not bytes: the containers' sizes are fixed per entry).
  size_t BookkeepingEntries() const;
  // Runs of ids admitted in the epoch (the duplicate check's memory).
  size_t SeenRuns(uint32_t epoch) const;

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
    std::vector<uint64_t> order;  // arrival order (may hold taken ids; skipped)
    std::unordered_map<uint64_t, Sample> samples;
    IdSet seen;  // every id of the epoch, for duplicates, as runs
    uint64_t bytes = 0;                 // payload bytes buffered now
    std::map<uint64_t, uint64_t> by_seq;  // seq -> id of buffered samples that have one
    std::set<uint64_t> seq_ahead;         // arrived seqs past the frontier
    uint64_t frontier = 0;                // every seq below it arrived
  };

  uint64_t max_bytes_;
  uint64_t max_samples_;
  uint64_t bytes_ = 0;
  uint64_t count_ = 0;
  std::map<uint32_t, Epoch> epochs_;
};

}  // namespace odb::buffer

#endif  // ODB_BUFFER_SAMPLE_BUFFER_H_
