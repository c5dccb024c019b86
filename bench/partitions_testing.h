#pragma once
// Test helpers shared by the bound tests (policies_test, window_bound_test):
// brute force over every way to split items into groups, random step models.

#include <cstddef>
#include <functional>
#include <random>
#include <vector>

#include "bench/bound.h"

namespace odb::bench {

// Calls `visit` once for every partition of the items 0..n-1 into non-empty
// blocks (restricted growth strings: item i joins one of the blocks so far or
// opens a new one), so a test can check a bound against every layout.
inline void ForEachPartition(size_t n,
                             const std::function<void(const std::vector<std::vector<size_t>>&)>& visit) {
  std::vector<std::vector<size_t>> blocks;
  std::function<void(size_t)> place = [&](size_t i) {
    if (i == n) {
      visit(blocks);
      return;
    }
    for (size_t b = 0; b < blocks.size(); ++b) {
      blocks[b].push_back(i);
      place(i + 1);
      blocks[b].pop_back();
    }
    blocks.push_back({i});
    place(i + 1);
    blocks.pop_back();
  };
  place(0);
}

// A random step model with each of a, c, k, m sometimes 0 (the bounds must
// hold at the edges of the model too).
inline StepModel RandomModel(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  StepModel m;
  m.a = rng() % 4 == 0 ? 0.0 : 200.0 * u(rng);
  m.b = 0.1 + u(rng);
  m.c = rng() % 2 ? 0.0 : 1e-3 * u(rng);
  m.k = rng() % 2 ? 0.0 : 100.0 * u(rng);
  m.m = rng() % 2 ? 0.0 : 300.0 * u(rng);
  return m;
}

}  // namespace odb::bench
