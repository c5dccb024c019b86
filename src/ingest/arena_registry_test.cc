// The daemon's side of producer arenas: registration over a real UNIX socket,
// block validation (every kind of crafted descriptor), returns, and a producer
// process that dies while the daemon holds its blocks. Processes are fork()ed
// before any thread starts and synchronised through pipes: no sleeps. The
// registry's timers run on a fake clock: a test advances it and polls for the
// outcome (with a deadline) instead of waiting out a timeout.
#include "src/ingest/arena_registry.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "src/shm/arena_writer.h"
#include "src/shm/fd_passing.h"
#include "src/shm/test_util.h"

namespace odb::ingest {
namespace {

using shm::testing::FillPattern;
using shm::testing::FindPatternMismatch;
using shm::testing::ForkChild;
using shm::testing::Pipe;
using shm::testing::WaitChild;

// A short directory for sockets ($TEST_TMPDIR paths can be longer than the
// 107 bytes of a Unix socket path), removed with its contents.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    std::string pattern = "/tmp/odb-" + tag.substr(0, 8) + "-XXXXXX";
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

shm::ArenaOptions Options1MiB() {
  shm::ArenaOptions o;
  o.capacity_bytes = 1 << 20;
  o.reserve = false;
  return o;
}

std::unique_ptr<shm::ArenaWriter> MakeWriter() {
  auto w = shm::ArenaWriter::Create(Options1MiB());
  REQUIRE(w.ok());
  return std::move(*w);
}

// What a producer does (client/cpp/src/producer.cc): connect, send the
// registration with the fd, read the answer.
wire::ArenaRegistered RegisterOver(const std::string& path, const std::string& payload, int fd) {
  shm::UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  wire::ArenaRegistered answer;
  if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    answer.set_error("connect failed");
    return answer;
  }
  absl::Status sent = fd >= 0 ? shm::SendFd(sock.get(), fd, payload)
                              : shm::SendFds(sock.get(), std::span<const int>(), payload);
  if (!sent.ok()) {
    answer.set_error("send failed");
    return answer;
  }
  char buffer[4096];
  const ssize_t n = ::recv(sock.get(), buffer, sizeof(buffer), 0);
  if (n <= 0 || !answer.ParseFromArray(buffer, static_cast<int>(n))) answer.set_error("no answer");
  return answer;
}

std::string Request(const std::string& producer, const shm::ArenaWriter& w, uint64_t generation = 0) {
  wire::ArenaRegister r;
  r.set_version(wire::PROTOCOL_VERSION_CURRENT);
  r.set_producer_id(producer);
  r.set_generation(generation != 0 ? generation : w.arena().generation());
  r.set_capacity_bytes(w.capacity_bytes());
  return r.SerializeAsString();
}

wire::ArenaBlock Block(uint64_t arena, uint64_t offset, uint64_t length) {
  wire::ArenaBlock b;
  b.set_arena_id(arena);
  b.set_offset(offset);
  b.set_length(length);
  return b;
}

// The registry on a fake clock that moves only when a test advances it: no
// timer fires on its own.
struct Served {
  TempDir dir{"arena-registry"};
  std::string path = dir.path() + "/odb-0-in.sock.arena";
  FakeClock clock;
  ArenaRegistry registry;

