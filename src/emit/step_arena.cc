#include "src/emit/step_arena.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "proto/odb.pb.h"
#include "src/shm/fd_passing.h"
#include "src/wire/tensor_codec.h"

namespace odb::emit {
namespace {

constexpr uint64_t kAlign = wire::kArenaTensorAlignment;
// A trainer that connects to the fd socket and says nothing is dropped after this.
constexpr int kRequestTimeoutMs = 2000;

uint64_t RoundUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string Errno(int e) { return std::strerror(e); }

}  // namespace

StepArena::StepArena(std::unique_ptr<shm::ArenaWriter> writer, const Clock& clock)
    : writer_(std::move(writer)),
      clock_(clock),
      generation_(writer_->arena().generation()),
      capacity_(writer_->capacity_bytes()),
      fd_(writer_->arena().fd()),
      base_(writer_->arena().base()) {}

absl::StatusOr<std::shared_ptr<StepArena>> StepArena::Create(uint64_t capacity_bytes, const Clock& clock) {
  shm::ArenaOptions o;
  o.dir = "";  // a sealed memfd: nothing in the file system to leave behind if the daemon dies
  o.capacity_bytes = capacity_bytes;
  o.reserve = false;  // pages are allocated as steps are first written into them
  o.max_blocks = 4096;
  o.memfd_name = "odb-step-arena";
  auto writer = shm::ArenaWriter::Create(o);
  if (!writer.ok()) return writer.status();
  return std::shared_ptr<StepArena>(new StepArena(std::move(*writer), clock));
}

absl::StatusOr<shm::Block> StepArena::Allocate(uint64_t length, std::chrono::milliseconds wait,
                                               const std::function<bool()>& cancelled) {
  const Clock::TimePoint deadline = clock_.Now() + wait;
  while (true) {
    {
      MutexLock lock(mu_);
      absl::StatusOr<shm::Block> block = writer_->Allocate(length, absl::FromChrono(kWaitSlice));
      if (block.ok() || block.status().code() != absl::StatusCode::kDeadlineExceeded) return block;
      if (clock_.Now() >= deadline) {
        const shm::ArenaWriter::Stats s = writer_->stats();
        return absl::DeadlineExceededError(
            "the step arena (" + std::to_string(capacity_) + " bytes) has had no room for a step of " +
            std::to_string(length) + " bytes for " + std::to_string(wait.count()) +
            " ms (shm.step_arena_wait_ms): the trainer holds " + std::to_string(s.outstanding_blocks) +
            " step(s), " + std::to_string(s.outstanding_bytes) +
            " bytes, of it (a step's block returns when every tensor of the step is released: does the "
            "training loop keep batches alive?); raise shm.step_arena_bytes or use "
            "shm.trainer_data_plane: zmq");
      }
    }
    if (cancelled && cancelled()) return absl::CancelledError("the daemon is stopping");
  }
}

void StepArena::Free(const shm::Block& block) {
  MutexLock lock(mu_);
  (void)writer_->Free(block);  // a block of an arena that was Reset is simply gone
}

StepArena::Stats StepArena::stats() const {
  // Gauges only: never wait behind the planner's Allocate (it sleeps under mu_).
  if (!mu_.try_lock()) {
    MutexLock last(stats_mu_);
    return last_stats_;
  }
  writer_->Reclaim();
  const shm::ArenaWriter::Stats s = writer_->stats();
  mu_.unlock();
  MutexLock last(stats_mu_);
  last_stats_ = {s.outstanding_blocks, s.outstanding_bytes, s.returns};
  return last_stats_;
}

absl::StatusOr<ArenaPlacement> AllocateStepBlock(StepArena& arena, const std::vector<uint64_t>& sizes,
                                                 std::chrono::milliseconds wait,
                                                 const std::function<bool()>& cancelled) {
  ArenaPlacement where;
  where.tensor_offsets.reserve(sizes.size());
  uint64_t cursor = 0;
  for (uint64_t size : sizes) {
    where.tensor_offsets.push_back(cursor);
    cursor = RoundUp(cursor + size);
  }
  absl::StatusOr<shm::Block> block = arena.Allocate(std::max<uint64_t>(cursor, 1), wait, cancelled);
  if (!block.ok()) return block.status();
  for (uint64_t& offset : where.tensor_offsets) offset += block->offset;
  where.generation = arena.generation();
  where.block_offset = block->offset;
  where.block_length = block->length;
  return where;
}

std::vector<zmq::message_t> StepToFrames(const std::vector<zmq::message_t>& parts, StepArena& arena) {
  wire::DaemonMessage message;
  std::vector<zmq::message_t> out;
  if (parts.size() != 1 || !message.ParseFromArray(parts[0].data(), static_cast<int>(parts[0].size())) ||
      !message.has_step() || !message.step().has_arena()) {
    for (const auto& p : parts) out.emplace_back(p.data(), p.size());
    return out;
  }
  wire::Step& step = *message.mutable_step();
  std::vector<zmq::message_t> frames;
  for (int i = 0; i < step.tensors_size(); ++i) {
    wire::TensorDesc& d = *step.mutable_tensors(i);
    frames.emplace_back(arena.At(d.offset()), d.length());  // written by this daemon: trusted bounds
    d.set_frame(static_cast<uint32_t>(i + 1));
    d.set_offset(0);
    d.set_length(0);
  }
  arena.Free(shm::Block{step.arena().offset(), step.arena().length(), arena.At(step.arena().offset())});
  step.clear_arena();
  std::string bytes = message.SerializeAsString();
  out.emplace_back(bytes.data(), bytes.size());
  for (auto& f : frames) out.push_back(std::move(f));
  return out;
}

std::string StepArenaSocketPath(const std::string& trainer_socket_path) { return trainer_socket_path + ".steps"; }

StepArenaServer::~StepArenaServer() {
  Stop();
  if (!path_.empty()) ::unlink(path_.c_str());
}

absl::Status StepArenaServer::Listen(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError("step arena socket '" + path + "' is longer than the " +
                                      std::to_string(sizeof(addr.sun_path) - 1) +
                                      " bytes a Unix socket allows; use a shorter run_dir");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  shm::UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::InternalError("step arena socket: socket(): " + Errno(errno));
  ::unlink(path.c_str());  // left by a daemon that died (the caller holds the endpoint lock)
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError("cannot bind the step arena socket " + path + ": " + Errno(errno));
  }
  ::chmod(path.c_str(), 0600);  // the job's user only; SO_PEERCRED is the check
  if (::listen(fd.get(), 16) != 0) {
    return absl::UnavailableError("cannot listen on the step arena socket " + path + ": " + Errno(errno));
  }
  listener_ = std::move(fd);
  path_ = path;
  return absl::OkStatus();
}

