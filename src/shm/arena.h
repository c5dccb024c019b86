#ifndef ODB_SHM_ARENA_H_
#define ODB_SHM_ARENA_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/shm/layout.h"
#include "src/shm/unique_fd.h"

namespace odb::shm {

struct ArenaOptions {
  // Where the segment's file goes: the daemon's run_dir, or /dev/shm. Empty: an
  // anonymous memfd (no name; reaches the peer only by fd passing), sealed
  // against shrinking and growing.
  std::string dir;
  // Usable bytes for blocks (rounded up to the page size). The segment is this
  // plus one header page plus the completion queue.
  uint64_t capacity_bytes = 0;
  // Most blocks outstanding at once (rounded up to a power of two). Sizes the
  // completion queue, which therefore can never overflow.
  uint32_t max_blocks = 16384;
  // Reserve the segment's pages now (posix_fallocate): a full /dev/shm is an
  // error here instead of a SIGBUS on some later write into a hole.
  bool reserve = true;
  // The memfd's name as /proc/<pid>/fd shows it (debugging only).
  std::string memfd_name = "odb-arena";
  // Map with MAP_POPULATE: page tables filled now, no page faults on first
  // touch (worth it for a long-lived arena that will be written end to end).
  bool populate = false;
};

struct AttachOptions {
  // When non-zero, the segment must have exactly this generation (the nonce the
  // creator announced with the fd or path) / this data capacity.
  uint64_t expected_generation = 0;
  uint64_t expected_capacity_bytes = 0;
  // MAP_POPULATE, as ArenaOptions::populate.
  bool populate = false;
};

// One shared-memory segment mapped MAP_SHARED: header, completion queue, data.
//
// Create makes a new one owned by the calling process (its creator and only
// writer): a file `<dir>/odb-shm-<uid>-<pid>-<nonce>` opened with
// O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, or a memfd. The header's magic is
// published last, so a segment seen half-built reads as "not initialised".
//
// Attach maps an existing one after checking, from the file's metadata and a
// pread of its header (nothing is mapped before it passes): a regular file of
// our uid with no group/other permission bits, our magic and layout version,
// creator uid equal to ours, header size equal to the file size, a consistent
// layout, the expected generation/capacity, a creator that is still running
// (pid and start time) and has not closed it. Each refusal is an absl::Status
// naming the file and the reason: kPermissionDenied (foreign owner or mode),
// kInvalidArgument (not an odb arena, another layout version, size mismatch,
// corrupt layout, unexpected generation or capacity), kFailedPrecondition
// (stale: creator dead or closed; not yet initialised), kNotFound.
//
// The Arena is only the mapping; ArenaWriter / ArenaReader add the allocator
// and the completion queue on top of it.
class Arena {
 public:
  static absl::StatusOr<std::unique_ptr<Arena>> Create(const ArenaOptions& options);
  static absl::StatusOr<std::unique_ptr<Arena>> Attach(const std::string& path,
                                                       const AttachOptions& options = {});
  // Maps the segment behind `fd` (e.g. received with RecvFd). The fd is
  // duplicated: the caller keeps its own.
  static absl::StatusOr<std::unique_ptr<Arena>> AttachFd(int fd, const AttachOptions& options = {});

  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  // Unmaps. In the creating process it also marks the segment closed and
  // removes its file (the peer's mapping stays valid: it holds the pages until
  // it unmaps); a fork()ed child's copy only unmaps.
  ~Arena();

  // The file's path; empty for a memfd.
  const std::string& path() const { return path_; }
  // The path, or "memfd:<name>": how messages name this segment.
  const std::string& name() const { return name_; }
  int fd() const { return fd_.get(); }
  bool is_creator() const { return is_creator_; }

  ArenaHeader* header() const { return reinterpret_cast<ArenaHeader*>(base_); }
  std::byte* base() const { return base_; }
  uint64_t total_bytes() const { return total_bytes_; }
  // The layout as validated when the segment was created or attached: the
  // mapped header is writable by the other side, so nothing that bounds a
  // read (the data region, the completion queue) is taken from it later.
  uint64_t generation() const { return layout_.generation; }
  pid_t creator_pid() const { return layout_.creator_pid; }
  uint64_t data_offset() const { return layout_.data_offset; }
  uint64_t capacity_bytes() const { return layout_.data_bytes; }
  CompletionEntry* cq_entries() const { return reinterpret_cast<CompletionEntry*>(base_ + layout_.cq_offset); }
  uint32_t cq_capacity() const { return layout_.cq_capacity; }

  // OK while the creator runs and has not closed the segment; otherwise
  // kFailedPrecondition naming the segment and the creator's pid.
  absl::Status CheckCreator() const;
  // Creator side: mark the segment closed (readers' CheckCreator fails from now).
  void MarkClosed();
  // Creator side: remove the file now instead of at destruction (no-op for a
  // memfd or when already removed).
  void Unlink();

 private:
  Arena() = default;
  static absl::StatusOr<std::unique_ptr<Arena>> MapValidated(UniqueFd fd, std::string path, std::string name,
                                                             const AttachOptions& options);

  UniqueFd fd_;
  std::string path_;
  std::string name_;
  std::byte* base_ = nullptr;
  uint64_t total_bytes_ = 0;
  struct Layout {
    uint64_t generation = 0;
    pid_t creator_pid = 0;
    uint64_t data_offset = 0;
    uint64_t data_bytes = 0;
    uint64_t cq_offset = 0;
    uint32_t cq_capacity = 0;
  };
  Layout layout_;  // copied from the validated header
  bool is_creator_ = false;
  bool unlinked_ = false;
};

// Checks an arena header against the file's metadata (`st_size`, `st_uid`,
// `st_mode`) and the options: the validation Attach and SweepStale share,
// without the creator-liveness test. `name` goes into the messages.
absl::Status ValidateArenaHeader(const ArenaHeader& header, uint64_t file_size, uid_t file_uid,
                                 mode_t file_mode, const std::string& name, const AttachOptions& options);

// Whether `filename` (no directory) has the shape of an arena created by `uid`:
// odb-shm-<uid>-<pid>-<16 hex digits>. Fills pid and nonce when it has.
bool ParseArenaFileName(const std::string& filename, uid_t uid, pid_t* pid, uint64_t* nonce);

struct SweepReport {
  std::vector<std::string> removed;                       // stale segments of dead creators
  std::vector<std::pair<std::string, std::string>> kept;  // (path, why): live, foreign, unreadable
};

// Removes the segments in `dir` whose creators are dead (a daemon does this at
// start, so a restart finds no stale segments). Only files that are ours are
// candidates: the arena file-name shape with our uid, a regular file (not a
// symlink) owned by us with mode 0600, whose header is a valid arena of our
// uid whose generation and creator pid match the name (or, for a header never
// initialised, whose creator named in the file name is dead). Anything else in
// the directory is never touched; arena-named files that fail a check are
// listed in `kept` with the reason. A segment whose creator runs is kept.
absl::StatusOr<SweepReport> SweepStale(const std::string& dir);

}  // namespace odb::shm

#endif  // ODB_SHM_ARENA_H_
