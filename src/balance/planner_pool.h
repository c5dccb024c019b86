// The global planner's round pool and groups, shared by its parts
// (global_planner.cc: grouping, dealing and dispatch; locality.cc: bringing
// samples home).
#ifndef ODB_BALANCE_PLANNER_POOL_H_
#define ODB_BALANCE_PLANNER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "src/common/sample.h"

namespace odb::balance::internal {

// Inter-node bytes count this many times intra-node bytes in the assignment
// objective (intra-node links are about an order of magnitude faster).
constexpr int64_t kNodeWeight = 8;

// The round's pool: the union of the W windows, in rank order then pending order.
struct Pool {
  std::vector<SampleMeta> metas;
  std::vector<SampleLengths> lens;
};

// Groups as member index lists into the pool.
using Members = std::vector<size_t>;

}  // namespace odb::balance::internal

#endif  // ODB_BALANCE_PLANNER_POOL_H_
