#include "src/ingest/arena_registry.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>

#include "src/shm/arena_reader.h"
#include "src/shm/fd_passing.h"

namespace odb::ingest {
namespace {

// Whether `pid` (as this process sees it) runs in this process's PID
// namespace; true when that cannot be read (the message then says less).
bool SamePidNamespace(pid_t pid) {
  char mine[64] = {}, theirs[64] = {};
  const std::string path = "/proc/" + std::to_string(pid) + "/ns/pid";
  if (::readlink("/proc/self/ns/pid", mine, sizeof(mine) - 1) <= 0) return true;
  if (::readlink(path.c_str(), theirs, sizeof(theirs) - 1) <= 0) return true;
  return std::string(mine) == std::string(theirs);
}

constexpr size_t kMaxPendingClients = 64;
constexpr size_t kMaxRegisterBytes = 4096;

std::string Errno(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

// Blocks occupy whole 64-byte units, at least one (shm::SlotAllocator).
uint64_t Footprint(uint64_t length) {
  const uint64_t units = length == 0 ? 1 : (length + shm::kBlockAlignment - 1) / shm::kBlockAlignment;
  return units * shm::kBlockAlignment;
}

}  // namespace

std::string ArenaSocketPath(const std::string& ingest_socket_path) { return ingest_socket_path + ".arena"; }

// One registered arena: its reader (the mapping) and the blocks the daemon
// holds. Shared by the registry and every BlockHolder of its blocks, so the
// mapping outlives both the registration and the producer as long as a block
// is held.
class ArenaRegistry::ProducerArena {
 public:
  ProducerArena(uint64_t id, std::string producer_id, pid_t pid, std::unique_ptr<shm::ArenaReader> reader,
                std::shared_ptr<std::atomic<uint64_t>> mapped, std::shared_ptr<std::atomic<uint64_t>> held_blocks,
                std::shared_ptr<std::atomic<uint64_t>> held_bytes,
                std::shared_ptr<std::atomic<uint64_t>> return_failures)
      : id_(id),
        producer_id_(std::move(producer_id)),
        pid_(pid),
        reader_(std::move(reader)),
        capacity_(reader_->arena().capacity_bytes()),  // read once, at registration
        mapped_(std::move(mapped)),
        held_blocks_(std::move(held_blocks)),
        held_bytes_(std::move(held_bytes)),
        return_failures_(std::move(return_failures)) {
    mapped_->fetch_add(1);
  }
  ~ProducerArena() {
    spdlog::debug("arena {} of producer '{}' (pid {}) detached", id_, producer_id_, pid_);
    mapped_->fetch_sub(1);
  }

  uint64_t id() const { return id_; }
  const std::string& producer_id() const { return producer_id_; }
  pid_t pid() const { return pid_; }

  // The block's bytes, marked held; or why not.
  absl::StatusOr<const uint8_t*> Hold(uint64_t offset, uint64_t length) {
    MutexLock lock(mu_);
    absl::StatusOr<std::span<std::byte>> view = reader_->View(offset, length);
    if (!view.ok()) return view.status();
    // The block's footprint must not overlap one held already: a block sent
    // twice (or two overlapping ones) would be returned twice.
    const uint64_t end = offset + Footprint(length);  // View bounded offset + length by the segment size
    auto next = held_.lower_bound(offset);
    if (next != held_.end() && next->first < end) return Overlap(offset, length, next->first, next->second);
    if (next != held_.begin()) {
      auto prev = std::prev(next);
      if (prev->second > offset) return Overlap(offset, length, prev->first, prev->second);
    }
    held_.emplace(offset, end);
    held_footprint_ += end - offset;
    held_blocks_->fetch_add(1);
    held_bytes_->fetch_add(length);
    return reinterpret_cast<const uint8_t*>(view->data());
  }

  // Hands the block back to the producer (through the completion queue).
  void Release(uint64_t offset, uint64_t length) {
    MutexLock lock(mu_);
    if (auto it = held_.find(offset); it != held_.end()) {
      held_footprint_ -= it->second - offset;
      held_.erase(it);
    }
    held_blocks_->fetch_sub(1);
    held_bytes_->fetch_sub(length);
    if (absl::Status s = reader_->Return(offset, length); !s.ok()) {
      return_failures_->fetch_add(1);
      spdlog::debug("arena {} of producer '{}': block ({}, {}) not returned: {}", id_, producer_id_, offset,
                    length, std::string(s.message()));
    }
  }

