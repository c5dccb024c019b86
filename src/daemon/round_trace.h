#ifndef ODB_DAEMON_ROUND_TRACE_H_
#define ODB_DAEMON_ROUND_TRACE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace odb {

// The `round_trace` file (docs/config.md): one line per alignment round,
// `round entry_ns exit_ns cpu_ns`. A diagnostic, so it may neither stop nor
// stall the daemon, nor lose lines without saying so:
//  - Open refuses a path that is not a regular file or a character device
//    (a FIFO without a reader would block start-up for ever; a socket, a
//    directory), naming the setting.
//  - A regular file is locked (flock, exclusive) before it is truncated: a
//    second daemon given the same path (no `{rank}` in it) is refused at
//    start-up instead of both truncating it and overwriting each other's
//    lines at their own offsets.
//  - Append writes each line with one write(2) on an O_APPEND descriptor. A
//    line that cannot be written whole (a full disk: ENOSPC, an I/O error)
//    is dropped and counted, never retried: the round goes on. The first
//    failure is logged with its cause, later ones at most once a minute with
//    the count; the destructor logs the total. (A file system that blocks a
//    write, e.g. a hung NFS mount, still blocks the planner thread: put the
//    trace on a local disk.)
// Used from one thread (the planner's).
class RoundTrace {
 public:
  // `path` after `{run}` / `{rank}` expansion.
  static absl::StatusOr<std::unique_ptr<RoundTrace>> Open(const std::string& path);
  RoundTrace(const RoundTrace&) = delete;
  RoundTrace& operator=(const RoundTrace&) = delete;
  ~RoundTrace();

  void Append(uint64_t round, int64_t entry_ns, int64_t exit_ns, int64_t cpu_ns);

  uint64_t written() const { return written_; }
  uint64_t dropped() const { return dropped_; }

 private:
  RoundTrace(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  int fd_;
  std::string path_;
  uint64_t written_ = 0;
  uint64_t dropped_ = 0;
  std::optional<std::chrono::steady_clock::time_point> last_warning_;
};

}  // namespace odb

#endif  // ODB_DAEMON_ROUND_TRACE_H_
