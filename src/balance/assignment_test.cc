#include "src/balance/assignment.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>
#include <set>

namespace odb::balance {
namespace {

TEST_CASE("Hungarian matches brute force on small matrices", "[assignment]") {
  std::mt19937_64 rng(42);
  int checked = 0;
  for (int n = 0; n <= 6; ++n) {
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<std::vector<int64_t>> w(n, std::vector<int64_t>(n));
      for (auto& row : w) {
        for (auto& x : row) x = std::uniform_int_distribution<int64_t>(trial % 3 == 0 ? 0 : -50, 1000)(rng) / (trial % 2 + 1);
      }
      const std::vector<int> got = MaxWeightAssignment(w);
      REQUIRE(static_cast<int>(got.size()) == n);
      REQUIRE(std::set<int>(got.begin(), got.end()).size() == static_cast<size_t>(n));  // a permutation
      std::vector<int> perm(n);
      std::iota(perm.begin(), perm.end(), 0);
      int64_t best = n == 0 ? 0 : INT64_MIN;
      do {
        best = std::max(best, AssignmentWeight(w, perm));
      } while (std::next_permutation(perm.begin(), perm.end()));
      REQUIRE(AssignmentWeight(w, got) == best);
      ++checked;
    }
  }
  REQUIRE(checked == 7 * 60);
}

TEST_CASE("Hungarian handles a 64 x 64 diagonal-dominant matrix", "[assignment]") {
  const int n = 64;
  std::vector<std::vector<int64_t>> w(n, std::vector<int64_t>(n, 1));
  for (int i = 0; i < n; ++i) w[i][(i * 7) % n] = 1000000;
  const std::vector<int> got = MaxWeightAssignment(w);
  for (int i = 0; i < n; ++i) REQUIRE(got[i] == (i * 7) % n);
}

}  // namespace
}  // namespace odb::balance
