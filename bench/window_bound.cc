#include "bench/window_bound.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

namespace odb::bench {

// Proofs. A layout of a window with equal counts gives every one of the W
// ranks n >= 1 micro-steps; a non-empty one holds samples within the budget
// (count x longest <= L padded, sum <= L packed; at most max_group_size
// samples) or a single sample, and costs a + g(p) + c (its sum of squares);
// an IDLE one costs a. T_w = the largest rank sum.
//
// (A) T_w >= the mean rank sum = n a + (sum over non-empty micro-steps of
//     g(p_j) + c Q) / W (Q: the window's sum of squares; each sample is in
//     exactly one micro-step).
//     Padded: there are at most W n non-empty micro-steps, a partition of the
//     samples into at most W n groups within the budget, so the sum of g is
//     at least P(W n), the least such sum over all partitions into at most
//     W n groups. P is reached by runs of the samples sorted by length:
//     order any partition's groups by their longest, M_1 >= M_2 >= ..., with
//     sizes s_1, s_2, ...; give the s_1 longest samples to the first run,
//     the next s_2 to the second, and so on. Every sample longer than M_j
//     lies in groups 1..j-1 (the others' longest is <= M_j), so at most
//     s_1 + ... + s_{j-1} samples are longer than M_j and the j-th run's
//     longest is <= M_j: each run has the size of its group and a longest no
//     larger, so it keeps the budget (a singleton stays one) and costs no
//     more (g is non-decreasing). LeastPaddedCompute is the exact least sum
//     over runs (dynamic programme over the sorted samples and the number of
//     runs), hence exactly P.
//     Packed: with J non-empty micro-steps, J >= G (G: the Martello-Toth
//     bin-packing bound on steps of at most L real tokens, or the samples
//     over max_group_size), and sum g(p_j) >= J g(R / J) (g convex, Jensen;
//     R: real tokens, p_j sums to R); J g(R / J) is non-decreasing in J (its
//     derivative g(x) - x g'(x) at x = R / J is >= g(0) >= 0 by convexity),
//     so the sum is >= G g(R / G).
// (B) Sort the samples longest first, l_1 >= l_2 >= ...; for t >= 0 with
//     t W + 1 <= N, the t W + 1 longest lie on W ranks, so some rank holds
//     t + 1 of them (pigeonhole). That rank's sum is >= n a + sum over its
//     non-empty micro-steps of g(p_j) + c (its squares). g is superadditive:
//     g(x) + g(y) >= max(m + m, b (x + k) + b (y + k)) >= max(m, b (x + y +
//     k)) = g(x + y) for x, y >= 0 (m, b, k >= 0); and p_j >= the real
//     tokens of micro-step j (padded: count x longest >= the sum). So the
//     rank's sum is >= n a + g(its real tokens) + c (its squares) >= n a +
//     g(s_t) + c q_t, s_t and q_t the sum and the sum of squares of the t + 1
//     shortest of the t W + 1 longest (any t + 1 of them are no shorter,
//     term by term). t = 0 is the longest sample alone.
// (B') Makespan: a rank holding samples costs >= n a + g(R_r) + c Q_r >= n a
//     + b k + sum over its samples of w_i = b l_i + c l_i^2 (as in (B), and
//     g(R) >= b (R + k)), so T_w >= n a + b k + the least makespan of the
//     weights w_i on W machines. That makespan exceeds every C for which the
//     weights cannot be packed into W bins of capacity C, in particular every
//     C whose Martello-Toth bin-packing bound exceeds W (or below the largest
//     weight). The weights are scaled to integers rounded down and C rounded
//     up (both only lower the bin-packing bound of the true weights).
// (C) n >= n_0: padded, the W n micro-steps hold the samples, so W n >= the
//     fewest groups within the budget (greedy runs of the sorted samples are
//     the fewest: a run from a later, shorter sample can hold at least as
//     many, so the greedy's k-th run ends no earlier than any other's; and
//     the exchange above keeps the number of groups); packed, W n >= G.
// A layout with its own n is >= max(A(n), B(n)) >= the min over n >= n_0.
// (A) with (D), the bound in use (s27; the above alone is LooseEqualCountsWindowBound):
//     the mean term (A) counts each micro-step at what it computes, but lets
//     the least compute use any number of groups up to W n. Every non-empty
//     micro-step pays at least b k (and m), so a cut into fewer groups than
//     the layout's non-empty micro-steps skips that cost; and (A) spreads the
//     compute evenly over the ranks, while a rank that holds many tokens must
//     hold them in enough micro-steps. So split by J, the layout's number of
//     non-empty micro-steps, and j_r <= n, rank r's share of them (its other
//     n - j_r micro-steps are IDLE at a; sum j_r = J, Jmin <= J <= N).
//     (A_J) T_w - n a >= (E(J) + c Q) / W, E(J) a lower bound on the sum of g
//         over EXACTLY J groups within the budget. Padded: the least such sum,
//         exact: the exchange of (A) keeps every group's size, so runs of the
//         sorted samples reach it with the same number of groups (a dynamic
//         programme over the sorted samples, one layer per group). Packed:
//         J g(R / J) (Jensen, as in (A)).
//     (D) every non-empty micro-step holds at most pmax real tokens: padded,
//         its real tokens are <= count x longest, which is <= the largest run
//         of the sorted samples the budget allows from any sample (the
//         samples no longer than the longest, as many as fit); packed,
//         max_tokens (and the max_group_size longest samples), or one sample,
//         <= the longest. So rank r's real tokens R_r <= j_r pmax, and its
//         sum is >= n a + sum over its micro-steps of (b (p + k) + c sum of
//         squares) >= n a + b (R_r + k j_r) + c l_min R_r (g(p) >= b (p + k),
//         p >= real tokens, len^2 >= l_min len). With b' = b + c l_min, rank
//         r has R_r <= h(j_r, T') := min(j_r pmax, (T' - b k j_r) / b'),
//         T' = T_w - n a; the R_r sum to R, so sum_r h(j_r, T') >= R, and T'
//         is at least the least T' where that holds, D(j).
//     For a fixed J only D depends on how J is shared. h is concave in j (the
//     least of two affine functions), so moving one micro-step from a rank
//     with j_x to one with j_y <= j_x - 2 does not lower sum_r h at any T';
//     the even share (J div W or one more) thus has the largest sum at every
//     T' and the smallest D(j) over all shares of J, D(J); its largest share
//     ceil(J / W) <= n whenever J <= W n, so it is one of the shares allowed.
//     D(J) is solved in closed form (sum_r h is piecewise linear in T', with
//     a kink where each of the two share sizes saturates at j pmax).
//     So T_w >= n a + max(B, min over Jmin <= J <= min(W n, N) of
//     max((E(J) + c Q) / W, D(J))), and the bound is the min of that over
//     n >= n_0. It is never below the loose bound: min over J <= W n of E(J)
//     is (A)'s least compute in at most W n groups (packed: J g(R / J) is
//     non-decreasing in J).
//     The search: both terms are taken J by J as n grows (a larger n only
//     adds J up to W n). E(J) >= b (R + J k), J m and the least over any
//     number of groups, a lower bound non-decreasing in J (packed: E
//     itself); once n a plus it (or B) reaches the best so far, no larger J
//     or n can give less; and once n a plus the lesser of the best over the
//     J taken and that lower bound at the next J (or B) reaches it, no larger
//     n can (its J are those taken and larger ones).

namespace {

double Square(double x) { return x * x; }

// Runs of the length-sorted (longest first) samples: the longest run that
// may start at sample i (count x l_i <= L, count <= max_group_size; 1 at
// least).
std::vector<size_t> LongestRuns(const std::vector<uint32_t>& sorted, const grouping::Budget& budget) {
  const size_t n = sorted.size();
  std::vector<size_t> run(n, 1);
  for (size_t i = 0; i < n; ++i) {
    size_t len = n - i;
    if (budget.max_tokens != 0) {
      len = sorted[i] == 0 ? len : std::min<size_t>(len, budget.max_tokens / sorted[i]);
    }
    if (budget.max_group_size != 0) len = std::min<size_t>(len, budget.max_group_size);
    run[i] = std::max<size_t>(1, len);
  }
  return run;
}

// The dynamic programme of LeastPaddedCompute, one layer (one more run
// allowed) at a time: cur[j] = the least sum of g over at most `layers` runs
// covering the j longest samples.
class PaddedRuns {
 public:
  PaddedRuns(std::vector<uint32_t> sorted, const grouping::Budget& budget, const StepModel& model)
      : sorted_(std::move(sorted)), run_(LongestRuns(sorted_, budget)), model_(model) {
    cur_.assign(sorted_.size() + 1, kInf);
    cur_[0] = 0.0;
  }
  // The value with at most `groups` runs.
  double At(uint64_t groups) {
    while (layers_ < groups && !settled_) Step();
    return cur_.back();
  }

