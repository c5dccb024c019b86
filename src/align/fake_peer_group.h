#ifndef ODB_ALIGN_FAKE_PEER_GROUP_H_
#define ODB_ALIGN_FAKE_PEER_GROUP_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/align/peer_group.h"
#include "src/common/mutex.h"

namespace odb::align {

// Test-only: W in-process ranks (one thread each) sharing one memory board,
// the way Gloo's own tests run ranks as threads over a HashStore. Fault
// injection: Kill(r) makes rank r "die" — every rank waiting on or later
// entering a collective gets Unavailable naming r; KillAt(r, n) kills rank r
// when it enters its n-th collective (0-based). A rank that simply never shows
// up produces DeadlineExceeded naming the missing ranks after `timeout`.
class FakeWorld {
 public:
  explicit FakeWorld(int size, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~FakeWorld();
  FakeWorld(const FakeWorld&) = delete;
  FakeWorld& operator=(const FakeWorld&) = delete;

  int size() const { return size_; }
  void Kill(int rank) ABSL_LOCKS_EXCLUDED(mu_);
  void KillAt(int rank, uint64_t call_index) ABSL_LOCKS_EXCLUDED(mu_);

  // The rank's view; owned by the world, valid while it lives.
  PeerGroup* Rank(int rank);

 private:
  class Member;
  absl::StatusOr<std::vector<std::string>> Gather(int rank, uint64_t call, std::string_view bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DeadError(int rank, uint64_t call) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Slot {
    std::vector<std::optional<std::string>> data;
    int arrived = 0;
    int readers_left = 0;
  };

  const int size_;
  const std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<Member>> members_;
  Mutex mu_;
  CondVar cv_;
  std::map<uint64_t, Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::optional<int> dead_rank_ ABSL_GUARDED_BY(mu_);
  std::map<int, uint64_t> kill_at_ ABSL_GUARDED_BY(mu_);
};

}  // namespace odb::align

#endif  // ODB_ALIGN_FAKE_PEER_GROUP_H_
