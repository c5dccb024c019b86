// The daemon's step arena: a step placed in one block (every tensor
// 64-byte aligned, every byte intact as the reader sees it), the reverse for a
// session that no longer reads the arena, back-pressure that ends in an error
// naming the cause, and the fd socket (the current generation only).
#include "src/emit/step_arena.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <future>
#include <random>

#include "proto/odb.pb.h"
#include "src/shm/arena_reader.h"
#include "src/shm/fd_passing.h"

namespace odb::emit {
namespace {

// A step of uint8 tensors of the given sizes (random bytes) written into a
// block of `arena` as the step builder does: AllocateStepBlock, the bytes at
// the tensors' offsets, EncodeArenaStep. Returns the header message and the
// bytes each tensor should hold.
struct Placed {
  std::vector<zmq::message_t> parts;
  std::vector<std::string> want;
};

absl::StatusOr<Placed> PlaceStep(StepArena& arena, const std::vector<size_t>& sizes, uint32_t seed,
                                 std::chrono::milliseconds wait, const std::function<bool()>& cancelled) {
  std::vector<uint64_t> lengths(sizes.begin(), sizes.end());
  auto where = AllocateStepBlock(arena, lengths, wait, cancelled);
  if (!where.ok()) return where.status();
  std::mt19937 rng(seed);
  Placed out;
  std::vector<collate::BatchTensorLayout> layouts;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::string bytes(sizes[i], '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    if (!bytes.empty()) std::memcpy(arena.At(where->tensor_offsets[i]), bytes.data(), bytes.size());
    out.want.push_back(std::move(bytes));
    layouts.push_back({"t" + std::to_string(i), DType::kUInt8, {static_cast<int64_t>(sizes[i])}, sizes[i]});
  }
  wire::Step step;
  step.set_step_index(seed);
  out.parts = EncodeArenaStep(std::move(step), layouts, *where);
  return out;
}

std::vector<std::string> Payloads(const std::vector<zmq::message_t>& parts) {
  std::vector<std::string> out;
  for (size_t i = 1; i < parts.size(); ++i) out.emplace_back(static_cast<const char*>(parts[i].data()), parts[i].size());
  return out;
}

wire::Step Header(const zmq::message_t& head) {
  wire::DaemonMessage m;
  REQUIRE(m.ParseFromArray(head.data(), static_cast<int>(head.size())));
  return m.step();
}

const auto kNever = [] { return false; };
const SteadyClock kSteady;

TEST_CASE("a step placed in the arena: one block, aligned tensors, every byte as the reader sees it") {
  auto arena = StepArena::Create(8 << 20, kSteady);
  REQUIRE(arena.ok());
  auto reader = shm::ArenaReader::AttachFd((*arena)->fd(), {.expected_generation = (*arena)->generation()});
  REQUIRE(reader.ok());
  const std::vector<size_t> sizes = {0, 1, 63, 64, 65, 4096, 100003};
  auto placed = PlaceStep(**arena, sizes, 7, std::chrono::milliseconds(1000), kNever);
  REQUIRE(placed.ok());
  REQUIRE(placed->parts.size() == 1);  // the header alone
  const wire::Step step = Header(placed->parts[0]);
  REQUIRE(step.has_arena());
  CHECK(step.arena().generation() == (*arena)->generation());
  auto block = (*reader)->View(step.arena().offset(), step.arena().length());
  REQUIRE(block.ok());
  REQUIRE(step.tensors_size() == static_cast<int>(sizes.size()));
  for (int i = 0; i < step.tensors_size(); ++i) {
    const wire::TensorDesc& d = step.tensors(i);
    CHECK(d.frame() == 0);
    CHECK(d.offset() % 64 == 0);
    CHECK(d.length() == sizes[i]);
    REQUIRE(d.offset() >= step.arena().offset());
    REQUIRE(d.offset() + d.length() <= step.arena().offset() + step.arena().length());
    const std::byte* at = block->data() + (d.offset() - step.arena().offset());
    CHECK(reinterpret_cast<uintptr_t>(at) % 64 == 0);
    CHECK(std::memcmp(at, placed->want[i].data(), placed->want[i].size()) == 0);
  }
  CHECK((*arena)->stats().outstanding_blocks == 1);
  REQUIRE((*reader)->Return(step.arena().offset(), step.arena().length()).ok());
  CHECK((*arena)->stats().outstanding_blocks == 0);
}

TEST_CASE("a step whose arena the session no longer reads goes back to frames, bytes intact, block freed") {
  auto arena = StepArena::Create(1 << 20, kSteady);
  REQUIRE(arena.ok());
  auto placed = PlaceStep(**arena, {10, 5000, 0, 777}, 3, std::chrono::milliseconds(100), kNever);
  REQUIRE(placed.ok());
  std::vector<zmq::message_t> back = StepToFrames(placed->parts, **arena);
  REQUIRE(back.size() == 5);
  CHECK(Payloads(back) == placed->want);
  const wire::Step step = Header(back[0]);
  CHECK_FALSE(step.has_arena());
  for (int i = 0; i < step.tensors_size(); ++i) CHECK(step.tensors(i).frame() == static_cast<uint32_t>(i + 1));
  CHECK((*arena)->stats().outstanding_blocks == 0);
}

TEST_CASE("a full arena waits for returns, then fails naming the cause; a step larger than it fails at once") {
  auto arena = StepArena::Create(1 << 20, kSteady);
  REQUIRE(arena.ok());
  auto reader = shm::ArenaReader::AttachFd((*arena)->fd(), {});
  REQUIRE(reader.ok());
  auto first = PlaceStep(**arena, {700000}, 1, std::chrono::milliseconds(100), kNever);
  REQUIRE(first.ok());
  auto second = PlaceStep(**arena, {700000}, 2, std::chrono::milliseconds(300), kNever);
  REQUIRE(second.status().code() == absl::StatusCode::kDeadlineExceeded);
  const std::string msg(second.status().message());
  CHECK(msg.find("trainer holds 1 step(s)") != std::string::npos);
  CHECK(msg.find("shm.step_arena_bytes") != std::string::npos);
  // Cancellation is seen while waiting.
  auto cancelled = PlaceStep(**arena, {700000}, 2, std::chrono::seconds(60), [] { return true; });
  CHECK(cancelled.status().code() == absl::StatusCode::kCancelled);
  // Once the reader returns the first block, the second fits.
  const wire::Step step = Header(first->parts[0]);
  REQUIRE((*reader)->Return(step.arena().offset(), step.arena().length()).ok());
  CHECK(PlaceStep(**arena, {700000}, 2, std::chrono::milliseconds(100), kNever).ok());
  auto huge = PlaceStep(**arena, {2 << 20}, 3, std::chrono::seconds(60), kNever);
  CHECK(huge.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a full arena's wait (shm.step_arena_wait_ms) is on the injected clock") {
  FakeClock clock;
  auto arena = StepArena::Create(1 << 20, clock);
  REQUIRE(arena.ok());
  auto reader = shm::ArenaReader::AttachFd((*arena)->fd(), {});
  REQUIRE(reader.ok());
  REQUIRE(PlaceStep(**arena, {700000}, 1, std::chrono::milliseconds(100), kNever).ok());
  // An hour of the fake clock: only its advance can end the wait (on the real
  // clock the planner would still be waiting when the check below gives up).
  const auto wait = std::chrono::hours(1);
  std::atomic<bool> stop{false};
  auto planner = std::async(std::launch::async, [&] {
    return PlaceStep(**arena, {700000}, 2, wait, [&] { return stop.load(); }).status();
  });
  struct StopOnExit {  // a failed check must not leave the planner waiting an hour
    std::atomic<bool>& stop;
    ~StopOnExit() { stop = true; }
  } stop_on_exit{stop};
  // The planner reads the clock when it starts waiting: advance until it has
  // seen an hour pass (it looks again at least every kWaitSlice).
  const auto real_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (planner.wait_for(StepArena::kWaitSlice * 2) != std::future_status::ready &&
         std::chrono::steady_clock::now() < real_deadline) {
    clock.Advance(std::chrono::duration_cast<std::chrono::milliseconds>(wait));
  }
  REQUIRE(planner.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
  const absl::Status status = planner.get();
  CHECK(status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(status.message()).find("3600000 ms (shm.step_arena_wait_ms)") != std::string::npos);
}

// Asks the server for `generation`: the fd, or the refusal text.
std::pair<int, std::string> Fetch(const std::string& path, const std::string& generation) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  shm::UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  REQUIRE(::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::send(sock.get(), generation.data(), generation.size(), 0) == static_cast<ssize_t>(generation.size()));
  auto got = shm::RecvFds(sock.get());
  REQUIRE(got.ok());
  if (got->fds.empty()) return {-1, got->payload};
  return {got->fds[0].release(), got->payload};
}

TEST_CASE("the fd socket hands out the current session's arena only") {
  char dir[] = "/tmp/odb-step-arena-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string path = StepArenaSocketPath(std::string(dir) + "/out.sock");
  {
    StepArenaServer server;
    REQUIRE(server.Listen(path).ok());
    server.Start();
    auto arena = StepArena::Create(1 << 20, kSteady);
    REQUIRE(arena.ok());
    const std::string gen = std::to_string((*arena)->generation());
    auto [none, why] = Fetch(path, gen);
    CHECK(none == -1);
    CHECK(why.find("no step arena of generation " + gen) != std::string::npos);
    server.Publish(*arena);
    auto [fd, empty] = Fetch(path, gen);
    REQUIRE(fd >= 0);
    auto reader = shm::ArenaReader::AttachFd(fd, {.expected_generation = (*arena)->generation()});
    CHECK(reader.ok());
    ::close(fd);
    auto [stale, why2] = Fetch(path, "12345");
    CHECK(stale == -1);
    CHECK(why2.find("generation 12345") != std::string::npos);
  }
  CHECK(::access(path.c_str(), F_OK) != 0);  // the socket file goes with the server
  ::rmdir(dir);
}

}  // namespace
}  // namespace odb::emit
