#include "src/shm/process.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace odb::shm {
namespace {

struct StatFields {
  bool found = false;   // /proc/<pid>/stat exists
  bool proc_ok = true;  // /proc is usable at all
  char state = '?';
  uint64_t start_ticks = 0;
};

StatFields ReadStat(pid_t pid) {
  StatFields out;
  if (pid <= 0) return out;
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT && errno != ESRCH) out.proc_ok = false;
    if (errno == ENOENT && ::access("/proc/self/stat", R_OK) != 0) out.proc_ok = false;
    return out;
  }
  char buf[1024];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof(buf) - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return out;  // the process went away between open and read
  buf[n] = '\0';
  // "pid (comm) S ppid ...": comm may hold spaces and parentheses, so fields
  // are counted from the last ')'.
  std::string line(buf, static_cast<size_t>(n));
  const size_t close_paren = line.rfind(')');
  if (close_paren == std::string::npos) return out;
  size_t pos = close_paren + 1;
  int field = 2;  // the field that ends at close_paren
  while (pos < line.size() && field < 22) {
    while (pos < line.size() && line[pos] == ' ') ++pos;
    ++field;
    const size_t end = line.find(' ', pos);
    const std::string token = line.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (field == 3 && !token.empty()) out.state = token[0];
    if (field == 22) out.start_ticks = std::strtoull(token.c_str(), nullptr, 10);
    if (end == std::string::npos) break;
    pos = end;
  }
  out.found = true;
  return out;
}

}  // namespace

uint64_t ProcessStartTicks(pid_t pid) {
  const StatFields s = ReadStat(pid);
  return s.found ? s.start_ticks : 0;
}

bool IsProcessAlive(pid_t pid, uint64_t start_ticks) {
  if (pid <= 0) return false;
  const StatFields s = ReadStat(pid);
  if (!s.proc_ok) return ::kill(pid, 0) == 0 || errno == EPERM;
  if (!s.found) return false;
  if (s.state == 'Z' || s.state == 'X' || s.state == 'x') return false;
  return start_ticks == 0 || s.start_ticks == start_ticks;
}

}  // namespace odb::shm
