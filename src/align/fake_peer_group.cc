#include "src/align/fake_peer_group.h"

#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "src/common/mutex.h"

namespace odb::align {

// The shared memory of one group: collective `call` of every member meets in
// slots_[call]. Groups split off are children, so a death reaches them.
class FakeWorld::Board {
 public:
  // `world_ranks[i]`: the world rank of member i; `received`: per world rank.
  Board(std::vector<int> world_ranks, std::chrono::milliseconds timeout,
        std::shared_ptr<std::vector<std::atomic<uint64_t>>> received)
      : world_ranks_(std::move(world_ranks)), timeout_(timeout), received_(std::move(received)) {}

  int size() const { return static_cast<int>(world_ranks_.size()); }
  int world_rank(int member) const { return world_ranks_[member]; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::vector<std::atomic<uint64_t>>& received() { return *received_; }

  // Kills the member with world rank `world_rank` (if it is one) here and in
  // every group split off this one.
  void KillWorldRank(int world_rank) {
    std::vector<std::shared_ptr<Board>> children;
    {
      MutexLock lock(mu_);
      for (int m = 0; m < size(); ++m) {
        if (world_ranks_[m] == world_rank && !dead_member_) dead_member_ = m;
      }
      for (auto& [key, child] : children_) children.push_back(child);
      cv_.NotifyAll();
    }
    for (auto& child : children) child->KillWorldRank(world_rank);
  }

  void KillAt(int member, uint64_t call) {
    MutexLock lock(mu_);
    kill_at_[member] = call;
  }

  absl::StatusOr<std::vector<std::string>> Gather(int member, uint64_t call, std::string_view bytes) {
    std::optional<int> newly_dead;
    absl::StatusOr<std::vector<std::string>> out = GatherLocked(member, call, bytes, newly_dead);
    // A KillAt death reaches the groups split off too (outside the lock:
    // children take their own).
    if (newly_dead) KillWorldRank(world_ranks_[*newly_dead]);
    return out;
  }

  // The board of the group that collective `call` split off for `color`
  // (created by its first member to arrive).
  std::shared_ptr<Board> Child(uint64_t call, int color, std::vector<int> world_ranks) {
    MutexLock lock(mu_);
    auto& child = children_[{call, color}];
    if (!child) child = std::make_shared<Board>(std::move(world_ranks), timeout_, received_);
    return child;
  }

 private:
  struct Slot {
    std::vector<std::optional<std::string>> data;
    int arrived = 0;
    int readers_left = 0;
  };

  absl::StatusOr<std::vector<std::string>> GatherLocked(int member, uint64_t call, std::string_view bytes,
                                                        std::optional<int>& newly_dead) {
    MutexLock lock(mu_);
    const int me = world_ranks_[member];
    auto dead_error = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return absl::UnavailableError("fake peer group: peer rank " + std::to_string(world_ranks_[*dead_member_]) +
                                    " died (seen by rank " + std::to_string(me) + " in collective " +
                                    std::to_string(call) + ")");
    };
    auto k = kill_at_.find(member);
    if (k != kill_at_.end() && call >= k->second && !dead_member_) {
      dead_member_ = member;
      newly_dead = member;
      cv_.NotifyAll();
    }
    if (dead_member_) return dead_error();
    Slot& slot = slots_[call];
    if (slot.data.empty()) {
      slot.data.resize(size());
      slot.readers_left = size();
    }
    slot.data[member] = std::string(bytes);
    if (++slot.arrived == size()) cv_.NotifyAll();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (!dead_member_ && slots_[call].arrived != size()) {
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) break;
      cv_.WaitFor(mu_, left);
    }
    if (dead_member_) return dead_error();
    Slot& s = slots_[call];
    if (s.arrived != size()) {
      std::string missing;
      for (int m = 0; m < size(); ++m) {
        if (!s.data[m]) missing += (missing.empty() ? "" : ",") + std::to_string(world_ranks_[m]);
      }
      return absl::DeadlineExceededError("fake peer group: rank " + std::to_string(me) + " waited " +
                                         std::to_string(timeout_.count()) + " ms in collective " +
                                         std::to_string(call) + " for peer rank(s) " + missing);
    }
    std::vector<std::string> out;
    out.reserve(size());
    uint64_t bytes_in = 0;
    for (auto& d : s.data) {
      bytes_in += d->size();
      out.push_back(*d);
    }
    (*received_)[me] += bytes_in;
    if (--s.readers_left == 0) slots_.erase(call);
    return out;
  }

  const std::vector<int> world_ranks_;
  const std::chrono::milliseconds timeout_;
  const std::shared_ptr<std::vector<std::atomic<uint64_t>>> received_;
  Mutex mu_;
  CondVar cv_;
  std::map<uint64_t, Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::optional<int> dead_member_ ABSL_GUARDED_BY(mu_);
  std::map<int, uint64_t> kill_at_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<uint64_t, int>, std::shared_ptr<Board>> children_ ABSL_GUARDED_BY(mu_);
};

class FakeWorld::Member final : public PeerGroup {
 public:
  Member(std::shared_ptr<Board> board, int member) : board_(std::move(board)), member_(member) {}
  int Rank() const override { return member_; }
  int Size() const override { return board_->size(); }
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view bytes) override {
    return board_->Gather(member_, calls_++, bytes);
  }
  absl::StatusOr<std::unique_ptr<PeerGroup>> Split(int color) override {
    const uint64_t call = calls_++;
    const std::string mine(reinterpret_cast<const char*>(&color), sizeof(color));
    auto colors = board_->Gather(member_, call, mine);
    if (!colors.ok()) return colors.status();
    std::vector<int> world_ranks;
    int index = -1;
    for (int m = 0; m < board_->size(); ++m) {
      int c = 0;
      if ((*colors)[m].size() != sizeof(c)) return absl::InternalError("fake peer group: bad Split color");
      std::memcpy(&c, (*colors)[m].data(), sizeof(c));
      if (c != color) continue;
      if (m == member_) index = static_cast<int>(world_ranks.size());
      world_ranks.push_back(board_->world_rank(m));
    }
    return std::unique_ptr<PeerGroup>(
        std::make_unique<Member>(board_->Child(call, color, std::move(world_ranks)), index));
  }

 private:
  std::shared_ptr<Board> board_;
  int member_;
  uint64_t calls_ = 0;  // only touched by the rank's own thread
};

FakeWorld::FakeWorld(int size, std::chrono::milliseconds timeout) : size_(size) {
  std::vector<int> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  board_ = std::make_shared<Board>(std::move(ranks), timeout,
                                   std::make_shared<std::vector<std::atomic<uint64_t>>>(size));
  for (int r = 0; r < size; ++r) members_.push_back(std::make_unique<Member>(board_, r));
}

FakeWorld::~FakeWorld() = default;

PeerGroup* FakeWorld::Rank(int rank) { return members_.at(rank).get(); }

void FakeWorld::Kill(int rank) { board_->KillWorldRank(rank); }

void FakeWorld::KillAt(int rank, uint64_t call_index) { board_->KillAt(rank, call_index); }

uint64_t FakeWorld::ReceivedBytes(int rank) const { return board_->received().at(rank).load(); }

}  // namespace odb::align
