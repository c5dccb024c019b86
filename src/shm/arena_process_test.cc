// Writer and reader in separate processes (fork), synchronised only through
// pipes, a socketpair and the arena's own shared state: no sleeps.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "src/shm/arena.h"
#include "src/shm/arena_reader.h"
#include "src/shm/arena_writer.h"
#include "src/shm/fd_passing.h"
#include "src/shm/test_util.h"

namespace odb::shm {
namespace {

using testing::FillPattern;
using testing::FindPatternMismatch;
using testing::ForkChild;
using testing::Pipe;
using testing::TempDir;
using testing::WaitChild;

constexpr uint64_t kEnd = ~uint64_t{0};

// What the writer tells the reader about a block (the part of a ZeroMQ
// message the integration will carry).
struct Descriptor {
  uint64_t offset;
  uint64_t length;
  uint64_t seed;
};

struct ReaderReport {
  uint64_t blocks = 0;
  uint64_t bytes = 0;
  uint64_t mismatched_blocks = 0;
  uint64_t first_bad_block_seed = 0;
  int64_t first_bad_byte = -1;
  uint64_t return_errors = 0;
};

struct SocketPair {
  SocketPair() { REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) == 0); }
  ~SocketPair() { Close(0), Close(1); }
  void Close(int i) {
    if (fds[i] >= 0) close(fds[i]);
    fds[i] = -1;
  }
  int fds[2] = {-1, -1};
};

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// The reader of the integrity test: receives the arena (fd or path) over the
// socket, holds up to 8 blocks and returns them in random order, checking
// every byte of a block just before returning it (so a block the writer
// reused too early shows up as a mismatch).
int IntegrityReader(int sock, Pipe& descriptors, Pipe& report_pipe) {
  absl::StatusOr<ReceivedFds> hello = RecvFds(sock);
  if (!hello.ok()) return 10;
  // Payload: "<generation> <path>" (path empty for a memfd, which comes as the fd).
  const size_t space = hello->payload.find(' ');
  AttachOptions expect;
  expect.expected_generation = std::stoull(hello->payload.substr(0, space));
  const std::string path = hello->payload.substr(space + 1);
  absl::StatusOr<std::unique_ptr<ArenaReader>> reader =
      hello->fds.empty() ? ArenaReader::Attach(path, expect)
                         : ArenaReader::AttachFd(hello->fds[0].get(), expect);
  if (!reader.ok()) return 11;
  hello->fds.clear();  // the mapping keeps the segment; the fd is not needed
  ReaderReport report;
  std::vector<Descriptor> held;
  std::mt19937_64 rng(getpid());
  auto return_one = [&] {
    const size_t i = rng() % held.size();
    const Descriptor d = held[i];
    held[i] = held.back();
    held.pop_back();
    absl::StatusOr<std::span<std::byte>> view = (*reader)->View(d.offset, d.length);
    if (!view.ok()) {
      ++report.mismatched_blocks;
      return;
    }
    const int64_t bad = FindPatternMismatch(view->data(), view->size(), d.seed);
    if (bad >= 0 && report.mismatched_blocks++ == 0) {
      report.first_bad_block_seed = d.seed;
      report.first_bad_byte = bad;
    }
    if (!(*reader)->Return(d.offset, d.length).ok()) ++report.return_errors;
  };
  while (true) {
    if (!held.empty() && (held.size() >= 8 || !descriptors.Readable())) {
      return_one();
      continue;
    }
    Descriptor d;
    if (!descriptors.Read(&d, sizeof(d))) return 12;
    if (d.length == kEnd) break;
    ++report.blocks;
    report.bytes += d.length;
    held.push_back(d);
  }
  while (!held.empty()) return_one();
  return report_pipe.Write(&report, sizeof(report)) ? 0 : 13;
}

