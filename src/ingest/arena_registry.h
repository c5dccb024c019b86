#ifndef ODB_INGEST_ARENA_REGISTRY_H_
#define ODB_INGEST_ARENA_REGISTRY_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/odb.pb.h"
#include "src/common/clock.h"
#include "src/common/mutex.h"
#include "src/ingest/decoder.h"
#include "src/shm/poll_thread.h"
#include "src/shm/unique_fd.h"

namespace odb::ingest {

// The producers' shared-memory arenas (shared-memory data plane, docs/shm.md).
//
// Registration: a local producer connects to a UNIX SOCK_SEQPACKET socket that
// the registry listens on next to each ipc:// ingest socket
// (`<ingest socket path>.arena`) and sends one message: an ArenaRegister
// header with its arena's memfd attached (SCM_RIGHTS). The registry checks the
// peer's uid (SO_PEERCRED: only the daemon's own user), that the fd is a memfd
// sealed against shrinking (a file could be truncated under the daemon's
// mapping, and a read past its end would be SIGBUS), attaches it as the
// arena's one reader (shm::ArenaReader: owner, mode, magic, layout, the
// announced generation and capacity, a live creator), that the arena's
// creator is the registering process, and answers ArenaRegistered with an
// arena id (or the reason it refused). The registry's own thread serves the
// socket, so a slow or silent client never holds up the I/O loop.
//
// Samples then name (arena id, block); Acquire (the ingest decoder, I/O
// thread) checks that the arena is registered by the sample's producer and
// that the block lies in the arena's data region, 64-byte aligned, and
// overlaps no block the daemon still holds, and returns the block's mapped
// bytes with a holder. The holder travels in the Sample where frames travel;
// when the last copy of the sample is gone (collated into a step, rejected,
// dropped with its epoch, or sent to a peer daemon) it Returns the block
// through the arena's completion queue, under the arena's lock (returns come
// from the I/O thread, the planner thread and the payload exchange).
//
// A producer that dies or closes its arena: the arena is forgotten once its
// writer has been gone for `retire_after` (samples that were already on their
// way still resolve meanwhile), but the mapping stays as long as any of its
// blocks is held, so its buffered samples still collate from it; the reader
// is destroyed (detached, unmapped) with the last block.
class ArenaRegistry : public ArenaBlockSource {
 public:
  struct Options {
    size_t max_arenas = 1024;  // registered at once; more are refused
    // How long an arena whose writer is gone still resolves blocks.
    std::chrono::milliseconds retire_after{5000};
    // How long a registration connection may stay silent.
    std::chrono::milliseconds client_timeout{5000};
  };

  // Its timers (retire_after, client_timeout) run on `clock`, the daemon's
  // injected clock, which must outlive the registry. The registry's thread
  // reads it at least every kRetireCheckEvery of real time (a FakeClock moves
  // without waking anyone).
  ArenaRegistry(Options options, const Clock& clock);
  static constexpr std::chrono::milliseconds kRetireCheckEvery{500};
  ~ArenaRegistry() override;
  ArenaRegistry(const ArenaRegistry&) = delete;
  ArenaRegistry& operator=(const ArenaRegistry&) = delete;

  // Listens on `path` (a stale socket file there is replaced: the caller holds
  // the endpoint lock). Call before Start. Errors name the path.
  absl::Status Listen(const std::string& path);
  const std::vector<std::string>& paths() const { return paths_; }
  // Serves registrations on the registry's thread until Stop (or destruction);
  // no thread when nothing listens.
  void Start();
  void Stop();

  absl::StatusOr<Acquired> Acquire(std::string_view producer_id, const wire::ArenaBlock& block) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Handles one registration as it arrived on a connection: `sock` is the
  // connected socket (its peer's credentials are checked), `payload` the
  // serialized ArenaRegister and `fds` what came with it. The answer to send.
  // Public for tests; the registry's thread calls it.
  wire::ArenaRegistered Register(int sock, const std::string& payload, std::vector<shm::UniqueFd> fds)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The answer to a registration that could not be read (over the size
  // limit, too many descriptors): refused, logged, counted.
  wire::ArenaRegistered RefuseUnreadable(int sock, const absl::Status& why);
  // Forgets arenas whose writer has been gone for retire_after (the registry's
  // thread calls it every kRetireCheckEvery of the clock).
  void RetireGone() ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    uint64_t arenas = 0;           // registered now
    uint64_t mapped = 0;           // mapped now (registered, or retired with blocks held)
    uint64_t held_blocks = 0;      // blocks the daemon holds now
    uint64_t held_bytes = 0;
    uint64_t registrations = 0;    // accepted since start
    uint64_t refused = 0;          // registrations refused
    uint64_t return_failures = 0;  // Returns the arena refused (its writer reset it)
    uint64_t writers_waiting = 0;  // registered arenas whose producer waits for a block (arena full)
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a producer waits for a block of its full arena, or soon will: the
  // daemon holds at least half of its arena. The planner then plans a round,
  // as for a full buffer, instead of waiting for a window of samples that
  // cannot come: the producer fills the other half while the round collates
  // (double buffering; without it producer and planner took turns).
  bool AnyArenaFilling() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class ProducerArena;
  class BlockHolder;

  void Serve();
  void Reply(int sock, const wire::ArenaRegistered& answer);

  const Options options_;
  const Clock& clock_;
  std::vector<shm::UniqueFd> listeners_;
  std::vector<std::string> paths_;

  mutable Mutex mu_;
  std::map<uint64_t, std::shared_ptr<ProducerArena>> arenas_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::shared_ptr<std::atomic<uint64_t>> mapped_;  // ProducerArenas alive (they outlive the registry)
  std::shared_ptr<std::atomic<uint64_t>> held_blocks_;
  std::shared_ptr<std::atomic<uint64_t>> held_bytes_;
  std::shared_ptr<std::atomic<uint64_t>> return_failures_;
  std::atomic<uint64_t> registrations_{0};
  std::atomic<uint64_t> refused_{0};
  shm::PollThread thread_;  // last: stopped before the members it serves go
};

// `<path>.arena`: the registration socket next to an ipc:// ingest socket at
// `path` (what both the daemon and the client derive from the endpoint).
std::string ArenaSocketPath(const std::string& ingest_socket_path);

}  // namespace odb::ingest

#endif  // ODB_INGEST_ARENA_REGISTRY_H_
