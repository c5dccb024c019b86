#ifndef ODB_SHM_TEST_UTIL_H_
#define ODB_SHM_TEST_UTIL_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace odb::shm::testing {

// A fresh directory under $TEST_TMPDIR (or the system temp dir), removed with
// everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs `body` in a fork()ed child, which exits with its return value (255 when
// it throws). Catch2 is never entered in the child.
pid_t ForkChild(const std::function<int()>& body);
// Waits for `pid`; its exit code, or 128 + signal when a signal killed it.
int WaitChild(pid_t pid);

// A pipe with helpers to move fixed-size records (no sleeps anywhere: readers
// block in read(2)).
struct Pipe {
  Pipe();
  ~Pipe();
  void CloseRead();
  void CloseWrite();
  // false on EOF / error.
  bool Write(const void* data, size_t size);
  bool Read(void* data, size_t size);
  // Whether a read would not block right now (poll with a zero timeout).
  bool Readable();
  int fds[2] = {-1, -1};
};

// Deterministic bytes for (seed, length): what the writer puts in a block and
// the reader checks, every byte.
void FillPattern(std::byte* data, uint64_t length, uint64_t seed);
// The index of the first byte that differs, or -1.
int64_t FindPatternMismatch(const std::byte* data, uint64_t length, uint64_t seed);

}  // namespace odb::shm::testing

#endif  // ODB_SHM_TEST_UTIL_H_