void RunIntegrity(const std::string& dir) {
  SocketPair sp;
  Pipe descriptors, report_pipe;
  const pid_t child = ForkChild([&] {
    sp.Close(0);
    descriptors.CloseWrite();
    report_pipe.CloseRead();
    return IntegrityReader(sp.fds[1], descriptors, report_pipe);
  });
  sp.Close(1);
  descriptors.CloseRead();
  report_pipe.CloseWrite();

  // The arena is created after the fork: the reader maps it only through what
  // it receives.
  ArenaOptions options;
  options.dir = dir;
  options.capacity_bytes = 4 << 20;
  options.max_blocks = 64;
  absl::StatusOr<std::unique_ptr<ArenaWriter>> writer = ArenaWriter::Create(options);
  REQUIRE(writer.ok());
  const std::string hello = std::to_string((*writer)->arena().generation()) + " " + (*writer)->arena().path();
  if (dir.empty()) {
    REQUIRE(SendFd(sp.fds[0], (*writer)->arena().fd(), hello).ok());
  } else {
    REQUIRE(SendFds(sp.fds[0], {}, hello).ok());
  }

  std::mt19937_64 rng(2024);
  const int kBlocks = 3000;
  uint64_t total = 0;
  for (int i = 0; i < kBlocks; ++i) {
    // Log-uniform over 1 B .. 1 MiB, and some empty blocks.
    const uint64_t length =
        i % 97 == 0 ? 0
                    : static_cast<uint64_t>(
                          std::exp(std::uniform_real_distribution<double>(0, std::log(1 << 20))(rng)));
    absl::StatusOr<Block> block = (*writer)->Allocate(length, absl::Seconds(60));
    REQUIRE(block.ok());
    REQUIRE(block->offset % 64 == 0);
    const Descriptor d{block->offset, length, 0x5eed0000ULL + static_cast<uint64_t>(i)};
    FillPattern(block->data, length, d.seed);
    REQUIRE(descriptors.Write(&d, sizeof(d)));
    total += length;
  }
  const Descriptor end{0, kEnd, 0};
  REQUIRE(descriptors.Write(&end, sizeof(end)));
  ReaderReport report;
  REQUIRE(report_pipe.Read(&report, sizeof(report)));
  REQUIRE(WaitChild(child) == 0);
  CHECK(report.first_bad_byte == -1);
  CHECK(report.first_bad_block_seed == 0);
  REQUIRE(report.mismatched_blocks == 0);
  REQUIRE(report.return_errors == 0);
  REQUIRE(report.blocks == kBlocks);
  REQUIRE(report.bytes == total);
  // Every block came back: the whole arena is one free range again.
  absl::StatusOr<Block> all = (*writer)->Allocate((*writer)->capacity_bytes(), absl::Seconds(60));
  REQUIRE(all.ok());
  const ArenaWriter::Stats s = (*writer)->stats();
  REQUIRE(s.returns == kBlocks);
  REQUIRE(s.bad_returns == 0);
  REQUIRE(s.stale_returns == 0);
  REQUIRE(s.waits > 0);  // 4 MiB for ~220 MiB of blocks: the writer had to wait for returns
}

TEST_CASE(
    "every byte of many random-size blocks crosses to another process: memfd passed over a socketpair") {
  RunIntegrity("");
}

TEST_CASE("every byte of many random-size blocks crosses to another process: file attached by path") {
  TempDir dir("integrity");
  RunIntegrity(dir.path());
}

