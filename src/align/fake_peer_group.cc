#include "src/align/fake_peer_group.h"

#include "absl/status/status.h"

namespace odb::align {

class FakeWorld::Member final : public PeerGroup {
 public:
  Member(FakeWorld* world, int rank) : world_(world), rank_(rank) {}
  int Rank() const override { return rank_; }
  int Size() const override { return world_->size_; }
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view bytes) override {
    return world_->Gather(rank_, calls_++, bytes);
  }

 private:
  FakeWorld* world_;
  int rank_;
  uint64_t calls_ = 0;  // only touched by the rank's own thread
};

FakeWorld::FakeWorld(int size, std::chrono::milliseconds timeout) : size_(size), timeout_(timeout) {
  for (int r = 0; r < size; ++r) members_.push_back(std::make_unique<Member>(this, r));
}

FakeWorld::~FakeWorld() = default;

PeerGroup* FakeWorld::Rank(int rank) { return members_.at(rank).get(); }

void FakeWorld::Kill(int rank) {
  MutexLock lock(mu_);
  if (!dead_rank_) dead_rank_ = rank;
  cv_.NotifyAll();
}

void FakeWorld::KillAt(int rank, uint64_t call_index) {
  MutexLock lock(mu_);
  kill_at_[rank] = call_index;
}

absl::Status FakeWorld::DeadError(int rank, uint64_t call) const {
  return absl::UnavailableError("fake peer group: peer rank " + std::to_string(*dead_rank_) +
                                " died (seen by rank " + std::to_string(rank) + " in collective " +
                                std::to_string(call) + ")");
}

absl::StatusOr<std::vector<std::string>> FakeWorld::Gather(int rank, uint64_t call, std::string_view bytes) {
  MutexLock lock(mu_);
  auto k = kill_at_.find(rank);
  if (k != kill_at_.end() && call >= k->second && !dead_rank_) {
    dead_rank_ = rank;
    cv_.NotifyAll();
  }
  if (dead_rank_) return DeadError(rank, call);
  Slot& slot = slots_[call];
  if (slot.data.empty()) {
    slot.data.resize(size_);
    slot.readers_left = size_;
  }
  slot.data[rank] = std::string(bytes);
  if (++slot.arrived == size_) cv_.NotifyAll();
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  bool done = slots_[call].arrived == size_;
  while (!dead_rank_ && !done) {
    const bool notified = cv_.WaitUntil(mu_, deadline);
    done = slots_[call].arrived == size_;
    if (!notified && !done) break;  // timed out
  }
  if (dead_rank_) return DeadError(rank, call);
  Slot& s = slots_[call];
  if (!done) {
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (!s.data[r]) missing += (missing.empty() ? "" : ",") + std::to_string(r);
    }
    return absl::DeadlineExceededError("fake peer group: rank " + std::to_string(rank) + " waited " +
                                       std::to_string(timeout_.count()) + " ms in collective " +
                                       std::to_string(call) + " for peer rank(s) " + missing);
  }
  std::vector<std::string> out;
  out.reserve(size_);
  for (auto& d : s.data) out.push_back(*d);
  if (--s.readers_left == 0) slots_.erase(call);
  return out;
}

}  // namespace odb::align
