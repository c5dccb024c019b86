#include "src/shm/arena_reader.h"

#include <unistd.h>

#include "src/shm/process.h"

namespace odb::shm {

absl::StatusOr<std::unique_ptr<ArenaReader>> ArenaReader::Attach(const std::string& path,
                                                                 const AttachOptions& options) {
  absl::StatusOr<std::unique_ptr<Arena>> arena = Arena::Attach(path, options);
  if (!arena.ok()) return arena.status();
  return Claim(std::move(*arena));
}

absl::StatusOr<std::unique_ptr<ArenaReader>> ArenaReader::AttachFd(int fd, const AttachOptions& options) {
  absl::StatusOr<std::unique_ptr<Arena>> arena = Arena::AttachFd(fd, options);
  if (!arena.ok()) return arena.status();
  return Claim(std::move(*arena));
}

absl::StatusOr<std::unique_ptr<ArenaReader>> ArenaReader::Claim(std::unique_ptr<Arena> arena) {
  ArenaHeader* h = arena->header();
  const pid_t me = getpid();
  int32_t holder = 0;
  if (!Atomic(h->reader_pid).compare_exchange_strong(holder, me, std::memory_order_acq_rel)) {
    const uint64_t start = Atomic(h->reader_start_ticks).load(std::memory_order_acquire);
    if (IsProcessAlive(holder, start)) {
      if (holder == me) {
        return absl::FailedPreconditionError(arena->name() + ": this process (pid " + std::to_string(me) +
                                             ") already reads the arena (one reader per arena)");
      }
      return absl::FailedPreconditionError(arena->name() + ": already read by pid " + std::to_string(holder) +
                                           " (one reader per arena)");
    }
    return absl::FailedPreconditionError(
        arena->name() + ": its previous reader pid " + std::to_string(holder) +
        " died; the writer must Reset() the arena before another reader attaches");
  }
  Atomic(h->reader_start_ticks).store(ProcessStartTicks(me), std::memory_order_release);
  const uint32_t epoch = Atomic(h->reader_epoch).load(std::memory_order_acquire);
  return std::unique_ptr<ArenaReader>(new ArenaReader(std::move(arena), epoch));
}

ArenaReader::ArenaReader(std::unique_ptr<Arena> arena, uint32_t epoch)
    : arena_(std::move(arena)),
      cq_(arena_->header(), arena_->cq_entries(), arena_->cq_capacity()),
      epoch_(epoch),
      pid_(getpid()) {}

ArenaReader::~ArenaReader() {
  ArenaHeader* h = arena_->header();
  // Only our own claim (not in a fork()ed child that inherited this object),
  // and only if the writer has not reset it already.
  if (getpid() == pid_ && Atomic(h->reader_epoch).load(std::memory_order_acquire) == epoch_ &&
      Atomic(h->reader_pid).load(std::memory_order_acquire) == pid_) {
    Atomic(h->reader_start_ticks).store(0, std::memory_order_relaxed);
    int32_t expected = pid_;
    Atomic(h->reader_pid).compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
  }
}

absl::StatusOr<std::span<std::byte>> ArenaReader::View(uint64_t offset, uint64_t length) const {
  const uint64_t start = arena_->data_offset();
  const uint64_t end = arena_->total_bytes();
  if (offset < start || offset > end || length > end - offset || offset % kBlockAlignment != 0) {
    return absl::OutOfRangeError("block (" + std::to_string(offset) + ", " + std::to_string(length) +
                                 ") is outside the data region [" + std::to_string(start) + ", " +
                                 std::to_string(end) + ") of arena " + arena_->name() +
                                 " or not 64-byte aligned");
  }
  return std::span<std::byte>(arena_->base() + offset, length);
}

absl::Status ArenaReader::Return(uint64_t offset, uint64_t length) {
  ArenaHeader* h = arena_->header();
  if (Atomic(h->reader_epoch).load(std::memory_order_acquire) != epoch_) {
    return absl::FailedPreconditionError(
        arena_->name() + ": the writer reset the arena (it considered this reader gone); detach");
  }
  if (absl::StatusOr<std::span<std::byte>> v = View(offset, length); !v.ok()) return v.status();
  if (!cq_.TryPush(CompletionEntry{offset, length, epoch_, 0})) {
    return absl::ResourceExhaustedError(
        "the completion queue of arena " + arena_->name() + " is full (" + std::to_string(cq_.capacity()) +
        " entries): more returns than blocks outstanding, a block returned twice?");
  }
  return absl::OkStatus();
}

}  // namespace odb::shm
