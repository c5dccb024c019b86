#include "src/grouping/budget.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <vector>

namespace odb::grouping {
namespace {

std::vector<SampleLengths> Tokens(std::initializer_list<uint32_t> lens) {
  std::vector<SampleLengths> out;
  for (uint32_t l : lens) out.push_back(SampleLengths{l, 0, 0});
  return out;
}

Budget Padded(uint64_t max_tokens) {
  Budget b;
  b.model = CostModel::kPadded;
  b.max_tokens = max_tokens;
  return b;
}

Budget Packed(uint64_t max_tokens) {
  Budget b;
  b.model = CostModel::kPacked;
  b.max_tokens = max_tokens;
  return b;
}

TEST_CASE("EffectiveLength adds the quadratic term only when q is set") {
  Budget b;
  CHECK(EffectiveLength(b, 1000) == 1000.0);
  b.quadratic_q = 1000.0;
  CHECK(EffectiveLength(b, 1000) == 2000.0);
  CHECK(EffectiveLength(b, 0) == 0.0);
}

TEST_CASE("GroupBudgetCost and PaddedTokens follow the cost model") {
  const auto g = Tokens({100, 300, 200});
  CHECK(GroupBudgetCost(Padded(4096), g) == 900.0);
  CHECK(GroupBudgetCost(Packed(4096), g) == 600.0);
  CHECK(PaddedTokens(CostModel::kPadded, g) == 900);
  CHECK(PaddedTokens(CostModel::kPacked, g) == 600);
  Budget q = Padded(4096);
  q.quadratic_q = 100.0;
  // Longest effective length is 300 + 900 = 1200, times 3 samples.
  CHECK(GroupBudgetCost(q, g) == 3600.0);
  q.model = CostModel::kPacked;
  CHECK(GroupBudgetCost(q, g) == Approx(600.0 + (100.0 + 900.0 + 400.0)));
  CHECK(GroupBudgetCost(q, {}) == 0.0);
}

TEST_CASE("FitsBudget is inclusive at the token limit for both models") {
  CHECK(FitsBudget(Padded(900), Tokens({100, 300, 200})));
  CHECK_FALSE(FitsBudget(Padded(899), Tokens({100, 300, 200})));
  CHECK(FitsBudget(Packed(600), Tokens({100, 300, 200})));
  CHECK_FALSE(FitsBudget(Packed(599), Tokens({100, 300, 200})));
  CHECK(FitsBudget(Padded(0), Tokens({4000000, 4000000})));  // 0 = no limit
  CHECK(FitsBudget(Padded(10), {}));
}

TEST_CASE("FitsBudget applies the quadratic term") {
  Budget b = Packed(4096);
  b.quadratic_q = 2048.0;
  CHECK(FitsBudget(b, Tokens({2048})));       // 2048 + 2048 = 4096
  CHECK_FALSE(FitsBudget(b, Tokens({2049})));
  CHECK_FALSE(FitsBudget(b, Tokens({2048, 1})));
  b.model = CostModel::kPadded;
  CHECK(FitsBudget(b, Tokens({1024, 1024})));  // 2 x (1024 + 512) = 3072
  CHECK_FALSE(FitsBudget(b, Tokens({1024, 1024, 1024})));  // 4608
}

TEST_CASE("FitsBudget enforces max group size and modality budgets") {
  Budget b = Packed(4096);
  b.max_group_size = 2;
  CHECK(FitsBudget(b, Tokens({1, 1})));
  CHECK_FALSE(FitsBudget(b, Tokens({1, 1, 1})));

  Budget v = Padded(4096);
  v.max_vision_patches = 100;
  v.max_audio_frames = 50;
  std::vector<SampleLengths> g = {{10, 60, 0}, {10, 40, 25}};
  CHECK(FitsBudget(v, g));
  g[1].vision_patches = 41;
  CHECK_FALSE(FitsBudget(v, g));
  g[1].vision_patches = 40;
  g[0].audio_frames = 26;
  CHECK_FALSE(FitsBudget(v, g));
  v.max_audio_frames = 0;  // unbounded again
  CHECK(FitsBudget(v, g));
}

TEST_CASE("FitsAlone flags samples that fit no budget on their own") {
  CHECK(FitsAlone(Padded(4096), {4096, 0, 0}));
  CHECK_FALSE(FitsAlone(Padded(4096), {4097, 0, 0}));
  Budget v = Packed(4096);
  v.max_vision_patches = 10;
  CHECK_FALSE(FitsAlone(v, {1, 11, 0}));
  CHECK(FitsAlone(v, {0, 0, 0}));  // length 0 is rejected upstream, never a crash here
}

TEST_CASE("StepTime is per_step + padded tokens + len^2 terms") {
  StepTimeModel m;
  m.per_step = 10.0;
  m.per_padded_token = 2.0;
  m.per_len_sq = 0.5;
  const auto g = Tokens({2, 4});
  CHECK(StepTime(m, CostModel::kPadded, g) == 10.0 + 2.0 * 8 + 0.5 * 20);
  CHECK(StepTime(m, CostModel::kPacked, g) == 10.0 + 2.0 * 6 + 0.5 * 20);
  CHECK(StepTime(m, CostModel::kPacked, {}) == 0.0);
}

TEST_CASE("GroupTally verdict does not depend on member order") {
  Budget b = Packed(5000);
  b.quadratic_q = 777.7;  // non-integer: per-sample sums would round by order
  std::vector<SampleLengths> g = Tokens({17, 900, 33, 411, 1200, 5, 64, 250});
  GroupTally first(b);
  for (const auto& s : g) first.Add(s);
  int permutations = 0;
  std::sort(g.begin(), g.end(), [](auto& a, auto& c) { return a.tokens < c.tokens; });
  do {
    GroupTally t(b);
    for (const auto& s : g) t.Add(s);
    REQUIRE(t.BudgetCost() == first.BudgetCost());
    REQUIRE(t.Fits() == first.Fits());
    ++permutations;
  } while (std::next_permutation(g.begin(), g.end(),
                                 [](auto& a, auto& c) { return a.tokens < c.tokens; }) &&
           permutations < 2000);
  CHECK(permutations == 2000);
  CHECK(first.CanAdd({0, 0, 0}) == first.Fits());
}

TEST_CASE("DescribeBudget names every field") {
  Budget b = Packed(8192);
  b.max_vision_patches = 3;
  const std::string d = DescribeBudget(b);
  CHECK(d.find("max_tokens=8192") != std::string::npos);
  CHECK(d.find("model=packed") != std::string::npos);
  CHECK(d.find("max_vision_patches=3") != std::string::npos);
  CHECK(d.find("max_audio_frames=0") != std::string::npos);
  CHECK(d.find("quadratic_q=") != std::string::npos);
  CHECK(d.find("max_group_size=") != std::string::npos);
}

}  // namespace
}  // namespace odb::grouping
