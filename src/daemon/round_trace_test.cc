#include "src/daemon/round_trace.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace odb {
namespace {

std::string TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "odb_round_trace_XXXXXX").string();
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_CASE("round_trace: one line per round; opening again starts the file anew") {
  const std::string dir = TempDir();
  const std::string path = dir + "/rounds-0.txt";
  {
    auto trace = RoundTrace::Open(path);
    REQUIRE(trace.ok());
    (*trace)->Append(0, 10, 20, 5);
    (*trace)->Append(1, 30, 45, 7);
    CHECK((*trace)->written() == 2);
  }
  CHECK(Read(path) == "0 10 20 5\n1 30 45 7\n");
  {
    auto trace = RoundTrace::Open(path);
    REQUIRE(trace.ok());
    (*trace)->Append(0, 1, 2, 3);
  }
  CHECK(Read(path) == "0 1 2 3\n");
  std::filesystem::remove_all(dir);
}

// Two daemons given one path (no {rank} in it) both truncated it and wrote
// at their own offsets, over each other's lines.
TEST_CASE("round_trace: a second writer of the same file is refused and truncates nothing") {
  const std::string dir = TempDir();
  const std::string path = dir + "/rounds.txt";
  auto first = RoundTrace::Open(path);
  REQUIRE(first.ok());
  (*first)->Append(0, 1, 2, 3);
  auto second = RoundTrace::Open(path);
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(second.status().message()),
             Catch::Contains("round_trace") && Catch::Contains(path) &&
                 Catch::Contains("another process writes it") && Catch::Contains("{rank}"));
  (*first)->Append(1, 4, 5, 6);
  CHECK(Read(path) == "0 1 2 3\n1 4 5 6\n");
  first->reset();
  CHECK(RoundTrace::Open(path).ok());  // free again once the first is closed
  std::filesystem::remove_all(dir);
}

// A FIFO made odbd's start-up wait for ever (fopen blocks until a reader
// comes); a directory or a missing one is named too.
TEST_CASE("round_trace: a FIFO, a directory or a missing directory is refused at once, naming the path") {
  const std::string dir = TempDir();
  const std::string fifo = dir + "/trace.fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& path : {fifo, dir, dir + "/no/such/dir/trace.txt"}) {
    INFO(path);
    auto trace = RoundTrace::Open(path);
    REQUIRE_FALSE(trace.ok());
    CHECK_THAT(std::string(trace.status().message()),
               Catch::Contains("round_trace: cannot write '" + path + "'"));
  }
  CHECK_THAT(std::string(RoundTrace::Open(fifo).status().message()), Catch::Contains("regular file"));
  std::filesystem::remove_all(dir);
}

// A full disk (/dev/full answers every write with ENOSPC): the lines were
// lost without a word. Now each is counted, the failure logged, and Append
// returns at once (the round goes on).
TEST_CASE("round_trace: a full disk drops the lines, counted, without stopping the caller") {
  auto trace = RoundTrace::Open("/dev/full");
  REQUIRE(trace.ok());
  for (uint64_t round = 0; round < 100; ++round) (*trace)->Append(round, 1, 2, 3);
  CHECK((*trace)->written() == 0);
  CHECK((*trace)->dropped() == 100);
}

// The directory removed under a running daemon: the open file lives on
// (unlinked), the lines go into it without an error; nothing is dropped.
TEST_CASE("round_trace: a directory removed while the trace is open does not stop the writes") {
  const std::string dir = TempDir();
  auto trace = RoundTrace::Open(dir + "/rounds.txt");
  REQUIRE(trace.ok());
  (*trace)->Append(0, 1, 2, 3);
  std::filesystem::remove_all(dir);
  (*trace)->Append(1, 1, 2, 3);
  CHECK((*trace)->written() == 2);
  CHECK((*trace)->dropped() == 0);
}

}  // namespace
}  // namespace odb
