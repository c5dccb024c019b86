#include "src/shm/arena.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>

#include "src/shm/process.h"

namespace odb::shm {
namespace {

std::string Errno(int err) { return std::strerror(err); }

uint64_t PageSize() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

uint64_t RoundUp(uint64_t value, uint64_t unit) { return (value + unit - 1) / unit * unit; }

uint64_t Random64() {
  uint64_t value = 0;
  while (value == 0) {
    if (getrandom(&value, sizeof(value), 0) != static_cast<ssize_t>(sizeof(value))) {
      std::random_device rd;
      value = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
  }
  return value;
}

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

std::string Mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0%03o", static_cast<unsigned>(mode & 07777));
  return buf;
}

uint32_t RoundUpPow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Reads up to sizeof(ArenaHeader) bytes from offset 0; the rest stays zero.
bool ReadHeader(int fd, ArenaHeader* header) {
  std::memset(static_cast<void*>(header), 0, sizeof(*header));
  size_t done = 0;
  while (done < sizeof(*header)) {
    const ssize_t n = ::pread(fd, reinterpret_cast<char*>(header) + done, sizeof(*header) - done, done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) break;  // short file: the validation reports its size
    done += static_cast<size_t>(n);
  }
  return true;
}

std::string FdTarget(int fd) {
  char buf[4096];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

// A pid is checked in this process's PID namespace; the creator's own
// namespace may differ (containers of one Kubernetes Pod without
// shareProcessNamespace, `unshare --pid`), where its pid means nothing here.
// The message names both causes, since the check cannot tell them apart.
constexpr const char* kOtherNamespaceHint =
    " (or it runs in another PID namespace, where its pid means nothing here: odbd, the trainer and its "
    "data workers must share one, e.g. Kubernetes shareProcessNamespace: true)";

absl::Status CheckLiveness(const ArenaHeader& h, const std::string& name) {
  if (!IsProcessAlive(h.creator_pid, h.creator_start_ticks)) {
    return absl::FailedPreconditionError(name + ": stale arena: its creator pid " +
                                         std::to_string(h.creator_pid) + " is no longer running" +
                                         kOtherNamespaceHint);
  }
  return absl::OkStatus();
}

}  // namespace

bool ParseArenaFileName(const std::string& filename, uid_t uid, pid_t* pid, uint64_t* nonce) {
  const std::string prefix = kArenaFilePrefix;
  if (filename.compare(0, prefix.size(), prefix) != 0) return false;
  size_t pos = prefix.size();
  auto number = [&](uint64_t* out) {
    const size_t start = pos;
    uint64_t v = 0;
    while (pos < filename.size() && filename[pos] >= '0' && filename[pos] <= '9' && pos - start < 10) {
      v = v * 10 + static_cast<uint64_t>(filename[pos] - '0');
      ++pos;
    }
    *out = v;
    return pos > start;
  };
  uint64_t file_uid = 0, file_pid = 0;
  if (!number(&file_uid) || pos >= filename.size() || filename[pos++] != '-') return false;
  if (!number(&file_pid) || pos >= filename.size() || filename[pos++] != '-') return false;
  if (filename.size() - pos != 16) return false;
  uint64_t v = 0;
  for (; pos < filename.size(); ++pos) {
    const char c = filename[pos];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(digit);
  }
  if (file_uid != uid || file_pid == 0 || file_pid > INT32_MAX) return false;
  if (pid != nullptr) *pid = static_cast<pid_t>(file_pid);
  if (nonce != nullptr) *nonce = v;
  return true;
}

absl::Status ValidateArenaHeader(const ArenaHeader& h, uint64_t file_size, uid_t file_uid, mode_t file_mode,
                                 const std::string& name, const AttachOptions& options) {
  const uid_t me = geteuid();
  if (file_uid != me) {
    return absl::PermissionDeniedError(name + ": owned by uid " + std::to_string(file_uid) +
                                       ", this process runs as uid " + std::to_string(me) +
                                       ": not our segment, refused");
  }
  if ((file_mode & 0077) != 0) {
    return absl::PermissionDeniedError(name + ": mode " + Mode(file_mode) +
                                       " gives other users access (an odb arena is 0600): refused");
  }
  if (file_size < kArenaHeaderBytes) {
    return absl::InvalidArgumentError(name + ": " + std::to_string(file_size) +
                                      " bytes, too small to hold an odb arena header (" +
                                      std::to_string(kArenaHeaderBytes) + ")");
  }
  if (h.magic == 0) {
    return absl::FailedPreconditionError(
        name +
        ": not initialised (magic 0): its creator is still building it or died "
        "doing so");
  }
  if (h.magic != kArenaMagic) {
    return absl::InvalidArgumentError(name + ": not an odb arena (magic 0x" + Hex16(h.magic) +
                                      ", expected 0x" + Hex16(kArenaMagic) + ")");
  }
  if (h.layout_version != kArenaLayoutVersion) {
    return absl::InvalidArgumentError(name + ": arena layout version " + std::to_string(h.layout_version) +
                                      ", this build reads version " + std::to_string(kArenaLayoutVersion));
  }
  if (h.creator_uid != me) {
    return absl::PermissionDeniedError(name + ": created by uid " + std::to_string(h.creator_uid) +
                                       ", this process runs as uid " + std::to_string(me) +
                                       ": not our segment, refused");
  }
  if (h.total_bytes != file_size) {
    return absl::InvalidArgumentError(name + ": size mismatch: the header says " +
                                      std::to_string(h.total_bytes) + " bytes, the file has " +
                                      std::to_string(file_size));
  }
  const uint64_t cap = h.cq_capacity;
  const bool layout_ok =
      h.header_bytes == kArenaHeaderBytes && h.block_alignment == kBlockAlignment && cap != 0 &&
      (cap & (cap - 1)) == 0 && h.cq_offset >= kArenaHeaderBytes && h.data_offset >= h.cq_offset &&
      h.data_offset - h.cq_offset >= cap * sizeof(CompletionEntry) && h.data_offset % kBlockAlignment == 0 &&
      h.cq_offset % alignof(CompletionEntry) == 0 && h.data_offset <= h.total_bytes &&
      h.data_bytes == h.total_bytes - h.data_offset && h.data_bytes % kBlockAlignment == 0 &&
      h.creator_pid > 0 && h.generation != 0;
  if (!layout_ok) {
    return absl::InvalidArgumentError(
        name + ": corrupt arena layout (header " + std::to_string(h.header_bytes) +
        " bytes, completion queue " + std::to_string(cap) + " entries at " + std::to_string(h.cq_offset) +
        ", data " + std::to_string(h.data_bytes) + " bytes at " + std::to_string(h.data_offset) + ", total " +
        std::to_string(h.total_bytes) + ")");
  }
  if (options.expected_generation != 0 && h.generation != options.expected_generation) {
    return absl::InvalidArgumentError(name + ": generation 0x" + Hex16(h.generation) + ", expected 0x" +
                                      Hex16(options.expected_generation) +
                                      ": another segment than the one announced");
  }
  if (options.expected_capacity_bytes != 0 && h.data_bytes != options.expected_capacity_bytes) {
    return absl::InvalidArgumentError(name + ": size mismatch: capacity " + std::to_string(h.data_bytes) +
                                      " bytes, expected " + std::to_string(options.expected_capacity_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::Create(const ArenaOptions& options) {
  if (options.capacity_bytes == 0) return absl::InvalidArgumentError("Arena::Create: capacity_bytes is 0");
  if (options.max_blocks == 0 || options.max_blocks > (1u << 24)) {
    return absl::InvalidArgumentError("Arena::Create: max_blocks " + std::to_string(options.max_blocks) +
                                      " outside [1, 16777216]");
  }
  const uint64_t page = PageSize();
  const uint32_t cq_capacity = RoundUpPow2(options.max_blocks);
  const uint64_t cq_offset = RoundUp(kArenaHeaderBytes, page);
  const uint64_t data_offset = cq_offset + RoundUp(uint64_t{cq_capacity} * sizeof(CompletionEntry), page);
  if (options.capacity_bytes > (uint64_t{1} << 46)) {
    return absl::InvalidArgumentError("Arena::Create: capacity_bytes " +
                                      std::to_string(options.capacity_bytes) + " is beyond 64 TiB");
  }
  const uint64_t data_bytes = RoundUp(options.capacity_bytes, page);
  const uint64_t total = data_offset + data_bytes;

  auto arena = std::unique_ptr<Arena>(new Arena());
  arena->is_creator_ = true;
  const uid_t uid = geteuid();
  const pid_t pid = getpid();
  // Never 0: a registration announcing generation 0 is refused (0 means
  // "not checked" to AttachOptions).
  uint64_t generation = Random64() | 1;
  if (options.dir.empty()) {
    const int fd = memfd_create(options.memfd_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return absl::InternalError("Arena::Create: memfd_create: " + Errno(errno));
    arena->fd_.reset(fd);
    arena->name_ = "memfd:" + options.memfd_name;
    arena->unlinked_ = true;  // nothing to remove
  } else {
    for (int attempt = 0;; ++attempt) {
      const std::string path = options.dir + "/" + kArenaFilePrefix + std::to_string(uid) + "-" +
                               std::to_string(pid) + "-" + Hex16(generation);
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd >= 0) {
        arena->fd_.reset(fd);
        arena->path_ = path;
        arena->name_ = path;
        break;
      }
      const int err = errno;
      if (err == EEXIST && attempt < 4) {
        generation = Random64() | 1;
        continue;
      }
      const std::string what = "Arena::Create: cannot create " + path + ": " + Errno(err);
      if (err == ENOENT) return absl::NotFoundError(what);
      if (err == EACCES || err == EPERM || err == EROFS) return absl::PermissionDeniedError(what);
      return absl::InternalError(what);
    }
  }
  // From here on a failure drops `arena`, whose destructor removes the file.
  const int fd = arena->fd();
  if (::fchmod(fd, 0600) != 0) return absl::InternalError(arena->name_ + ": fchmod 0600: " + Errno(errno));
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    return absl::ResourceExhaustedError(arena->name_ + ": cannot size the arena to " + std::to_string(total) +
                                        " bytes: " + Errno(errno));
  }
  if (options.reserve) {
    const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(total));
    if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
      return absl::ResourceExhaustedError(arena->name_ + ": cannot reserve " + std::to_string(total) +
                                          " bytes for the arena: " + Errno(rc));
    }
  }
  if (options.dir.empty() && ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return absl::InternalError(arena->name_ + ": sealing the memfd: " + Errno(errno));
  }
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE,
                      MAP_SHARED | (options.populate ? MAP_POPULATE : 0), fd, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(arena->name_ + ": mmap of " + std::to_string(total) +
                                        " bytes: " + Errno(errno));
  }
  arena->base_ = static_cast<std::byte*>(base);
  arena->total_bytes_ = total;

  ArenaHeader* h = arena->header();  // a fresh file reads as zeros
  h->layout_version = kArenaLayoutVersion;
  h->header_bytes = kArenaHeaderBytes;
  h->total_bytes = total;
  h->generation = generation;
  h->creator_pid = pid;
  h->creator_uid = uid;
  h->creator_start_ticks = ProcessStartTicks(pid);
  h->cq_offset = cq_offset;
  h->cq_capacity = cq_capacity;
  h->block_alignment = kBlockAlignment;
  h->data_offset = data_offset;
  h->data_bytes = data_bytes;
  arena->layout_ = {generation, pid, data_offset, data_bytes, cq_offset, cq_capacity};
  Atomic(h->writer_state).store(kWriterLive, std::memory_order_relaxed);
  Atomic(h->magic).store(kArenaMagic, std::memory_order_release);  // published: Attach may accept it now
  return arena;
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::Attach(const std::string& path, const AttachOptions& options) {
  const int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(path + ": no such arena");
    if (err == ELOOP) return absl::PermissionDeniedError(path + ": is a symbolic link, refused");
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(path + ": " + Errno(err));
    return absl::InvalidArgumentError(path + ": cannot open: " + Errno(err));
  }
  return MapValidated(UniqueFd(fd), path, path, options);
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::AttachFd(int fd, const AttachOptions& options) {
  const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0)
    return absl::InvalidArgumentError("fd " + std::to_string(fd) + ": cannot duplicate: " + Errno(errno));
  const std::string target = FdTarget(dup);
  const std::string name = "fd " + std::to_string(fd) + (target.empty() ? "" : " (" + target + ")");
  // A memfd is ours to map only if its creator can no longer shrink it under
  // our mapping (a read past its end would be a SIGBUS).
  if (target.rfind("/memfd:", 0) == 0) {
    const int seals = ::fcntl(dup, F_GET_SEALS);
    if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
      ::close(dup);
      return absl::InvalidArgumentError(name + ": memfd not sealed against shrinking: refused");
    }
  }
  return MapValidated(UniqueFd(dup), "", name, options);
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::MapValidated(UniqueFd fd, std::string path, std::string name,
                                                           const AttachOptions& options) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return absl::InvalidArgumentError(name + ": fstat: " + Errno(errno));
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(name + ": not a regular file, refused");
  ArenaHeader h;
  if (!ReadHeader(fd.get(), &h))
    return absl::InvalidArgumentError(name + ": cannot read its header: " + Errno(errno));
  if (absl::Status s =
          ValidateArenaHeader(h, static_cast<uint64_t>(st.st_size), st.st_uid, st.st_mode, name, options);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLiveness(h, name); !s.ok()) return s;
  if (h.writer_state == kWriterClosed) {
    return absl::FailedPreconditionError(name + ": stale arena: closed by its creator (pid " +
                                         std::to_string(h.creator_pid) + ")");
  }
  void* base = ::mmap(nullptr, h.total_bytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED | (options.populate ? MAP_POPULATE : 0), fd.get(), 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(name + ": mmap of " + std::to_string(h.total_bytes) +
                                        " bytes: " + Errno(errno));
  }
  auto arena = std::unique_ptr<Arena>(new Arena());
  arena->fd_ = std::move(fd);
  arena->path_ = std::move(path);
  arena->name_ = std::move(name);
  arena->base_ = static_cast<std::byte*>(base);
  arena->total_bytes_ = h.total_bytes;
  arena->layout_ = {h.generation, h.creator_pid, h.data_offset, h.data_bytes, h.cq_offset, h.cq_capacity};
  arena->unlinked_ = true;  // never ours to remove
  // The identity fields are immutable once published; the mapped copy must be
  // the one just validated.
  const ArenaHeader* mapped = arena->header();
  if (Atomic(const_cast<ArenaHeader*>(mapped)->magic).load(std::memory_order_acquire) != kArenaMagic ||
      mapped->generation != h.generation || mapped->total_bytes != h.total_bytes) {
    return absl::InvalidArgumentError(arena->name_ + ": the header changed while it was validated");
  }
  return arena;
}

Arena::~Arena() {
  // Only the creating process closes and removes the segment: a child that
  // inherited this object through fork() (a DataLoader worker) and destroys
  // its copy must not pull the segment from under its parent.
  if (is_creator_ && base_ != nullptr && getpid() == layout_.creator_pid) {
    MarkClosed();
    Unlink();
  } else if (is_creator_ && base_ == nullptr) {
    Unlink();  // Create failed half-way, in this process
  }
  if (base_ != nullptr) ::munmap(base_, total_bytes_);
}

absl::Status Arena::CheckCreator() const {
  ArenaHeader* h = header();
  if (Atomic(h->writer_state).load(std::memory_order_acquire) == kWriterClosed) {
    return absl::FailedPreconditionError(name_ + ": its writer (pid " + std::to_string(h->creator_pid) +
                                         ") closed the arena");
  }
  if (!IsProcessAlive(h->creator_pid, h->creator_start_ticks)) {
    return absl::FailedPreconditionError(name_ + ": its writer (pid " + std::to_string(h->creator_pid) +
                                         ") is no longer running" + kOtherNamespaceHint);
  }
  return absl::OkStatus();
}

void Arena::MarkClosed() {
  if (!is_creator_ || base_ == nullptr) return;
  Atomic(header()->writer_state).store(kWriterClosed, std::memory_order_release);
}

void Arena::Unlink() {
  if (!is_creator_ || unlinked_ || path_.empty()) return;
  ::unlink(path_.c_str());
  unlinked_ = true;
}

absl::StatusOr<SweepReport> SweepStale(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError("SweepStale: " + dir + ": no such directory");
    return absl::PermissionDeniedError("SweepStale: " + dir + ": " + Errno(err));
  }
  UniqueFd dir_fd(dfd);
  const int listing_fd = ::fcntl(dfd, F_DUPFD_CLOEXEC, 0);
  DIR* listing = listing_fd < 0 ? nullptr : ::fdopendir(listing_fd);
  if (listing == nullptr) {
    if (listing_fd >= 0) ::close(listing_fd);
    return absl::InternalError("SweepStale: " + dir + ": cannot list: " + Errno(errno));
  }
  std::vector<std::string> names;
  while (dirent* entry = ::readdir(listing)) names.emplace_back(entry->d_name);
  ::closedir(listing);

