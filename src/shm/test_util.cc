#include "src/shm/test_util.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace odb::shm::testing {
namespace {

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

TempDir::TempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  const char* root = std::getenv("TEST_TMPDIR");
  const std::filesystem::path base =
      root != nullptr ? std::filesystem::path(root) : std::filesystem::temp_directory_path();
  path_ = (base / ("odb-shm-test-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++)))
              .string();
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

pid_t ForkChild(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  int code = 255;
  try {
    code = body();
  } catch (...) {
    code = 255;
  }
  std::fflush(nullptr);
  _exit(code);
}

int WaitChild(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

Pipe::Pipe() {
  if (pipe2(fds, O_CLOEXEC) != 0) fds[0] = fds[1] = -1;
}

Pipe::~Pipe() {
  CloseRead();
  CloseWrite();
}

void Pipe::CloseRead() {
  if (fds[0] >= 0) close(fds[0]);
  fds[0] = -1;
}

void Pipe::CloseWrite() {
  if (fds[1] >= 0) close(fds[1]);
  fds[1] = -1;
}

bool Pipe::Write(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fds[1], p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool Pipe::Read(void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = read(fds[0], p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool Pipe::Readable() {
  pollfd p{fds[0], POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

void FillPattern(std::byte* data, uint64_t length, uint64_t seed) {
  uint64_t state = seed;
  uint64_t i = 0;
  for (; i + 8 <= length; i += 8) {
    const uint64_t v = SplitMix(state);
    std::memcpy(data + i, &v, 8);
  }
  if (i < length) {
    const uint64_t v = SplitMix(state);
    std::memcpy(data + i, &v, length - i);
  }
}

int64_t FindPatternMismatch(const std::byte* data, uint64_t length, uint64_t seed) {
  uint64_t state = seed;
  uint64_t i = 0;
  for (; i + 8 <= length; i += 8) {
    const uint64_t v = SplitMix(state);
    if (std::memcmp(data + i, &v, 8) != 0) {
      for (uint64_t j = 0; j < 8; ++j) {
        if (data[i + j] != reinterpret_cast<const std::byte*>(&v)[j]) return static_cast<int64_t>(i + j);
      }
    }
  }
  if (i < length) {
    const uint64_t v = SplitMix(state);
    for (uint64_t j = 0; i + j < length; ++j) {
      if (data[i + j] != reinterpret_cast<const std::byte*>(&v)[j]) return static_cast<int64_t>(i + j);
    }
  }
  return -1;
}

}  // namespace odb::shm::testing
