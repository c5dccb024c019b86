#ifndef ODB_BALANCE_ASSIGNMENT_H_
#define ODB_BALANCE_ASSIGNMENT_H_

#include <cstdint>
#include <vector>

namespace odb::balance {

// Exact maximum-weight perfect matching on a square n x n matrix (Hungarian
// algorithm, O(n^3) integer arithmetic, so the result is exact and the same on
// every machine). weight[i][j] is the gain of giving row i column j. Returns
// col_of_row: row i gets column col_of_row[i]. Ties are broken
// deterministically (the algorithm is a pure function of the matrix).
// Precondition: every row has n entries; n may be 0.
std::vector<int> MaxWeightAssignment(const std::vector<std::vector<int64_t>>& weight);

// Sum of weight[i][col_of_row[i]].
int64_t AssignmentWeight(const std::vector<std::vector<int64_t>>& weight, const std::vector<int>& col_of_row);

// One non-zero entry of a sparse n x n weight matrix. Entries not listed are
// 0; duplicate (row, col) entries add up.
struct WeightedEdge {
  int32_t row = 0;
  int32_t col = 0;
  int64_t weight = 0;
};

// Perfect assignment of n rows to n columns for SPARSE non-negative weights,
// in O(E log E + passes * E log d) for E entries and d entries per row,
// instead of the Hungarian algorithm's O(n^3) time and O(n^2) memory (at
// n = 2560: 17 * 10^9 steps and 52 MB per call). Not exact: greedy by
// descending weight (ties: smaller row, then smaller column), every row left
// over takes the smallest free column in row order, then at most
// `improve_passes` sweeps of pairwise exchanges that raise the total weight
// (every exchange that can raise it involves an entry > 0, so only listed
// entries are tried). A pure function of (n, edges, improve_passes): the same
// result on every machine. Precondition: 0 <= row, col < n, weight >= 0.
std::vector<int> SparseAssignment(int n, const std::vector<WeightedEdge>& edges, int improve_passes);

// The pairwise-exchange sweeps of SparseAssignment, applied to an existing
// perfect assignment `col_of_row` (a permutation of 0..n-1), at most `passes`
// sweeps. Returns whether anything changed.
bool ImproveSparseAssignment(int n, const std::vector<WeightedEdge>& edges, std::vector<int>& col_of_row,
                             int passes);

// Sum of the weights of the entries col_of_row selects (duplicates added).
int64_t SparseAssignmentWeight(int n, const std::vector<WeightedEdge>& edges,
                               const std::vector<int>& col_of_row);

}  // namespace odb::balance

#endif  // ODB_BALANCE_ASSIGNMENT_H_