  const uid_t me = geteuid();
  SweepReport report;
  for (const std::string& filename : names) {
    pid_t name_pid = 0;
    uint64_t name_nonce = 0;
    if (!ParseArenaFileName(filename, me, &name_pid, &name_nonce)) continue;  // not ours: not even looked at
    const std::string path = dir + "/" + filename;
    auto keep = [&](std::string why) { report.kept.emplace_back(path, std::move(why)); };
    struct stat lst;
    if (::fstatat(dfd, filename.c_str(), &lst, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
    if (!S_ISREG(lst.st_mode)) {
      keep("not a regular file");
      continue;
    }
    if (lst.st_uid != me) {
      keep("owned by uid " + std::to_string(lst.st_uid));
      continue;
    }
    if ((lst.st_mode & 07777) != 0600) {
      keep("mode " + Mode(lst.st_mode) + ", not 0600");
      continue;
    }
    const int fd = ::openat(dfd, filename.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      keep(std::string("cannot open: ") + Errno(errno));
      continue;
    }
    UniqueFd file(fd);
    struct stat st;
    ArenaHeader h;
    if (::fstat(fd, &st) != 0 || st.st_ino != lst.st_ino || st.st_dev != lst.st_dev) {
      keep("replaced while it was checked");
      continue;
    }
    if (!ReadHeader(fd, &h)) {
      keep(std::string("cannot read its header: ") + Errno(errno));
      continue;
    }
    if (h.magic == 0) {
      // Created (O_EXCL) but never published: its creator is building it, or
      // died doing so. The pid in the name, which only it could have written
      // with our uid, tells which.
      if (IsProcessAlive(name_pid, 0)) {
        keep("not initialised yet; its creator pid " + std::to_string(name_pid) + " runs");
        continue;
      }
    } else {
      if (absl::Status s =
              ValidateArenaHeader(h, static_cast<uint64_t>(st.st_size), st.st_uid, st.st_mode, path, {});
          !s.ok()) {
        keep(std::string(s.message()));
        continue;
      }
      if (h.creator_pid != name_pid || h.generation != name_nonce) {
        keep("its header (creator pid " + std::to_string(h.creator_pid) + ", generation 0x" +
             Hex16(h.generation) + ") does not match its name");
        continue;
      }
      const bool closed = h.writer_state == kWriterClosed;
      if (!closed && IsProcessAlive(h.creator_pid, h.creator_start_ticks)) {
        keep("in use: its creator pid " + std::to_string(h.creator_pid) + " runs");
        continue;
      }
    }
    if (::unlinkat(dfd, filename.c_str(), 0) != 0) {
      keep(std::string("cannot remove: ") + Errno(errno));
      continue;
    }
    report.removed.push_back(path);
  }
  return report;
}

}  // namespace odb::shm