 private:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  void Step() {
    std::vector<double> next = cur_;
    bool changed = false;
    for (size_t i = 0; i < sorted_.size(); ++i) {
      if (cur_[i] == kInf) continue;
      for (size_t len = 1; len <= run_[i]; ++len) {
        const double v = cur_[i] + model_.Compute(static_cast<double>(len) * sorted_[i]);
        if (v < next[i + len]) {
          next[i + len] = v;
          changed = true;
        }
      }
    }
    cur_ = std::move(next);
    ++layers_;
    settled_ = !changed;
  }
  std::vector<uint32_t> sorted_;
  std::vector<size_t> run_;
  StepModel model_;
  std::vector<double> cur_;
  uint64_t layers_ = 0;
  bool settled_ = false;
};

// A lower bound on the least makespan of `weights` on `world` machines:
// the largest C found (bisection) whose bin-packing bound exceeds `world`,
// at least the largest weight and the mean.
double MakespanLowerBound(const std::vector<double>& weights, uint64_t world) {
  double total = 0.0, largest = 0.0;
  for (double w : weights) {
    total += w;
    largest = std::max(largest, w);
  }
  const double mean = total / static_cast<double>(world);
  double lo = std::max(largest, mean);
  if (weights.size() <= world || total <= 0.0) return largest;
  const double scale = std::ldexp(1.0, 40) / total;
  std::vector<uint64_t> sizes;
  sizes.reserve(weights.size());
  for (double w : weights) sizes.push_back(static_cast<uint64_t>(std::floor(w * scale)));
  auto exceeds = [&](double c) {  // no packing into `world` bins of capacity c
    const uint64_t cap = static_cast<uint64_t>(std::ceil(c * scale));
    return BinPackingLowerBound(sizes, cap) > world;
  };
  if (!exceeds(lo)) return lo;
  double hi = total;  // one bin holds everything
  for (int it = 0; it < 40; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (exceeds(mid)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

std::vector<uint32_t> SortedLongestFirst(const std::vector<SampleLengths>& samples) {
  std::vector<uint32_t> sorted;
  sorted.reserve(samples.size());
  for (const SampleLengths& s : samples) sorted.push_back(s.tokens);
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  return sorted;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// The dynamic programme of (A_J) padded, one layer (one more run) at a time:
// cur_[i] = the least sum of g over exactly `layers_` runs covering the i
// longest samples.
class ExactRuns {
 public:
  ExactRuns(const std::vector<uint32_t>& sorted, const std::vector<size_t>& run, const StepModel& model)
      : sorted_(sorted), run_(run), model_(model) {
    cur_.assign(sorted_.size() + 1, kInf);
    cur_[0] = 0.0;
  }
  // The least sum of g over exactly `groups` runs (+infinity past N).
  double At(uint64_t groups) {
    if (groups == 0 || groups > sorted_.size()) return groups == 0 ? 0.0 : kInf;
    while (values_.size() < groups) Step();
    return values_[groups - 1];
  }

 private:
  void Step() {
    std::vector<double> next(sorted_.size() + 1, kInf);
    for (size_t i = values_.size(); i < sorted_.size(); ++i) {  // i >= runs so far
      if (cur_[i] == kInf) continue;
      for (size_t len = 1; len <= run_[i]; ++len) {
        const double v = cur_[i] + model_.Compute(static_cast<double>(len) * sorted_[i]);
        if (v < next[i + len]) next[i + len] = v;
      }
    }
    cur_ = std::move(next);
    values_.push_back(cur_.back());
  }
  const std::vector<uint32_t>& sorted_;
  const std::vector<size_t>& run_;
  StepModel model_;
  std::vector<double> cur_;
  std::vector<double> values_;
};

// D(J) of (D): the least T' with sum_r min(j_r pmax, (T' - b k j_r) / b') >=
// R for the even share of J micro-steps on W ranks (q = J div W on W - r
// ranks, q + 1 on r = J mod W). +infinity when J pmax < R.
double CapsBound(uint64_t groups, uint64_t world, const StepModel& model, double real, double lmin,
                 double pmax) {
  const uint64_t q = groups / world, r = groups % world;
  const double qd = static_cast<double>(q), rd = static_cast<double>(r);
  const double wd = static_cast<double>(world), gd = static_cast<double>(groups);
  if (gd * pmax < real) return kInf;
  const double bk = model.b * model.k;
  const double slope = model.b + model.c * lmin;
  if (slope <= 0.0) return bk * (r > 0 ? qd + 1.0 : qd);  // only T' >= b k j_r is left
  // A share j saturates (j pmax) from T' = j (b k + b' pmax) on.
  const double tq = qd * (bk + slope * pmax);
  const double t1 = (slope * real + bk * gd) / wd;  // no share saturated: sum = (W T' - b k J) / b'
  if (r == 0) return std::min(t1, tq);              // (t1 <= tq: J pmax >= R)
  if (t1 <= tq) return t1;
  // The q shares saturated: (W - r) q pmax + r (T' - b k (q + 1)) / b' = R.
  const double t2 = bk * (qd + 1.0) + slope * (real - (wd - rd) * qd * pmax) / rd;
  return std::min(t2, (qd + 1.0) * (bk + slope * pmax));
}

// The search of (A_J) and (D) over n >= out.fewest and J (see the proofs):
// `exact(J)` is E(J), `lower(J)` a lower bound on it non-decreasing in J.
template <class Exact, class Lower>
void SearchCounts(EqualCountsBound& out, uint64_t jmin, uint64_t samples, uint64_t world,
                  const StepModel& model, double real, double sq, double lmin, double pmax, double pigeon,
                  Exact exact, Lower lower) {
  const double wd = static_cast<double>(world);
  auto mean = [&](double compute) { return (compute + model.c * sq) / wd; };
  double best_rest = kInf;  // min over the J taken so far of max(mean, D)
  uint64_t next = jmin;     // the next J
  bool done = false;        // no larger J can help
  out.bound = kInf;
  for (uint64_t count = out.fewest;; ++count) {
    const double base = static_cast<double>(count) * model.a;
    // What this n or a larger one can give at best: the J taken, or a J
    // still to take (E >= lower, non-decreasing).
    if (base + std::max(pigeon, std::min(best_rest, mean(lower(next)))) >= out.bound) break;
    const uint64_t last = std::min<uint64_t>(count * world, samples);
    for (; !done && next <= last; ++next) {
      if (base + std::max(pigeon, mean(lower(next))) >= out.bound) {
        done = true;
        break;
      }
      best_rest =
          std::min(best_rest, std::max(mean(exact(next)), CapsBound(next, world, model, real, lmin, pmax)));
    }
    const double v = base + std::max(pigeon, best_rest);
    if (v < out.bound) {
      out.bound = v;
      out.best_count = count;
    }
    if (done || next > samples) break;  // the rest no longer falls; n a only grows
  }
}

// Both bounds; `loose`: session 26's (A) and (B) only.
EqualCountsBound WindowBound(const std::vector<SampleLengths>& samples, const grouping::Budget& budget,
                             const StepModel& model, int world, bool loose) {
  EqualCountsBound out;
  const uint64_t w = static_cast<uint64_t>(std::max(world, 1));
  const double wd = static_cast<double>(w);
  if (samples.empty()) {  // every rank still runs one (IDLE) micro-step
    out.bound = model.a;
    out.fewest = out.best_count = 1;
    return out;
  }
  const std::vector<uint32_t> sorted = SortedLongestFirst(samples);
  const size_t n = sorted.size();
  double real = 0.0, sq = 0.0;
  for (uint32_t l : sorted) {
    real += l;
    sq += Square(l);
  }
  const double lmin = static_cast<double>(sorted.back());
  // (B) without its n a.
  double pigeon = 0.0;
  for (uint64_t t = 0; t * w + 1 <= n; ++t) {
    double s = 0.0, q = 0.0;
    for (uint64_t i = t * w - t; i <= t * w; ++i) {
      s += sorted[i];
      q += Square(sorted[i]);
    }
    pigeon = std::max(pigeon, model.Compute(s) + model.c * q);
  }
  // (B') the makespan of the linear weights.
  {
    std::vector<double> weights;
    weights.reserve(n);
    for (uint32_t l : sorted) weights.push_back(model.b * l + model.c * Square(l));
    pigeon = std::max(pigeon, model.b * model.k + MakespanLowerBound(weights, w));
  }
  auto ceil_div = [](uint64_t x, uint64_t y) { return (x + y - 1) / y; };
  if (budget.model == grouping::CostModel::kPacked) {
    // (C) and (A) packed.
    uint64_t g = 1;
    if (budget.max_tokens != 0) {
      std::vector<uint64_t> sizes;
      sizes.reserve(n);
      for (uint32_t l : sorted) sizes.push_back(std::min<uint64_t>(l, budget.max_tokens));
      g = std::max<uint64_t>(g, BinPackingLowerBound(std::move(sizes), budget.max_tokens));
    }
    if (budget.max_group_size != 0) g = std::max<uint64_t>(g, ceil_div(n, budget.max_group_size));
    out.fewest = out.best_count = std::max<uint64_t>(1, ceil_div(g, w));
    auto compute = [&](uint64_t groups) {  // J g(R / J), non-decreasing in J
      const double gd = static_cast<double>(groups);
      return gd * model.Compute(real / gd);
    };
    if (loose) {  // the (A) - n a part does not depend on n: the least n is the best
      out.bound =
          static_cast<double>(out.fewest) * model.a + std::max((compute(g) + model.c * sq) / wd, pigeon);
      return out;
    }
    // (D) packed.
    double cap = budget.max_tokens != 0 ? static_cast<double>(budget.max_tokens) : real;
    if (budget.max_group_size != 0) {
      double top = 0.0;
      for (size_t i = 0; i < std::min<size_t>(n, budget.max_group_size); ++i) top += sorted[i];
      cap = std::min(cap, top);
    }
    const double pmax = std::max(cap, static_cast<double>(sorted.front()));
    SearchCounts(out, g, n, w, model, real, sq, lmin, pmax, pigeon, compute, compute);
    return out;
  }
  // Padded. (C): the fewest runs, greedy.
  const std::vector<size_t> run = LongestRuns(sorted, budget);
  uint64_t fewest_runs = 0;
  for (size_t i = 0; i < n; i += run[i]) ++fewest_runs;
  out.fewest = std::max<uint64_t>(1, ceil_div(fewest_runs, w));
  // The least the compute can be with any number of runs (n runs: singletons
  // are always allowed), to know when a larger n can no longer help.
  std::vector<double> unlimited(n + 1, kInf);
  unlimited[0] = 0.0;
  for (size_t i = 0; i < n; ++i) {
    for (size_t len = 1; len <= run[i]; ++len) {
      unlimited[i + len] =
          std::min(unlimited[i + len], unlimited[i] + model.Compute(static_cast<double>(len) * sorted[i]));
    }
  }
  if (loose) {
    PaddedRuns dp(sorted, budget, model);
    const double floor_rest = std::max(pigeon, (unlimited[n] + model.c * sq) / wd);
    out.bound = kInf;
    for (uint64_t count = out.fewest;; ++count) {
      const double base = static_cast<double>(count) * model.a;
      if (base + floor_rest >= out.bound) break;
      const double mean = (dp.At(count * w) + model.c * sq) / wd;
      const double v = base + std::max(mean, pigeon);
      if (v < out.bound) {
        out.bound = v;
        out.best_count = count;
      }
      if (model.a <= 0.0 && count * w >= n) break;  // no more runs help
    }
    return out;
  }
  // (D) padded: the largest run's padded tokens.
  double pmax = 0.0;
  for (size_t i = 0; i < n; ++i) pmax = std::max(pmax, static_cast<double>(run[i]) * sorted[i]);
  ExactRuns exact(sorted, run, model);
  const double least = unlimited[n];
  SearchCounts(
      out, fewest_runs, n, w, model, real, sq, lmin, pmax, pigeon, [&](uint64_t j) { return exact.At(j); },
      [&](uint64_t j) {
        const double jd = static_cast<double>(j);
        return std::max({least, model.b * (real + jd * model.k), jd * model.m});
      });
  return out;
}

}  // namespace

double LeastPaddedCompute(const std::vector<SampleLengths>& samples, const grouping::Budget& budget,
                          const StepModel& model, uint64_t groups, std::vector<double>* out) {
  PaddedRuns dp(SortedLongestFirst(samples), budget, model);
  if (out != nullptr) {
    out->clear();
    for (uint64_t j = 1; j <= groups; ++j) out->push_back(dp.At(j));
  }
  return dp.At(groups);
}

std::vector<double> LeastPaddedComputeExact(const std::vector<SampleLengths>& samples,
                                            const grouping::Budget& budget, const StepModel& model,
                                            uint64_t groups) {
  const std::vector<uint32_t> sorted = SortedLongestFirst(samples);
  const std::vector<size_t> run = LongestRuns(sorted, budget);
  ExactRuns exact(sorted, run, model);
  std::vector<double> out;
  for (uint64_t j = 1; j <= groups; ++j) out.push_back(exact.At(j));
  return out;
}

EqualCountsBound EqualCountsWindowBound(const std::vector<SampleLengths>& samples,
                                        const grouping::Budget& budget, const StepModel& model, int world) {
  return WindowBound(samples, budget, model, world, /*loose=*/false);
}

EqualCountsBound LooseEqualCountsWindowBound(const std::vector<SampleLengths>& samples,
                                             const grouping::Budget& budget, const StepModel& model,
                                             int world) {
  return WindowBound(samples, budget, model, world, /*loose=*/true);
}

}  // namespace odb::bench
