// Log lines a peer can cause once per message or connection (garbage, a
// second client that keeps talking, connection churn): each kind logs at most
// `lines` per `window` on the injected clock; the rest are counted, and the
// next line of the kind that is logged is preceded by a note of how many were
// not. Metrics count every occurrence; only log lines are dropped.
#ifndef ODB_COMMON_LOG_LIMITER_H_
#define ODB_COMMON_LOG_LIMITER_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "src/common/clock.h"

namespace odb {

class LogLimiter {
 public:
  // `source`: what the lines are about ("trainer socket"); `counted_by`: the
  // metrics that count every occurrence, named in the note.
  LogLimiter(const Clock& clock, size_t kinds, std::string source, std::string counted_by,
             std::chrono::seconds window = std::chrono::seconds(60), uint32_t lines = 20);

  // Whether a line of `kind` may be logged now (after the note of how many of
  // its kind were not, if any).
  bool MayLog(size_t kind);
  // Lines of `kind` not logged since the last one that was.
  uint64_t skipped(size_t kind) const { return limits_.at(kind).skipped; }

 private:
  struct Limit {
    Clock::TimePoint window_start{};
    bool started = false;
    uint32_t lines = 0;    // logged in the current window
    uint64_t skipped = 0;  // not logged since the last line of this kind
  };
  const Clock& clock_;
  const std::string source_;
  const std::string counted_by_;
  const std::chrono::seconds window_;
  const uint32_t lines_;
  std::vector<Limit> limits_;
};

}  // namespace odb

#endif  // ODB_COMMON_LOG_LIMITER_H_
