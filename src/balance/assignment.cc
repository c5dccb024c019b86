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

namespace {

// Row-compressed sparse matrix, each row's entries sorted by column with
// duplicates merged, so that the weight of (row, col) is a binary search.
struct SparseRows {
  std::vector<size_t> start;  // n + 1
  std::vector<int32_t> col;
  std::vector<int64_t> weight;

  int64_t At(int row, int c) const {
    const auto first = col.begin() + static_cast<std::ptrdiff_t>(start[row]);
    const auto last = col.begin() + static_cast<std::ptrdiff_t>(start[row + 1]);
    const auto it = std::lower_bound(first, last, c);
    return it != last && *it == c ? weight[static_cast<size_t>(it - col.begin())] : 0;
  }
};

SparseRows BuildRows(int n, const std::vector<WeightedEdge>& edges) {
  const bool canonical =
      std::adjacent_find(edges.begin(), edges.end(), [](const WeightedEdge& a, const WeightedEdge& b) {
        return !(a.row < b.row || (a.row == b.row && a.col < b.col));
      }) == edges.end();
  if (canonical) {
    // Already in strict (row, col) order (global_planner's LocalityEdges):
    // no copy, no sort.
    SparseRows m;
    m.start.assign(static_cast<size_t>(n) + 1, 0);
    m.col.reserve(edges.size());
    m.weight.reserve(edges.size());
    for (const WeightedEdge& e : edges) {
      assert(e.row >= 0 && e.row < n && e.col >= 0 && e.col < n && e.weight >= 0 && "SparseAssignment entry");
      m.col.push_back(e.col);
      m.weight.push_back(e.weight);
      ++m.start[static_cast<size_t>(e.row) + 1];
    }
    for (int r = 0; r < n; ++r) m.start[r + 1] += m.start[r];
    return m;
  }
  std::vector<WeightedEdge> sorted = edges;
  for (const WeightedEdge& e : sorted) {
    assert(e.row >= 0 && e.row < n && e.col >= 0 && e.col < n && e.weight >= 0 && "SparseAssignment entry");
    (void)e;
  }
  const auto by_row_col = [](const WeightedEdge& a, const WeightedEdge& b) {
    return a.row != b.row ? a.row < b.row : a.col < b.col;
  };
  const bool rows_in_order =
      std::is_sorted(sorted.begin(), sorted.end(),
                     [](const WeightedEdge& a, const WeightedEdge& b) { return a.row < b.row; });
  if (rows_in_order) {
    // The usual input (one row after another): sort each short row alone.
    for (size_t i = 0; i < sorted.size();) {
      size_t j = i;
      while (j < sorted.size() && sorted[j].row == sorted[i].row) ++j;
      std::sort(sorted.begin() + static_cast<std::ptrdiff_t>(i),
                sorted.begin() + static_cast<std::ptrdiff_t>(j), by_row_col);
      i = j;
    }
  } else {
    std::sort(sorted.begin(), sorted.end(), by_row_col);
  }
  SparseRows m;
  m.start.assign(static_cast<size_t>(n) + 1, 0);
  for (size_t i = 0; i < sorted.size(); ++i) {
    const WeightedEdge& e = sorted[i];
    if (i > 0 && sorted[i - 1].row == e.row && sorted[i - 1].col == e.col) {
      m.weight.back() += e.weight;
      continue;
    }
    m.col.push_back(e.col);
    m.weight.push_back(e.weight);
    ++m.start[static_cast<size_t>(e.row) + 1];
  }
  for (int r = 0; r < n; ++r) m.start[r + 1] += m.start[r];
  return m;
}

bool Improve(int n, const SparseRows& m, std::vector<int>& col_of_row, int passes) {
  std::vector<int> row_of_col(n, -1);
  for (int r = 0; r < n; ++r) row_of_col[col_of_row[r]] = r;
  bool changed = false;
  for (int pass = 0; pass < passes; ++pass) {
    bool improved = false;
    for (int a = 0; a < n; ++a) {
      for (size_t k = m.start[a]; k < m.start[a + 1]; ++k) {
        const int ca = col_of_row[a];
        const int c = m.col[k];
        if (c == ca) continue;
        const int64_t wa = m.At(a, ca);
        if (m.weight[k] <= wa) continue;  // then only b's side could gain: tried from row b
        const int b = row_of_col[c];
        const int64_t gain = m.weight[k] + m.At(b, ca) - wa - m.At(b, c);
        if (gain <= 0) continue;
        col_of_row[a] = c;
        col_of_row[b] = ca;
        row_of_col[c] = a;
        row_of_col[ca] = b;
        improved = true;
      }
    }
    changed = changed || improved;
    if (!improved) break;
  }
  return changed;
}

}  // namespace

std::vector<int> SparseAssignment(int n, const std::vector<WeightedEdge>& edges, int improve_passes) {
  if (n <= 0) return {};
  const SparseRows m = BuildRows(n, edges);
  // Ties in weight (a group's node term is the same for every rank of the
  // node) go to the column fewer rows want, so that a column some other row
  // needs is not taken by a row that any of several would serve; then to the
  // smaller entry index, i.e. (entries are in (row, col) order) the smaller
  // row, then column. A total order: std::sort gives one result everywhere.
  std::vector<uint32_t> demand(n, 0);
  for (int32_t c : m.col) ++demand[c];
  struct Keyed {
    int64_t weight;
    uint32_t demand;
    uint32_t entry;
  };
  std::vector<Keyed> order;
  order.reserve(m.col.size());
  for (size_t k = 0; k < m.col.size(); ++k) {
    if (m.weight[k] > 0) order.push_back({m.weight[k], demand[m.col[k]], static_cast<uint32_t>(k)});
  }
  std::sort(order.begin(), order.end(), [](const Keyed& x, const Keyed& y) {
    if (x.weight != y.weight) return x.weight > y.weight;
    if (x.demand != y.demand) return x.demand < y.demand;
    return x.entry < y.entry;
  });
  std::vector<int32_t> row_of_entry(m.col.size());
  for (int r = 0; r < n; ++r) {
    for (size_t k = m.start[r]; k < m.start[r + 1]; ++k) row_of_entry[k] = r;
  }
  std::vector<int> col_of_row(n, -1), row_of_col(n, -1);
  for (const Keyed& e : order) {
    const size_t k = e.entry;
    const int r = row_of_entry[k], c = m.col[k];
    if (col_of_row[r] != -1 || row_of_col[c] != -1) continue;
    col_of_row[r] = c;
    row_of_col[c] = r;
  }
  int free_col = 0;
  for (int r = 0; r < n; ++r) {
    if (col_of_row[r] != -1) continue;
    while (row_of_col[free_col] != -1) ++free_col;
    col_of_row[r] = free_col;
    row_of_col[free_col] = r;
  }
  Improve(n, m, col_of_row, improve_passes);
  return col_of_row;
}

bool ImproveSparseAssignment(int n, const std::vector<WeightedEdge>& edges, std::vector<int>& col_of_row,
                             int passes) {
  if (n <= 0) return false;
  return Improve(n, BuildRows(n, edges), col_of_row, passes);
}

int64_t SparseAssignmentWeight(int n, const std::vector<WeightedEdge>& edges,
                               const std::vector<int>& col_of_row) {
  int64_t total = 0;
  for (const WeightedEdge& e : edges) {
    if (e.row >= 0 && e.row < n && col_of_row[e.row] == e.col) total += e.weight;
  }
  return total;
}

}  // namespace odb::balance
