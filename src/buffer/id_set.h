#ifndef ODB_BUFFER_ID_SET_H_
#define ODB_BUFFER_ID_SET_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/btree_map.h"

namespace odb::buffer {

// A set of 64-bit numbers (an epoch's seqs, or the ids of its samples that
// carry no seq), exactly (no false positives: a duplicate is rejected, never a
// new sample), as maximal runs of consecutive numbers. Memory is one entry per run, not per id: a producer whose ids count up
// (base, base + 1, ...) costs one run however long its stream, so an epoch of
// such producers keeps O(producers + ids arriving out of order) entries,
// independent of the epoch's length. Ids in no order (a shuffled dataset's
// indices) cost at most one run per id, and runs merge as the gaps between
// them fill (the whole of 0..N-1 is one run again). A btree keeps an entry at
// about 20 bytes (an std::unordered_set spends ~40 per id).
class IdSet {
 public:
  // False if `id` was already in the set.
  bool Insert(uint64_t id);
  enum class Inserted { kNew, kRepeat, kNoRoom };
  // As Insert, but an id that would start a run of its own (it neither
  // extends nor joins runs) is not inserted when `may_grow` is false
  // (kNoRoom): how a caller caps the runs, the set's memory.
  Inserted InsertBounded(uint64_t id, bool may_grow);
  bool Contains(uint64_t id) const;
  // Runs held: the bookkeeping's size.
  size_t Runs() const { return runs_.size(); }
  uint64_t Count() const { return count_; }
  // The first number not in the set when counting up from 0 (0 when 0 is
  // not in it): every number below it is in the set.
  uint64_t PrefixEnd() const;

 private:
  // The last id of each run -> its first id. Keyed by the last id, so the
  // run that could hold or extend `id` upwards is lower_bound(id).
  absl::btree_map<uint64_t, uint64_t> runs_;
  uint64_t count_ = 0;
};

}  // namespace odb::buffer

#endif  // ODB_BUFFER_ID_SET_H_
