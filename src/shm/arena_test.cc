// One process playing both sides: layout, validation, allocation rules.
// arena_process_test.cc runs the two sides in separate processes.
#include "src/shm/arena.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "src/shm/arena_reader.h"
#include "src/shm/arena_writer.h"
#include "src/shm/test_util.h"

namespace odb::shm {
namespace {

using testing::FillPattern;
using testing::FindPatternMismatch;
using testing::TempDir;

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

std::unique_ptr<ArenaWriter> MakeWriter(const std::string& dir, uint64_t capacity,
                                        uint32_t max_blocks = 1024) {
  ArenaOptions options;
  options.dir = dir;
  options.capacity_bytes = capacity;
  options.max_blocks = max_blocks;
  absl::StatusOr<std::unique_ptr<ArenaWriter>> w = ArenaWriter::Create(options);
  REQUIRE(w.ok());
  return std::move(*w);
}

TEST_CASE("a file arena: collision-free name, mode 0600, header, attach by path") {
  TempDir dir("create");
  auto writer = MakeWriter(dir.path(), 1 << 20, 100);
  const Arena& arena = writer->arena();
  const std::string filename = std::filesystem::path(arena.path()).filename();
  pid_t pid = 0;
  uint64_t nonce = 0;
  REQUIRE(ParseArenaFileName(filename, geteuid(), &pid, &nonce));
  REQUIRE(pid == getpid());
  REQUIRE(nonce == arena.generation());
  REQUIRE(filename.rfind("odb-shm-" + std::to_string(geteuid()) + "-" + std::to_string(getpid()) + "-", 0) ==
          0);
  struct stat st;
  REQUIRE(stat(arena.path().c_str(), &st) == 0);
  REQUIRE((st.st_mode & 07777) == 0600);
  REQUIRE(static_cast<uint64_t>(st.st_size) == arena.total_bytes());
  const ArenaHeader* h = arena.header();
  REQUIRE(h->magic == kArenaMagic);
  REQUIRE(h->layout_version == kArenaLayoutVersion);
  REQUIRE(h->creator_pid == getpid());
  REQUIRE(h->creator_uid == geteuid());
  REQUIRE(h->cq_capacity == 128);  // 100 rounded up to a power of two
  REQUIRE(arena.capacity_bytes() == (1 << 20));
  REQUIRE(arena.data_offset() % 4096 == 0);
  REQUIRE(reinterpret_cast<uintptr_t>(arena.base()) % 4096 == 0);
  // Two arenas of one process in one directory never collide.
  auto second = MakeWriter(dir.path(), 4096);
  REQUIRE(second->arena().path() != arena.path());

  absl::StatusOr<std::unique_ptr<Arena>> attached = Arena::Attach(arena.path());
  REQUIRE(attached.ok());
  REQUIRE((*attached)->generation() == arena.generation());
  REQUIRE_FALSE((*attached)->is_creator());
  // The writer's destructor closes and removes the file.
  const std::string path = arena.path();
  writer.reset();
  REQUIRE_FALSE(std::filesystem::exists(path));
  REQUIRE((*attached)->CheckCreator().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(Contains((*attached)->CheckCreator(), "closed"));
}

TEST_CASE("a memfd arena is sealed and attaches by fd") {
  ArenaOptions options;
  options.capacity_bytes = 256 << 10;
  options.populate = true;
  auto writer = ArenaWriter::Create(options);
  REQUIRE(writer.ok());
  const Arena& arena = (*writer)->arena();
  REQUIRE(arena.path().empty());
  REQUIRE(arena.name() == "memfd:odb-arena");
  const int seals = fcntl(arena.fd(), F_GET_SEALS);
  REQUIRE((seals & F_SEAL_SHRINK) != 0);
  REQUIRE((seals & F_SEAL_GROW) != 0);
  REQUIRE(ftruncate(arena.fd(), 4096) != 0);  // the creator cannot shrink it under a reader
  AttachOptions expect;
  expect.expected_generation = arena.generation();
  expect.expected_capacity_bytes = 256 << 10;
  expect.populate = true;
  auto reader = ArenaReader::AttachFd(arena.fd(), expect);
  REQUIRE(reader.ok());
  expect.expected_generation = arena.generation() ^ 1;
  auto wrong = Arena::AttachFd(arena.fd(), expect);
  REQUIRE(wrong.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(Contains(wrong.status(), "generation"));
  expect.expected_generation = 0;
  expect.expected_capacity_bytes = 1 << 20;
  auto small = Arena::AttachFd(arena.fd(), expect);
  REQUIRE(small.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(Contains(small.status(), "size mismatch"));
}

TEST_CASE("an arena in /dev/shm") {
  if (access("/dev/shm", W_OK) != 0) {
    WARN("no writable /dev/shm here");
    return;
  }
  auto writer = MakeWriter("/dev/shm", 64 << 10);
  REQUIRE(writer->arena().path().rfind("/dev/shm/odb-shm-", 0) == 0);
  auto reader = ArenaReader::Attach(writer->arena().path());
  REQUIRE(reader.ok());
}

TEST_CASE("every block is 64-byte aligned, on both sides, and bytes written are bytes read") {
  TempDir dir("align");
  auto writer = MakeWriter(dir.path(), 8 << 20);
  auto reader = ArenaReader::Attach(writer->arena().path());
  REQUIRE(reader.ok());
  std::mt19937_64 rng(12);
  std::vector<Block> live;
  for (int i = 0; i < 3000; ++i) {
    const uint64_t length = rng() % 3 == 0 ? rng() % 64 : rng() % 50000;
    absl::StatusOr<Block> b = writer->TryAllocate(length);
    if (IsWouldBlock(b.status())) {
      // Return the oldest half, out of order.
      std::shuffle(live.begin(), live.end(), rng);
      for (size_t k = 0; k < live.size() / 2; ++k)
        REQUIRE((*reader)->Return(live[k].offset, live[k].length).ok());
      live.erase(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(live.size() / 2));
      continue;
    }
    REQUIRE(b.ok());
    REQUIRE(b->offset % 64 == 0);
    REQUIRE(reinterpret_cast<uintptr_t>(b->data) % 64 == 0);
    REQUIRE(b->length == length);
    FillPattern(b->data, length, static_cast<uint64_t>(i));
    absl::StatusOr<std::span<std::byte>> view = (*reader)->View(b->offset, b->length);
    REQUIRE(view.ok());
    REQUIRE(reinterpret_cast<uintptr_t>(view->data()) % 64 == 0);
    REQUIRE(FindPatternMismatch(view->data(), view->size(), static_cast<uint64_t>(i)) == -1);
    live.push_back(*b);
  }
  for (const Block& b : live) REQUIRE((*reader)->Return(b.offset, b.length).ok());
  REQUIRE(writer->Reclaim() == live.size());
  const ArenaWriter::Stats s = writer->stats();
  REQUIRE(s.outstanding_blocks == 0);
  REQUIRE(s.free_bytes == writer->capacity_bytes());
  REQUIRE(s.largest_free == writer->capacity_bytes());
  REQUIRE(s.bad_returns == 0);
}

TEST_CASE("a block larger than the arena is an error naming both sizes; the whole arena fits") {
  TempDir dir("oversize");
  auto writer = MakeWriter(dir.path(), 1 << 20);
  const uint64_t capacity = writer->capacity_bytes();
  absl::StatusOr<Block> big = writer->TryAllocate(capacity + 1);
  REQUIRE(big.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_FALSE(IsWouldBlock(big.status()));
  const std::string msg(big.status().message());
  REQUIRE(msg.find(std::to_string(capacity + 1) + " bytes") != std::string::npos);
  REQUIRE(msg.find(std::to_string(capacity) + " bytes") != std::string::npos);
  REQUIRE(msg.find(writer->arena().path()) != std::string::npos);
  // The blocking form fails the same way at once instead of waiting.
  absl::StatusOr<Block> big_blocking = writer->Allocate(capacity + 1, absl::Hours(1));
  REQUIRE(big_blocking.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(writer->TryAllocate(capacity).ok());
}

TEST_CASE("exhaustion is would-block: by bytes and by block count; Allocate times out") {
  TempDir dir("exhaust");
  auto writer = MakeWriter(dir.path(), 64 << 10, 4);
  auto a = writer->TryAllocate(32 << 10);
  auto b = writer->TryAllocate(32 << 10);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  absl::StatusOr<Block> c = writer->TryAllocate(1);
  REQUIRE(IsWouldBlock(c.status()));
  REQUIRE(Contains(c.status(), "no free range"));
  REQUIRE(writer->Free(*a).ok());
  REQUIRE(writer->Free(*a).code() == absl::StatusCode::kInvalidArgument);  // not twice
  // Four blocks at most (max_blocks): the fifth waits even with bytes free.
  for (int i = 0; i < 3; ++i) REQUIRE(writer->TryAllocate(64).ok());
  absl::StatusOr<Block> fifth = writer->TryAllocate(64);
  REQUIRE(IsWouldBlock(fifth.status()));
  REQUIRE(Contains(fifth.status(), "all 4 blocks"));
  absl::StatusOr<Block> timed = writer->Allocate(64, absl::Milliseconds(20));
  REQUIRE(timed.status().code() == absl::StatusCode::kDeadlineExceeded);
  REQUIRE(writer->stats().waits >= 1);
}

TEST_CASE("one reader per arena; Reset gives the reader up and drops its late returns") {
  TempDir dir("reader");
  auto writer = MakeWriter(dir.path(), 1 << 20);
  REQUIRE(writer->reader_state() == ArenaWriter::ReaderState::kNone);
  auto reader = ArenaReader::Attach(writer->arena().path());
  REQUIRE(reader.ok());
  REQUIRE(writer->reader_state() == ArenaWriter::ReaderState::kAlive);
  REQUIRE(writer->reader_pid() == getpid());
  auto second = ArenaReader::Attach(writer->arena().path());
  REQUIRE(second.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(Contains(second.status(), "already reads"));

  auto block = writer->TryAllocate(1000);
  REQUIRE(block.ok());
  writer->Reset();
  REQUIRE(writer->stats().outstanding_blocks == 0);
  REQUIRE(writer->reader_state() == ArenaWriter::ReaderState::kNone);
  absl::Status late = (*reader)->Return(block->offset, block->length);
  REQUIRE(late.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(Contains(late, "reset"));
  reader->reset();  // its destructor must not release the new epoch's claim
  auto fresh = ArenaReader::Attach(writer->arena().path());
  REQUIRE(fresh.ok());
  REQUIRE((*fresh)->epoch() == 1);
  fresh->reset();
  REQUIRE(writer->reader_state() == ArenaWriter::ReaderState::kNone);
}

TEST_CASE("returns that name no outstanding block are counted and ignored") {
  TempDir dir("bad");
  auto writer = MakeWriter(dir.path(), 1 << 20);
  auto reader = ArenaReader::Attach(writer->arena().path());
  REQUIRE(reader.ok());
  auto block = writer->TryAllocate(100);
  REQUIRE(block.ok());
  REQUIRE((*reader)->Return(block->offset + 64, 100).ok());  // not a block
  REQUIRE((*reader)->Return(block->offset, 99).ok());        // wrong length
  REQUIRE((*reader)->Return(block->offset, 100).ok());
  REQUIRE((*reader)->Return(block->offset, 100).ok());  // twice
  REQUIRE(writer->Reclaim() == 1);
  REQUIRE(writer->stats().bad_returns == 3);
  REQUIRE(writer->stats().free_bytes == writer->capacity_bytes());
  // Outside the data region or misaligned: refused on the reader's side.
  REQUIRE((*reader)->Return(0, 64).code() == absl::StatusCode::kOutOfRange);
  REQUIRE((*reader)->Return(block->offset + 1, 1).code() == absl::StatusCode::kOutOfRange);
  REQUIRE((*reader)->View(writer->arena().total_bytes() - 64, 128).status().code() ==
          absl::StatusCode::kOutOfRange);
}

TEST_CASE("the writer's reader-liveness check sees a claim by a pid that does not run") {
  TempDir dir("claim");
  auto writer = MakeWriter(dir.path(), 1 << 20);
  ArenaHeader* h = writer->arena().header();
  h->reader_pid = getpid();
  h->reader_start_ticks = 1;  // this pid, another start time: a reused pid
  REQUIRE(writer->reader_state() == ArenaWriter::ReaderState::kDead);
  auto refused = ArenaReader::Attach(writer->arena().path());
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(Contains(refused.status(), "must Reset()"));
  writer->Reset();
  REQUIRE(ArenaReader::Attach(writer->arena().path()).ok());
}

TEST_CASE("arena file names") {
  pid_t pid = 0;
  uint64_t nonce = 0;
  REQUIRE(ParseArenaFileName("odb-shm-1000-42-00000000deadbeef", 1000, &pid, &nonce));
  REQUIRE(pid == 42);
  REQUIRE(nonce == 0xdeadbeefULL);
  REQUIRE_FALSE(ParseArenaFileName("odb-shm-1001-42-00000000deadbeef", 1000, &pid, &nonce));  // another uid
  REQUIRE_FALSE(ParseArenaFileName("odb-shm-1000-42-00000000deadbee", 1000, &pid, &nonce));
  REQUIRE_FALSE(ParseArenaFileName("odb-shm-1000-42-00000000DEADBEEF", 1000, &pid, &nonce));
  REQUIRE_FALSE(ParseArenaFileName("odb-shm-1000-42-00000000deadbeef.tmp", 1000, &pid, &nonce));
  REQUIRE_FALSE(ParseArenaFileName("odb-shm-1000--00000000deadbeef", 1000, &pid, &nonce));
  REQUIRE_FALSE(ParseArenaFileName("odbd-rank-0.lock", 1000, &pid, &nonce));
}

TEST_CASE("creation errors name the directory") {
  ArenaOptions options;
  options.dir = "/nonexistent-odb-dir";
  options.capacity_bytes = 4096;
  auto missing = Arena::Create(options);
  REQUIRE(missing.status().code() == absl::StatusCode::kNotFound);
  REQUIRE(Contains(missing.status(), "/nonexistent-odb-dir/odb-shm-"));
  options.dir = "";
  options.capacity_bytes = 0;
  REQUIRE(Arena::Create(options).status().code() == absl::StatusCode::kInvalidArgument);
  auto attach = Arena::Attach("/nonexistent-odb-dir/x");
  REQUIRE(attach.status().code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace odb::shm

namespace odb::shm {
namespace {

TEST_CASE("the reader's bounds are the layout it validated, not what the writer rewrites later") {
  TempDir dir("rewrite");
  auto writer = MakeWriter(dir.path(), 1 << 20);
  auto reader = ArenaReader::Attach(writer->arena().path());
  REQUIRE(reader.ok());
  const uint64_t data_offset = (*reader)->arena().data_offset();
  const uint32_t cq_capacity = (*reader)->arena().cq_capacity();
  // A hostile writer moves the data region over the header and the completion queue.
  ArenaHeader* h = writer->arena().header();
  h->data_offset = 0;
  h->data_bytes = writer->arena().total_bytes();
  h->cq_capacity = cq_capacity * 4;
  CHECK((*reader)->arena().data_offset() == data_offset);
  CHECK((*reader)->arena().cq_capacity() == cq_capacity);
  CHECK((*reader)->View(0, 64).status().code() == absl::StatusCode::kOutOfRange);
  CHECK((*reader)->View(data_offset - 64, 64).status().code() == absl::StatusCode::kOutOfRange);
  CHECK((*reader)->View(data_offset, 64).ok());
}

}  // namespace
}  // namespace odb::shm