  // OK while the producer runs and has not closed the arena.
  absl::Status CheckWriter() const {
    MutexLock lock(mu_);
    return reader_->CheckWriter();
  }

  bool writer_waiting() const {
    MutexLock lock(mu_);
    return reader_->writer_waiting();
  }

  // Whether the daemon holds at least half of the arena: its producer will
  // soon wait for a block.
  bool half_held() const {
    MutexLock lock(mu_);
    return held_footprint_ >= capacity_ / 2;
  }

  // When the writer was first seen gone (RetireGone's bookkeeping).
  std::optional<Clock::TimePoint> gone_since;

 private:
  absl::Status Overlap(uint64_t offset, uint64_t length, uint64_t other, uint64_t other_end) const {
    return absl::InvalidArgumentError("block [" + std::to_string(offset) + ", +" + std::to_string(length) +
                                      ") of arena " + std::to_string(id_) + " overlaps block [" +
                                      std::to_string(other) + ", " + std::to_string(other_end) +
                                      ") that the daemon still holds (a block sent twice?)");
  }

  const uint64_t id_;
  const std::string producer_id_;
  const pid_t pid_;
  mutable Mutex mu_;
  // One thread at a time calls into the reader (returns come from any thread).
  const std::unique_ptr<shm::ArenaReader> reader_ ABSL_PT_GUARDED_BY(mu_);
  const uint64_t capacity_;
  std::map<uint64_t, uint64_t> held_ ABSL_GUARDED_BY(mu_);  // offset -> end of the footprint
  uint64_t held_footprint_ ABSL_GUARDED_BY(mu_) = 0;        // the footprints in held_
  std::shared_ptr<std::atomic<uint64_t>> mapped_;
  std::shared_ptr<std::atomic<uint64_t>> held_blocks_;
  std::shared_ptr<std::atomic<uint64_t>> held_bytes_;
  std::shared_ptr<std::atomic<uint64_t>> return_failures_;
};

// Keeps one held block (and through it the arena's mapping); returns the block
// when the sample that carries it is gone.
class ArenaRegistry::BlockHolder : public FrameHolder {
 public:
  BlockHolder(std::shared_ptr<ProducerArena> arena, uint64_t offset, uint64_t length)
      : arena_(std::move(arena)), offset_(offset), length_(length) {}
  ~BlockHolder() override { arena_->Release(offset_, length_); }

