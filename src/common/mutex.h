#ifndef ODB_COMMON_MUTEX_H_
#define ODB_COMMON_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace odb {

// std::mutex with Abseil's thread-safety annotations, so that clang's
// -Wthread-safety checks every ABSL_GUARDED_BY(mu) and
// ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) against the locks taken
// (tools/check_thread_safety.py). std::mutex itself carries no annotations,
// and absl::Mutex would change the daemon's locking primitive; this keeps
// std::mutex and std::condition_variable underneath.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Takes the mutex only if nobody holds it; true when taken (then the
  // caller unlocks it). For readers that must never wait behind a writer.
  bool try_lock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope (std::lock_guard, annotated).
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// std::condition_variable over a Mutex: waits with the mutex held (the
// caller's MutexLock), which the wait releases and takes again. Callers loop
// on their condition in the function that holds the lock (not in a predicate
// lambda: the analysis cannot see that a lambda runs under the lock).
class CondVar {
 public:
  void NotifyAll() { cv_.notify_all(); }

  // Waits until notified (spurious wake-ups included).
  void Wait(Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's lock releases it
  }

  // Waits until notified or `timeout` passed (spurious wake-ups included:
  // callers re-check their condition). True when notified.
  template <typename Rep, typename Period>
  bool WaitFor(Mutex& mu, std::chrono::duration<Rep, Period> timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const std::cv_status status = cv_.wait_for(lock, timeout);
    lock.release();  // still held: the caller's lock releases it
    return status == std::cv_status::no_timeout;
  }

  // Waits until notified or the steady clock reaches `deadline`. True when notified.
  bool WaitUntil(Mutex& mu, std::chrono::steady_clock::time_point deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const std::cv_status status = cv_.wait_until(lock, deadline);
    lock.release();
    return status == std::cv_status::no_timeout;
  }

 private:
  std::condition_variable cv_;
};

}  // namespace odb

#endif  // ODB_COMMON_MUTEX_H_
