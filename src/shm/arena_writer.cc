#include "src/shm/arena_writer.h"

#include <algorithm>

#include "src/shm/process.h"

namespace odb::shm {
namespace {

constexpr char kWouldBlock[] = "would block: ";

// How long Allocate sleeps at most before it looks at the reader's liveness
// again (a dead reader never wakes it).
constexpr absl::Duration kLivenessSlice = absl::Milliseconds(100);

}  // namespace

bool IsWouldBlock(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted && status.message().rfind(kWouldBlock, 0) == 0;
}

absl::StatusOr<std::unique_ptr<ArenaWriter>> ArenaWriter::Create(const ArenaOptions& options) {
  absl::StatusOr<std::unique_ptr<Arena>> arena = Arena::Create(options);
  if (!arena.ok()) return arena.status();
  return std::unique_ptr<ArenaWriter>(new ArenaWriter(std::move(*arena)));
}

ArenaWriter::ArenaWriter(std::unique_ptr<Arena> arena)
    : arena_(std::move(arena)),
      cq_(arena_->header(), arena_->cq_entries(), arena_->cq_capacity()),
      allocator_(arena_->data_offset(), arena_->capacity_bytes(), kBlockAlignment) {}

absl::Status ArenaWriter::Oversize(uint64_t length) const {
  return absl::InvalidArgumentError("a block of " + std::to_string(length) + " bytes can never fit arena " +
                                    arena_->name() + " of " + std::to_string(arena_->capacity_bytes()) +
                                    " bytes: make the arena larger or send this sample over the socket");
}

size_t ArenaWriter::Reclaim() {
  size_t freed = 0;
  const uint32_t epoch = Atomic(arena_->header()->reader_epoch).load(std::memory_order_relaxed);
  CompletionEntry e;
  while (!cq_corrupt_) {
    const CompletionQueue::PopResult r = cq_.TryPop(&e);
    if (r == CompletionQueue::PopResult::kEmpty) break;
    if (r == CompletionQueue::PopResult::kCorrupt) {
      const ArenaHeader* h = arena_->header();
      cq_corrupt_ = true;
      cq_corrupt_what_ = "the completion queue of " + arena_->name() + " is corrupt (head " +
                         std::to_string(h->cq_head) + ", tail " + std::to_string(h->cq_tail) + ", capacity " +
                         std::to_string(cq_.capacity()) + "): the reader misbehaves; Reset() the arena";
      break;
    }
    if (e.epoch != epoch) {
      ++stats_.stale_returns;
      continue;
    }
    auto it = outstanding_.find(e.offset);
    if (it == outstanding_.end() || it->second != e.length) {
      ++stats_.bad_returns;
      continue;
    }
    allocator_.Free(e.offset, e.length);
    outstanding_bytes_ -= allocator_.RoundUp(e.length);
    outstanding_.erase(it);
    ++stats_.returns;
    ++freed;
  }
  return freed;
}

absl::StatusOr<Block> ArenaWriter::TryAllocate(uint64_t length) {
  if (allocator_.RoundUp(length) > allocator_.size()) return Oversize(length);
  Reclaim();
  if (cq_corrupt_) return absl::DataLossError(cq_corrupt_what_);
  if (outstanding_.size() >= cq_.capacity()) {
    return absl::ResourceExhaustedError(std::string(kWouldBlock) + "all " + std::to_string(cq_.capacity()) +
                                        " blocks of arena " + arena_->name() + " are outstanding");
  }
  const std::optional<uint64_t> offset = allocator_.Allocate(length);
  if (!offset) {
    return absl::ResourceExhaustedError(
        std::string(kWouldBlock) + "no free range of " + std::to_string(allocator_.RoundUp(length)) +
        " bytes in arena " + arena_->name() + " (" + std::to_string(allocator_.free_bytes()) +
        " bytes free, largest " + std::to_string(allocator_.largest_free()) + ")");
  }
  outstanding_.emplace(*offset, length);
  outstanding_bytes_ += allocator_.RoundUp(length);
  ++stats_.allocations;
  return Block{*offset, length, At(*offset)};
}

absl::StatusOr<Block> ArenaWriter::Allocate(uint64_t length, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<Block> block = TryAllocate(length);
    if (block.ok() || !IsWouldBlock(block.status())) return block;
    if (reader_state() == ReaderState::kDead) {
      return absl::UnavailableError("the reader (pid " + std::to_string(reader_pid()) + ") of arena " +
                                    arena_->name() + " died with " + std::to_string(outstanding_.size()) +
                                    " blocks outstanding; Reset() reclaims them");
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          "no room for a block of " + std::to_string(length) + " bytes in arena " + arena_->name() +
          " within " + absl::FormatDuration(timeout) + " (" + std::string(block.status().message()) + ")");
    }
    ++stats_.waits;
    cq_.WaitForEntries(std::min(left, kLivenessSlice));
  }
}

absl::Status ArenaWriter::Free(const Block& block) {
  auto it = outstanding_.find(block.offset);
  if (it == outstanding_.end() || it->second != block.length) {
    return absl::InvalidArgumentError("Free: no outstanding block of " + std::to_string(block.length) +
                                      " bytes at offset " + std::to_string(block.offset) + " in arena " +
                                      arena_->name());
  }
  allocator_.Free(block.offset, block.length);
  outstanding_bytes_ -= allocator_.RoundUp(block.length);
  outstanding_.erase(it);
  return absl::OkStatus();
}

ArenaWriter::ReaderState ArenaWriter::reader_state() const {
  ArenaHeader* h = arena_->header();
  const pid_t pid = Atomic(h->reader_pid).load(std::memory_order_acquire);
  if (pid == 0) return ReaderState::kNone;
  const uint64_t start = Atomic(h->reader_start_ticks).load(std::memory_order_acquire);
  return IsProcessAlive(pid, start) ? ReaderState::kAlive : ReaderState::kDead;
}

pid_t ArenaWriter::reader_pid() const {
  return Atomic(arena_->header()->reader_pid).load(std::memory_order_acquire);
}

void ArenaWriter::Reset() {
  ArenaHeader* h = arena_->header();
  // A new epoch first: whatever the old reader pushes from now on is dropped.
  Atomic(h->reader_epoch).fetch_add(1, std::memory_order_acq_rel);
  cq_.DiscardAll();
  cq_corrupt_ = false;
  cq_corrupt_what_.clear();
  Atomic(h->reader_start_ticks).store(0, std::memory_order_relaxed);
  Atomic(h->reader_pid).store(0, std::memory_order_release);
  allocator_.Reset();
  outstanding_.clear();
  outstanding_bytes_ = 0;
  ++stats_.resets;
}

ArenaWriter::Stats ArenaWriter::stats() const {
  Stats s = stats_;
  s.outstanding_blocks = outstanding_.size();
  s.outstanding_bytes = outstanding_bytes_;
  s.free_bytes = allocator_.free_bytes();
  s.largest_free = allocator_.largest_free();
  return s;
}

}  // namespace odb::shm