TEST_CASE("a full arena blocks the writer until the reader returns a block") {
  TempDir dir("blocking");
  ArenaOptions options;
  options.dir = dir.path();
  options.capacity_bytes = 64 << 10;
  absl::StatusOr<std::unique_ptr<ArenaWriter>> writer = ArenaWriter::Create(options);
  REQUIRE(writer.ok());
  const std::string path = (*writer)->arena().path();
  Pipe to_reader, from_reader;
  const pid_t child = ForkChild([&] {
    to_reader.CloseWrite();
    from_reader.CloseRead();
    absl::StatusOr<std::unique_ptr<ArenaReader>> reader = ArenaReader::Attach(path);
    if (!reader.ok()) return 10;
    const char attached = 'a';
    if (!from_reader.Write(&attached, 1)) return 11;
    Descriptor a, b;
    if (!to_reader.Read(&a, sizeof(a)) || !to_reader.Read(&b, sizeof(b))) return 12;
    // Wait for the writer to be asleep in Allocate: its own flag in the
    // segment, not a timer, says so.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!(*reader)->writer_waiting()) {
      if (std::chrono::steady_clock::now() > give_up) return 13;
      sched_yield();
    }
    if (!(*reader)->Return(a.offset, a.length).ok()) return 14;
    Descriptor done;
    if (!to_reader.Read(&done, sizeof(done))) return 15;
    return (*reader)->Return(b.offset, b.length).ok() ? 0 : 16;
  });
  to_reader.CloseRead();
  from_reader.CloseWrite();
  char attached;
  REQUIRE(from_reader.Read(&attached, 1));

  absl::StatusOr<Block> a = (*writer)->TryAllocate(32 << 10);
  absl::StatusOr<Block> b = (*writer)->TryAllocate(32 << 10);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(IsWouldBlock((*writer)->TryAllocate(32 << 10).status()));
  const Descriptor da{a->offset, a->length, 0}, db{b->offset, b->length, 0};
  REQUIRE(to_reader.Write(&da, sizeof(da)));
  REQUIRE(to_reader.Write(&db, sizeof(db)));
  const uint64_t waits_before = (*writer)->stats().waits;
  absl::StatusOr<Block> c = (*writer)->Allocate(32 << 10, absl::Seconds(60));
  REQUIRE(c.ok());
  REQUIRE(c->offset == a->offset);  // the returned block, reused
  REQUIRE((*writer)->stats().waits > waits_before);
  REQUIRE((*writer)->stats().returns == 1);
  REQUIRE(to_reader.Write(&da, sizeof(da)));
  REQUIRE(WaitChild(child) == 0);
  REQUIRE((*writer)->Reclaim() == 1);
  REQUIRE((*writer)->stats().outstanding_blocks == 1);  // c
}

TEST_CASE("a reader killed with blocks outstanding: the writer sees it, Reset reclaims everything") {
  TempDir dir("reader-death");
  ArenaOptions options;
  options.dir = dir.path();
  options.capacity_bytes = 1 << 20;
  absl::StatusOr<std::unique_ptr<ArenaWriter>> writer = ArenaWriter::Create(options);
  REQUIRE(writer.ok());
  const std::string path = (*writer)->arena().path();
  Pipe to_reader, from_reader;
  const pid_t child = ForkChild([&] {
    to_reader.CloseWrite();
    from_reader.CloseRead();
    absl::StatusOr<std::unique_ptr<ArenaReader>> reader = ArenaReader::Attach(path);
    if (!reader.ok()) return 10;
    for (int i = 0; i < 4; ++i) {
      Descriptor d;
      if (!to_reader.Read(&d, sizeof(d))) return 11;
      if (i < 2 && !(*reader)->Return(d.offset, d.length).ok()) return 12;
    }
    const char returned = 'r';
    if (!from_reader.Write(&returned, 1)) return 13;
    Descriptor never;
    (void)to_reader.Read(&never, sizeof(never));  // blocks until killed
    return 0;
  });
  to_reader.CloseRead();
  from_reader.CloseWrite();
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Block> b = (*writer)->TryAllocate(200 << 10);
    REQUIRE(b.ok());
    const Descriptor d{b->offset, b->length, 0};
    REQUIRE(to_reader.Write(&d, sizeof(d)));
  }
  char returned;
  REQUIRE(from_reader.Read(&returned, 1));
  REQUIRE((*writer)->Reclaim() == 2);
  REQUIRE((*writer)->reader_state() == ArenaWriter::ReaderState::kAlive);
  REQUIRE((*writer)->reader_pid() == child);

  REQUIRE(kill(child, SIGKILL) == 0);
  REQUIRE(WaitChild(child) == 128 + SIGKILL);
  REQUIRE((*writer)->reader_state() == ArenaWriter::ReaderState::kDead);
  // Waiting for its blocks would be forever: Allocate says so at once.
  absl::StatusOr<Block> whole = (*writer)->Allocate((*writer)->capacity_bytes(), absl::Hours(1));
  REQUIRE(whole.status().code() == absl::StatusCode::kUnavailable);
  REQUIRE(Contains(whole.status(), "pid " + std::to_string(child)));
  REQUIRE(Contains(whole.status(), "Reset()"));
  // A new reader cannot take over before the writer reclaimed the old one's blocks.
  auto early = ArenaReader::Attach(path);
  REQUIRE(early.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(Contains(early.status(), "pid " + std::to_string(child) + " died"));

  (*writer)->Reset();
  REQUIRE((*writer)->stats().outstanding_blocks == 0);
  REQUIRE((*writer)->TryAllocate((*writer)->capacity_bytes()).ok());
  REQUIRE(ArenaReader::Attach(path).ok());
}