  explicit Served(ArenaRegistry::Options options = {}) : registry(options, clock) {
    absl::Status listening = registry.Listen(path);
    INFO(listening.message());
    REQUIRE(listening.ok());
    registry.Start();
  }
};

TEST_CASE("a registered arena's blocks are read in place and returned when released") {
  Served s;
  auto writer = MakeWriter();
  wire::ArenaRegistered answer = RegisterOver(s.path, Request("p0", *writer), writer->arena().fd());
  INFO(answer.error());
  REQUIRE(answer.arena_id() > 0);
  CHECK(s.registry.stats().arenas == 1);

  auto block = writer->TryAllocate(5000);
  REQUIRE(block.ok());
  FillPattern(block->data, block->length, 7);
  auto got = s.registry.Acquire("p0", Block(answer.arena_id(), block->offset, block->length));
  REQUIRE(got.ok());
  CHECK(FindPatternMismatch(reinterpret_cast<const std::byte*>(got->data), block->length, 7) == -1);
  CHECK(s.registry.stats().held_blocks == 1);
  CHECK(s.registry.stats().held_bytes == 5000);

  got->holder.reset();  // the sample is gone: the block goes back
  CHECK(s.registry.stats().held_blocks == 0);
  CHECK(writer->Reclaim() == 1);
  CHECK(writer->stats().outstanding_blocks == 0);
}

TEST_CASE("once the daemon holds half of a producer's arena, the arena counts as filling (a round is due)") {
  Served s;
  auto writer = MakeWriter();  // 1 MiB
  wire::ArenaRegistered answer = RegisterOver(s.path, Request("p0", *writer), writer->arena().fd());
  REQUIRE(answer.arena_id() > 0);
  CHECK_FALSE(s.registry.AnyArenaFilling());
  std::vector<ArenaBlockSource::Acquired> held;
  for (int i = 0; i < 4; ++i) {  // 4 x 120 KiB: under half
    auto block = writer->TryAllocate(120 << 10);
    REQUIRE(block.ok());
    auto got = s.registry.Acquire("p0", Block(answer.arena_id(), block->offset, block->length));
    REQUIRE(got.ok());
    held.push_back(std::move(*got));
  }
  CHECK_FALSE(s.registry.AnyArenaFilling());
  auto block = writer->TryAllocate(40 << 10);  // 520 KiB held: half of the arena
  REQUIRE(block.ok());
  auto got = s.registry.Acquire("p0", Block(answer.arena_id(), block->offset, block->length));
  REQUIRE(got.ok());
  held.push_back(std::move(*got));
  CHECK(s.registry.AnyArenaFilling());
  held.front().holder.reset();  // a sample collated: its block goes back, under half again
  CHECK_FALSE(s.registry.AnyArenaFilling());
}

TEST_CASE("crafted descriptors are refused with the reason and never read out of bounds") {
  Served s;
  auto writer = MakeWriter();
  const uint64_t id = RegisterOver(s.path, Request("p0", *writer), writer->arena().fd()).arena_id();
  REQUIRE(id > 0);
  const uint64_t data = writer->arena().data_offset();
  const uint64_t end = writer->arena().total_bytes();

  SECTION("an arena nobody registered") {
    auto r = s.registry.Acquire("p0", Block(id + 100, data, 64));
    REQUIRE_FALSE(r.ok());
    CHECK(Contains(r.status(), "arena " + std::to_string(id + 100) + " is not registered"));
  }
  SECTION("another producer's arena") {
    auto r = s.registry.Acquire("intruder", Block(id, data, 64));
    REQUIRE_FALSE(r.ok());
    CHECK(Contains(r.status(), "registered by producer 'p0', not by this connection's producer 'intruder'"));
    CHECK_FALSE(s.registry.Acquire("", Block(id, data, 64)).ok());  // a connection without hello
  }
  SECTION("a block overlapping the header or the completion queue") {
    auto r = s.registry.Acquire("p0", Block(id, 0, 64));
    REQUIRE_FALSE(r.ok());
    CHECK(Contains(r.status(), "outside the data region"));
    CHECK_FALSE(s.registry.Acquire("p0", Block(id, data - 64, 128)).ok());
  }
  SECTION("out of range, and lengths that overflow") {
    CHECK_FALSE(s.registry.Acquire("p0", Block(id, end, 64)).ok());
    CHECK_FALSE(s.registry.Acquire("p0", Block(id, end - 64, 128)).ok());
    CHECK_FALSE(s.registry.Acquire("p0", Block(id, data, ~uint64_t{0})).ok());
    CHECK_FALSE(s.registry.Acquire("p0", Block(id, ~uint64_t{0} - 63, 64)).ok());
    CHECK(s.registry.Acquire("p0", Block(id, end - 64, 64)).ok());  // the last unit is fine
  }
  SECTION("misaligned") {
    auto r = s.registry.Acquire("p0", Block(id, data + 8, 64));
    REQUIRE_FALSE(r.ok());
    CHECK(Contains(r.status(), "64-byte aligned"));
  }
  SECTION("a block the daemon still holds, or one overlapping it") {
    auto first = s.registry.Acquire("p0", Block(id, data + 128, 100));  // footprint [data+128, data+256)
    REQUIRE(first.ok());
    auto twice = s.registry.Acquire("p0", Block(id, data + 128, 100));
    REQUIRE_FALSE(twice.ok());
    CHECK(Contains(twice.status(), "that the daemon still holds"));
    CHECK_FALSE(s.registry.Acquire("p0", Block(id, data + 192, 64)).ok());  // inside its footprint
    CHECK_FALSE(s.registry.Acquire("p0", Block(id, data + 64, 100)).ok());  // runs into it
    auto next = s.registry.Acquire("p0", Block(id, data + 256, 64));        // right after it
    CHECK(next.ok());
    first->holder.reset();
    CHECK(s.registry.Acquire("p0", Block(id, data + 128, 100)).ok());  // free again once released
  }
  CHECK(s.registry.stats().arenas == 1);  // nothing of the above unregistered it
}

TEST_CASE("registrations that cannot be mapped safely are refused, naming why") {
  Served s;
  auto writer = MakeWriter();
  SECTION("a regular file instead of a sealed memfd") {
    const std::string file = s.dir.path() + "/plain";
    shm::UniqueFd fd(::open(file.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600));
    REQUIRE(::ftruncate(fd.get(), 1 << 20) == 0);
    auto a = RegisterOver(s.path, Request("p0", *writer), fd.get());
    CHECK(a.arena_id() == 0);
    CHECK_THAT(a.error(), Catch::Contains("not a memfd sealed against shrinking"));
    CHECK(s.registry.stats().refused == 1);
    CHECK(s.registry.stats().arenas == 0);
  }
  SECTION("a generation other than the arena's") {
    auto a = RegisterOver(s.path, Request("p0", *writer, writer->arena().generation() ^ 1), writer->arena().fd());
    CHECK(a.arena_id() == 0);
    CHECK_THAT(a.error(), Catch::Contains("generation"));
  }
  SECTION("no descriptor, or an unreadable request") {
    auto a = RegisterOver(s.path, Request("p0", *writer), -1);
    CHECK(a.arena_id() == 0);
    CHECK_THAT(a.error(), Catch::Contains("exactly one"));
    auto b = RegisterOver(s.path, std::string("\xff\xff\xff", 3), writer->arena().fd());
    CHECK(b.arena_id() == 0);
    CHECK_THAT(b.error(), Catch::Contains("not an ArenaRegister"));
  }
  SECTION("a registration over the size limit is answered, naming the limit") {
    std::string big = Request("p0", *writer);
    big.append(8000, '\0');  // still one datagram, over 4096 bytes
    auto a = RegisterOver(s.path, big, writer->arena().fd());
    CHECK(a.arena_id() == 0);
    CHECK_THAT(a.error(), Catch::Contains("longer than 4096 bytes"));
    CHECK(s.registry.stats().refused == 1);
  }
  SECTION("the same arena twice (one reader per arena)") {
    CHECK(RegisterOver(s.path, Request("p0", *writer), writer->arena().fd()).arena_id() > 0);
    auto again = RegisterOver(s.path, Request("p0", *writer), writer->arena().fd());
    CHECK(again.arena_id() == 0);
    CHECK_THAT(again.error(), Catch::Contains("already reads the arena"));
  }
  SECTION("over the limit") {
    ArenaRegistry::Options one;
    one.max_arenas = 1;
    Served small(one);
    auto other = MakeWriter();
    CHECK(RegisterOver(small.path, Request("p0", *writer), writer->arena().fd()).arena_id() > 0);
    auto a = RegisterOver(small.path, Request("p1", *other), other->arena().fd());
    CHECK(a.arena_id() == 0);
    CHECK_THAT(a.error(), Catch::Contains("shm.max_arenas"));
    CHECK(small.registry.stats().refused == 1);
  }
}

TEST_CASE("a registration that leaves out its arena's generation or capacity is refused") {
  Served served;
  auto w = MakeWriter();
  for (const auto& [generation, capacity] : {std::pair<uint64_t, uint64_t>{0, w->capacity_bytes()},
                                             std::pair<uint64_t, uint64_t>{w->arena().generation(), 0}}) {
    wire::ArenaRegister r;
    r.set_version(wire::PROTOCOL_VERSION_CURRENT);
    r.set_producer_id("p0");
    r.set_generation(generation);
    r.set_capacity_bytes(capacity);
    wire::ArenaRegistered a = RegisterOver(served.path, r.SerializeAsString(), w->arena().fd());
    CHECK(a.arena_id() == 0);
    CHECK_THAT(a.error(), Catch::Contains("both must be the arena's own (non-zero)"));
  }
  CHECK(served.registry.stats().arenas == 0);
}

TEST_CASE("an arena created by another process than the one registering it is refused") {
  TempDir dir("arena-registry");
  const std::string path = dir.path() + "/in.sock.arena";
  FakeClock clock;
  ArenaRegistry registry({}, clock);
  REQUIRE(registry.Listen(path).ok());
  // The child creates an arena and hands its fd to us; we register it as ours.
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  Pipe done;
  const pid_t child = ForkChild([&] {
    auto w = shm::ArenaWriter::Create(Options1MiB());
    if (!w.ok()) return 1;
    const std::string announced =
        std::to_string((*w)->arena().generation()) + " " + std::to_string((*w)->capacity_bytes());
    if (!shm::SendFd(sv[1], (*w)->arena().fd(), announced).ok()) return 2;
    char byte;
    done.Read(&byte, 1);
    return 0;
  });
  registry.Start();
  std::string generation;
  auto fd = shm::RecvFd(sv[0], &generation);
  REQUIRE(fd.ok());
  wire::ArenaRegister r;
  r.set_version(wire::PROTOCOL_VERSION_CURRENT);
  r.set_producer_id("p0");
  const size_t space = generation.find(' ');
  REQUIRE(space != std::string::npos);
  r.set_generation(std::stoull(generation.substr(0, space)));
  r.set_capacity_bytes(std::stoull(generation.substr(space + 1)));
  auto a = RegisterOver(path, r.SerializeAsString(), fd->get());
  CHECK(a.arena_id() == 0);
  CHECK_THAT(a.error(), Catch::Contains("not by the registering process"));
  const char byte = 1;
  done.Write(&byte, 1);
  CHECK(WaitChild(child) == 0);
  ::close(sv[0]), ::close(sv[1]);
}

TEST_CASE("a producer that dies: its held block stays readable, then the arena is retired and unmapped") {
  TempDir dir("arena-registry");
  const std::string path = dir.path() + "/in.sock.arena";
  ArenaRegistry::Options options;
  options.retire_after = std::chrono::milliseconds(0);
  FakeClock clock;  // never advanced: only the call below retires (the thread's check never comes due)
  ArenaRegistry registry(options, clock);
  REQUIRE(registry.Listen(path).ok());
  struct Sent {
    uint64_t arena_id, offset, length;
  };
  Pipe sent, die;
  // Forked before the registry's thread starts; the child's connect waits in
  // the listen backlog until it does.
  const pid_t child = ForkChild([&] {
    auto w = shm::ArenaWriter::Create(Options1MiB());
    if (!w.ok()) return 1;
    wire::ArenaRegistered a = RegisterOver(path, Request("dying", **w), (*w)->arena().fd());
    if (a.arena_id() == 0) return 2;
    auto b = (*w)->TryAllocate(300000);
    if (!b.ok()) return 3;
    FillPattern(b->data, b->length, 42);
    Sent m{a.arena_id(), b->offset, b->length};
    sent.Write(&m, sizeof(m));
    char byte;
    die.Read(&byte, 1);
    _exit(0);  // like SIGKILL: no destructor closes the arena
  });
  registry.Start();
  Sent m{};
  REQUIRE(sent.Read(&m, sizeof(m)));
  auto held = registry.Acquire("dying", Block(m.arena_id, m.offset, m.length));
  REQUIRE(held.ok());
  const char byte = 1;
  die.Write(&byte, 1);
  REQUIRE(WaitChild(child) == 0);

  registry.RetireGone();
  CHECK(registry.stats().arenas == 0);  // no new samples resolve against it
  CHECK_FALSE(registry.Acquire("dying", Block(m.arena_id, m.offset + 327680, 64)).ok());
  CHECK(registry.stats().mapped == 1);  // but the buffered sample's bytes are still there
  CHECK(FindPatternMismatch(reinterpret_cast<const std::byte*>(held->data), m.length, 42) == -1);
  held->holder.reset();
  CHECK(registry.stats().mapped == 0);  // detached with its last block
  CHECK(registry.stats().held_blocks == 0);
}

// Connects to the registration socket and sends nothing.
shm::UniqueFd ConnectSilently(const std::string& path) {
  shm::UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  REQUIRE(::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0);
  return sock;
}

// Whether the registry closed `sock` within `wait` (it reads end of file).
bool ClosedWithin(int sock, std::chrono::milliseconds wait) {
  pollfd p{sock, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
  char byte;
  return ::recv(sock, &byte, 1, MSG_DONTWAIT) == 0;
}

TEST_CASE("a silent registration connection is dropped after client_timeout of the injected clock") {
  ArenaRegistry::Options options;
  options.client_timeout = std::chrono::hours(1);  // only the fake clock's advance can end it
  Served s(options);
  shm::UniqueFd sock = ConnectSilently(s.path);
  // The clock has not moved: the connection stays, however often the thread looks.
  CHECK_FALSE(ClosedWithin(sock.get(), ArenaRegistry::kRetireCheckEvery * 2));
  // The thread reads the clock at least every kRetireCheckEvery: advance until
  // it has seen an hour pass since it accepted the connection.
  bool closed = false;
  const auto real_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!closed && std::chrono::steady_clock::now() < real_deadline) {
    s.clock.Advance(options.client_timeout);
    closed = ClosedWithin(sock.get(), ArenaRegistry::kRetireCheckEvery * 2);
  }
  CHECK(closed);
  // The registry still serves.
  auto writer = MakeWriter();
  CHECK(RegisterOver(s.path, Request("p0", *writer), writer->arena().fd()).arena_id() > 0);
}

// 100 silent connections made a producer's valid registration fail (the
// newest connection was turned away while the silent ones held every slot
// until client_timeout); the producer fell back to the socket (issue 31).
TEST_CASE("a flood of silent registration connections does not lock a valid producer out") {
  ArenaRegistry::Options options;
  options.client_timeout = std::chrono::hours(1);  // the silent ones never time out here
  Served s(options);
  std::vector<shm::UniqueFd> silent;
  for (int i = 0; i < 100; ++i) silent.push_back(ConnectSilently(s.path));
  auto writer = MakeWriter();
  const wire::ArenaRegistered answer = RegisterOver(s.path, Request("p0", *writer), writer->arena().fd());
  INFO(answer.error());
  CHECK(answer.arena_id() > 0);
  CHECK(s.registry.stats().refused >= 100 - 64);  // the oldest silent ones gave way, counted
}

TEST_CASE("an arena whose producer died is retired after retire_after of the injected clock") {
  TempDir dir("arena-registry");
  const std::string path = dir.path() + "/in.sock.arena";
  ArenaRegistry::Options options;
  options.retire_after = std::chrono::hours(1);  // only the fake clock's advance can end it
  FakeClock clock;
  ArenaRegistry registry(options, clock);
  REQUIRE(registry.Listen(path).ok());
  Pipe registered;
  // Forked before the registry's thread starts (its connect waits in the backlog).
  const pid_t child = ForkChild([&] {
    auto w = shm::ArenaWriter::Create(Options1MiB());
    if (!w.ok()) return 1;
    wire::ArenaRegistered a = RegisterOver(path, Request("short-lived", **w), (*w)->arena().fd());
    if (a.arena_id() == 0) return 2;
    const char byte = 1;
    registered.Write(&byte, 1);
    _exit(0);  // like SIGKILL: no destructor closes the arena
  });
  registry.Start();
  char byte;
  REQUIRE(registered.Read(&byte, 1));
  REQUIRE(WaitChild(child) == 0);
  // The registry's thread notes the writer gone at its first look after an
  // advance and retires the arena once an hour more has passed: with half-hour
  // steps, three advances at the least (the thread may see an advance late,
  // never early).
  const auto step = std::chrono::minutes(30);
  int advances = 0;
  const auto real_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (registry.stats().arenas != 0 && std::chrono::steady_clock::now() < real_deadline) {
    clock.Advance(step);
    ++advances;
    // Poll the condition for two of the thread's looks.
    const auto look = std::chrono::steady_clock::now() + ArenaRegistry::kRetireCheckEvery * 2;
    while (registry.stats().arenas != 0 && std::chrono::steady_clock::now() < look) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  CHECK(registry.stats().arenas == 0);
  CHECK(advances >= 3);
}

}  // namespace
}  // namespace odb::ingest
