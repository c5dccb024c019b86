#include "src/shm/process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

namespace odb::shm {
namespace {

TEST_CASE("this process is alive with its own start time, not with another") {
  const uint64_t start = ProcessStartTicks(getpid());
  REQUIRE(start != 0);
  REQUIRE(IsProcessAlive(getpid(), start));
  REQUIRE(IsProcessAlive(getpid(), 0));
  REQUIRE_FALSE(IsProcessAlive(getpid(), start + 1));  // what pid reuse looks like
  REQUIRE_FALSE(IsProcessAlive(0, 0));
  REQUIRE_FALSE(IsProcessAlive(-1, 0));
}

TEST_CASE("a killed child is dead, zombie or reaped") {
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t child = fork();
  if (child == 0) {
    char c;
    (void)!read(ready[0], &c, 1);  // blocks until killed
    _exit(0);
  }
  const uint64_t start = ProcessStartTicks(child);
  REQUIRE(start != 0);
  REQUIRE(IsProcessAlive(child, start));
  REQUIRE(kill(child, SIGKILL) == 0);
  // Until it is reaped the child is a zombie; wait for that state (waitid with
  // WNOWAIT blocks until it has exited without reaping it).
  siginfo_t info{};
  REQUIRE(waitid(P_PID, child, &info, WEXITED | WNOWAIT) == 0);
  REQUIRE_FALSE(IsProcessAlive(child, start));
  REQUIRE(waitpid(child, nullptr, 0) == child);
  REQUIRE_FALSE(IsProcessAlive(child, start));
  REQUIRE(ProcessStartTicks(child) == 0);
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace odb::shm
