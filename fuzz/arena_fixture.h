#ifndef ODB_FUZZ_ARENA_FIXTURE_H_
#define ODB_FUZZ_ARENA_FIXTURE_H_

// One real producer arena (a sealed memfd, 256 KiB) and a registry that
// accepted it over a socketpair, as the daemon's registration thread does:
// the arena fuzz targets decode against live shared memory, not a fake, so
// ASan sees a view that leaves the mapping.

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "proto/odb.pb.h"
#include "src/shm/arena_writer.h"
#include "src/shm/unique_fd.h"

namespace odb::fuzz {

constexpr uint64_t kArenaBytes = 256 << 10;
constexpr uint64_t kDataOffset = 8192;  // checked by the fixtures
inline constexpr const char* kProducer = "p0";

inline std::unique_ptr<shm::ArenaWriter> MakeArenaWriter() {
  shm::ArenaOptions o;
  o.capacity_bytes = kArenaBytes;
  o.reserve = false;
  // 64 blocks: the completion queue fits one page, so the data region starts
  // at 8192 (the seeds under fuzz/corpus/arena_* name blocks there).
  o.max_blocks = 64;
  auto w = shm::ArenaWriter::Create(o);
  if (!w.ok()) {
    std::fprintf(stderr, "fuzz fixture: cannot create an arena: %s\n", std::string(w.status().message()).c_str());
    std::abort();
  }
  return std::move(*w);
}

// A connected SOCK_SEQPACKET pair: Register checks the peer's credentials
// on the first one (our own uid and pid, as a local producer's).
struct SocketPair {
  int fds[2] = {-1, -1};
  SocketPair() {
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) std::abort();
  }
  ~SocketPair() {
    for (int fd : fds) ::close(fd);
  }
};

inline std::string RegisterRequest(const shm::ArenaWriter& w, const std::string& producer) {
  wire::ArenaRegister r;
  r.set_version(wire::PROTOCOL_VERSION_CURRENT);
  r.set_producer_id(producer);
  r.set_generation(w.arena().generation());
  r.set_capacity_bytes(w.capacity_bytes());
  return r.SerializeAsString();
}

inline std::vector<shm::UniqueFd> DupFd(int fd) {
  std::vector<shm::UniqueFd> fds;
  fds.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  return fds;
}

}  // namespace odb::fuzz

#endif  // ODB_FUZZ_ARENA_FIXTURE_H_
