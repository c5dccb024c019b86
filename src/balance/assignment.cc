#include "src/balance/assignment.h"

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <limits>

namespace odb::balance {

std::vector<int> MaxWeightAssignment(const std::vector<std::vector<int64_t>>& weight) {
  const int n = static_cast<int>(weight.size());
  if (n == 0) return {};
  // Minimise cost = max_w - w with the classic potentials formulation
  // (1-based arrays; column 0 is the virtual start).
  int64_t max_w = std::numeric_limits<int64_t>::min();
  for (const auto& row : weight) {
    assert(static_cast<int>(row.size()) == n && "MaxWeightAssignment needs a square matrix");
    for (int64_t w : row) max_w = std::max(max_w, w);
  }
  const int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
  // Costs max_w - w in one contiguous row-major block (the inner loop reads
  // a row per step; a vector of vectors costs an indirection per row).
  std::vector<int64_t> cost(static_cast<size_t>(n) * n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) cost[static_cast<size_t>(i) * n + j] = max_w - weight[i][j];
  }
  std::vector<int64_t> u(n + 1, 0), v(n + 1, 0), minv(n + 1);
  std::vector<int> p(n + 1, 0), way(n + 1, 0);
  std::vector<char> used(n + 1);
  for (int i = 1; i <= n; ++i) {
    p[0] = i;
    int j0 = 0;
    std::fill(minv.begin(), minv.end(), kInf);
    std::fill(used.begin(), used.end(), 0);
    do {
      used[j0] = 1;
      const int i0 = p[j0];
      int64_t delta = kInf;
      int j1 = 0;
      const int64_t* row = cost.data() + static_cast<size_t>(i0 - 1) * n - 1;  // row[j], j in 1..n
      const int64_t ui0 = u[i0];
      for (int j = 1; j <= n; ++j) {
        if (used[j]) continue;
        const int64_t cur = row[j] - ui0 - v[j];
        if (cur < minv[j]) {
          minv[j] = cur;
          way[j] = j0;
        }
        if (minv[j] < delta) {
          delta = minv[j];
          j1 = j;
        }
      }
      for (int j = 0; j <= n; ++j) {
        if (used[j]) {
          u[p[j]] += delta;
          v[j] -= delta;
        } else {
          minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (p[j0] != 0);
    do {
      const int j1 = way[j0];
      p[j0] = p[j1];
      j0 = j1;
    } while (j0 != 0);
  }
  std::vector<int> col_of_row(n, -1);
  for (int j = 1; j <= n; ++j) col_of_row[p[j] - 1] = j - 1;
  return col_of_row;
}

int64_t AssignmentWeight(const std::vector<std::vector<int64_t>>& weight,
                         const std::vector<int>& col_of_row) {
  int64_t total = 0;
  for (size_t i = 0; i < col_of_row.size(); ++i) total += weight[i][col_of_row[i]];
  return total;
}

}  // namespace odb::balance
