#include "bench/bound.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

namespace odb::bench {

double StepModel::Compute(double padded_tokens) const { return std::max(m, b * (padded_tokens + k)); }

grouping::StepTimeModel StepModel::PlannerModel() const {
  grouping::StepTimeModel planner;
  planner.per_step = a + b * k;
  planner.per_padded_token = b;
  planner.per_len_sq = c;
  return planner;
}

namespace {

std::vector<uint32_t> SortedTokens(const std::vector<SampleLengths>& samples) {
  std::vector<uint32_t> lens;
  lens.reserve(samples.size());
  for (const SampleLengths& s : samples) lens.push_back(s.tokens);
  std::sort(lens.begin(), lens.end());
  return lens;
}

double SumSquares(const std::vector<uint32_t>& lens) {
  double sum = 0.0;
  for (uint32_t l : lens) sum += static_cast<double>(l) * l;
  return sum;
}

// A run of `size` samples whose longest has `longest` tokens respects the
// padded budget (token limit and group-size cap). Monotone in both arguments.
bool RunFits(const grouping::Budget& budget, uint64_t size, uint32_t longest) {
  if (budget.max_group_size != 0 && size > budget.max_group_size) return false;
  return budget.max_tokens == 0 ||
         grouping::PaddedBudgetCost(budget, size, longest) <= static_cast<double>(budget.max_tokens);
}

// Exact padded optimum over runs of the ascending order `lens` (see
// docs/benchmarks.md for why runs suffice): best[i] = min over the last run
// (j, i] of best[j] + a + g((i - j) * lens[i - 1]). The run grows while it
// fits (feasibility is monotone), so the inner loop stops at the first
// infeasible run: O(n * L / shortest) at worst. A lone sample always forms a
// run (a sample over budget is emitted alone by every policy). Returns the
// cost without the c * sum(len^2) term; `cut[i]` is where the last run of
// best[i] starts.
double PaddedDp(const std::vector<uint32_t>& lens, const grouping::Budget& budget, const StepModel& model,
                std::vector<size_t>* cut) {
  const size_t n = lens.size();
  std::vector<double> best(n + 1, std::numeric_limits<double>::infinity());
  best[0] = 0.0;
  if (cut) cut->assign(n + 1, 0);
  for (size_t i = 1; i <= n; ++i) {
    const uint32_t longest = lens[i - 1];
    for (size_t size = 1; size <= i; ++size) {
      if (size > 1 && !RunFits(budget, size, longest)) break;
      const double padded = static_cast<double>(size) * longest;
      const double cost = best[i - size] + model.a + model.Compute(padded);
      if (cost < best[i]) {
        best[i] = cost;
        if (cut) (*cut)[i] = i - size;
      }
    }
  }
  return best[n];
}

}  // namespace

uint64_t BinPackingLowerBound(std::vector<uint64_t> sizes, uint64_t capacity) {
  if (sizes.empty()) return 0;
  if (capacity == 0) return 1;  // no token limit: one bin holds everything
  for (uint64_t& s : sizes) s = std::min(s, capacity);
  std::sort(sizes.begin(), sizes.end());
  const size_t n = sizes.size();
  std::vector<uint64_t> prefix(n + 1, 0);  // prefix[i] = sum of the i smallest
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + sizes[i];
  // Index of the first item with size > x (upper_bound) / >= x (lower_bound).
  auto above = [&](uint64_t x) {
    return static_cast<size_t>(std::upper_bound(sizes.begin(), sizes.end(), x) - sizes.begin());
  };
  auto at_least = [&](uint64_t x) {
    return static_cast<size_t>(std::lower_bound(sizes.begin(), sizes.end(), x) - sizes.begin());
  };
  const size_t half = above(capacity / 2);  // first item with 2 * size > capacity (integer sizes)
  uint64_t best = (prefix[n] + capacity - 1) / capacity;  // L1 = ceil(total / C)
  // L(alpha) for alpha = 0 and every distinct size <= C / 2 (L2 of Martello
  // and Toth, 1990): J1 = {s > C - alpha}, J2 = {C/2 < s <= C - alpha},
  // J3 = {alpha <= s <= C/2}; L(alpha) = |J1| + |J2| +
  // max(0, ceil((sum J3 - (|J2| C - sum J2)) / C)).
  std::vector<uint64_t> alphas = {0};
  for (size_t i = 0; i < half; ++i) {
    if (i == 0 || sizes[i] != sizes[i - 1]) alphas.push_back(sizes[i]);
  }
  for (uint64_t alpha : alphas) {
    const size_t j1_begin = above(capacity - alpha);
    const size_t j3_begin = at_least(alpha);
    const uint64_t j1 = n - j1_begin;
    const uint64_t j2 = j1_begin - half;
    const uint64_t sum_j2 = prefix[j1_begin] - prefix[half];
    const uint64_t sum_j3 = prefix[half] - prefix[std::min(j3_begin, half)];
    const uint64_t room = j2 * capacity - sum_j2;
    const uint64_t extra = sum_j3 > room ? (sum_j3 - room + capacity - 1) / capacity : 0;
    best = std::max(best, j1 + j2 + extra);
  }
  return best;
}

double RowsSumSquaresBound(std::vector<uint32_t> lengths, uint64_t rows, uint64_t cap) {
  // Only a sample within the budget fits a row; longest first.
  if (cap != 0) {
    lengths.erase(std::remove_if(lengths.begin(), lengths.end(), [&](uint32_t l) { return l > cap; }),
                  lengths.end());
  }
  std::sort(lengths.begin(), lengths.end(), std::greater<uint32_t>());
  const double all = SumSquares(lengths);
  if (rows == 0 || lengths.empty()) return 0.0;
  if (cap == 0) return all;
  const double c = static_cast<double>(cap);
  // (ii) A row whose longest sample has m tokens holds reals in [0, m] summing
  // to at most cap: at most psi(m) = q m^2 + r^2 (q = floor(cap / m), r = cap -
  // q m), non-decreasing in m; the rows' longest are distinct samples.
  double psi = 0.0;
  for (size_t j = 0; j < std::min<size_t>(rows, lengths.size()) && lengths[j] > 0; ++j) {
    const double m = lengths[j], q = std::floor(c / m), r = c - q * m;
    psi += q * m * m + r * r;
  }
  // (iii) For any lambda >= 0: sum len^2 = lambda sum len + sum len (len -
  // lambda) <= lambda rows cap + the most sum len (len - lambda) over samples
  // longer than lambda, at most k rows of them longer than cap / (k + 1) (k + 1
  // of those overflow a row). Those counts are nested caps on prefixes of the
  // longest-first order, along which len (len - lambda) decreases: taking each
  // sample the caps admit is optimal (a laminar matroid). Convex in lambda,
  // linear between sample lengths: searched over them.
  constexpr uint64_t kCaps = 64;
  std::vector<uint32_t> candidates = {0};
  for (auto it = lengths.rbegin(); it != lengths.rend(); ++it) {
    if (*it != candidates.back()) candidates.push_back(*it);
  }
  auto bound_at = [&](double lambda) {
    uint64_t counts[kCaps + 1] = {};
    double sum = 0.0;
    for (uint32_t l : lengths) {
      if (l <= lambda) break;
      const uint64_t first = std::max<uint64_t>(1, cap / l);  // in cap k for every k >= first
      bool admitted = true;
      for (uint64_t k = first; k <= kCaps && admitted; ++k) admitted = counts[k] < k * rows;
      if (!admitted) continue;
      for (uint64_t k = first; k <= kCaps; ++k) ++counts[k];
      sum += static_cast<double>(l) * (l - lambda);
    }
    return lambda * static_cast<double>(rows) * c + sum;
  };
  size_t lo = 0, hi = candidates.size() - 1;  // first index whose next value is no smaller
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (bound_at(candidates[mid + 1]) >= bound_at(candidates[mid])) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return std::min({all, psi, bound_at(candidates[lo])});
}

Bounds LowerBounds(const std::vector<SampleLengths>& samples, const grouping::Budget& budget,
                   const StepModel& model, int world) {
  Bounds bounds;
  if (samples.empty() || world < 1) return bounds;
  const std::vector<uint32_t> lens = SortedTokens(samples);
  const double attention = model.c * SumSquares(lens);
  std::vector<size_t> cut;
  bounds.padded = (PaddedDp(lens, budget, model, &cut) + attention) / world;
  for (size_t i = lens.size(); i > 0; i = cut[i]) ++bounds.padded_groups;

  // Any layout: a rank step holds real tokens s_g <= L and computes on at
  // least s_g, so it costs at least a + g(s_g) + c * (its sum of len^2). With
  // G steps, sum_g g(s_g) >= G * g(total / G) (Jensen: g is convex), and
  // G >= G_min (no G_min - 1 bins of capacity L hold the tokens).
  std::vector<uint64_t> sizes(lens.begin(), lens.end());
  const double total = std::accumulate(sizes.begin(), sizes.end(), 0.0);
  bounds.min_rank_steps = budget.max_tokens == 0 ? 1 : BinPackingLowerBound(sizes, budget.max_tokens);
  double best = std::numeric_limits<double>::infinity();
  double compute = std::numeric_limits<double>::infinity();
  for (uint64_t g = std::max<uint64_t>(1, bounds.min_rank_steps); g <= lens.size(); ++g) {
    const double steps = static_cast<double>(g);
    best = std::min(best, steps * model.a + steps * model.Compute(total / steps));
    compute = std::min(compute, steps * model.Compute(total / steps));
  }
  bounds.any_layout = (best + attention) / world;
  bounds.compute_floor = (compute + attention) / world;

  // The step that holds the longest sample (see Bounds::largest_sample).
  bounds.largest_sample = bounds.any_layout;
  if (world > 1 && budget.max_tokens != 0) {
    const double l1 = lens.back(), cap = budget.max_tokens;
    const double alone = model.Step(l1, l1 * l1);
    // The other W - 1 rank steps of that step hold samples other than x1,
    // each within the budget (docs/benchmarks.md, "Largest-sample bound").
    std::vector<uint32_t> rest(lens.begin(), lens.end() - 1);
    const double others = (world - 1) * (model.a + model.Compute(cap)) +
                          model.c * RowsSumSquaresBound(std::move(rest), world - 1, budget.max_tokens);
    bounds.largest_sample =
        std::max(bounds.any_layout, bounds.any_layout + alone * (1.0 - 1.0 / world) - others / world);
  }
  return bounds;
}

WindowBounds WindowedBounds(const Bounds& bounds, const StepModel& model, uint64_t windows, bool padded) {
  const double n = static_cast<double>(windows);
  const double base = padded ? std::max(bounds.padded, bounds.any_layout) : bounds.any_layout;
  WindowBounds w;
  const double windows_floor = n * model.a + std::max(n * model.Compute(0.0), bounds.compute_floor);
  w.synchronous = std::max({base, bounds.largest_sample, windows_floor});
  w.per_window = std::max(base, windows_floor);
  return w;
}

std::vector<std::vector<SampleLengths>> OptimalPaddedGroups(const std::vector<SampleLengths>& samples,
                                                            const grouping::Budget& budget,
                                                            const StepModel& model) {
  std::vector<SampleLengths> sorted = samples;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const SampleLengths& x, const SampleLengths& y) { return x.tokens < y.tokens; });
  std::vector<uint32_t> lens;
  lens.reserve(sorted.size());
  for (const SampleLengths& s : sorted) lens.push_back(s.tokens);
  std::vector<size_t> cut;
  PaddedDp(lens, budget, model, &cut);
  std::vector<std::vector<SampleLengths>> groups;
  for (size_t i = lens.size(); i > 0; i = cut[i]) {
    groups.emplace_back(sorted.begin() + static_cast<std::ptrdiff_t>(cut[i]),
                        sorted.begin() + static_cast<std::ptrdiff_t>(i));
  }
  std::reverse(groups.begin(), groups.end());
  return groups;
}

}  // namespace odb::bench