TEST_CASE("a fork()ed child destroying its inherited copies leaves the segment and the claim alone") {
  TempDir dir("fork-copy");
  ArenaOptions options;
  options.dir = dir.path();
  options.capacity_bytes = 1 << 20;
  absl::StatusOr<std::unique_ptr<ArenaWriter>> writer = ArenaWriter::Create(options);
  REQUIRE(writer.ok());
  const std::string path = (*writer)->arena().path();
  absl::StatusOr<std::unique_ptr<ArenaReader>> reader = ArenaReader::Attach(path);
  REQUIRE(reader.ok());
  // Like a DataLoader worker forked from a process that holds both.
  const pid_t child = ForkChild([&] {
    writer->reset();
    reader->reset();
    return 0;
  });
  REQUIRE(WaitChild(child) == 0);
  REQUIRE(std::filesystem::exists(path));
  REQUIRE((*reader)->CheckWriter().ok());
  REQUIRE((*writer)->reader_state() == ArenaWriter::ReaderState::kAlive);
  REQUIRE((*writer)->reader_pid() == getpid());
}

// Writes a copy of `source` under `name` in `dir` with the header patched by
// `patch`, with `mode`; returns its path.
std::string WriteVariant(const std::string& dir, const std::string& name, const std::vector<char>& source,
                         mode_t mode, const std::function<void(ArenaHeader&)>& patch,
                         size_t extra_bytes = 0) {
  std::vector<char> bytes = source;
  ArenaHeader h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  patch(h);
  std::memcpy(bytes.data(), &h, sizeof(h));
  bytes.resize(bytes.size() + extra_bytes);
  const std::string path = dir + "/" + name;
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  REQUIRE(fchmod(fd, mode) == 0);
  close(fd);
  return path;
}

std::string ArenaName(pid_t pid, uint64_t nonce) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(nonce));
  return "odb-shm-" + std::to_string(geteuid()) + "-" + std::to_string(pid) + "-" + hex;
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

