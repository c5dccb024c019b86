#include "src/daemon/endpoint_lock.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

namespace odb {
namespace {

TEST_CASE("a second holder of the same rank and socket paths is refused, naming the first") {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("odb-lock-test-" + std::to_string(getpid()));
  auto paths = EndpointLock::PathsFor(dir, 3, {"ipc://" + dir + "/in.sock", "tcp://127.0.0.1:5555"});
  REQUIRE(paths.size() == 2);
  EndpointLock first;
  REQUIRE(first.Acquire(paths).ok());
  // flock locks belong to the open file description: a second open in the
  // same process conflicts like another process would.
  EndpointLock second;
  absl::Status s = second.Acquire(paths);
  REQUIRE(s.code() == absl::StatusCode::kAlreadyExists);
  REQUIRE(std::string(s.message()).find("pid " + std::to_string(getpid())) != std::string::npos);
  // Another rank in the same run_dir is fine.
  EndpointLock other_rank;
  REQUIRE(other_rank.Acquire(EndpointLock::PathsFor(dir, 4, {})).ok());
  std::filesystem::remove_all(dir);
}

TEST_CASE("the lock is released with its holder") {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("odb-lock-test2-" + std::to_string(getpid()));
  auto paths = EndpointLock::PathsFor(dir, 0, {});
  {
    EndpointLock first;
    REQUIRE(first.Acquire(paths).ok());
  }
  EndpointLock again;
  REQUIRE(again.Acquire(paths).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace odb
