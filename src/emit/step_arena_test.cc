// The daemon's step arena: a step's frames placed in one block (every tensor
// 64-byte aligned, every byte intact as the reader sees it), the reverse for a
// session that no longer reads the arena, back-pressure that ends in an error
// naming the cause, and the fd socket (the current generation only).
#include "src/emit/step_arena.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "proto/odb.pb.h"
#include "src/shm/arena_reader.h"
#include "src/shm/fd_passing.h"

namespace odb::emit {
namespace {

// A frames step: header + one frame per tensor of the given sizes (uint8, shape [n]).
std::vector<zmq::message_t> FramesStep(const std::vector<size_t>& sizes, uint32_t seed) {
  wire::DaemonMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  m.mutable_step()->set_step_index(seed);
  std::vector<zmq::message_t> parts;
  std::mt19937 rng(seed);
  std::vector<zmq::message_t> frames;
  for (size_t i = 0; i < sizes.size(); ++i) {
    wire::TensorDesc* d = m.mutable_step()->add_tensors();
    d->set_name("t" + std::to_string(i));
    d->set_dtype(wire::UINT8);
    d->add_shape(static_cast<int64_t>(sizes[i]));
    d->set_frame(static_cast<uint32_t>(i + 1));
    zmq::message_t f(sizes[i]);
    for (size_t b = 0; b < sizes[i]; ++b) static_cast<uint8_t*>(f.data())[b] = static_cast<uint8_t>(rng());
    frames.push_back(std::move(f));
  }
  std::string head = m.SerializeAsString();
  parts.emplace_back(head.data(), head.size());
  for (auto& f : frames) parts.push_back(std::move(f));
  return parts;
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

TEST_CASE("a step placed in the arena: one block, aligned tensors, every byte as the reader sees it") {
  auto arena = StepArena::Create(8 << 20);
  REQUIRE(arena.ok());
  auto reader = shm::ArenaReader::AttachFd((*arena)->fd(), {.expected_generation = (*arena)->generation()});
  REQUIRE(reader.ok());
  const std::vector<size_t> sizes = {0, 1, 63, 64, 65, 4096, 100003};
  auto frames = FramesStep(sizes, 7);
  const std::vector<std::string> want = Payloads(frames);
  auto placed = PlaceStepInArena(std::move(frames), **arena, std::chrono::milliseconds(1000), kNever);
  REQUIRE(placed.ok());
  REQUIRE(placed->size() == 1);  // the header alone
  const wire::Step step = Header((*placed)[0]);
  REQUIRE(step.has_arena());
  CHECK(step.arena().generation() == (*arena)->generation());
  auto block = (*reader)->View(step.arena().offset(), step.arena().length());
  REQUIRE(block.ok());
  for (int i = 0; i < step.tensors_size(); ++i) {
    const wire::TensorDesc& d = step.tensors(i);
    CHECK(d.frame() == 0);
    CHECK(d.offset() % 64 == 0);
    CHECK(d.length() == sizes[i]);
    REQUIRE(d.offset() >= step.arena().offset());
    REQUIRE(d.offset() + d.length() <= step.arena().offset() + step.arena().length());
    const std::byte* at = block->data() + (d.offset() - step.arena().offset());
    CHECK(reinterpret_cast<uintptr_t>(at) % 64 == 0);
    CHECK(std::memcmp(at, want[i].data(), want[i].size()) == 0);
  }
  CHECK((*arena)->stats().outstanding_blocks == 1);
  REQUIRE((*reader)->Return(step.arena().offset(), step.arena().length()).ok());
  CHECK((*arena)->stats().outstanding_blocks == 0);
}

TEST_CASE("an idle step stays as it is") {
  auto arena = StepArena::Create(1 << 20);
  REQUIRE(arena.ok());
  auto placed = PlaceStepInArena(FramesStep({}, 1), **arena, std::chrono::milliseconds(100), kNever);
  REQUIRE(placed.ok());
  CHECK_FALSE(Header((*placed)[0]).has_arena());
  CHECK((*arena)->stats().outstanding_blocks == 0);
}

TEST_CASE("a step whose arena the session no longer reads goes back to frames, bytes intact, block freed") {
  auto arena = StepArena::Create(1 << 20);
  REQUIRE(arena.ok());
  auto frames = FramesStep({10, 5000, 0, 777}, 3);
  const std::vector<std::string> want = Payloads(frames);
  auto placed = PlaceStepInArena(std::move(frames), **arena, std::chrono::milliseconds(100), kNever);
  REQUIRE(placed.ok());
  std::vector<zmq::message_t> back = StepToFrames(*placed, **arena);
  REQUIRE(back.size() == 5);
  CHECK(Payloads(back) == want);
  const wire::Step step = Header(back[0]);
  CHECK_FALSE(step.has_arena());
  for (int i = 0; i < step.tensors_size(); ++i) CHECK(step.tensors(i).frame() == static_cast<uint32_t>(i + 1));
  CHECK((*arena)->stats().outstanding_blocks == 0);
}

TEST_CASE("a full arena waits for returns, then fails naming the cause; a step larger than it fails at once") {
  auto arena = StepArena::Create(1 << 20);
  REQUIRE(arena.ok());
  auto reader = shm::ArenaReader::AttachFd((*arena)->fd(), {});
  REQUIRE(reader.ok());
  auto first = PlaceStepInArena(FramesStep({700000}, 1), **arena, std::chrono::milliseconds(100), kNever);
  REQUIRE(first.ok());
  auto second = PlaceStepInArena(FramesStep({700000}, 2), **arena, std::chrono::milliseconds(300), kNever);
  REQUIRE(second.status().code() == absl::StatusCode::kDeadlineExceeded);
  const std::string msg(second.status().message());
  CHECK(msg.find("trainer holds 1 step(s)") != std::string::npos);
  CHECK(msg.find("shm.step_arena_bytes") != std::string::npos);
  // Cancellation is seen while waiting.
  auto cancelled = PlaceStepInArena(FramesStep({700000}, 2), **arena, std::chrono::seconds(60), [] { return true; });
  CHECK(cancelled.status().code() == absl::StatusCode::kCancelled);
  // Once the reader returns the first block, the second fits.
  const wire::Step step = Header((*first)[0]);
  REQUIRE((*reader)->Return(step.arena().offset(), step.arena().length()).ok());
  CHECK(PlaceStepInArena(FramesStep({700000}, 2), **arena, std::chrono::milliseconds(100), kNever).ok());
  auto huge = PlaceStepInArena(FramesStep({2 << 20}, 3), **arena, std::chrono::seconds(60), kNever);
  CHECK(huge.status().code() == absl::StatusCode::kInvalidArgument);
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
    auto arena = StepArena::Create(1 << 20);
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
