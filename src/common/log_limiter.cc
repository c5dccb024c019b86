#include "src/common/log_limiter.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace odb {

LogLimiter::LogLimiter(const Clock& clock, size_t kinds, std::string source, std::string counted_by,
                       std::chrono::seconds window, uint32_t lines)
    : clock_(clock),
      source_(std::move(source)),
      counted_by_(std::move(counted_by)),
      window_(window),
      lines_(lines),
      limits_(kinds) {}

bool LogLimiter::MayLog(size_t kind) {
  Limit& limit = limits_.at(kind);
  const Clock::TimePoint now = clock_.Now();
  if (!limit.started || now - limit.window_start >= window_) {
    limit.started = true;
    limit.window_start = now;
    limit.lines = 0;
  }
  if (limit.lines >= lines_) {
    ++limit.skipped;
    return false;
  }
  ++limit.lines;
  if (limit.skipped > 0) {
    spdlog::warn(
        "{}: {} more line(s) like the next were not logged (at most {} per {} s; {} count every one)",
        source_, limit.skipped, lines_, window_.count(), counted_by_);
    limit.skipped = 0;
  }
  return true;
}

}  // namespace odb
