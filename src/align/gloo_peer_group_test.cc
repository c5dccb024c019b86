// Real Gloo, real TCP on 127.0.0.1: W = 3 ranks as threads in one process.
#include "src/align/gloo_peer_group.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "src/align/aligner.h"
#include "src/align/hello.h"
#include "src/align/planner.h"

namespace odb::align {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// As odbd's main does (see gloo_peer_group.h): without it, a rank writing to
// a peer that just died is killed by SIGPIPE (seen: 1 run in 48 of "dies").
const bool kSigpipeIgnored = [] { return signal(SIGPIPE, SIG_IGN) != SIG_ERR; }();

std::string TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "odb_gloo_XXXXXX").string();
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

GlooPeerGroupOptions Opts(int rank, int world, const std::string& dir, const std::string& job) {
  GlooPeerGroupOptions o;
  o.rank = rank;
  o.world_size = world;
  o.job_id = job;
  o.file_store_dir = dir;
  o.hostname = "127.0.0.1";
  o.connect_timeout = milliseconds(10000);
  o.collective_timeout = milliseconds(5000);
  o.hello = AlignmentHelloFields(LocalPlanner(PlannerConfig{}), world);
  return o;
}

// Runs fn(rank) on W threads and joins them.
void OnRanks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

void CheckAllGather(const std::function<GlooPeerGroupOptions(int)>& make) {
  constexpr int kWorld = 3;
  std::vector<absl::Status> status(kWorld);
  std::vector<std::vector<std::vector<std::string>>> got(kWorld);
  OnRanks(kWorld, [&](int r) {
    auto g = GlooPeerGroup::Connect(make(r));
    if (!g.ok()) {
      status[r] = g.status();
      return;
    }
    for (int round = 0; round < 20; ++round) {
      // Variable sizes, including an empty contribution.
      const size_t n = (r == 1 && round % 4 == 0) ? 0 : static_cast<size_t>((r + 1) * 37 * (round + 1));
      std::string mine(n, static_cast<char>('a' + r));
      if (!mine.empty()) mine[0] = static_cast<char>(round);
      auto out = (*g)->AllGather(mine);
      if (!out.ok()) {
        status[r] = out.status();
        return;
      }
      got[r].push_back(*out);
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO(status[r].ToString());
    REQUIRE(status[r].ok());
    REQUIRE(got[r].size() == 20);
    for (int round = 0; round < 20; ++round) {
      REQUIRE(got[r][round].size() == kWorld);
      for (int p = 0; p < kWorld; ++p) {
        const size_t n = (p == 1 && round % 4 == 0) ? 0 : static_cast<size_t>((p + 1) * 37 * (round + 1));
        const std::string& s = got[r][round][p];
        REQUIRE(s.size() == n);
        if (n > 0) {
          REQUIRE(s[0] == static_cast<char>(round));
          REQUIRE(s.back() == static_cast<char>('a' + p));
        }
      }
    }
  }
}

void CheckMismatch(const std::function<GlooPeerGroupOptions(int)>& make) {
  constexpr int kWorld = 3;
  std::vector<absl::Status> status(kWorld);
  OnRanks(kWorld, [&](int r) {
    GlooPeerGroupOptions o = make(r);
    if (r == 2) {
      PlannerConfig cfg;
      cfg.budget.max_tokens = 8192;
      o.hello = AlignmentHelloFields(LocalPlanner(cfg), kWorld);
    }
    status[r] = GlooPeerGroup::Connect(o).status();
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << status[r].ToString());
    REQUIRE(status[r].code() == absl::StatusCode::kFailedPrecondition);
    const std::string msg(status[r].message());
    REQUIRE(msg.find("rank 2 has budget.max_tokens=8192 but rank 0 has budget.max_tokens=4096") != std::string::npos);
  }
}

TEST_CASE("gloo over FileStore: variable-size all-gather on 3 ranks", "[gloo]") {
  const std::string dir = TempDir();
  CheckAllGather([&](int r) { return Opts(r, 3, dir, "allgather"); });
  std::filesystem::remove_all(dir);
}

TEST_CASE("gloo over FileStore: a config mismatch is refused on every rank", "[gloo]") {
  const std::string dir = TempDir();
  CheckMismatch([&](int r) { return Opts(r, 3, dir, "mismatch"); });
  std::filesystem::remove_all(dir);
}

TEST_CASE("gloo over FileStore: an absent peer fails within the connect timeout", "[gloo]") {
  const std::string dir = TempDir();
  std::vector<absl::Status> status(2);
  std::vector<double> seconds(2);
  OnRanks(2, [&](int r) {  // rank 2 of 3 never starts
    GlooPeerGroupOptions o = Opts(r, 3, dir, "absent");
    o.connect_timeout = milliseconds(1500);
    const auto t0 = Clock::now();
    status[r] = GlooPeerGroup::Connect(o).status();
    seconds[r] = std::chrono::duration<double>(Clock::now() - t0).count();
  });
  for (int r = 0; r < 2; ++r) {
    INFO(status[r].ToString());
    REQUIRE(status[r].code() == absl::StatusCode::kDeadlineExceeded);
    REQUIRE(std::string(status[r].message()).find("peer rank 2 did not reach the rendezvous") != std::string::npos);
    REQUIRE(seconds[r] < 15.0);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("gloo over FileStore: a peer that dies mid-run turns into an error on the others", "[gloo]") {
  const std::string dir = TempDir();
  std::vector<absl::Status> status(3);
  std::vector<double> seconds(3);
  OnRanks(3, [&](int r) {
    GlooPeerGroupOptions o = Opts(r, 3, dir, "dies");
    o.collective_timeout = milliseconds(2000);
    auto g = GlooPeerGroup::Connect(o);
    if (!g.ok()) {
      status[r] = g.status();
      return;
    }
    REQUIRE((*g)->AllGather("x").ok());
    if (r == 2) return;  // "dies": its context is destroyed, sockets close
    const auto t0 = Clock::now();
    absl::Status s;
    for (int i = 0; i < 3 && s.ok(); ++i) s = (*g)->AllGather("y").status();
    status[r] = s;
    seconds[r] = std::chrono::duration<double>(Clock::now() - t0).count();
    // A failed group stays failed.
    REQUIRE_FALSE((*g)->AllGather("z").ok());
  });
  for (int r = 0; r < 2; ++r) {
    INFO(status[r].ToString());
    REQUIRE_FALSE(status[r].ok());
    REQUIRE(seconds[r] < 20.0);
  }
  std::filesystem::remove_all(dir);
}

// Byte i of rank r's message in round k: distinct per rank, round and position.
std::string Message(int r, int round, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((r * 131 + round * 17 + i) % 251);
  return s;
}

// A rank that is connected but never enters the collective (alive, silent):
// the others fail within about collective_timeout and name it, with the ring
// and with the log all-gather alike (Bruck's waits are bounded by what is
// left of the collective's time).
TEST_CASE("gloo: a silent peer is named by the others within the collective timeout, ring and log", "[gloo]") {
  for (const bool log_gather : {false, true}) {
    INFO((log_gather ? "log all-gather" : "ring"));
    const std::string dir = TempDir();
    constexpr int kWorld = 3;
    std::vector<absl::Status> status(kWorld);
    std::vector<double> seconds(kWorld);
    std::atomic<int> done{0};
    OnRanks(kWorld, [&](int r) {
      GlooPeerGroupOptions o = Opts(r, kWorld, dir, log_gather ? "silent_log" : "silent_ring");
      o.collective_timeout = milliseconds(1000);
      o.log_allgather_min_ranks = log_gather ? 1 : 1000;
      auto g = GlooPeerGroup::Connect(o);
      if (!g.ok()) {
        status[r] = g.status();
        return;
      }
      REQUIRE((*g)->UsesLogAllGather() == log_gather);
      if (r == 2) {
        // Silent: holds its connections open until the others have failed.
        const auto deadline = Clock::now() + std::chrono::seconds(30);
        while (done.load() < kWorld - 1 && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
        return;
      }
      const auto t0 = Clock::now();
      status[r] = (*g)->AllGather(Message(r, 0, 300)).status();
      seconds[r] = std::chrono::duration<double>(Clock::now() - t0).count();
      done.fetch_add(1);
    });
    for (int r = 0; r < kWorld - 1; ++r) {
      INFO("rank " << r << ": " << status[r].ToString());
      REQUIRE(status[r].code() == absl::StatusCode::kUnavailable);
      REQUIRE(std::string(status[r].message()).find("rank 2") != std::string::npos);
      REQUIRE(seconds[r] < 15.0);
    }
    std::filesystem::remove_all(dir);
  }
}

// A peer whose size header is garbage (a corrupt frame, another program on
// the port, a different odbd): huge, "negative" (2^64 - 1 as a signed
// size), over the per-message limit, or within it but over the all-gather's
// total. Every rank, the liar included, fails the all-gather with an error
// naming the rank and the size, before any buffer is sized from it (2^39
// bytes used to become a 512 GiB overflow buffer: std::bad_alloc on this
// machine, an 8 GiB one would simply have been allocated), ring and log alike.
// A size that is within the limits is honoured: the liar's bytes are cut or
// zero-padded to it and the group keeps working.
TEST_CASE("gloo: a peer announcing a garbage message size is refused by every rank, ring and log", "[gloo]") {
  struct Lie {
    uint64_t size;
    std::string expected;
  };
  const size_t kMaxMessage = size_t{1} << 20;
  const std::vector<Lie> lies = {
      {uint64_t{1} << 39, "rank 1 announced a message of 549755813888 bytes, over the limit of 1048576 per rank"},
      {~uint64_t{0}, "rank 1 announced a message of 18446744073709551615 bytes"},
      {kMaxMessage + 1, "rank 1 announced a message of 1048577 bytes, over the limit"},
      // Each within the per-message limit; rank 0 (1 MiB) and rank 1 (1 MiB) together over 2 MiB - 1.
      {kMaxMessage, "ranks 0-1 announced"},
  };
  for (const bool log_gather : {false, true}) {
    for (const Lie& lie : lies) {
      INFO((log_gather ? "log all-gather" : "ring") << ", rank 1 announces " << lie.size);
      const std::string dir = TempDir();
      constexpr int kWorld = 3;
      std::vector<absl::Status> status(kWorld);
      const bool over_total = lie.size == kMaxMessage;
      OnRanks(kWorld, [&](int r) {
        GlooPeerGroupOptions o = Opts(r, kWorld, dir, "garbage");
        o.log_allgather_min_ranks = log_gather ? 1 : 1000;
        o.max_message_bytes = kMaxMessage;
        o.max_gather_bytes = over_total ? 2 * kMaxMessage - 1 : 64 * kMaxMessage;
        auto g = GlooPeerGroup::Connect(o);
        if (!g.ok()) {
          status[r] = g.status();
          return;
        }
        // One honest round first: the slot is sized, the group works.
        auto first = (*g)->AllGather(Message(r, 0, 300));
        if (!first.ok()) {
          status[r] = first.status();
          return;
        }
        if (r == 1) (*g)->AnnounceSizeForTest(lie.size);
        // Rank 0 announces its true size: with the total case it is the
        // largest one, so ranks 0-1 pass the total only together.
        status[r] = (*g)->AllGather(Message(r, 1, over_total && r == 0 ? kMaxMessage : 300)).status();
      });
      for (int r = 0; r < kWorld; ++r) {
        INFO("rank " << r << ": " << status[r].ToString());
        REQUIRE(status[r].code() == absl::StatusCode::kDataLoss);
        REQUIRE(std::string(status[r].message()).find(lie.expected) != std::string::npos);
      }
      std::filesystem::remove_all(dir);
    }
  }
}

// The limits' edges: a header of exactly max_message_bytes, all headers
// together exactly max_gather_bytes, and an empty message are taken (and the
// group stays in step); one byte over the total is refused on every rank.
// A rank whose own, true message is over the limit is told so (its window),
// the others name it.
TEST_CASE(
    "gloo: headers at exactly the limits or empty are taken, one byte over is not; an honest oversized "
    "message is named as such",
    "[gloo]") {
  const size_t kMaxMessage = size_t{1} << 20;
  constexpr size_t kSmall = 300;
  constexpr int kWorld = 3;
  for (const bool log_gather : {false, true}) {
    for (const size_t over : {size_t{0}, size_t{1}}) {
      INFO((log_gather ? "log all-gather" : "ring") << ", total " << over << " byte(s) over");
      const std::string dir = TempDir();
      std::vector<absl::Status> status(kWorld);
      std::vector<std::vector<std::string>> at_max(kWorld), empty(kWorld), after(kWorld);
      OnRanks(kWorld, [&](int r) {
        GlooPeerGroupOptions o = Opts(r, kWorld, dir, "edges");
        o.log_allgather_min_ranks = log_gather ? 1 : 1000;
        o.max_message_bytes = kMaxMessage;
        o.max_gather_bytes = kMaxMessage + 2 * kSmall - over;  // rank 1 at the message limit, 0 and 2 small
        auto g = GlooPeerGroup::Connect(o);
        if (!g.ok()) {
          status[r] = g.status();
          return;
        }
        const auto step = [&](std::optional<uint64_t> announce, int round, std::vector<std::string>& out) {
          if (r == 1) (*g)->AnnounceSizeForTest(announce);
          auto got = (*g)->AllGather(Message(r, round, kSmall));
          if (!got.ok()) {
            status[r] = got.status();
            return false;
          }
          out = *got;
          return true;
        };
        if (!step(kMaxMessage, 0, at_max[r])) return;
        if (!step(0, 1, empty[r])) return;
        step(std::nullopt, 2, after[r]);
      });
      for (int r = 0; r < kWorld; ++r) {
        INFO("rank " << r << ": " << status[r].ToString());
        if (over > 0) {
          REQUIRE(status[r].code() == absl::StatusCode::kDataLoss);
          REQUIRE_THAT(std::string(status[r].message()),
                       Catch::Contains("ranks 0-2 announced " + std::to_string(kMaxMessage + 2 * kSmall) +
                                       " bytes together, over the limit of " +
                                       std::to_string(kMaxMessage + 2 * kSmall - 1)));
          continue;
        }
        REQUIRE(status[r].ok());
        std::string padded = Message(1, 0, kSmall);
        padded.resize(kMaxMessage, '\0');
        REQUIRE(at_max[r][1] == padded);
        REQUIRE(empty[r][1].empty());
        for (int p = 0; p < kWorld; ++p) {
          if (p != 1) REQUIRE(at_max[r][p] == Message(p, 0, kSmall));
          REQUIRE(after[r][p] == Message(p, 2, kSmall));
        }
      }
      std::filesystem::remove_all(dir);
    }
    // Rank 0's own message is one byte over: no peer lied.
    const std::string dir = TempDir();
    std::vector<absl::Status> status(kWorld);
    OnRanks(kWorld, [&](int r) {
      GlooPeerGroupOptions o = Opts(r, kWorld, dir, "honest");
      o.log_allgather_min_ranks = log_gather ? 1 : 1000;
      o.max_message_bytes = kMaxMessage;
      auto g = GlooPeerGroup::Connect(o);
      if (!g.ok()) {
        status[r] = g.status();
        return;
      }
      status[r] = (*g)->AllGather(Message(r, 0, r == 0 ? kMaxMessage + 1 : kSmall)).status();
    });
    for (int r = 0; r < kWorld; ++r) {
      INFO("rank " << r << ": " << status[r].ToString());
      REQUIRE(status[r].code() == absl::StatusCode::kDataLoss);
      const std::string msg(status[r].message());
      REQUIRE_THAT(msg, Catch::Contains("rank 0 announced a message of " + std::to_string(kMaxMessage + 1)));
      if (r == 0) {
        REQUIRE_THAT(msg, Catch::Contains("this rank's own message") && Catch::Contains("grouping.window"));
      } else {
        REQUIRE_THAT(msg, Catch::Contains("corrupt header"));
      }
    }
    std::filesystem::remove_all(dir);
  }
}

// Within the limits a peer's header is taken at its word: bytes past what
// it holds are zeros, and every rank agrees on them (no rank reads past a
// buffer, the group stays in step for the next call).
TEST_CASE("gloo: a peer announcing more or fewer bytes than it has, within the limits, keeps the group in step", "[gloo]") {
  for (const bool log_gather : {false, true}) {
    for (const uint64_t lie : {uint64_t{10}, uint64_t{5000}}) {
      INFO((log_gather ? "log all-gather" : "ring") << ", rank 1 announces " << lie << " of 300 bytes");
      const std::string dir = TempDir();
      constexpr int kWorld = 3;
      std::vector<absl::Status> status(kWorld);
      std::vector<std::vector<std::string>> lied(kWorld), after(kWorld);
      OnRanks(kWorld, [&](int r) {
        GlooPeerGroupOptions o = Opts(r, kWorld, dir, "short");
        o.log_allgather_min_ranks = log_gather ? 1 : 1000;
        auto g = GlooPeerGroup::Connect(o);
        if (!g.ok()) {
          status[r] = g.status();
          return;
        }
        if (r == 1) (*g)->AnnounceSizeForTest(lie);
        auto out = (*g)->AllGather(Message(r, 0, 300));
        if (r == 1) (*g)->AnnounceSizeForTest(std::nullopt);
        if (!out.ok()) {
          status[r] = out.status();
          return;
        }
        lied[r] = *out;
        auto next = (*g)->AllGather(Message(r, 1, 300));
        if (!next.ok()) {
          status[r] = next.status();
          return;
        }
        after[r] = *next;
      });
      const std::string truth = Message(1, 0, 300);
      std::string expected = truth.substr(0, std::min<size_t>(lie, truth.size()));
      expected.resize(lie, '\0');
      for (int r = 0; r < kWorld; ++r) {
        INFO("rank " << r << ": " << status[r].ToString());
        REQUIRE(status[r].ok());
        REQUIRE(lied[r][1] == expected);
        REQUIRE(lied[r][0] == Message(0, 0, 300));
        for (int p = 0; p < kWorld; ++p) REQUIRE(after[r][p] == Message(p, 1, 300));
      }
      std::filesystem::remove_all(dir);
    }
  }
}

TEST_CASE("gloo: one collective per all-gather while messages fit the slot; growth, overflow, shrink", "[gloo]") {
  const std::string dir = TempDir();
  constexpr int kWorld = 3;
  constexpr size_t kMin = GlooPeerGroup::kMinSlotBytes;
  constexpr size_t kMax = GlooPeerGroup::kMaxSlotBytes;
  // sizes[round][rank], with whether the round needs the second collective
  // (some rank's message is larger than the slot the round starts with).
  struct Round {
    std::vector<size_t> sizes;
    bool overflows;
  };
  const std::vector<Round> rounds = {
      {{0, 10, 20}, false},                // differing sizes and an empty one, within the first slot
      {{0, 0, 0}, false},                  // all empty
      {{kMin, 1, kMin}, false},            // exactly the slot
      {{5000, 3, 0}, true},                // growth beyond the slot: the rest in a second collective
      {{4000, 0, 6000}, false},            // the slot grew with headroom: one collective
      {{3 * kMax, 7, 100}, true},          // beyond the largest slot
      {{kMax, kMax, kMax}, false},         // the slot stops at kMaxSlotBytes
      {{10, 10, 10}, false},               // small again: the slot stays for kSlotMemory calls
      {{200, 0, 100}, false},
      {{0, 0, 1}, false},
      {{5, 5, 5}, false},                  // the 4th small call: the slot shrinks after this
      {{200, 0, 100}, false},              // fits the shrunk slot
      {{kMin + 1, kMin + 1, kMin + 1}, true},  // every rank just over the slot
      {{0, 0, 1}, false},
  };
  static_assert(GlooPeerGroup::kSlotMemory == 4, "the rounds above shrink the slot after 4 small calls");
  std::vector<absl::Status> status(kWorld);
  std::vector<std::vector<std::vector<std::string>>> got(kWorld);
  std::vector<std::vector<size_t>> slots(kWorld);
  std::vector<std::vector<uint64_t>> overflows(kWorld);
  OnRanks(kWorld, [&](int r) {
    auto g = GlooPeerGroup::Connect(Opts(r, kWorld, dir, "slots"));
    if (!g.ok()) {
      status[r] = g.status();
      return;
    }
    overflows[r].push_back((*g)->Overflows());  // after the hello at connect
    for (size_t k = 0; k < rounds.size(); ++k) {
      slots[r].push_back((*g)->SlotBytes());
      auto out = (*g)->AllGather(Message(r, static_cast<int>(k), rounds[k].sizes[r]));
      if (!out.ok()) {
        status[r] = out.status();
        return;
      }
      got[r].push_back(*out);
      overflows[r].push_back((*g)->Overflows());
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << status[r].ToString());
    REQUIRE(status[r].ok());
    REQUIRE(got[r].size() == rounds.size());
    REQUIRE(slots[r] == slots[0]);  // every rank agrees on the slot without talking
    for (size_t k = 0; k < rounds.size(); ++k) {
      INFO("round " << k << ", slot " << slots[r][k]);
      REQUIRE(got[r][k].size() == kWorld);
      for (int p = 0; p < kWorld; ++p) REQUIRE(got[r][k][p] == Message(p, static_cast<int>(k), rounds[k].sizes[p]));
      // The second collective ran exactly when some message exceeded the round's slot.
      const size_t largest = *std::max_element(rounds[k].sizes.begin(), rounds[k].sizes.end());
      REQUIRE((largest > slots[r][k]) == rounds[k].overflows);
      REQUIRE(overflows[r][k + 1] - overflows[r][k] == (rounds[k].overflows ? 1u : 0u));
    }
    REQUIRE(slots[r][4] >= 6000);  // grew after the 5000-byte message
    REQUIRE(slots[r][6] == kMax);  // capped
    for (size_t k = 7; k <= 10; ++k) REQUIRE(slots[r][k] == kMax);  // kept while a recent call wanted it
    REQUIRE(slots[r][11] < 1000);  // shrank after kSlotMemory small calls
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("gloo: one rank's large messages overflow instead of padding every rank's slot", "[gloo]") {
  const std::string dir = TempDir();
  constexpr int kWorld = 5;
  constexpr size_t kLarge = 40000;
  constexpr int kSkewed = 4;  // rounds in which rank 0 alone sends kLarge bytes
  std::vector<absl::Status> status(kWorld);
  std::vector<std::vector<size_t>> slots(kWorld);
  std::vector<uint64_t> skewed_overflows(kWorld), balanced_overflows(kWorld);
  std::vector<std::vector<std::string>> last(kWorld);
  OnRanks(kWorld, [&](int r) {
    auto g = GlooPeerGroup::Connect(Opts(r, kWorld, dir, "skewed"));
    if (!g.ok()) {
      status[r] = g.status();
      return;
    }
    const uint64_t start = (*g)->Overflows();
    for (int k = 0; k < kSkewed; ++k) {
      auto out = (*g)->AllGather(Message(r, k, r == 0 ? kLarge : 8));
      if (!out.ok()) {
        status[r] = out.status();
        return;
      }
      slots[r].push_back((*g)->SlotBytes());
      last[r] = *out;
    }
    skewed_overflows[r] = (*g)->Overflows() - start;
    // Then every rank sends as much: one overflow while the slot grows, then one collective.
    for (int k = 0; k < 3; ++k) {
      auto out = (*g)->AllGather(Message(r, 100 + k, kLarge));
      if (!out.ok()) {
        status[r] = out.status();
        return;
      }
    }
    balanced_overflows[r] = (*g)->Overflows() - start - skewed_overflows[r];
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << status[r].ToString());
    REQUIRE(status[r].ok());
    for (int p = 0; p < kWorld; ++p) REQUIRE(last[r][p] == Message(p, kSkewed - 1, p == 0 ? kLarge : 8));
    // The slots of all ranks hold at most kPaddingFactor x the round's bytes (rounded to 64 each).
    for (size_t slot : slots[r]) {
      REQUIRE(slot * kWorld <= GlooPeerGroup::kPaddingFactor * (kLarge + 8 * (kWorld - 1)) + 64 * kWorld);
    }
    REQUIRE(skewed_overflows[r] == kSkewed);  // rank 0's message never fits: the others are not padded to it
    REQUIRE(balanced_overflows[r] == 1);
  }
  std::filesystem::remove_all(dir);
}

// Rank r's message size in round k of the all-gather checks below: empty,
// uneven, one sender beyond the slot, every rank beyond it (uneven), and
// mixes, so that both the slot's collective and the overflow's run with
// zero-byte blocks somewhere.
size_t PatternSize(int r, int world, int k) {
  switch (k % 7) {
    case 0: return 0;                                                             // all empty
    case 1: return r % 3 == 1 ? 0 : static_cast<size_t>(r * 53 + 7 * k) % 240;   // uneven, within the slot
    case 2: return r == world - 1 ? 3000 : 0;                                     // one sender, over the slot
    case 3: return static_cast<size_t>(r + 1) * 700;                              // every rank over the slot
    case 4: return r % 2 == 0 ? 5000 + static_cast<size_t>(r) : 1;                // half over, half tiny
    case 5: return r == 0 ? 1 : 0;                                                // one tiny sender
    default: return static_cast<size_t>(world - r) * 31;                          // uneven, decreasing
  }
}

// Every rank's bytes in rank order on every rank, W = 1..9 (powers of two
// and not), with the log all-gather (Bruck) or Gloo's ring.
void CheckAllGatherPatterns(bool log_gather) {
  constexpr int kRounds = 14;  // each pattern twice, with different slots the second time
  const std::string dir = TempDir();
  for (int world = 1; world <= 9; ++world) {
    INFO("W = " << world << (log_gather ? ", log all-gather" : ", ring"));
    std::vector<absl::Status> status(world);
    std::vector<std::vector<std::vector<std::string>>> got(world);
    std::vector<int> used_log(world, -1);
    std::vector<uint64_t> overflows(world);
    OnRanks(world, [&](int r) {
      GlooPeerGroupOptions o = Opts(r, world, dir, "patterns" + std::to_string(world) + (log_gather ? "l" : "r"));
      o.log_allgather_min_ranks = log_gather ? 1 : 1000;
      auto g = GlooPeerGroup::Connect(o);
      if (!g.ok()) {
        status[r] = g.status();
        return;
      }
      used_log[r] = (*g)->UsesLogAllGather() ? 1 : 0;
      const uint64_t start = (*g)->Overflows();
      for (int k = 0; k < kRounds; ++k) {
        auto out = (*g)->AllGather(Message(r, k, PatternSize(r, world, k)));
        if (!out.ok()) {
          status[r] = out.status();
          return;
        }
        got[r].push_back(*out);
      }
      overflows[r] = (*g)->Overflows() - start;
    });
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r << ": " << status[r].ToString());
      REQUIRE(status[r].ok());
      REQUIRE(used_log[r] == (log_gather ? 1 : 0));
      REQUIRE(got[r].size() == static_cast<size_t>(kRounds));
      for (int k = 0; k < kRounds; ++k) {
        INFO("round " << k);
        REQUIRE(got[r][k].size() == static_cast<size_t>(world));
        for (int p = 0; p < world; ++p) REQUIRE(got[r][k][p] == Message(p, k, PatternSize(p, world, k)));
      }
      // The messages beyond the slot went through the second all-gather.
      REQUIRE(overflows[r] >= 2);
      REQUIRE(overflows[r] == overflows[0]);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("gloo: the log all-gather (Bruck) gives every rank's bytes in rank order, W = 1..9", "[gloo]") {
  CheckAllGatherPatterns(/*log_gather=*/true);
}

TEST_CASE("gloo: Gloo's ring gives the same, W = 1..9", "[gloo]") { CheckAllGatherPatterns(/*log_gather=*/false); }

// A partitioned round's world-wide collectives alternate between a small
// summary from every rank and the larger per-step token totals: the slot
// must fit both, or one of them overflows in every round.
TEST_CASE("gloo: all-gathers that alternate between two sizes keep one collective each", "[gloo]") {
  const std::string dir = TempDir();
  constexpr int kWorld = 5;
  constexpr int kCycles = 6;
  constexpr size_t kSmall = 41, kLarge = 1140;  // > kMinSlotBytes, < kPaddingFactor x the mean
  static_assert(kLarge > GlooPeerGroup::kMinSlotBytes);
  std::vector<absl::Status> status(kWorld);
  std::vector<uint64_t> overflows(kWorld);
  std::vector<std::vector<std::string>> last(kWorld);
  OnRanks(kWorld, [&](int r) {
    auto g = GlooPeerGroup::Connect(Opts(r, kWorld, dir, "alternate"));
    if (!g.ok()) {
      status[r] = g.status();
      return;
    }
    const uint64_t start = (*g)->Overflows();
    for (int k = 0; k < 2 * kCycles; ++k) {
      auto out = (*g)->AllGather(Message(r, k, k % 2 == 0 ? kSmall : kLarge));
      if (!out.ok()) {
        status[r] = out.status();
        return;
      }
      last[r] = *out;
    }
    overflows[r] = (*g)->Overflows() - start;
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << status[r].ToString());
    REQUIRE(status[r].ok());
    for (int p = 0; p < kWorld; ++p) REQUIRE(last[r][p] == Message(p, 2 * kCycles - 1, kLarge));
    REQUIRE(overflows[r] == 1);  // the first large call only: the slot grew and stayed
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("gloo: Split(color) makes working sub-groups; the parent stays usable", "[gloo]") {
  const std::string dir = TempDir();
  constexpr int kWorld = 4;
  std::vector<absl::Status> status(kWorld);
  std::vector<std::string> log(kWorld);  // what each rank saw, checked below
  OnRanks(kWorld, [&](int r) {
    auto fail = [&](const absl::Status& s) { status[r] = s; };
    auto g = GlooPeerGroup::Connect(Opts(r, kWorld, dir, "split"));
    if (!g.ok()) return fail(g.status());
    // Two sub-groups of two: colors 0 (ranks 0, 2) and 1 (ranks 1, 3).
    auto sub = (*g)->Split(r % 2);
    if (!sub.ok()) return fail(sub.status());
    log[r] += "sub " + std::to_string((*sub)->Rank()) + "/" + std::to_string((*sub)->Size()) + ":";
    for (int round = 0; round < 3; ++round) {
      auto out = (*sub)->AllGather("r" + std::to_string(r) + std::string(static_cast<size_t>(round * 600), 'x'));
      if (!out.ok()) return fail(out.status());
      for (const std::string& s : *out) log[r] += " " + s.substr(0, 2) + "+" + std::to_string(s.size() - 2);
      log[r] += ";";
    }
    // The parent still works, interleaved with the sub-group.
    auto all = (*g)->AllGather(std::to_string(r));
    if (!all.ok()) return fail(all.status());
    log[r] += " parent";
    for (const std::string& s : *all) log[r] += " " + s;
    // A second split with other colors (one group of 3, one alone) gets keys of its own.
    auto again = (*g)->Split(r == 3 ? 7 : -1);
    if (!again.ok()) return fail(again.status());
    auto out = (*again)->AllGather(std::to_string(r));
    if (!out.ok()) return fail(out.status());
    log[r] += "; again " + std::to_string((*again)->Rank()) + "/" + std::to_string((*again)->Size()) + ":";
    for (const std::string& s : *out) log[r] += " " + s;
    auto sub_again = (*sub)->AllGather("z");  // the first sub-group is still usable too
    if (!sub_again.ok()) return fail(sub_again.status());
  });
  const std::vector<std::string> expected = {
      "sub 0/2: r0+0 r2+0; r0+600 r2+600; r0+1200 r2+1200; parent 0 1 2 3; again 0/3: 0 1 2",
      "sub 0/2: r1+0 r3+0; r1+600 r3+600; r1+1200 r3+1200; parent 0 1 2 3; again 1/3: 0 1 2",
      "sub 1/2: r0+0 r2+0; r0+600 r2+600; r0+1200 r2+1200; parent 0 1 2 3; again 2/3: 0 1 2",
      "sub 1/2: r1+0 r3+0; r1+600 r3+600; r1+1200 r3+1200; parent 0 1 2 3; again 0/1: 3",
  };
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << status[r].ToString());
    REQUIRE(status[r].ok());
    REQUIRE(log[r] == expected[r]);
  }
  std::filesystem::remove_all(dir);
}

// ---- A peer process stopped (SIGSTOP) past the collective timeout. ----
// Rank 1 runs in a child process (this binary again, running the hidden test
// below), so that stopping it stops every thread of that rank and nothing else.

constexpr char kStoppedChild[] = "gloo: rank 1 of the SIGSTOP test (run by it)";

GlooPeerGroupOptions StopOpts(int rank, const std::string& dir) {
  GlooPeerGroupOptions o = Opts(rank, 2, dir, "stopped");
  o.collective_timeout = milliseconds(1000);
  return o;
}

TEST_CASE(kStoppedChild, "[.]") {
  const char* dir = std::getenv("ODB_STOP_TEST_DIR");
  if (dir == nullptr) return;  // only meaningful when started by the test below
  std::string message = "no failure";
  auto g = GlooPeerGroup::Connect(StopOpts(1, dir));
  if (!g.ok()) {
    message = "connect: " + g.status().ToString();
  } else {
    for (int i = 0; i < 100; ++i) {  // the parent stops this process in the second all-gather
      auto out = (*g)->AllGather("child");
      if (!out.ok()) {
        message = std::string(out.status().message());
        break;
      }
    }
  }
  const std::string tmp = std::string(dir) + "/child.tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs(message.c_str(), f);
  std::fclose(f);
  std::filesystem::rename(tmp, std::string(dir) + "/child.txt");
}

TEST_CASE("gloo: a peer stopped past the timeout is named; once resumed, it says it was stopped", "[gloo]") {
  const std::string dir = TempDir();
  const std::string env = "ODB_STOP_TEST_DIR=" + dir;
  char* const envp[] = {const_cast<char*>(env.c_str()), nullptr};
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    execle("/proc/self/exe", "gloo_peer_group_test", kStoppedChild, static_cast<char*>(nullptr), envp);
    _exit(127);
  }
  // A failed REQUIRE below must not leave a stopped child behind.
  struct Reaper {
    pid_t pid;
    bool reaped = false;
    ~Reaper() {
      if (!reaped) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } reaper{child};
  auto g = GlooPeerGroup::Connect(StopOpts(0, dir));
  REQUIRE(g.ok());
  REQUIRE((*g)->AllGather("parent").ok());
  // The child is now in (or on its way to) its second all-gather, waiting for this rank.
  REQUIRE(kill(child, SIGSTOP) == 0);
  int wstatus = 0;
  REQUIRE(waitpid(child, &wstatus, WUNTRACED) == child);
  REQUIRE(WIFSTOPPED(wstatus));
  const auto t0 = Clock::now();
  const absl::Status waited = (*g)->AllGather("parent").status();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  REQUIRE(kill(child, SIGCONT) == 0);
  // The child fails on resuming (this rank dropped the connections) and writes its error.
  pid_t done = 0;
  for (int i = 0; i < 600 && done == 0; ++i) {  // 30 s
    done = waitpid(child, &wstatus, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(milliseconds(50));
  }
  REQUIRE(done == child);
  reaper.reaped = true;
  REQUIRE(WIFEXITED(wstatus));
  std::string stopped;
  if (FILE* f = std::fopen((dir + "/child.txt").c_str(), "r")) {
    char buf[4096];
    stopped.assign(buf, std::fread(buf, 1, sizeof(buf), f));
    std::fclose(f);
  }
  std::filesystem::remove_all(dir);

  const std::string timed_out(waited.message());
  INFO("rank 0 (waited): " << timed_out);
  INFO("rank 1 (stopped): " << stopped);
  REQUIRE(waited.code() == absl::StatusCode::kUnavailable);
  REQUIRE(timed_out.find("timed out waiting for rank 1: it did not answer within collective_timeout_ms = 1000") !=
          std::string::npos);
  REQUIRE(timed_out.find("alive but unresponsive") != std::string::npos);
  REQUIRE(timed_out.find("network") == std::string::npos);
  REQUIRE(seconds < 15.0);  // the timeout plus the report window, not a hang
  REQUIRE(stopped.find("this process did not run for ") != std::string::npos);
  REQUIRE(stopped.find("(stopped or suspended?") != std::string::npos);
  REQUIRE(stopped.find("peers timed out waiting for rank 1 (rank 0 reported no answer within "
                       "collective_timeout_ms = 1000)") != std::string::npos);
  REQUIRE(stopped.find("network") == std::string::npos);
}

TEST_CASE("gloo: unreachable stores fail fast with a clear error", "[gloo]") {
  GlooPeerGroupOptions o = Opts(0, 2, "/nonexistent/odb/rendezvous", "nostore");
  absl::Status s = GlooPeerGroup::Connect(o).status();
  REQUIRE(s.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(std::string(s.message()).find("does not exist") != std::string::npos);

  o.store = GlooPeerGroupOptions::StoreKind::kRedis;
  o.redis_host = "127.0.0.1";
  o.redis_port = 1;  // nothing listens on port 1
  o.connect_timeout = milliseconds(1000);
  const auto t0 = Clock::now();
  s = GlooPeerGroup::Connect(o).status();
  REQUIRE(s.code() == absl::StatusCode::kUnavailable);
  REQUIRE(std::string(s.message()).find("unreachable") != std::string::npos);
  REQUIRE(std::chrono::duration<double>(Clock::now() - t0).count() < 11.0);
}

TEST_CASE("aligner over real gloo: 3 ranks finish a join epoch in lockstep", "[gloo]") {
  const std::string dir = TempDir();
  constexpr int kWorld = 3;
  std::vector<std::vector<size_t>> steps_per_round(kWorld);
  std::vector<size_t> emitted(kWorld, 0);
  std::vector<absl::Status> status(kWorld);
  OnRanks(kWorld, [&](int r) {
    PlannerConfig cfg;
    cfg.max_wait_rounds = 0;
    auto g = GlooPeerGroup::Connect(Opts(r, kWorld, dir, "aligner"));
    if (!g.ok()) {
      status[r] = g.status();
      return;
    }
    Aligner aligner(g->get(), std::make_unique<LocalPlanner>(cfg));
    REQUIRE(aligner.StartEpoch(0).ok());
    std::vector<SampleMeta> pending;
    for (uint64_t i = 0; i < 20u * (r + 1); ++i) {
      SampleMeta m;
      m.id = i;
      m.owner_rank = r;
      m.lengths.tokens = static_cast<uint32_t>(1 + (i * 97 + r * 13) % 900);
      pending.push_back(m);
    }
    for (int round = 0; round < 1000; ++round) {
      RoundInput in{0, pending, 4, true};
      auto res = aligner.RunRound(in);
      if (!res.ok()) {
        status[r] = res.status();
        return;
      }
      steps_per_round[r].push_back(res->steps.size());
      for (const PlannedStep& s : res->steps) emitted[r] += s.samples.size();
      std::erase_if(pending, [&](const SampleMeta& m) {
        for (const SampleKey& k : res->keep_pending) {
          if (k.id == m.id) return false;
        }
        return true;
      });
      if (res->epoch_finished) return;
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO(status[r].ToString());
    REQUIRE(status[r].ok());
    REQUIRE(steps_per_round[r] == steps_per_round[0]);
    REQUIRE(emitted[r] == 20u * (r + 1));
  }
  std::filesystem::remove_all(dir);
}

// One rank's view of a group whose outgoing bytes pass through `tamper`
// (call index, the true bytes) -> what is sent: a peer whose messages are
// not what this odbd would send.
class TamperingPeerGroup final : public PeerGroup {
 public:
  TamperingPeerGroup(PeerGroup* inner, std::function<std::string(uint64_t, std::string_view)> tamper)
      : inner_(inner), tamper_(std::move(tamper)) {}
  int Rank() const override { return inner_->Rank(); }
  int Size() const override { return inner_->Size(); }
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view bytes) override {
    return inner_->AllGather(tamper_(calls_++, bytes));
  }
  absl::StatusOr<std::unique_ptr<PeerGroup>> Split(int color) override { return inner_->Split(color); }

 private:
  PeerGroup* inner_;
  std::function<std::string(uint64_t, std::string_view)> tamper_;
  uint64_t calls_ = 0;
};

// Rank 1's round messages, from its second all-gather on: its previous
// round's message again (a peer out of step), random bytes of the same
// length, the first half, nothing. Every rank (rank 1 too: it reads its own
// slot) fails the round with an error naming rank 1 instead of planning on
// what it sent; none crashes, none waits for the collective timeout.
TEST_CASE("aligner over real gloo: a peer's replayed, random, cut or empty round message is named by every rank", "[gloo]") {
  const std::vector<std::pair<std::string, std::function<std::string(const std::string&, std::string_view)>>> kinds = {
      {"replayed", [](const std::string& previous, std::string_view) { return previous; }},
      {"random",
       [](const std::string&, std::string_view now) {
         std::mt19937_64 rng(now.size());
         std::string out(now.size(), '\0');
         for (char& c : out) c = static_cast<char>(rng());
         return out;
       }},
      {"cut", [](const std::string&, std::string_view now) { return std::string(now.substr(0, now.size() / 2)); }},
      {"empty", [](const std::string&, std::string_view) { return std::string(); }},
  };
  for (const auto& [kind, lie] : kinds) {
    INFO("rank 1 sends a " << kind << " message");
    const std::string dir = TempDir();
    constexpr int kWorld = 3;
    std::vector<absl::Status> status(kWorld);
    std::vector<double> seconds(kWorld);
    OnRanks(kWorld, [&, &lie = lie](int r) {
      PlannerConfig cfg;
      cfg.max_wait_rounds = 0;
      GlooPeerGroupOptions o = Opts(r, kWorld, dir, "tamper");
      o.collective_timeout = milliseconds(20000);
      auto g = GlooPeerGroup::Connect(o);
      if (!g.ok()) {
        status[r] = g.status();
        return;
      }
      std::string previous;
      TamperingPeerGroup tampering(g->get(), [&](uint64_t call, std::string_view bytes) {
        std::string sent = call == 0 ? std::string(bytes) : lie(previous, bytes);
        previous = std::string(bytes);
        return sent;
      });
      PeerGroup* peers = r == 1 ? static_cast<PeerGroup*>(&tampering) : g->get();
      Aligner aligner(peers, std::make_unique<LocalPlanner>(cfg));
      REQUIRE(aligner.StartEpoch(0).ok());
      std::vector<SampleMeta> pending;
      for (uint64_t i = 0; i < 200; ++i) {
        SampleMeta m;
        m.id = i;
        m.owner_rank = r;
        m.lengths.tokens = static_cast<uint32_t>(1 + (i * 97 + r * 13) % 900);
        pending.push_back(m);
      }
      const auto t0 = Clock::now();
      for (int round = 0; round < 50; ++round) {
        auto res = aligner.RunRound(RoundInput{0, pending, 1, false});
        if (!res.ok()) {
          status[r] = res.status();
          break;
        }
        std::erase_if(pending, [&](const SampleMeta& m) {
          for (const SampleKey& k : res->keep_pending) {
            if (k.id == m.id) return false;
          }
          return true;
        });
      }
      seconds[r] = std::chrono::duration<double>(Clock::now() - t0).count();
    });
    for (int r = 0; r < kWorld; ++r) {
      INFO("rank " << r << ": " << status[r].ToString());
      REQUIRE_FALSE(status[r].ok());
      REQUIRE(std::string(status[r].message()).find("rank 1") != std::string::npos);
      REQUIRE(seconds[r] < 15.0);
    }
    std::filesystem::remove_all(dir);
  }
}

// LocalPlanner's plan, partitioned into blocks of kBlock ranks (Planner's
// own PlanBlock plans a block as a world of its own): enough for the
// Aligner's partitioned round without the global planner (src/balance).
class BlockedLocalPlanner final : public Planner {
 public:
  BlockedLocalPlanner(PlannerConfig config, size_t block) : inner_(std::move(config)), block_(block) {}
  RoundPlan Plan(const RoundState& state) const override { return inner_.Plan(state); }
  const PlannerConfig& config() const override { return inner_.config(); }
  std::string Name() const override { return "blocked-local"; }
  size_t BlockRanks(size_t world) const override { return std::min(world, block_); }

 private:
  LocalPlanner inner_;
  size_t block_;
};

// The partitioned round's world-wide collectives (every rank's summary, then
// the token totals) over real Gloo, with few blocks (2 of 10 ranks) and
// enough steps per round (20) that the totals are larger than the smallest
// slot: after the first round, no round pays the overflow's second
// all-gather, and every step's loss weights sum to W over the world.
TEST_CASE("aligner over real gloo: a partitioned round's world-wide all-gathers fit the slot", "[gloo]") {
  const std::string dir = TempDir();
  constexpr int kWorld = 10;
  constexpr size_t kBlock = 5;
  constexpr uint32_t kSteps = 20;
  constexpr int kRounds = 6;
  std::vector<absl::Status> status(kWorld);
  std::vector<std::vector<uint64_t>> overflows(kWorld);  // the world group's, after each round
  std::vector<std::vector<std::vector<double>>> weights(kWorld);  // [rank][round][step]
  OnRanks(kWorld, [&](int r) {
    PlannerConfig cfg;
    cfg.max_wait_rounds = 0;
    auto g = GlooPeerGroup::Connect(Opts(r, kWorld, dir, "partitioned"));
    if (!g.ok()) {
      status[r] = g.status();
      return;
    }
    Aligner aligner(g->get(), std::make_unique<BlockedLocalPlanner>(cfg, kBlock));
    if (auto s = aligner.StartEpoch(0); !s.ok()) {
      status[r] = s;
      return;
    }
    // One sample per step (each near the budget), different per rank.
    std::vector<SampleMeta> pending;
    for (uint64_t i = 0; i < kSteps * kRounds; ++i) {
      SampleMeta m;
      m.id = i;
      m.owner_rank = r;
      m.lengths.tokens = static_cast<uint32_t>(3000 + (i * 37 + static_cast<uint64_t>(r) * 101) % 1000);
      pending.push_back(m);
    }
    for (int round = 0; round < kRounds; ++round) {
      RoundInput in{0, pending, kSteps, false};
      auto res = aligner.RunRound(in);
      if (!res.ok()) {
        status[r] = res.status();
        return;
      }
      if (res->steps.size() != kSteps) {
        status[r] = absl::InternalError("round " + std::to_string(round) + " planned " +
                                        std::to_string(res->steps.size()) + " steps");
        return;
      }
      overflows[r].push_back((*g)->Overflows());
      auto& w = weights[r].emplace_back();
      for (const PlannedStep& s : res->steps) w.push_back(s.loss_weight);
      std::erase_if(pending, [&](const SampleMeta& m) {
        for (const SampleKey& k : res->keep_pending) {
          if (k.id == m.id) return false;
        }
        return true;
      });
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << status[r].ToString());
    REQUIRE(status[r].ok());
    REQUIRE(overflows[r].size() == static_cast<size_t>(kRounds));
    INFO("overflows after round 1: " << overflows[r][1] << ", after the last: " << overflows[r].back());
    REQUIRE(overflows[r].back() == overflows[r][1]);
  }
  for (int round = 0; round < kRounds; ++round) {
    for (uint32_t k = 0; k < kSteps; ++k) {
      double sum = 0;
      for (int r = 0; r < kWorld; ++r) sum += weights[r][round][k];
      REQUIRE(sum == Approx(kWorld).epsilon(1e-12));
    }
  }
  std::filesystem::remove_all(dir);
}

// ---- RedisStore: the test runs its own redis-server on a free port. ----

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  p += ":/usr/bin:/usr/sbin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::filesystem::path candidate = std::filesystem::path(p.substr(start, end - start)) / name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
    start = end + 1;
  }
  return "";
}

class RedisServer {
 public:
  explicit RedisServer(const std::string& binary) : port_(FreePort()) {
    pid_ = fork();
    if (pid_ == 0) {
      const std::string port = std::to_string(port_);
      execl(binary.c_str(), binary.c_str(), "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning", static_cast<char*>(nullptr));
      _exit(127);
    }
    // Ready when it accepts connections.
    for (int i = 0; i < 100; ++i) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(port_));
      const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
      close(fd);
      if (ok) return;
      std::this_thread::sleep_for(milliseconds(50));
    }
    FAIL("redis-server did not start on port " << port_);
  }
  ~RedisServer() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }

 private:
  int port_;
  pid_t pid_ = -1;
};

TEST_CASE("gloo over RedisStore: all-gather and mismatch refusal", "[gloo][redis]") {
  const std::string binary = FindOnPath("redis-server");
  if (binary.empty()) {
    WARN("SKIPPED: redis-server is not on PATH (Debian package redis-server); RedisStore not tested");
    return;
  }
  RedisServer server(binary);
  auto make = [&](int r, const std::string& job) {
    GlooPeerGroupOptions o = Opts(r, 3, "", job);
    o.store = GlooPeerGroupOptions::StoreKind::kRedis;
    o.redis_host = "127.0.0.1";
    o.redis_port = server.port();
    return o;
  };
  CheckAllGather([&](int r) { return make(r, "redis_allgather"); });
  CheckMismatch([&](int r) { return make(r, "redis_mismatch"); });
}

}  // namespace
}  // namespace odb::align