void StepArenaServer::Start() {
  if (thread_.running() || !listener_.valid()) return;
  if (!thread_.Start([this] { Serve(); })) {
    spdlog::error("step arena socket: pipe2: {}; steps go as frames", Errno(errno));
    listener_.reset();
  }
}

void StepArenaServer::Stop() { thread_.Stop(); }

void StepArenaServer::Publish(std::shared_ptr<StepArena> arena) {
  MutexLock lock(mu_);
  current_ = std::move(arena);
}

void StepArenaServer::Serve() {
  while (!thread_.stopping()) {
    pollfd fds[2] = {{thread_.wake_fd(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("step arena socket: poll: {}; no more step arenas are handed out", Errno(errno));
      return;
    }
    if (fds[0].revents != 0) continue;  // stopping() is checked above
    shm::UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) continue;
    Answer(conn.get());
  }
}

absl::StatusOr<uint64_t> ParseStepArenaRequest(std::string_view request) {
  uint64_t value = 0;
  bool ok = !request.empty() && request.size() <= 20 && (request[0] != '0' || request.size() == 1);
  for (size_t i = 0; ok && i < request.size(); ++i) {
    const char c = request[i];
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    ok = c >= '0' && c <= '9' && value <= (UINT64_MAX - digit) / 10;
    if (ok) value = value * 10 + digit;
  }
  if (ok) return value;
  std::string shown;
  for (size_t i = 0; i < request.size() && i < 64; ++i) {
    const unsigned char c = static_cast<unsigned char>(request[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      shown += static_cast<char>(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      shown += std::string("\\x") + kHex[c >> 4] + kHex[c & 15];
    }
  }
  if (request.size() > 64) shown += "...";
  return absl::InvalidArgumentError("malformed step arena request \"" + shown + "\" (" +
                                    std::to_string(request.size()) +
                                    " bytes): expected the arena's generation in decimal");
}

void StepArenaServer::Answer(int conn) {
  // One trainer at a time, and a request is a few bytes: a bounded wait for it.
  pollfd p{conn, POLLIN, 0};
  if (::poll(&p, 1, kRequestTimeoutMs) <= 0) return;
  char buf[64];
  const ssize_t n = ::recv(conn, buf, sizeof(buf) - 1, MSG_DONTWAIT);
  if (n <= 0) return;
  buf[n] = '\0';
  auto refuse = [&](const std::string& why) {
    spdlog::warn("step arena request refused: {}", why);
    (void)!::send(conn, why.data(), why.size(), MSG_NOSIGNAL);
  };
  absl::StatusOr<shm::PeerCredentials> peer = shm::GetPeerCredentials(conn);
  if (!peer.ok() || peer->uid != ::getuid()) {
    refuse("the step arena is only for processes of uid " + std::to_string(::getuid()));
    return;
  }
  absl::StatusOr<uint64_t> requested = ParseStepArenaRequest(std::string_view(buf, static_cast<size_t>(n)));
  if (!requested.ok()) {
    refuse(std::string(requested.status().message()));
    return;
  }
  const uint64_t generation = *requested;
  std::shared_ptr<StepArena> arena;
  {
    MutexLock lock(mu_);
    arena = current_;
  }
  if (arena == nullptr || arena->generation() != generation) {
    refuse("no step arena of generation " + std::to_string(generation) +
           " (the daemon offers each trainer session its own; a newer session replaced this one?)");
    return;
  }
  if (absl::Status s = shm::SendFd(conn, arena->fd(), ""); !s.ok()) {
    spdlog::warn("step arena: sending the fd to pid {} failed: {}", peer->pid, std::string(s.message()));
  }
}

}  // namespace odb::emit