 private:
  std::shared_ptr<ProducerArena> arena_;
  uint64_t offset_;
  uint64_t length_;
};

ArenaRegistry::ArenaRegistry(Options options, const Clock& clock)
    : options_(options),
      clock_(clock),
      mapped_(std::make_shared<std::atomic<uint64_t>>(0)),
      held_blocks_(std::make_shared<std::atomic<uint64_t>>(0)),
      held_bytes_(std::make_shared<std::atomic<uint64_t>>(0)),
      return_failures_(std::make_shared<std::atomic<uint64_t>>(0)) {}

ArenaRegistry::~ArenaRegistry() {
  Stop();
  for (const std::string& path : paths_) ::unlink(path.c_str());
}

absl::Status ArenaRegistry::Listen(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError("arena registration socket '" + path + "' is longer than the " +
                                      std::to_string(sizeof(addr.sun_path) - 1) +
                                      " bytes a Unix socket allows; use a shorter run_dir");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  shm::UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::InternalError("arena registration socket: socket(): " + Errno(errno));
  ::unlink(path.c_str());  // a socket file left by a daemon that died (the caller holds the endpoint lock)
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError("cannot bind the arena registration socket " + path + ": " + Errno(errno));
  }
  // Producers of the job's user only: the file is the first gate, SO_PEERCRED the check.
  ::chmod(path.c_str(), 0600);
  // A full backlog refuses connections before the thread sees them: room for a flood of them.
  if (::listen(fd.get(), SOMAXCONN) != 0) {
    return absl::UnavailableError("cannot listen on the arena registration socket " + path + ": " + Errno(errno));
  }
  listeners_.push_back(std::move(fd));
  paths_.push_back(path);
  return absl::OkStatus();
}

void ArenaRegistry::Start() {
  if (thread_.running() || listeners_.empty()) return;  // nothing to serve: no arena can be registered
  if (!thread_.Start([this] { Serve(); })) {
    spdlog::error("arena registry: pipe2: {}; shared-memory registration is off", Errno(errno));
  }
}

void ArenaRegistry::Stop() { thread_.Stop(); }

void ArenaRegistry::Serve() {
  struct Client {
    shm::UniqueFd fd;
    Clock::TimePoint since;
  };
  std::deque<Client> clients;
  Clock::TimePoint last_retire = clock_.Now();
  while (!thread_.stopping()) {
    std::vector<pollfd> fds;
    fds.push_back({thread_.wake_fd(), POLLIN, 0});
    for (const shm::UniqueFd& l : listeners_) fds.push_back({l.get(), POLLIN, 0});
    for (const Client& c : clients) fds.push_back({c.fd.get(), POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(kRetireCheckEvery.count()));
    if (ready < 0 && errno != EINTR) {
      spdlog::error("arena registry: poll: {}; shared-memory registration stops", Errno(errno));
      return;
    }
    const Clock::TimePoint now = clock_.Now();
    if (ready > 0) {
      // Registrations first (their clients were polled), then new connections.
      size_t at = 1 + listeners_.size();
      std::deque<Client> kept;
      for (Client& c : clients) {
        const short revents = fds[at++].revents;
        if (revents == 0) {
          if (now - c.since < options_.client_timeout) kept.push_back(std::move(c));
          continue;
        }
        absl::StatusOr<shm::ReceivedFds> got = shm::RecvFds(c.fd.get(), kMaxRegisterBytes);
        if (!got.ok()) {
          // A client that hung up has nothing to be told; anything else that
          // cannot be read is answered (it may be a client of another version).
          if (got.status().code() != absl::StatusCode::kUnavailable) {
            Reply(c.fd.get(), RefuseUnreadable(c.fd.get(), got.status()));
          }
          continue;
        }
        wire::ArenaRegistered answer = Register(c.fd.get(), got->payload, std::move(got->fds));
        Reply(c.fd.get(), answer);
      }
      clients = std::move(kept);
      for (size_t i = 0; i < listeners_.size(); ++i) {
        if ((fds[1 + i].revents & POLLIN) == 0) continue;
        while (true) {
          shm::UniqueFd conn(::accept4(listeners_[i].get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
          if (!conn.valid()) break;
          if (clients.size() >= kMaxPendingClients) {
            // The oldest pending connection gives way, not the new one: a producer
            // sends its registration right after connecting, so connections that
            // stay silent (a flood of them) must not lock valid ones out until
            // client_timeout. The table stays bounded either way.
            refused_.fetch_add(1);
            wire::ArenaRegistered busy;
            busy.set_version(wire::PROTOCOL_VERSION_CURRENT);
            busy.set_error("the daemon had " + std::to_string(kMaxPendingClients) +
                           " registrations pending and dropped this one, the oldest, which sent nothing; "
                           "try again");
            Reply(clients.front().fd.get(), busy);
            clients.pop_front();
          }
          clients.push_back({std::move(conn), now});
        }
      }
    } else {
      std::erase_if(clients, [&](const Client& c) { return now - c.since >= options_.client_timeout; });
    }
    if (now - last_retire >= kRetireCheckEvery) {
      last_retire = now;
      RetireGone();
    }
  }
}

void ArenaRegistry::Reply(int sock, const wire::ArenaRegistered& answer) {
  const std::string bytes = answer.SerializeAsString();
  // A tiny message on a fresh SEQPACKET connection: it fits the socket buffer.
  if (::send(sock, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
    spdlog::debug("arena registry: answer not sent: {}", Errno(errno));
  }
}

wire::ArenaRegistered ArenaRegistry::RefuseUnreadable(int sock, const absl::Status& why) {
  std::string who = "a producer";
  if (absl::StatusOr<shm::PeerCredentials> peer = shm::GetPeerCredentials(sock); peer.ok()) {
    who = "pid " + std::to_string(peer->pid);
  }
  const std::string text =
      why.code() == absl::StatusCode::kInvalidArgument
          ? "the registration message is longer than " + std::to_string(kMaxRegisterBytes) +
                " bytes, the limit for one (an ArenaRegister is well under it); the producer sends over the "
                "socket instead"
          : "the registration message could not be read (" + std::string(why.message()) +
                "); the producer sends over the socket instead";
  refused_.fetch_add(1);
  spdlog::warn("arena registration of {} refused: {}", who, text);
  wire::ArenaRegistered answer;
  answer.set_version(wire::PROTOCOL_VERSION_CURRENT);
  answer.set_error(text);
  return answer;
}

wire::ArenaRegistered ArenaRegistry::Register(int sock, const std::string& payload,
                                              std::vector<shm::UniqueFd> fds) {
  wire::ArenaRegistered answer;
  answer.set_version(wire::PROTOCOL_VERSION_CURRENT);
  wire::ArenaRegister request;
  std::string who = "a producer";
  auto refuse = [&](const std::string& why) {
    refused_.fetch_add(1);
    spdlog::warn("arena registration of {} refused: {}", who, why);
    answer.set_error(why);
    return answer;
  };
  absl::StatusOr<shm::PeerCredentials> peer = shm::GetPeerCredentials(sock);
  if (!peer.ok()) return refuse(std::string(peer.status().message()));
  who = "pid " + std::to_string(peer->pid);
  if (peer->uid != ::getuid()) {
    return refuse("the producer runs as uid " + std::to_string(peer->uid) + ", this daemon as uid " +
                  std::to_string(::getuid()) + ": arenas are shared only within one user (send over the socket)");
  }
  // SO_PEERCRED reports pid 0 for a peer outside this process's PID
  // namespace: the arena's creator pid cannot be checked (docs/deploy.md).
  if (peer->pid == 0) {
    return refuse("the producer runs in another PID namespace than the daemon (its pid is not visible here), and "
                  "an arena is checked by its creator's pid: odbd and its producers must share one PID namespace "
                  "(Kubernetes: shareProcessNamespace: true); the producer sends over the socket");
  }
  if (!request.ParseFromString(payload)) return refuse("the registration is not an ArenaRegister message");
  if (request.producer_id().empty() || request.producer_id().size() > 256) {
    return refuse("the registration's producer_id is empty or over 256 bytes");
  }
  who = "producer '" + request.producer_id() + "' (pid " + std::to_string(peer->pid) + ")";
  if (request.version() != wire::PROTOCOL_VERSION_CURRENT) {
    return refuse("protocol version " + std::to_string(request.version()) + ", this daemon speaks " +
                  std::to_string(wire::PROTOCOL_VERSION_CURRENT) + "; upgrade the client and the daemon together");
  }
  // Both are checked against the segment when it is attached; 0 would mean
  // "not checked" there (fuzz/regressions/arena_register/generation_omitted).
  if (request.generation() == 0 || request.capacity_bytes() == 0) {
    return refuse("the registration announces generation " + std::to_string(request.generation()) +
                  " and capacity " + std::to_string(request.capacity_bytes()) +
                  " bytes; both must be the arena's own (non-zero), so that the daemon maps the arena announced");
  }
  if (fds.size() != 1) {
    return refuse("the registration carried " + std::to_string(fds.size()) +
                  " file descriptors; it needs exactly one (the arena's memfd)");
  }
  // A file arena could be truncated under the daemon's mapping (a read past
  // its new end is SIGBUS); a sealed memfd cannot shrink.
  const int seals = ::fcntl(fds[0].get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return refuse("the arena is not a memfd sealed against shrinking (only those are mapped: a file could be "
                  "truncated under the daemon)");
  }
  {
    MutexLock lock(mu_);
    if (arenas_.size() >= options_.max_arenas) {
      return refuse("the daemon has " + std::to_string(arenas_.size()) + " arenas registered, its limit " +
                    "(shm.max_arenas); the producer sends over the socket");
    }
  }
  shm::AttachOptions attach;
  attach.expected_generation = request.generation();
  attach.expected_capacity_bytes = request.capacity_bytes();
  absl::StatusOr<std::unique_ptr<shm::ArenaReader>> reader = shm::ArenaReader::AttachFd(fds[0].get(), attach);
  if (!reader.ok()) return refuse(std::string(reader.status().message()));
  if ((*reader)->arena().creator_pid() != peer->pid) {
    const bool other_namespace = !SamePidNamespace(peer->pid);
    return refuse("the arena was created by pid " + std::to_string((*reader)->arena().creator_pid()) +
                  ", not by the registering process (pid " + std::to_string(peer->pid) + ")" +
                  (other_namespace ? ", which runs in another PID namespace than the daemon, where pids differ: "
                                     "odbd and its producers must share one PID namespace (Kubernetes: "
                                     "shareProcessNamespace: true)"
                                   : ""));
  }
  const uint64_t capacity = (*reader)->arena().capacity_bytes();
  MutexLock lock(mu_);
  const uint64_t id = next_id_++;
  arenas_.emplace(id, std::make_shared<ProducerArena>(id, request.producer_id(), peer->pid, std::move(*reader),
                                                      mapped_, held_blocks_, held_bytes_, return_failures_));
  registrations_.fetch_add(1);
  spdlog::info("arena {} registered by {}: {} MiB", id, who, capacity >> 20);
  answer.set_arena_id(id);
  return answer;
}

absl::StatusOr<ArenaBlockSource::Acquired> ArenaRegistry::Acquire(std::string_view producer_id,
                                                                  const wire::ArenaBlock& block) {
  std::shared_ptr<ProducerArena> arena;
  {
    MutexLock lock(mu_);
    auto it = arenas_.find(block.arena_id());
    if (it != arenas_.end()) arena = it->second;
  }
  if (arena == nullptr) {
    return absl::NotFoundError("arena " + std::to_string(block.arena_id()) +
                               " is not registered with this daemon (register it first; an arena is "
                               "forgotten a few seconds after its producer exits)");
  }
  if (producer_id.empty() || arena->producer_id() != producer_id) {
    return absl::PermissionDeniedError(
        "arena " + std::to_string(block.arena_id()) + " was registered by producer '" + arena->producer_id() +
        "', not by this connection's producer '" + std::string(producer_id.substr(0, 256)) + "'");
  }
  absl::StatusOr<const uint8_t*> data = arena->Hold(block.offset(), block.length());
  if (!data.ok()) return data.status();
  Acquired out;
  out.data = *data;
  out.holder = std::make_shared<BlockHolder>(std::move(arena), block.offset(), block.length());
  return out;
}

void ArenaRegistry::RetireGone() {
  std::vector<std::shared_ptr<ProducerArena>> arenas;
  {
    MutexLock lock(mu_);
    for (const auto& [id, arena] : arenas_) arenas.push_back(arena);
  }
  const Clock::TimePoint now = clock_.Now();
  std::vector<uint64_t> retire;
  for (const auto& arena : arenas) {
    absl::Status writer = arena->CheckWriter();
    if (writer.ok()) continue;
    if (!arena->gone_since) {
      arena->gone_since = now;
      spdlog::debug("arena {}: {}", arena->id(), std::string(writer.message()));
    }
    if (now - *arena->gone_since >= options_.retire_after) retire.push_back(arena->id());
  }
  arenas.clear();  // so that use_count() below counts the registry and the held blocks only
  if (retire.empty()) return;
  MutexLock lock(mu_);
  for (uint64_t id : retire) {
    auto it = arenas_.find(id);
    if (it == arenas_.end()) continue;
    spdlog::info("arena {} of producer '{}' (pid {}) retired: its producer is gone{}", id,
                 it->second->producer_id(), it->second->pid(),
                 it->second.use_count() > 1 ? "; unmapped once its buffered samples are collated" : "");
    arenas_.erase(it);
  }
}

bool ArenaRegistry::AnyArenaFilling() const {
  MutexLock lock(mu_);
  for (const auto& [id, arena] : arenas_) {
    if (arena->writer_waiting() || arena->half_held()) return true;
  }
  return false;
}

ArenaRegistry::Stats ArenaRegistry::stats() const {
  Stats s;
  {
    MutexLock lock(mu_);
    s.arenas = arenas_.size();
    for (const auto& [id, arena] : arenas_) s.writers_waiting += arena->writer_waiting() ? 1 : 0;
  }
  s.mapped = mapped_->load();
  s.held_blocks = held_blocks_->load();
  s.held_bytes = held_bytes_->load();
  s.registrations = registrations_.load();
  s.refused = refused_.load();
  s.return_failures = return_failures_->load();
  return s;
}

}  // namespace odb::ingest
