#ifndef ODB_ALIGN_FAKE_PEER_GROUP_H_
#define ODB_ALIGN_FAKE_PEER_GROUP_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/align/peer_group.h"

namespace odb::align {

// Test-only: W in-process ranks (one thread each) sharing one memory board,
// the way Gloo's own tests run ranks as threads over a HashStore. Fault
// injection: Kill(r) makes rank r "die" — every rank waiting on or later
// entering a collective gets Unavailable naming r, in the world and in every
// group split off it that holds r; KillAt(r, n) kills rank r when it enters
// its n-th collective of the world group (0-based; Split counts as one). A
// rank that simply never shows up produces DeadlineExceeded naming the
// missing ranks after `timeout`. Split(color) gives each color its own board
// (its own collectives), ranked by world rank, like a Gloo sub-context.
class FakeWorld {
 public:
  explicit FakeWorld(int size, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~FakeWorld();
  FakeWorld(const FakeWorld&) = delete;
  FakeWorld& operator=(const FakeWorld&) = delete;

  int size() const { return size_; }
  void Kill(int rank);
  void KillAt(int rank, uint64_t call_index);

  // The rank's view; owned by the world, valid while it lives.
  PeerGroup* Rank(int rank);

  // Bytes every rank's AllGather returned so far (what it "received"), for
  // the scale benchmark; groups split off count toward their world ranks.
  uint64_t ReceivedBytes(int rank) const;

  class Board;  // one group's collectives (the world's or a split's)

 private:
  class Member;
  const int size_;
  std::shared_ptr<Board> board_;
  std::vector<std::unique_ptr<Member>> members_;
};

}  // namespace odb::align

#endif  // ODB_ALIGN_FAKE_PEER_GROUP_H_
