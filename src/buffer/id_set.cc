#include "src/buffer/id_set.h"

#include <iterator>
#include <limits>

namespace odb::buffer {

bool IdSet::Contains(uint64_t id) const {
  auto it = runs_.lower_bound(id);  // the first run ending at or after id
  return it != runs_.end() && it->second <= id;
}

uint64_t IdSet::PrefixEnd() const {
  // The lowest run is the first entry (keyed by last id, runs are disjoint).
  if (runs_.empty() || runs_.begin()->second != 0) return 0;
  return runs_.begin()->first + 1;  // a run ending at UINT64_MAX wraps to 0: never reached by seqs
}

bool IdSet::Insert(uint64_t id) { return InsertBounded(id, /*may_grow=*/true) == Inserted::kNew; }

IdSet::Inserted IdSet::InsertBounded(uint64_t id, bool may_grow) {
  auto above = runs_.lower_bound(id);  // first run whose last id >= id
  if (above != runs_.end() && above->second <= id) return Inserted::kRepeat;
  // `above` (if any) starts after id; the run before it (if any) ends before id.
  const bool joins_above = above != runs_.end() && id != std::numeric_limits<uint64_t>::max() &&
                           above->second == id + 1;
  auto below = above == runs_.begin() ? runs_.end() : std::prev(above);
  const bool joins_below = below != runs_.end() && id != 0 && below->first == id - 1;
  if (!joins_above && !joins_below && !may_grow) return Inserted::kNoRoom;
  ++count_;
  if (joins_above && joins_below) {
    above->second = below->second;  // [below.first .. above.last]
    runs_.erase(below);
  } else if (joins_above) {
    above->second = id;
  } else if (joins_below) {
    const uint64_t first = below->second;
    // A btree's erase invalidates every iterator: hint with the one it returns
    // (the run after `below`, i.e. where `above` was).
    runs_.emplace_hint(runs_.erase(below), id, first);
  } else {
    runs_.emplace_hint(above, id, id);
  }
  return Inserted::kNew;
}

}  // namespace odb::buffer
