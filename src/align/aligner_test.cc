// The Aligner through real threads over FakePeerGroup: lockstep rounds,
// coverage, exact weights, and faults turning into errors (never hangs).
#include "src/align/aligner.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "src/align/fake_peer_group.h"
#include "src/align/test_scenario.h"

namespace odb::align {
namespace {

using testing::FakeEmitter;
using testing::MakeScenario;
using testing::Scenario;

struct RankLog {
  absl::Status status;
  std::vector<size_t> steps_per_round;
  std::map<uint64_t, double> weight_by_step;
  std::set<SampleKey> emitted;
  std::set<SampleKey> not_emitted;
  std::set<SampleKey> late;
  bool finished = false;
};

RankLog RunRank(const Scenario& sc, PeerGroup* peers) {
  const int r = peers->Rank();
  RankLog log;
  Aligner aligner(peers, std::make_unique<LocalPlanner>(sc.config));
  log.status = aligner.StartEpoch(1);
  if (!log.status.ok()) return log;
  std::vector<SampleMeta> pending;
  size_t next = 0;
  FakeEmitter emitter(sc.depth, sc.seed * 100 + r);
  for (uint64_t round = 0; round < 5000; ++round) {
    while (next < sc.arrivals[r].size() && sc.arrivals[r][next].round <= round) {
      pending.push_back(sc.arrivals[r][next++].meta);
    }
    RoundInput in{1, pending, emitter.FreeSlots(), round >= sc.finish_round[r]};
    in.stream_started = next > 0;  // late-starting ranks wait on their start_wait
    auto res = aligner.RunRound(in);
    if (!res.ok()) {
      log.status = res.status();
      return log;
    }
    log.steps_per_round.push_back(res->steps.size());
    for (const PlannedStep& s : res->steps) {
      log.weight_by_step[s.step_index] = s.loss_weight;
      for (const SampleMeta& m : s.samples) log.emitted.insert(KeyOf(m));
    }
    for (const SampleKey& k : res->not_emitted) log.not_emitted.insert(k);
    std::set<SampleKey> keep(res->keep_pending.begin(), res->keep_pending.end());
    std::erase_if(pending, [&](const SampleMeta& m) { return !keep.count(KeyOf(m)); });
    emitter.Push(static_cast<uint32_t>(res->steps.size()));
    emitter.Drain();
    if (res->epoch_finished) {
      log.finished = true;
      for (size_t i = next; i < sc.arrivals[r].size(); ++i) log.late.insert(KeyOf(sc.arrivals[r][i].meta));
      return log;
    }
  }
  return log;
}

TEST_CASE("threaded scenarios over FakePeerGroup", "[aligner]") {
  int scenarios = 0;
  for (int world : {1, 2, 3, 4, 8}) {
    for (uint64_t i = 0; i < 16; ++i) {
      const uint64_t seed = 77000 + world * 1000 + i;
      const EpochMode mode = i % 2 ? EpochMode::kNonJoin : EpochMode::kJoin;
      const Scenario sc = MakeScenario(seed, world, mode);
      FakeWorld fake(world);
      std::vector<RankLog> logs(world);
      std::vector<std::thread> threads;
      for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { logs[r] = RunRank(sc, fake.Rank(r)); });
      for (auto& t : threads) t.join();
      INFO("seed " << seed << " W=" << world);
      std::set<SampleKey> all, covered;
      for (int r = 0; r < world; ++r) {
        INFO(logs[r].status.ToString());
        REQUIRE(logs[r].status.ok());
        REQUIRE(logs[r].finished);
        REQUIRE(logs[r].steps_per_round == logs[0].steps_per_round);  // lockstep
        for (const auto& a : sc.arrivals[r]) all.insert(KeyOf(a.meta));
        for (const auto* part : {&logs[r].emitted, &logs[r].not_emitted, &logs[r].late}) {
          for (const auto& k : *part) REQUIRE(covered.insert(k).second);  // exactly once
        }
        if (mode == EpochMode::kJoin) REQUIRE(logs[r].not_emitted.empty());
      }
      REQUIRE(covered == all);
      for (const auto& [step, w0] : logs[0].weight_by_step) {
        double sum = 0;
        for (int r = 0; r < world; ++r) sum += logs[r].weight_by_step.at(step);
        REQUIRE(std::abs(sum - world) < 1e-9);
      }
      ++scenarios;
    }
  }
  REQUIRE(scenarios == 80);
}

// One rank of a deterministic epoch: samples of its list arrive in random
// bursts (in list order, as the daemon offers its unbroken prefix), the
// emitter frees slots at a random pace and the stream finishes some rounds
// after the last sample. Returns every step as (index, sample ids, weight).
struct DetStep {
  uint64_t index;
  std::vector<uint64_t> ids;
  double weight;
  uint64_t round;
  friend bool operator==(const DetStep&, const DetStep&) = default;
};

std::vector<DetStep> RunDeterministicRank(const PlannerConfig& config, const std::vector<SampleMeta>& list,
                                          uint64_t timing_seed, PeerGroup* peers, uint64_t first_round = 0,
                                          uint64_t first_step = 0, absl::Status* status = nullptr) {
  std::mt19937_64 rng(timing_seed * 7919 + static_cast<uint64_t>(peers->Rank()));
  Aligner aligner(peers, std::make_unique<LocalPlanner>(config));
  REQUIRE(aligner.StartEpoch(3, first_round, first_step).ok());
  std::vector<SampleMeta> pending;
  std::vector<DetStep> out;
  size_t next = 0;
  uint64_t finish_at = 0;
  for (uint64_t round = 0; round < 100000; ++round) {
    const size_t burst = rng() % 4 == 0 ? rng() % 20 : 0;
    for (size_t i = 0; i < burst && next < list.size(); ++i) pending.push_back(list[next++]);
    if (next == list.size() && finish_at == 0) finish_at = round + rng() % 5;
    RoundInput in{3, pending, static_cast<uint32_t>(rng() % 4), next == list.size() && round >= finish_at};
    auto res = aligner.RunRound(in);
    if (!res.ok()) {
      if (status) *status = res.status();
      return out;
    }
    for (const PlannedStep& s : res->steps) {
      DetStep d{s.step_index, {}, s.loss_weight, s.round};
      for (const SampleMeta& m : s.samples) d.ids.push_back(m.id);
      out.push_back(std::move(d));
    }
    std::set<SampleKey> keep(res->keep_pending.begin(), res->keep_pending.end());
    std::erase_if(pending, [&](const SampleMeta& m) { return !keep.count(KeyOf(m)); });
    if (res->epoch_finished) return out;
  }
  FAIL("the deterministic epoch did not finish");
  return out;
}

TEST_CASE("deterministic: the steps depend on the lists only, not on arrival or credit timing", "[aligner]") {
  constexpr int kWorld = 3;
  PlannerConfig config;
  config.budget.max_tokens = 256;
  config.window = 8;
  config.seed = 5;
  config.deterministic = true;
  std::mt19937_64 rng(1234);
  std::vector<std::vector<SampleMeta>> lists(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    for (uint64_t i = 0; i < 60 + 7 * static_cast<uint64_t>(r); ++i) {
      SampleMeta m;
      m.id = 1000 * static_cast<uint64_t>(r) + i;
      m.owner_rank = r;
      m.lengths.tokens = static_cast<uint32_t>(1 + rng() % 200);
      lists[r].push_back(m);
    }
  }
  auto run = [&](uint64_t timing_seed) {
    FakeWorld fake(kWorld);
    std::vector<std::vector<DetStep>> steps(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] { steps[r] = RunDeterministicRank(config, lists[r], timing_seed, fake.Rank(r)); });
    }
    for (auto& t : threads) t.join();
    return steps;
  };
  const auto reference = run(1);
  std::set<uint64_t> covered;
  for (const auto& rank_steps : reference) {
    for (const DetStep& d : rank_steps) {
      for (uint64_t id : d.ids) REQUIRE(covered.insert(id).second);
    }
  }
  REQUIRE(covered.size() == 60 + 67 + 74);
  for (uint64_t timing = 2; timing < 8; ++timing) {
    INFO("timing seed " << timing);
    REQUIRE(run(timing) == reference);
  }

  SECTION("a run resumed at one of its rounds plans the same steps from there") {
    // What the rounds before round k took leaves each list; the rest is offered again.
    const uint64_t k = reference[0][reference[0].size() / 2].round;
    std::set<uint64_t> before;
    for (const auto& rank_steps : reference) {
      for (const DetStep& d : rank_steps) {
        if (d.round < k) before.insert(d.ids.begin(), d.ids.end());
      }
    }
    uint64_t first_step = UINT64_MAX;
    for (const DetStep& d : reference[0]) {
      if (d.round == k) first_step = std::min(first_step, d.index);
    }
    FakeWorld fake(kWorld);
    std::vector<std::vector<DetStep>> resumed(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        std::vector<SampleMeta> rest;
        for (const SampleMeta& m : lists[r]) {
          if (!before.count(m.id)) rest.push_back(m);
        }
        resumed[r] = RunDeterministicRank(config, rest, 99, fake.Rank(r), k, first_step);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kWorld; ++r) {
      std::vector<DetStep> tail;
      for (const DetStep& d : reference[r]) {
        if (d.round >= k) tail.push_back(d);
      }
      REQUIRE(resumed[r] == tail);
    }
  }
}

