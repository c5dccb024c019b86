#ifndef ODB_COMMON_CLOCK_H_
#define ODB_COMMON_CLOCK_H_

#include <atomic>
#include <chrono>

namespace odb {

// The daemon's notion of time, behind a seam: timeouts (dead producers, a
// lost trainer) are decided against Now(), so a test advances a FakeClock
// instead of waiting minutes.
class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class SteadyClock : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

// Thread-safe; starts at the real time of construction and moves only by Advance.
class FakeClock : public Clock {
 public:
  FakeClock() : now_(std::chrono::steady_clock::now().time_since_epoch().count()) {}
  TimePoint Now() const override { return TimePoint(TimePoint::duration(now_.load())); }
  void Advance(std::chrono::milliseconds d) {
    now_.fetch_add(std::chrono::duration_cast<TimePoint::duration>(d).count());
  }

 private:
  std::atomic<TimePoint::rep> now_;
};

}  // namespace odb

#endif  // ODB_COMMON_CLOCK_H_
