#include "bench/window_bound.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <limits>
#include <random>

#include "bench/batching_sim_uneq.h"
#include "bench/partitions_testing.h"
#include "bench/policies.h"
#include "bench/trace.h"

namespace odb::bench {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Brute {
  double equal_counts = kInf;       // the fastest equal-count layout on `world` ranks (T_b of one window)
  std::vector<double> padded_runs;  // [K - 1]: least sum of g over padded partitions into <= K groups
  std::vector<double> padded_exact;  // [K - 1]: the same over partitions into exactly K groups
};

// Brute force over every equal-count layout: a partition of the samples into
// micro-steps within the budget (or singletons), its blocks dealt to the
// ranks in every way, n = the most blocks on a rank (at least 1; the other
// micro-steps IDLE, each a).
Brute Solve(const std::vector<SampleLengths>& s, const grouping::Budget& budget, const StepModel& model,
            int world) {
  Brute out;
  out.padded_runs.assign(s.size(), kInf);
  out.padded_exact.assign(s.size(), kInf);
  const bool packed = budget.model == grouping::CostModel::kPacked;
  ForEachPartition(s.size(), [&](const std::vector<std::vector<size_t>>& blocks) {
    std::vector<double> cost;
    bool ok = true;
    double padded_sum = 0.0;
    for (const auto& block : blocks) {
      uint64_t longest = 0, sum = 0;
      double sq = 0.0;
      for (size_t i : block) {
        longest = std::max<uint64_t>(longest, s[i].tokens);
        sum += s[i].tokens;
        sq += static_cast<double>(s[i].tokens) * s[i].tokens;
      }
      const uint64_t p = packed ? sum : longest * block.size();
      const bool size_ok = budget.max_group_size == 0 || block.size() <= budget.max_group_size;
      ok &= (p <= budget.max_tokens && size_ok) || block.size() == 1;
      cost.push_back(model.Step(static_cast<double>(p), sq) - model.a);
      padded_sum += model.Compute(static_cast<double>(longest * block.size()));
    }
    if (!ok) return;
    if (!packed) {
      out.padded_exact[blocks.size() - 1] = std::min(out.padded_exact[blocks.size() - 1], padded_sum);
      for (size_t k = blocks.size(); k <= s.size(); ++k) {
        out.padded_runs[k - 1] = std::min(out.padded_runs[k - 1], padded_sum);
      }
    }
    // Every deal of the blocks to the ranks.
    const size_t nb = blocks.size();
    std::vector<int> rank_of(nb, 0);
    while (true) {
      std::vector<double> load(world, 0.0);
      std::vector<int> count(world, 0);
      for (size_t b = 0; b < nb; ++b) {
        load[rank_of[b]] += cost[b];
        ++count[rank_of[b]];
      }
      const int n = std::max(1, *std::max_element(count.begin(), count.end()));
      out.equal_counts =
          std::min(out.equal_counts, n * model.a + *std::max_element(load.begin(), load.end()));
      size_t b = 0;
      while (b < nb && ++rank_of[b] == world) rank_of[b++] = 0;
      if (b == nb) break;
    }
  });
  return out;
}

TEST_CASE("equal-counts window bound: never above brute force over equal-count layouts, often equal",
          "[bound][windows]") {
  std::mt19937_64 rng(26);
  int tight = 0, trials = 0, tighter = 0, tight_loose = 0;
  for (int trial = 0; trial < 400; ++trial) {
    INFO("trial " << trial);
    grouping::Budget budget;
    budget.max_tokens = 64 + rng() % 200;
    budget.max_group_size = rng() % 4 == 0 ? 2 + rng() % 3 : 0;
    budget.model = rng() % 2 ? grouping::CostModel::kPacked : grouping::CostModel::kPadded;
    const int world = 1 + static_cast<int>(rng() % 3);
    const size_t n = 1 + rng() % 6;
    std::vector<SampleLengths> s(n);
    // Mostly within the budget; now and then one sample over it (alone).
    for (auto& x : s)
      x.tokens = 1 + static_cast<uint32_t>(rng() % (budget.max_tokens + budget.max_tokens / 8));
    const StepModel model = RandomModel(rng);
    const Brute brute = Solve(s, budget, model, world);
    const EqualCountsBound b = EqualCountsWindowBound(s, budget, model, world);
    const EqualCountsBound loose = LooseEqualCountsWindowBound(s, budget, model, world);
    INFO("bound " << b.bound << " loose " << loose.bound << " brute " << brute.equal_counts << " world "
                  << world << " n " << n);
    REQUIRE(brute.equal_counts < kInf);
    CHECK(b.bound <= brute.equal_counts * (1 + 1e-9));
    CHECK(loose.bound <= brute.equal_counts * (1 + 1e-9));
    CHECK(b.bound >= loose.bound * (1 - 1e-12));  // never looser than session 26's
    CHECK(b.fewest >= 1);
    CHECK(b.fewest == loose.fewest);
    ++trials;
    tight += b.bound >= brute.equal_counts * (1 - 1e-9);
    tight_loose += loose.bound >= brute.equal_counts * (1 - 1e-9);
    tighter += b.bound > loose.bound * (1 + 1e-9);
    if (budget.model == grouping::CostModel::kPadded) {
      // The least padded compute over at most K groups is exact (runs of the
      // sorted samples reach the optimum over all partitions).
      std::vector<double> runs;
      LeastPaddedCompute(s, budget, model, n, &runs);
      REQUIRE(runs.size() == n);
      // And over exactly K groups (the tight bound's E(J)).
      const std::vector<double> exact = LeastPaddedComputeExact(s, budget, model, n + 1);
      REQUIRE(exact.size() == n + 1);
      CHECK(exact[n] == kInf);
      for (size_t k = 0; k < n; ++k) {
        INFO("groups " << k + 1);
        if (brute.padded_runs[k] == kInf) {
          CHECK(runs[k] == kInf);
        } else {
          CHECK(runs[k] == Approx(brute.padded_runs[k]).epsilon(1e-12));
        }
        if (brute.padded_exact[k] == kInf) {
          CHECK(exact[k] == kInf);
        } else {
          CHECK(exact[k] == Approx(brute.padded_exact[k]).epsilon(1e-12));
        }
      }
    }
  }
  // The bound is reached (equals the fastest layout) in a good share of the
  // windows: a bound 5% higher would fail the check above.
  INFO("tight " << tight << " (loose " << tight_loose << ") of " << trials << ", tighter than loose "
                << tighter);
  CHECK(tight * 4 >= trials);
  // The session 27 bound is strictly above session 26's in some of the
  // windows (19 of the 400 here; with the loose bound in its place, none).
  CHECK(tighter * 40 >= trials);
}

TEST_CASE("equal-counts window bound by hand", "[bound][windows]") {
  // Default model (a = 512, b = 1), padded budget 4096, two ranks.
  grouping::Budget budget;
  StepModel model;
  auto lens = [](std::vector<uint32_t> v) {
    std::vector<SampleLengths> s;
    for (uint32_t t : v) s.push_back(SampleLengths{t});
    return s;
  };
  // One sample: its rank runs it alone, the other an IDLE micro-step.
  CHECK(EqualCountsWindowBound(lens({3000}), budget, model, 2).bound == 512 + 3000);
  // Three samples of 3000 on two ranks: some rank holds two (pigeonhole),
  // in two micro-steps (2 x 3000 > 4096): 2 x 512 + 6000. The any-counts
  // mean would be (3 x 3512) / 2 = 5268 only.
  const EqualCountsBound three = EqualCountsWindowBound(lens({3000, 3000, 3000}), budget, model, 2);
  CHECK(three.bound == 2 * 512 + 6000);
  CHECK(three.fewest == 2);
  // Padded: 2000 and 16 x 100 on one rank: one micro-step would pad to
  // 17 x 2000; the least padding within two runs is 2000 + 16 x 100 = 3600,
  // plus 2 x 512.
  std::vector<uint32_t> v = {2000};
  for (int i = 0; i < 16; ++i) v.push_back(100);
  CHECK(EqualCountsWindowBound(lens(v), budget, model, 1).bound == 2 * 512 + 3600);
  // Packed: the same samples in one micro-step of 3600 tokens.
  budget.model = grouping::CostModel::kPacked;
  CHECK(EqualCountsWindowBound(lens(v), budget, model, 1).bound == 512 + 3600);
}

TEST_CASE("equal-counts window bound: every non-empty micro-step pays b k (session 27)", "[bound][windows]") {
  // a = 512, b = 1, k = 100; budget 100; three samples of 60 on two ranks.
  // Each sample is a micro-step of its own (2 x 60 > 100): some rank runs two,
  // so the fastest layout takes 2 x 512 + 2 x (60 + 100) = 1344.
  grouping::Budget budget;
  budget.max_tokens = 100;
  StepModel model;
  model.k = 100;
  const std::vector<SampleLengths> s = {SampleLengths{60}, SampleLengths{60}, SampleLengths{60}};
  const Brute brute = Solve(s, budget, model, 2);
  CHECK(brute.equal_counts == 1344);
  // Session 26: the mean of the three micro-steps' compute, 3 x 160 / 2 =
  // 240, beats the pigeonhole's 120 + 100: 1024 + 240 = 1264.
  CHECK(LooseEqualCountsWindowBound(s, budget, model, 2).bound == 1264);
  // (D): the J = 3 micro-steps shared 2 and 1; a micro-step holds at most 60
  // tokens, so the rank with 2 holds at most 120 and the one with 1 at most
  // 60: the 180 tokens need T' >= 2 x 100 + 120 = 320. That is the optimum.
  const EqualCountsBound tight = EqualCountsWindowBound(s, budget, model, 2);
  CHECK(tight.bound == 1344);
  CHECK(tight.best_count == 2);
  // Packed the same samples also run alone (120 > 100), but (D)'s cap is the
  // budget, 100: the rank with 1 micro-step holds at most 100, the one with 2
  // at most T' - 200, so T' >= 200 + (180 - 100) = 280. Above the loose
  // 1264, below the optimum.
  budget.model = grouping::CostModel::kPacked;
  CHECK(Solve(s, budget, model, 2).equal_counts == 1344);
  CHECK(LooseEqualCountsWindowBound(s, budget, model, 2).bound == 1264);
  CHECK(EqualCountsWindowBound(s, budget, model, 2).bound == 1304);
}

TEST_CASE("equal-counts window bound: never above the planner's equal-count windows",
          "[bound][windows][uneq]") {
  auto trace = GenerateTrace("chat_longtail", 1200, 4096, 7);
  REQUIRE(trace.ok());
  const auto& arrival = trace->samples;
  for (const std::string p :
       {"odb:global:q32:w64:paced16:full:mixsteps", "odb:global:q32:w64:paced16:full:packed:mixsteps"}) {
    for (const char* target : {"1m", "4m"}) {
      INFO(p << ", windows " << target);
      SimConfig cfg;
      cfg.world = 4;
      cfg.window = 64;
      cfg.model.c = 1e-4;
      cfg.model.k = 200;
      cfg.window_tokens = ParseWindowTarget(target)->Tokens(arrival, cfg.world, cfg.budget.max_tokens);
      auto traced = RunOdbTraced(p, arrival, cfg);
      REQUIRE(traced.ok());
      UnequalConfig uc;
      uc.model = cfg.model;
      uc.budget = cfg.budget;
      if (IsPackedPolicy(p)) uc.budget.model = grouping::CostModel::kPacked;
      const UnequalMetrics u = EvaluateUnequal(*traced, uc);
      REQUIRE(u.windows > 1);
      CHECK(u.equal_counts_violations == 0);
      CHECK(u.equal_counts_bound <= u.equal_time * (1 + 1e-12));
      CHECK(u.equal_counts_bound >= u.per_window_bound);
    }
  }
}

}  // namespace
}  // namespace odb::bench