TEST_CASE("SoloPeerGroup runs a W=1 join epoch", "[aligner]") {
  SoloPeerGroup solo;
  const Scenario sc = MakeScenario(4242, 1, EpochMode::kJoin);
  RankLog log = RunRank(sc, &solo);
  REQUIRE(log.status.ok());
  REQUIRE(log.emitted.size() == sc.arrivals[0].size());
  for (const auto& [step, w] : log.weight_by_step) REQUIRE(w == Approx(1.0));
}

TEST_CASE("a dying peer is an error naming it on every other rank", "[aligner][fault]") {
  constexpr int kWorld = 4;
  FakeWorld fake(kWorld);
  fake.KillAt(1, 5);
  const Scenario sc = MakeScenario(99, kWorld, EpochMode::kJoin);
  std::vector<RankLog> logs(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) threads.emplace_back([&, r] { logs[r] = RunRank(sc, fake.Rank(r)); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    REQUIRE(logs[r].status.code() == absl::StatusCode::kUnavailable);
    REQUIRE(std::string(logs[r].status.message()).find("peer rank 1 died") != std::string::npos);
  }
}

TEST_CASE("a silent peer is a deadline error naming it, not a hang", "[aligner][fault]") {
  constexpr int kWorld = 3;
  FakeWorld fake(kWorld, std::chrono::seconds(2));
  std::vector<absl::Status> status(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      Aligner aligner(fake.Rank(r), std::make_unique<LocalPlanner>(PlannerConfig{}));
      REQUIRE(aligner.StartEpoch(0).ok());
      for (int round = 0; round < 10; ++round) {
        if (r == 2 && round == 3) return;  // rank 2 goes silent
        auto res = aligner.RunRound(RoundInput{0, {}, 2, false});
        if (!res.ok()) {
          status[r] = res.status();
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    REQUIRE(status[r].code() == absl::StatusCode::kDeadlineExceeded);
    REQUIRE(std::string(status[r].message()).find("peer rank(s) 2") != std::string::npos);
  }
}

TEST_CASE("a rank that has not started waits on start_wait, a started one on max_wait", "[aligner]") {
  SoloPeerGroup solo;
  auto now = std::chrono::steady_clock::time_point{};
  AlignerOptions options;
  options.max_wait = std::chrono::milliseconds(10);
  options.start_wait = std::chrono::milliseconds(1000);
  options.now = [&now] { return now; };
  PlannerConfig config;
  config.max_wait_rounds = 2;
  Aligner aligner(&solo, std::make_unique<LocalPlanner>(config), options);
  REQUIRE(aligner.StartEpoch(0).ok());
  RoundInput in;
  in.free_slots = 4;
  in.stream_started = false;  // the data workers are still starting
  for (int round = 0; round < 6; ++round) {  // past max_wait_rounds and max_wait
    auto res = aligner.RunRound(in);
    REQUIRE(res.ok());
    REQUIRE(res->waiting);
    now += std::chrono::milliseconds(100);
  }
  now += std::chrono::milliseconds(500);  // 1100 ms since the wait began
  auto res = aligner.RunRound(in);
  REQUIRE(res.ok());
  REQUIRE_FALSE(res->waiting);
  // Started: max_wait_rounds bounds the wait again.
  in.stream_started = true;
  for (int round = 0; round < 2; ++round) REQUIRE(aligner.RunRound(in)->waiting);
  REQUIRE_FALSE(aligner.RunRound(in)->waiting);
}

TEST_CASE("misuse and bad input are rejected locally", "[aligner]") {
  SoloPeerGroup solo;
  Aligner aligner(&solo, std::make_unique<LocalPlanner>(PlannerConfig{}));
  REQUIRE(aligner.RunRound(RoundInput{}).status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(aligner.StartEpoch(0).ok());
  REQUIRE(aligner.StartEpoch(1).code() == absl::StatusCode::kFailedPrecondition);
  RoundInput in;
  in.free_slots = 2;
  SampleMeta m;
  m.id = 42;
  in.pending = {m};  // 0 tokens
  auto s = aligner.RunRound(in).status();
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(s.message()).find("sample 42 has 0 tokens") != std::string::npos);
  in.pending[0].lengths.tokens = 5;
  in.pending[0].owner_rank = 3;
  REQUIRE(aligner.RunRound(in).status().code() == absl::StatusCode::kInvalidArgument);
  in.epoch = 7;
  in.pending[0].owner_rank = 0;
  REQUIRE(aligner.RunRound(in).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace odb::align

namespace odb::align {
namespace {

// A planner that breaks the accounting contract on purpose.
class CorruptPlanner final : public Planner {
 public:
  enum class Fault { kDuplicate, kDrop };
  CorruptPlanner(PlannerConfig config, Fault fault) : inner_(std::move(config)), fault_(fault) {}
  RoundPlan Plan(const RoundState& state) const override {
    RoundPlan plan = inner_.Plan(state);
    for (PlannedStep& step : plan.ranks[0].steps) {
      if (step.samples.empty()) continue;
      if (fault_ == Fault::kDuplicate) {
        step.samples.push_back(step.samples.front());
      } else {
        step.samples.pop_back();
      }
      break;
    }
    return plan;
  }
  const PlannerConfig& config() const override { return inner_.config(); }
  std::string Name() const override { return "corrupt"; }

 private:
  LocalPlanner inner_;
  Fault fault_;
};

absl::Status FirstPlannedRound(CorruptPlanner::Fault fault) {
  SoloPeerGroup solo;
  PlannerConfig config;
  config.budget.max_tokens = 64;
  Aligner aligner(&solo, std::make_unique<CorruptPlanner>(config, fault));
  if (absl::Status s = aligner.StartEpoch(0); !s.ok()) return s;
  RoundInput input;
  for (uint64_t id = 0; id < 8; ++id) {
    SampleMeta m;
    m.id = id;
    m.lengths.tokens = 16;
    input.pending.push_back(m);
  }
  input.free_slots = 4;
  input.stream_finished = true;
  return aligner.RunRound(input).status();
}

}  // namespace

TEST_CASE("a plan that places a sample twice or loses one is an internal error", "[aligner]") {
  absl::Status dup = FirstPlannedRound(CorruptPlanner::Fault::kDuplicate);
  REQUIRE(dup.code() == absl::StatusCode::kInternal);
  REQUIRE(std::string(dup.message()).find("placed sample") != std::string::npos);
  REQUIRE(std::string(dup.message()).find("twice") != std::string::npos);
  absl::Status lost = FirstPlannedRound(CorruptPlanner::Fault::kDrop);
  REQUIRE(lost.code() == absl::StatusCode::kInternal);
  REQUIRE(std::string(lost.message()).find("accounted for 7 of 8") != std::string::npos);
}

}  // namespace odb::align
