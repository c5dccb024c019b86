#include "src/daemon/store_lease.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

namespace odb {
namespace {

std::string TempDir(const std::string& name) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("odb-lease-" + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

void Touch(const std::string& path) { std::ofstream(path) << "stale"; }

TEST_CASE("a previous run's keys are removed by the first daemon of the next run") {
  const std::string dir = TempDir("stale");
  const std::string job = StoreLease::JobDir(dir, "myjob");
  std::filesystem::create_directories(job);
  Touch(job + "/1234567890");             // a Gloo key of a killed run
  Touch(job + "/odbd-rank-0.pid");        // its rank marker
  auto first = StoreLease::Acquire(dir, "myjob", 0);
  REQUIRE(first.ok());
  REQUIRE((*first)->removed_stale());
  REQUIRE(!std::filesystem::exists(job + "/1234567890"));
  // A second rank of the same run joins without removing anything.
  auto second = StoreLease::Acquire(dir, "myjob", 1);
  REQUIRE(second.ok());
  REQUIRE(!(*second)->removed_stale());
  REQUIRE(std::filesystem::exists(job + "/odbd-rank-0.pid"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a rank held by a live daemon of the same job id is refused, naming it") {
  const std::string dir = TempDir("collide");
  auto first = StoreLease::Acquire(dir, "shared", 0);
  REQUIRE(first.ok());
  auto again = StoreLease::Acquire(dir, "shared", 0);
  REQUIRE(again.status().code() == absl::StatusCode::kAlreadyExists);
  const std::string message(again.status().message());
  REQUIRE(message.find("job id 'shared' is in use") != std::string::npos);
  REQUIRE(message.find("pid " + std::to_string(getpid())) != std::string::npos);
  REQUIRE(message.find("--job-id") != std::string::npos);
  // Another job id in the same store is independent.
  REQUIRE(StoreLease::Acquire(dir, "other", 0).ok());
  std::filesystem::remove_all(dir);
}

TEST_CASE("the last daemon out removes the job's keys; the others leave them") {
  const std::string dir = TempDir("last");
  const std::string job = StoreLease::JobDir(dir, "j");
  auto a = StoreLease::Acquire(dir, "j", 0);
  auto b = StoreLease::Acquire(dir, "j", 1);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  Touch(job + "/key");
  a->reset();
  REQUIRE(std::filesystem::exists(job + "/key"));
  REQUIRE(!std::filesystem::exists(job + "/odbd-rank-0.pid"));
  b->reset();
  REQUIRE(!std::filesystem::exists(job));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace odb
