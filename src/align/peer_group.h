#ifndef ODB_ALIGN_PEER_GROUP_H_
#define ODB_ALIGN_PEER_GROUP_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace odb::align {

// The one collective the alignment protocol needs: every rank contributes a
// byte string (sizes may differ) and receives all W of them, indexed by rank.
// Collective: every rank calls it the same number of times, in the same order.
// Errors are values: a dead or silent peer turns into a Status (naming the
// rank when known) within the implementation's timeout, never a hang. After
// an error the group is unusable (every later call fails the same way).
class PeerGroup {
 public:
  virtual ~PeerGroup() = default;
  virtual int Rank() const = 0;
  virtual int Size() const = 0;
  virtual absl::StatusOr<std::vector<std::string>> AllGather(std::string_view bytes) = 0;
  // Ranks passing the same `color` form a new group, ranked in the order of their rank here. Collective:
  // every rank of this group calls it once, in the same order relative to other collectives.
  virtual absl::StatusOr<std::unique_ptr<PeerGroup>> Split(int color) = 0;
  // This rank fails the job for a reason of its own (a producer that went silent, bad config, ...;
  // not a failed collective): leaves `cause` where every peer's diagnosis of its next failed
  // collective reads it, so every rank reports the job's first cause instead of "lost peer".
  // The first cause sticks; callable from any thread. Groups without peers ignore it.
  virtual void ReportFailure(const std::string& cause) { (void)cause; }
};

// W = 1: no network at all.
class SoloPeerGroup final : public PeerGroup {
 public:
  int Rank() const override { return 0; }
  int Size() const override { return 1; }
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view bytes) override {
    return std::vector<std::string>{std::string(bytes)};
  }
  absl::StatusOr<std::unique_ptr<PeerGroup>> Split(int /*color*/) override {
    return std::unique_ptr<PeerGroup>(new SoloPeerGroup());
  }
};

}  // namespace odb::align

#endif  // ODB_ALIGN_PEER_GROUP_H_
