#ifndef ODB_SHM_POLL_THREAD_H_
#define ODB_SHM_POLL_THREAD_H_

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <thread>

namespace odb::shm {

// The thread of a small socket server (the daemon's arena registry, its step
// arena fd socket) that sleeps in poll(): Stop() sets stopping(), wakes the
// thread through a pipe whose read end it polls (wake_fd()), joins it and
// closes the pipe. Start and Stop from one thread; Stop is idempotent.
class PollThread {
 public:
  PollThread() = default;
  ~PollThread() { Stop(); }
  PollThread(const PollThread&) = delete;
  PollThread& operator=(const PollThread&) = delete;

  // Runs `serve` on the thread; false (errno set) when the pipe cannot be made.
  bool Start(std::function<void()> serve) {
    if (::pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) return false;
    thread_ = std::thread(std::move(serve));
    return true;
  }

  void Stop() {
    stop_.store(true);
    if (wake_[1] >= 0) {
      const char byte = 1;
      (void)!::write(wake_[1], &byte, 1);
    }
    if (thread_.joinable()) thread_.join();
    for (int& fd : wake_) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  }

  bool running() const { return thread_.joinable(); }
  bool stopping() const { return stop_.load(); }
  // Readable once Stop() was called: poll it next to the server's sockets.
  int wake_fd() const { return wake_[0]; }

 private:
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace odb::shm

#endif  // ODB_SHM_POLL_THREAD_H_
