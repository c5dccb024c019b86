#ifndef ODB_CLIENT_RESUME_H_
#define ODB_CLIENT_RESUME_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "odb/consumer.h"

namespace odb::client {

// What a C++ trainer checkpoints to resume an epoch without replaying it
// (docs/resume.md, the C++ side of OdbDataLoader.state_dict()): the sample
// ids of the steps it trained, kept as a cursor (every id below it) plus the
// ids above it, so the state stays small when ids are trained roughly in
// order. After a restart the trainer's producers skip Contains(id) samples;
// with several ranks, Merge() every rank's set (an all-gather) first.
class ConsumedSet {
 public:
  static constexpr int kVersion = 1;

  void Add(uint64_t id);
  // Every sample of a trained step.
  void AddStep(const StepInfo& step);
  bool Contains(uint64_t id) const { return id < cursor_ || extra_.count(id) > 0; }
  uint64_t size() const { return cursor_ + extra_.size(); }
  void Merge(const ConsumedSet& other);

  // Versioned JSON: {"format":"odb.ConsumedSet","version":1,"epoch":E,
  // "consumed":{"cursor":C,"extra":[...]}}.
  std::string Serialize(uint32_t epoch) const;
  struct Parsed;
  // A corrupt, truncated or other-version text is an error naming what is
  // wrong, never a silently wrong set.
  static absl::StatusOr<Parsed> Parse(const std::string& text);

 private:
  void Compact();
  uint64_t cursor_ = 0;        // every id below is consumed
  std::set<uint64_t> extra_;  // consumed ids at or above cursor_
};

// alignment.deterministic: where a resumed epoch replays from, step for step
// (docs/resume.md, the `replay` entry of OdbDataLoader's state). A C++
// trainer checkpoints it next to its ConsumedSet sets: the samples of the
// steps before `first_step` (they leave the rank lists) and those from
// `first_step` on (they stay in the lists: the replayed round plans them
// again into the same steps). After the restart it calls
// Consumer::StartEpoch(epoch, producers, round, first_step), its producers
// send each rank's uninterrupted list less the first set (with seq = the
// position in the shortened list), and it drops the steps below `next_step`.
struct ReplayPoint {
  uint64_t round = 0;       // the planning round to replay
  uint64_t first_step = 0;  // its first step index
  uint64_t next_step = 0;   // the first step not trained yet

  // The replay point after `last`, the last step trained (of any kind), or
  // nullopt when the daemon does not run alignment.deterministic.
  static std::optional<ReplayPoint> After(const StepInfo& last);
};

struct ConsumedSet::Parsed {
  uint32_t epoch = 0;
  ConsumedSet consumed;
};

}  // namespace odb::client

#endif  // ODB_CLIENT_RESUME_H_
