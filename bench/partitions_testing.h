#pragma once
// Test helper shared by the bound tests (policies_test, window_bound_test):
// brute force over every way to split items into groups.

#include <cstddef>
#include <functional>
#include <vector>

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

}  // namespace odb::bench
