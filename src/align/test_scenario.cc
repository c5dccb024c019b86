#include "src/align/test_scenario.h"

#include <algorithm>

namespace odb::align::testing {

Scenario MakeScenario(uint64_t seed, int world, EpochMode mode) {
  std::mt19937_64 rng(seed);
  auto uni = [&rng](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  Scenario s;
  s.seed = seed;
  s.world = world;
  s.config.mode = mode;
  s.config.seed = seed * 31 + 7;
  s.config.budget.model = uni(0, 1) ? grouping::CostModel::kPadded : grouping::CostModel::kPacked;
  s.config.budget.max_tokens = 1024;
  s.config.window = static_cast<uint32_t>(std::vector<uint64_t>{4, 8, 16, 32}[uni(0, 3)]);
  s.config.max_wait_rounds = static_cast<uint32_t>(uni(0, 3));
  s.depth = static_cast<uint32_t>(uni(1, 6));
  s.arrivals.resize(world);
  s.finish_round.resize(world);
  const int empty_rank = uni(0, 2) == 0 ? static_cast<int>(uni(0, world - 1)) : -1;
  const uint64_t base = uni(0, 40);
  for (int r = 0; r < world; ++r) {
    // Skew: each rank gets base * factor in [0, 3] samples.
    uint64_t n = r == empty_rank ? 0 : base * uni(0, 30) / 10 + uni(0, 2);
    uint64_t round = uni(0, 3);
    for (uint64_t i = 0; i < n; ++i) {
      round += uni(0, 2) == 0 ? uni(0, 3) : 0;  // random arrival delays
      Arrival a;
      a.meta.id = 1000 * static_cast<uint64_t>(r) + i * 3 + uni(0, 2);  // unique per owner, not sorted-dense
      a.meta.owner_rank = r;
      const uint64_t roll = uni(0, 99);
      a.meta.lengths.tokens = static_cast<uint32_t>(roll == 0 ? uni(1025, 3000) : roll < 70 ? uni(1, 200) : uni(1, 1024));
      a.meta.payload_bytes = a.meta.lengths.tokens * 4;
      a.round = round;
      s.arrivals[r].push_back(a);
    }
    s.finish_round[r] = round + uni(0, 5);
  }
  return s;
}

}  // namespace odb::align::testing

namespace odb::align::testing {

std::set<SampleKey> AllKeys(const Scenario& sc) {
  std::set<SampleKey> all;
  for (const auto& rank : sc.arrivals) {
    for (const Arrival& a : rank) all.insert(KeyOf(a.meta));
  }
  return all;
}

}  // namespace odb::align::testing