TEST_CASE(
    "a writer killed with SIGKILL: the reader detects it, its segment is stale and swept, foreign files "
    "stay") {
  TempDir dir("stale");
  Pipe to_writer, from_writer;
  const pid_t child = ForkChild([&] {
    to_writer.CloseWrite();
    from_writer.CloseRead();
    ArenaOptions options;
    options.dir = dir.path();
    options.capacity_bytes = 1 << 20;
    absl::StatusOr<std::unique_ptr<ArenaWriter>> writer = ArenaWriter::Create(options);
    if (!writer.ok()) return 10;
    absl::StatusOr<Block> block = (*writer)->TryAllocate(100000);
    if (!block.ok()) return 11;
    FillPattern(block->data, block->length, 77);
    const std::string path = (*writer)->arena().path();
    const Descriptor d{block->offset, block->length, 77};
    const uint64_t path_size = path.size();
    if (!from_writer.Write(&d, sizeof(d)) || !from_writer.Write(&path_size, sizeof(path_size)) ||
        !from_writer.Write(path.data(), path.size())) {
      return 12;
    }
    char never;
    (void)to_writer.Read(&never, 1);  // blocks until killed: no destructor runs, the file stays
    return 0;
  });
  to_writer.CloseRead();
  from_writer.CloseWrite();
  Descriptor d;
  uint64_t path_size = 0;
  REQUIRE(from_writer.Read(&d, sizeof(d)));
  REQUIRE(from_writer.Read(&path_size, sizeof(path_size)));
  std::string path(path_size, '\0');
  REQUIRE(from_writer.Read(path.data(), path_size));

  absl::StatusOr<std::unique_ptr<ArenaReader>> reader = ArenaReader::Attach(path);
  REQUIRE(reader.ok());
  REQUIRE((*reader)->CheckWriter().ok());
  absl::StatusOr<SweepReport> live_sweep = SweepStale(dir.path());
  REQUIRE(live_sweep.ok());
  REQUIRE(live_sweep->removed.empty());
  REQUIRE(live_sweep->kept.size() == 1);
  REQUIRE(live_sweep->kept[0].second.find("in use") != std::string::npos);

  REQUIRE(kill(child, SIGKILL) == 0);
  REQUIRE(WaitChild(child) == 128 + SIGKILL);

  // The reader notices (creator pid) ...
  absl::Status gone = (*reader)->CheckWriter();
  REQUIRE(gone.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(Contains(gone, "pid " + std::to_string(child)));
  REQUIRE(Contains(gone, "no longer running"));
  // ... and what it already holds is still readable until it detaches.
  absl::StatusOr<std::span<std::byte>> view = (*reader)->View(d.offset, d.length);
  REQUIRE(view.ok());
  REQUIRE(FindPatternMismatch(view->data(), view->size(), 77) == -1);

  // A new attach is refused, naming the file and the reason.
  absl::StatusOr<std::unique_ptr<Arena>> stale = Arena::Attach(path);
  REQUIRE(stale.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(Contains(stale.status(), path));
  REQUIRE(Contains(stale.status(), "stale arena: its creator pid " + std::to_string(child)));

  // Foreign files next to it, all with the dead child's pid in an arena-shaped
  // name, so only the ownership checks keep the sweep off them.
  std::vector<char> bytes(std::filesystem::file_size(path));
  {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in.read(bytes.data(), static_cast<std::streamsize>(bytes.size())));
  }
  const uint64_t gen = 0x0123456789abcde0ULL;
  auto same = [](ArenaHeader&) {};
  struct Foreign {
    std::string path;
    absl::StatusCode code;
    std::string reason;
  };
  std::vector<Foreign> foreign;
  auto with_gen = [&](uint64_t g, const std::function<void(ArenaHeader&)>& more) {
    return [g, more](ArenaHeader& h) {
      h.generation = g;
      more(h);
    };
  };
  foreign.push_back(
      {WriteVariant(dir.path(), ArenaName(child, gen + 1), bytes, 0644, with_gen(gen + 1, same)),
       absl::StatusCode::kPermissionDenied, "mode 0644 gives other users access"});
  foreign.push_back({WriteVariant(dir.path(), ArenaName(child, gen + 2), bytes, 0600,
                                  with_gen(gen + 2, [](ArenaHeader& h) { h.magic = 0x4e4f545f4f55525aULL; })),
                     absl::StatusCode::kInvalidArgument, "not an odb arena"});
  foreign.push_back({WriteVariant(dir.path(), ArenaName(child, gen + 3), bytes, 0600,
                                  with_gen(gen + 3, [](ArenaHeader& h) { h.layout_version = 99; })),
                     absl::StatusCode::kInvalidArgument, "layout version 99, this build reads version 1"});
  foreign.push_back(
      {WriteVariant(dir.path(), ArenaName(child, gen + 4), bytes, 0600, with_gen(gen + 4, same), 4096),
       absl::StatusCode::kInvalidArgument, "size mismatch"});
  foreign.push_back({WriteVariant(dir.path(), ArenaName(child, gen + 5), bytes, 0600,
                                  with_gen(gen + 5, [](ArenaHeader& h) { h.creator_uid += 1; })),
                     absl::StatusCode::kPermissionDenied, "created by uid"});
  if (geteuid() == 0) {
    const std::string other =
        WriteVariant(dir.path(), ArenaName(child, gen + 6), bytes, 0600, with_gen(gen + 6, same));
    REQUIRE(chown(other.c_str(), 65534, 65534) == 0);
    foreign.push_back({other, absl::StatusCode::kPermissionDenied, "owned by uid 65534"});
  } else {
    WARN("not root: the other-owner case needs chown");
  }
  for (const Foreign& f : foreign) {
    absl::StatusOr<std::unique_ptr<Arena>> refused = Arena::Attach(f.path);
    INFO(f.path << ": " << refused.status());
    REQUIRE(refused.status().code() == f.code);
    REQUIRE(Contains(refused.status(), f.path));
    REQUIRE(Contains(refused.status(), f.reason));
  }
  // A header that does not match its name, a symlink in an arena's name, and
  // files that are not arena-shaped at all.
  const std::string mismatched = WriteVariant(dir.path(), ArenaName(child, gen + 7), bytes, 0600, same);
  const std::string link = dir.path() + "/" + ArenaName(child, gen + 8);
  REQUIRE(symlink(path.c_str(), link.c_str()) == 0);
  REQUIRE(Arena::Attach(link).status().code() == absl::StatusCode::kPermissionDenied);
  const std::string notes = dir.path() + "/notes.txt";
  std::ofstream(notes) << "not an arena";
  const std::string other_uid_name = dir.path() + "/odb-shm-" + std::to_string(geteuid() + 1) + "-" +
                                     std::to_string(child) + "-" + std::string(16, 'a');
  std::ofstream(other_uid_name) << "";
  // Ours: never initialised (magic 0) by a dead creator, and by a live one.
  const std::string half_dead =
      WriteVariant(dir.path(), ArenaName(child, gen + 9), std::vector<char>(4096, 0), 0600, same);
  const std::string half_live =
      WriteVariant(dir.path(), ArenaName(getpid(), gen + 10), std::vector<char>(4096, 0), 0600, same);

  absl::StatusOr<SweepReport> sweep = SweepStale(dir.path());
  REQUIRE(sweep.ok());
  std::vector<std::string> removed = sweep->removed;
  std::sort(removed.begin(), removed.end());
  std::vector<std::string> expected = {path, half_dead};
  std::sort(expected.begin(), expected.end());
  REQUIRE(removed == expected);
  REQUIRE_FALSE(Exists(path));
  REQUIRE_FALSE(Exists(half_dead));
  for (const Foreign& f : foreign) REQUIRE(Exists(f.path));
  for (const std::string& p : {mismatched, link, notes, other_uid_name, half_live}) REQUIRE(Exists(p));
  // Every arena-shaped file of ours that stayed is reported with its reason.
  REQUIRE(sweep->kept.size() == foreign.size() + 3);  // + mismatched, link, half_live
  for (const auto& [kept_path, why] : sweep->kept) {
    INFO(kept_path << ": " << why);
    REQUIRE_FALSE(why.empty());
    if (kept_path == mismatched) REQUIRE(why.find("does not match its name") != std::string::npos);
    if (kept_path == link) REQUIRE(why == "not a regular file");
    if (kept_path == half_live) REQUIRE(why.find("not initialised yet") != std::string::npos);
  }

  // The reader's mapping outlives the file; then it detaches.
  REQUIRE(FindPatternMismatch(view->data(), view->size(), 77) == -1);
  reader->reset();
  // A second sweep finds nothing more to remove.
  absl::StatusOr<SweepReport> again = SweepStale(dir.path());
  REQUIRE(again.ok());
  REQUIRE(again->removed.empty());
}

}  // namespace
}  // namespace odb::shm
