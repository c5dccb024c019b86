// Fuzz target: a producer arena's registration as the daemon's registration
// thread handles it (odb::ingest::ArenaRegistry::Register): the serialized
// ArenaRegister and the descriptors that came with it, from a local process
// (a socketpair: the peer's uid and pid are this process's).
//
// Input: byte 0 picks the descriptors sent (none; the real arena's sealed
// memfd; an unsealed memfd; a pipe; /dev/null; two copies of the arena's
// memfd); byte 1 bit 0: when the rest parses as an ArenaRegister, its
// generation and capacity are replaced by the real arena's (so that the
// mutator reaches the accepting path; the stored seeds cannot know the
// nonce of a process that does not exist yet); the rest is the payload.
//
// Checks beyond "no crash, no sanitizer report": an answer either has an
// arena id or an error (never both, never neither), bounded in size; an
// accepted registration came with exactly the arena's memfd and a payload
// that names a producer, the current protocol version and the arena's
// generation and capacity; its data region's first block then resolves for
// that producer and for no other; the registry counts one registration or
// one refusal per call.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/arena_fixture.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/protobuf_quiet.h"
#include "src/ingest/arena_registry.h"

namespace {

struct Fixture {
  std::unique_ptr<odb::shm::ArenaWriter> writer = odb::fuzz::MakeArenaWriter();
  int unsealed = ::memfd_create("odb-fuzz-unsealed", MFD_CLOEXEC);
  int pipe_fds[2] = {-1, -1};
  int dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  Fixture() {
    if (unsealed < 0 || ::ftruncate(unsealed, 1 << 20) != 0 || ::pipe2(pipe_fds, O_CLOEXEC) != 0 || dev_null < 0) {
      std::abort();
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = odb::fuzz::SilenceProtobufLogs();
  (void)quiet;
  static Fixture* fixture = new Fixture();
  if (size < 2) return 0;
  const int kind = data[0] % 6;
  std::string payload(reinterpret_cast<const char*>(data + 2), size - 2);
  odb::wire::ArenaRegister parsed;
  const bool parses = parsed.ParseFromString(payload);
  if ((data[1] & 1) && parses) {
    parsed.set_generation(fixture->writer->arena().generation());
    parsed.set_capacity_bytes(fixture->writer->capacity_bytes());
    payload = parsed.SerializeAsString();
  }
  const int arena_fd = fixture->writer->arena().fd();
  std::vector<odb::shm::UniqueFd> fds;
  switch (kind) {
    case 1: fds = odb::fuzz::DupFd(arena_fd); break;
    case 2: fds = odb::fuzz::DupFd(fixture->unsealed); break;
    case 3: fds = odb::fuzz::DupFd(fixture->pipe_fds[0]); break;
    case 4: fds = odb::fuzz::DupFd(fixture->dev_null); break;
    case 5:
      fds = odb::fuzz::DupFd(arena_fd);
      fds.emplace_back(::fcntl(arena_fd, F_DUPFD_CLOEXEC, 0));
      break;
    default: break;
  }

  const odb::SteadyClock clock;
  odb::ingest::ArenaRegistry registry(odb::ingest::ArenaRegistry::Options{.max_arenas = 4}, clock);
  odb::fuzz::SocketPair pair;
  const odb::wire::ArenaRegistered answer = registry.Register(pair.fds[0], payload, std::move(fds));
  const bool accepted = answer.arena_id() != 0;
  FUZZ_CHECK(accepted == answer.error().empty(), "an answer with both or neither of an arena id and an error");
  FUZZ_CHECK(answer.error().size() <= 2048, "a refusal of " + std::to_string(answer.error().size()) + " bytes");
  const odb::ingest::ArenaRegistry::Stats stats = registry.stats();
  FUZZ_CHECK(stats.registrations + stats.refused == 1, "one call, not one count");
  if (!accepted) return 0;
  FUZZ_CHECK(kind == 1, "accepted a registration without exactly the arena's sealed memfd (kind " +
                            std::to_string(kind) + ")");
  odb::wire::ArenaRegister request;
  FUZZ_CHECK(request.ParseFromString(payload), "accepted a payload that does not parse");
  FUZZ_CHECK(request.version() == odb::wire::PROTOCOL_VERSION_CURRENT, "accepted another protocol version");
  FUZZ_CHECK(!request.producer_id().empty(), "accepted an arena without a producer id");
  FUZZ_CHECK(request.generation() == fixture->writer->arena().generation() &&
                 request.capacity_bytes() == fixture->writer->capacity_bytes(),
             "accepted an arena announced with another generation or capacity");
  odb::wire::ArenaBlock block;
  block.set_arena_id(answer.arena_id());
  block.set_offset(fixture->writer->arena().data_offset());
  block.set_length(64);
  FUZZ_CHECK(registry.Acquire(request.producer_id(), block).ok(), "the registered arena's first block is refused");
  FUZZ_CHECK(!registry.Acquire(request.producer_id() + "x", block).ok(), "another producer resolved the block");
  fixture->writer->Reclaim();
  return 0;
}
