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
int64_t AssignmentWeight(const std::vector<std::vector<int64_t>>& weight,
                         const std::vector<int>& col_of_row);

}  // namespace odb::balance

#endif  // ODB_BALANCE_ASSIGNMENT_H_
