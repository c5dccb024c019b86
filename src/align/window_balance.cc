#include "src/align/window_balance.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "src/align/planned_groups.h"

namespace odb::align {

namespace {

double Square(uint32_t x) { return static_cast<double>(x) * static_cast<double>(x); }

bool SameLengths(const SampleLengths& a, const SampleLengths& b) {
  return a.tokens == b.tokens && a.vision_patches == b.vision_patches && a.audio_frames == b.audio_frames;
}

// One rank's micro-step while a layout is built: its members (indices into
// the window's samples) and the aggregates its cost and budget need.
struct Slot {
  explicit Slot(const grouping::Budget& budget) : tally(budget) {}
  grouping::GroupTally tally;
  std::vector<size_t> members;
  double sum_sq = 0.0;
};

double SlotCost(const WindowBalanceConfig& c, uint64_t count, uint32_t longest, uint64_t sum_tokens,
                double sum_sq) {
  const grouping::StepTimeModel& m = c.step_model;
  if (count == 0) return m.per_step;
  const uint64_t padded = c.budget.model == grouping::CostModel::kPadded ? count * longest : sum_tokens;
  return m.per_step + m.per_padded_token * static_cast<double>(padded) + m.per_len_sq * sum_sq;
}

double SlotCost(const WindowBalanceConfig& c, const Slot& s) {
  return SlotCost(c, s.tally.size(), s.tally.longest_tokens(), s.tally.sum_tokens(), s.sum_sq);
}

// Its cost with `len` added.
double SlotCostWith(const WindowBalanceConfig& c, const Slot& s, const SampleLengths& len) {
  return SlotCost(c, s.tally.size() + 1, std::max(s.tally.longest_tokens(), len.tokens),
                  s.tally.sum_tokens() + len.tokens, s.sum_sq + Square(len.tokens));
}

using Layout = std::vector<std::vector<Slot>>;  // [rank][micro-step]

// The greedy layout with `m` micro-steps per rank (see BalanceWindow), or
// nullopt when some sample fits no micro-step left. `order`: the samples,
// longest first.
std::optional<Layout> Lay(const WindowBalanceConfig& c, std::span<const SampleMeta> samples,
                          std::span<const size_t> order, size_t world, size_t m, double& cost) {
  Layout layout(world, std::vector<Slot>(m, Slot(c.budget)));
  std::vector<double> load(world, static_cast<double>(m) * c.step_model.per_step);
  std::set<std::pair<double, size_t>> by_load;  // (load, rank): the least loaded first
  for (size_t r = 0; r < world; ++r) by_load.insert({load[r], r});
  for (size_t i : order) {
    const SampleMeta& s = samples[i];
    size_t best_r = world, best_k = 0, feasible = 0;
    double best_load = 0.0;
    for (auto it = by_load.begin(); it != by_load.end() && feasible < kCandidateRanks; ++it) {
      const size_t r = it->second;
      size_t k_min = m;
      double d_min = 0.0;
      for (size_t k = 0; k < m; ++k) {
        const Slot& slot = layout[r][k];
        if (!slot.tally.CanAdd(s.lengths)) continue;
        const double d = SlotCostWith(c, slot, s.lengths) - SlotCost(c, slot);
        if (k_min == m || d < d_min) {
          k_min = k;
          d_min = d;
        }
      }
      if (k_min == m) continue;
      ++feasible;
      const double v = load[r] + d_min;
      // Ties: the sample's own rank (no payload move), then the lowest rank.
      const bool own = static_cast<int32_t>(r) == s.owner_rank;
      const bool best_own = best_r != world && static_cast<int32_t>(best_r) == s.owner_rank;
      const bool better = best_r == world || v < best_load ||
                          (v == best_load && (own != best_own ? own : r < best_r));
      if (better) {
        best_r = r;
        best_k = k_min;
        best_load = v;
      }
    }
    if (best_r == world) return std::nullopt;
    Slot& slot = layout[best_r][best_k];
    slot.tally.Add(s.lengths);
    slot.sum_sq += Square(s.lengths.tokens);
    slot.members.push_back(i);
    by_load.erase({load[best_r], best_r});
    load[best_r] = best_load;
    by_load.insert({load[best_r], best_r});
  }
  cost = *std::max_element(load.begin(), load.end());
  return layout;
}

// The best-fit start with `m` micro-steps per rank, for packed windows the
// greedy (Lay) finds no layout for (padded ones have SortedRuns): samples
// longest first (`order`), each into the micro-step, over all ranks, that it
// leaves fullest under the budget
// (GroupTally::BudgetCost after adding it; ties: the least loaded rank, then
// the lowest rank and micro-step). Lay sends each sample to a least loaded
// rank, which spreads the window evenly but, with micro-steps nearly as full
// as the budget allows (a window of one budget per rank, packed), strands
// the last samples where no micro-step has room; best-fit decreasing leaves
// the room in fewer, larger gaps. Returns each rank's members (nullopt when
// some sample fits no micro-step, or `work` passes kMaxBalanceWork).
std::optional<std::vector<std::vector<size_t>>> BestFit(const WindowBalanceConfig& c,
                                                        std::span<const SampleMeta> samples,
                                                        std::span<const size_t> order, size_t world, size_t m,
                                                        uint64_t& work) {
  std::vector<std::vector<grouping::GroupTally>> slots(world,
                                                       std::vector<grouping::GroupTally>(m, grouping::GroupTally(c.budget)));
  std::vector<double> load(world, 0.0);
  std::vector<std::vector<size_t>> assign(world);
  for (size_t i : order) {
    const SampleLengths& len = samples[i].lengths;
    size_t best_r = world, best_k = 0;
    double best_fill = -1.0;
    work += uint64_t{world} * m;
    if (work > kMaxBalanceWork) return std::nullopt;
    for (size_t r = 0; r < world; ++r) {
      for (size_t k = 0; k < m; ++k) {
        grouping::GroupTally next = slots[r][k];
        next.Add(len);
        if (!next.Fits()) continue;
        const double fill = next.BudgetCost();
        if (best_r == world || fill > best_fill || (fill == best_fill && load[r] < load[best_r])) {
          best_r = r;
          best_k = k;
          best_fill = fill;
        }
      }
    }
    if (best_r == world) return std::nullopt;
    slots[best_r][best_k].Add(len);
    load[best_r] += static_cast<double>(len.tokens);
    assign[best_r].push_back(i);
  }
  return assign;
}

// The cheapest way to run `members` (sample indices, in the window's
// longest-first order) as `m` micro-steps
// within the budget: the sorted list cut into at most m runs (dynamic
// programming; for padded costs some cheapest split is such a cut), unused
// micro-steps IDLE at the fixed per_step. nullopt when no cut keeps the
// budget. `groups` (optional) receives the runs. `work` counts the DP's steps.
std::optional<double> PackRank(const WindowBalanceConfig& c, std::span<const SampleMeta> samples,
                               std::span<const size_t> members, size_t m, uint64_t& work,
                               std::vector<std::vector<size_t>>* groups = nullptr) {
  const size_t n = members.size();
  const double per_step = c.step_model.per_step;
  if (n == 0) {
    if (groups) groups->assign(m, {});
    return static_cast<double>(m) * per_step;
  }
  constexpr double kNone = std::numeric_limits<double>::infinity();
  // f[j * (n + 1) + i]: the first i samples in j non-empty runs; from[...]:
  // where the last run starts. One buffer per thread, reused (this runs
  // thousands of times per window: Improve evaluates every move with it).
  thread_local std::vector<double> f;
  thread_local std::vector<size_t> from;
  // With `groups`: of the cuts that cost the same (a linear step model
  // charges every split of a rank's samples into j runs alike), the one
  // whose costliest run is cheapest, in top[...]: else the DP keeps the
  // first it finds, a last run of one sample (a micro-step far below the
  // budget, which pays an accelerator's fixed floors for little work, and
  // under FSDP waits as long as the full one on the other ranks).
  thread_local std::vector<double> top;
  const size_t row = n + 1;
  f.assign((m + 1) * row, kNone);
  from.assign((m + 1) * row, 0);
  if (groups) top.assign((m + 1) * row, kNone);
  f[0] = 0.0;
  if (groups) top[0] = 0.0;
  for (size_t i = 1; i <= n; ++i) {
    Slot run(c.budget);
    for (size_t a = i; a-- > 0;) {
      const SampleLengths& l = samples[members[a]].lengths;
      if (!run.tally.CanAdd(l)) break;  // a longer run never fits again
      run.tally.Add(l);
      run.sum_sq += Square(l.tokens);
      const double cost = SlotCost(c, run);
      work += m;
      for (size_t j = 1; j <= m; ++j) {
        const double prev = f[(j - 1) * row + a];
        if (prev == kNone) continue;
        double& cell = f[j * row + i];
        if (prev + cost < cell) {
          if (groups) {
            const bool tie = cell != kNone && cell - (prev + cost) <= 1e-12 * cell;
            const double highest = std::max(top[(j - 1) * row + a], cost);
            if (tie && highest >= top[j * row + i]) continue;
            top[j * row + i] = highest;
          }
          cell = prev + cost;
          from[j * row + i] = a;
        } else if (groups && prev + cost - cell <= 1e-12 * cell) {
          const double highest = std::max(top[(j - 1) * row + a], cost);
          if (highest < top[j * row + i]) {
            top[j * row + i] = highest;
            from[j * row + i] = a;
          }
        }
      }
    }
  }
  size_t best_j = 0;
  double best = kNone;
  for (size_t j = 1; j <= m; ++j) {
    if (f[j * row + n] == kNone) continue;
    const double total = f[j * row + n] + static_cast<double>(m - j) * per_step;
    if (total < best) {
      best = total;
      best_j = j;
    }
  }
  if (best_j == 0) return std::nullopt;
  if (groups) {
    // Of the run counts that cost the same, the most: an unused micro-step
    // is an IDLE one (the trainer runs a dummy step for it), and where a
    // step costs nothing per micro-step beyond per_step (no compute floor),
    // a split of the rank's samples over one more micro-step costs exactly
    // what the IDLE one did (final layout only: the search's costs stay).
    for (size_t j = m; j > best_j; --j) {
      if (f[j * row + n] == kNone) continue;
      const double total = f[j * row + n] + static_cast<double>(m - j) * per_step;
      if (total - best <= 1e-12 * best) {
        best_j = j;
        break;
      }
    }
    groups->assign(m, {});
    size_t i = n;
    for (size_t j = best_j; j > 0; --j) {
      const size_t a = from[j * row + i];
      (*groups)[j - 1].assign(members.begin() + static_cast<std::ptrdiff_t>(a),
                              members.begin() + static_cast<std::ptrdiff_t>(i));
      i = a;
    }
  }
  return best;
}

// The length-sorted start of a padded layout with `m` micro-steps per rank:
// the window's samples, longest first (`order`), cut into at most world x m
// runs within the budget with the least total cost (a run costs SlotCost;
// every one of the world x m micro-steps pays per_step whether it holds a
// run or not, so this is the least padding in at most world x m groups: a
// Lagrangian cut, each run charged `lambda` on top of its cost beyond
// per_step, lambda bisected to the smallest that keeps the count within
// world x m; the slots it leaves over filled by splitting the costliest
// runs), then the runs dealt to ranks costliest first, each to the least
// loaded rank with fewer than m runs (ties: the lowest rank). nullopt
// when no cut into world x m runs keeps the budget. Returns each rank's
// members (in `order`'s order) and counts its work in `work`.
constexpr int kSortedRunsBisections = 24;

std::optional<std::vector<std::vector<size_t>>> SortedRuns(const WindowBalanceConfig& c,
                                                           std::span<const SampleMeta> samples,
                                                           std::span<const size_t> order, size_t world,
                                                           size_t m, uint64_t& work, bool even = false) {
  const size_t n = order.size();
  const size_t slots = world * m;
  const double per_step = c.step_model.per_step;
  // The cut for one lambda: from[i] = where the last run of the first i
  // samples starts; returns the number of runs (SIZE_MAX: none fits).
  std::vector<double> f(n + 1);
  std::vector<size_t> from(n + 1), count(n + 1);
  auto cut = [&](double lambda) {
    f[0] = 0.0;
    count[0] = 0;
    for (size_t i = 1; i <= n; ++i) {
      f[i] = std::numeric_limits<double>::infinity();
      count[i] = SIZE_MAX;
      Slot run(c.budget);
      for (size_t a = i; a-- > 0;) {
        const SampleLengths& l = samples[order[a]].lengths;
        if (!run.tally.CanAdd(l)) break;
        run.tally.Add(l);
        run.sum_sq += Square(l.tokens);
        ++work;
        if (count[a] == SIZE_MAX) continue;
        const double v = f[a] + (SlotCost(c, run) - per_step) + lambda;
        // Ties: fewer runs.
        if (v < f[i] || (v == f[i] && count[a] + 1 < count[i])) {
          f[i] = v;
          from[i] = a;
          count[i] = count[a] + 1;
        }
      }
    }
    return count[n];
  };
  // The even cut: the longest-first list cut greedily into runs whose cost
  // beyond per_step stays within a cap (a run is closed when the next sample
  // would pass the cap or the budget), the cap bisected to the least that
  // needs at most world x m runs. Where the cut with the least padding fills
  // most micro-steps to the budget and leaves a few nearly empty (a rank
  // dealt one of those runs is light, one dealt only full ones heavy: with
  // m runs per rank the ranks' sums then differ by most of a run), these
  // runs cost about the same, at a little more padding.
  auto even_cut = [&](double cap) {
    size_t runs = 0;
    size_t i = 0;
    while (i < n) {
      Slot run(c.budget);
      const size_t a = i;
      while (i < n) {
        const SampleLengths& l = samples[order[i]].lengths;
        if (!run.tally.CanAdd(l)) break;
        if (i > a && SlotCostWith(c, run, l) - per_step > cap) break;
        run.tally.Add(l);
        run.sum_sq += Square(l.tokens);
        ++i;
        ++work;
      }
      if (i == a) return SIZE_MAX;  // a sample no micro-step holds
      from[i] = a;
      ++runs;
    }
    return runs;
  };
  if (n == 0) return std::nullopt;
  if (even) {
    double lo = 0.0, hi = 0.0;
    for (size_t i = 0; i < n; ++i) {
      Slot one(c.budget);
      one.tally.Add(samples[order[i]].lengths);
      one.sum_sq = Square(samples[order[i]].lengths.tokens);
      hi += SlotCost(c, one);
    }
    // With no cap but the budget: the fewest runs a greedy cut needs.
    if (even_cut(hi) > slots) return std::nullopt;
    for (int it = 0; it < kSortedRunsBisections; ++it) {
      const double mid = lo + (hi - lo) / 2;
      (even_cut(mid) <= slots ? hi : lo) = mid;
    }
    even_cut(hi);
  } else if (cut(0.0) > slots) {
    // A charge above which the cut with the fewest runs wins: any cut's cost
    // beyond per_step a run is at most n x the costliest sample's (every row
    // is padded to at most the longest sample), so two cuts differ by less.
    double hi = per_step + 1.0;
    for (size_t i = 0; i < n; ++i) {
      Slot one(c.budget);
      one.tally.Add(samples[order[i]].lengths);
      one.sum_sq = Square(samples[order[i]].lengths.tokens);
      hi = std::max(hi, 2.0 * SlotCost(c, one) * static_cast<double>(n));
    }
    if (cut(hi) > slots) return std::nullopt;
    double lo = 0.0;
    bool at_hi = true;  // the arrays hold cut(hi)
    for (int it = 0; it < kSortedRunsBisections; ++it) {
      const double mid = lo + (hi - lo) / 2;
      const size_t runs = cut(mid);
      at_hi = runs <= slots;
      (at_hi ? hi : lo) = mid;
      if (runs == slots) break;  // no cut within the slots has less padding
    }
    if (!at_hi) cut(hi);
  }
  struct Run {
    size_t begin, end;
    double cost;
  };
  auto cost_of = [&](size_t begin, size_t end) {
    Slot run(c.budget);
    for (size_t a = begin; a < end; ++a) {
      run.tally.Add(samples[order[a]].lengths);
      run.sum_sq += Square(samples[order[a]].lengths.tokens);
    }
    ++work;
    return SlotCost(c, run);
  };
  std::vector<Run> runs;
  for (size_t i = n; i > 0; i = from[i]) runs.push_back({from[i], i, cost_of(from[i], i)});
  // Slots left over (runs of equal lengths gain nothing from a split, so the
  // cut keeps them whole): the costliest run of two or more samples is split
  // where its costlier part is cheapest, until every slot holds a run. A
  // part never pads more than the whole, and smaller runs even the ranks.
  while (runs.size() < slots) {
    size_t top = runs.size();
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].end - runs[i].begin >= 2 && (top == runs.size() || runs[i].cost > runs[top].cost)) top = i;
    }
    if (top == runs.size()) break;
    const Run whole = runs[top];
    size_t best_at = whole.begin + 1;
    double best_max = std::numeric_limits<double>::infinity();
    for (size_t at = whole.begin + 1; at < whole.end; ++at) {
      const double v = std::max(cost_of(whole.begin, at), cost_of(at, whole.end));
      if (v < best_max) {
        best_max = v;
        best_at = at;
      }
    }
    runs[top] = {whole.begin, best_at, cost_of(whole.begin, best_at)};
    runs.push_back({best_at, whole.end, cost_of(best_at, whole.end)});
  }
  std::stable_sort(runs.begin(), runs.end(), [](const Run& x, const Run& y) { return x.cost > y.cost; });
  std::vector<double> load(world, static_cast<double>(m) * per_step);
  std::vector<size_t> used(world, 0);
  std::vector<std::vector<size_t>> assign(world);
  for (const Run& run : runs) {
    size_t best = world;
    for (size_t r = 0; r < world; ++r) {
      if (used[r] < m && (best == world || load[r] < load[best])) best = r;
    }
    if (best == world) return std::nullopt;
    ++used[best];
    load[best] += run.cost - per_step;
    for (size_t a = run.begin; a < run.end; ++a) assign[best].push_back(order[a]);
  }
  return assign;
}

// Improves an assignment of samples to ranks (each rank's list in
// longest-first order) by moving one sample off the costliest rank, or
// exchanging one of its samples with another rank's (padded, where neither
// helps: one of its samples for two of another rank's, or two for one),
// while that lowers the costliest rank's cost and the other rank stays below
// it. Samples of equal lengths are tried once per rank, and padded moves
// and exchanges whose receiver's cost bound (its packing without what it
// gives, plus the added samples' own costs) already reaches the best found
// are not packed: the work they save goes to further moves. Stops when no
// move or exchange helps or `work` passes kMaxBalanceWork. Returns the
// costliest rank's cost.
double Improve(const WindowBalanceConfig& c, std::span<const SampleMeta> samples,
               std::span<const size_t> position, size_t m, std::vector<std::vector<size_t>>& assign,
               std::vector<double>& cost, uint64_t& work) {
  const size_t world = assign.size();
  auto sorted_with = [&](const std::vector<size_t>& list, size_t drop, size_t add) {
    std::vector<size_t> out;
    out.reserve(list.size() + 1);
    for (size_t x : list) {
      if (x != drop) out.push_back(x);
    }
    if (add != SIZE_MAX) {
      out.insert(std::upper_bound(out.begin(), out.end(), add,
                                  [&](size_t a, size_t b) { return position[a] < position[b]; }),
                 add);
    }
    return out;
  };
  std::set<std::pair<double, size_t>> by_cost;  // (cost, rank)
  for (size_t r = 0; r < world; ++r) by_cost.insert({cost[r], r});
  for (;;) {
    const size_t top = std::prev(by_cost.end())->second;
    // The other ranks a sample may go to: the kCandidateRanks cheapest.
    std::vector<size_t> others;
    for (auto it = by_cost.begin(); it != by_cost.end() && others.size() < kCandidateRanks; ++it) {
      if (it->second != top) others.push_back(it->second);
    }
    double best = cost[top] * (1.0 - 1e-9);
    size_t best_q = world, best_x = SIZE_MAX, best_y = SIZE_MAX;
    double best_top = 0.0, best_other = 0.0;
    // The top rank's cost without x is the same for every receiver q: packed
    // once per x (its DP work still counted each time, so the kMaxBalanceWork
    // bound stops the search where it always did).
    struct Without {
      bool known = false;
      std::optional<double> cost;
      uint64_t work = 0;
    };
    std::vector<Without> without(assign[top].size());
    const bool padded = c.budget.model == grouping::CostModel::kPadded;
    auto Own = [&](size_t i) {
      const double t = samples[i].lengths.tokens;
      return c.step_model.per_padded_token * t + c.step_model.per_len_sq * t * t;
    };
    auto consider = [&](size_t q, size_t x, size_t y, Without* cached) {
      std::optional<double> a;
      if (cached && cached->known) {
        a = cached->cost;
        work += cached->work;
      } else {
        const uint64_t before = work;
        a = PackRank(c, samples, sorted_with(assign[top], x, y), m, work);
        if (cached) *cached = {true, a, work - before};
      }
      if (!a || *a >= best) return;
      // Padded, a rank's cheapest packing grows by at least the added
      // sample's own cost (taking it out of its run saves that much).
      if (y == SIZE_MAX && padded && cost[q] + Own(x) >= best) return;
      const std::optional<double> b = PackRank(c, samples, sorted_with(assign[q], y, x), m, work);
      if (!b || std::max(*a, *b) >= best) return;
      best = std::max(*a, *b);
      best_q = q;
      best_x = x;
      best_y = y;
      best_top = *a;
      best_other = *b;
    };
    // Samples of equal lengths cost the same wherever they go: of each run
    // of them in a rank's list (longest first, so they are adjacent) only
    // the first is tried, which is the one the search would pick anyway.
    auto repeats = [&](const std::vector<size_t>& list, size_t i) {
      return i > 0 && SameLengths(samples[list[i]].lengths, samples[list[i - 1]].lengths);
    };
    for (size_t i = 0; i < assign[top].size(); ++i) {
      if (repeats(assign[top], i)) continue;
      for (size_t q : others) {
        if (work <= kMaxBalanceWork) consider(q, assign[top][i], SIZE_MAX, &without[i]);
      }
    }
    // Padded: each other rank's packing without its j-th sample, packed once
    // per sample when first needed (for exchanges and the two-for-one below).
    std::vector<std::vector<Without>> rank_without(world);
    auto other_without = [&](size_t q, size_t j) -> const Without& {
      std::vector<Without>& q_without = rank_without[q];
      if (q_without.empty()) q_without.resize(assign[q].size());
      Without& w = q_without[j];
      if (!w.known) {
        w.cost = PackRank(c, samples, sorted_with(assign[q], assign[q][j], SIZE_MAX), m, work);
        w.known = true;
      }
      return w;
    };
    if (best_q == world) {
      for (size_t i = 0; i < assign[top].size(); ++i) {
        if (repeats(assign[top], i)) continue;
        const size_t x = assign[top][i];
        for (size_t q : others) {
          for (size_t j = 0; j < assign[q].size(); ++j) {
            const size_t y = assign[q][j];
            if (repeats(assign[q], j)) continue;
            // The top rank's packing with y for x costs at least its packing
            // without x (known from the single moves) and y's own cost.
            if (padded && without[i].known && without[i].cost && *without[i].cost + Own(y) >= best) continue;
            if (work > kMaxBalanceWork || samples[y].lengths.tokens == samples[x].lengths.tokens) continue;
            // Likewise the other rank's with x for y: its packing without y
            // (once per y, shared by every x) and x's own cost.
            if (padded) {
              const Without& w = other_without(q, j);
              if (w.cost && *w.cost + Own(x) >= best) continue;
            }
            consider(q, x, y, nullptr);
          }
        }
      }
    }
    // Padded, at a local optimum of single moves and exchanges: one sample
    // of the top rank for two of another's, or two for one (whole samples
    // over a rank's few micro-steps: no single exchange evens them).
    std::vector<size_t> best_xs, best_ys;
    if (best_q == world && padded) {
      auto consider_group = [&](size_t q, const std::vector<size_t>& xs, const std::vector<size_t>& ys) {
        std::vector<size_t> t = assign[top];
        for (size_t x : xs) t = sorted_with(t, x, SIZE_MAX);
        for (size_t y : ys) t = sorted_with(t, SIZE_MAX, y);
        const std::optional<double> a = PackRank(c, samples, t, m, work);
        if (!a || *a >= best) return;
        std::vector<size_t> u = assign[q];
        for (size_t y : ys) u = sorted_with(u, y, SIZE_MAX);
        for (size_t x : xs) u = sorted_with(u, SIZE_MAX, x);
        const std::optional<double> b = PackRank(c, samples, u, m, work);
        if (!b || std::max(*a, *b) >= best) return;
        best = std::max(*a, *b);
        best_q = q;
        best_xs = xs;
        best_ys = ys;
        best_top = *a;
        best_other = *b;
      };
      const std::vector<size_t>& tl = assign[top];
      for (size_t i = 0; i < tl.size(); ++i) {
        if (repeats(tl, i)) continue;
        for (size_t q : others) {
          const std::vector<size_t>& ql = assign[q];
          for (size_t j1 = 0; j1 < ql.size(); ++j1) {
            if (repeats(ql, j1)) continue;
            for (size_t j2 = j1 + 1; j2 < ql.size(); ++j2) {
              if (j2 > j1 + 1 && repeats(ql, j2)) continue;
              if (work > kMaxBalanceWork) break;
              // one for two
              if (!without[i].known || !without[i].cost ||
                  *without[i].cost + Own(ql[j1]) + Own(ql[j2]) < best) {
                consider_group(q, {tl[i]}, {ql[j1], ql[j2]});
              }
            }
          }
          // two for one: the other rank's packing costs at least its
          // packing without y (once per y) and the two samples' own costs.
          for (size_t i2 = i + 1; i2 < tl.size(); ++i2) {
            if (i2 > i + 1 && repeats(tl, i2)) continue;
            for (size_t j = 0; j < ql.size(); ++j) {
              if (repeats(ql, j)) continue;
              if (work > kMaxBalanceWork) break;
              const Without& w = other_without(q, j);
              if (w.cost && *w.cost + Own(tl[i]) + Own(tl[i2]) >= best) continue;
              consider_group(q, {tl[i], tl[i2]}, {ql[j]});
            }
          }
        }
      }
    }
    if (best_q == world) return cost[top];
    if (!best_xs.empty()) {
      for (size_t x : best_xs) {
        assign[top] = sorted_with(assign[top], x, SIZE_MAX);
        assign[best_q] = sorted_with(assign[best_q], SIZE_MAX, x);
      }
      for (size_t y : best_ys) {
        assign[best_q] = sorted_with(assign[best_q], y, SIZE_MAX);
        assign[top] = sorted_with(assign[top], SIZE_MAX, y);
      }
    } else {
      assign[top] = sorted_with(assign[top], best_x, best_y);
      assign[best_q] = sorted_with(assign[best_q], best_y, best_x);
    }
    for (auto [r, v] : {std::pair<size_t, double>{top, best_top}, std::pair<size_t, double>{best_q, best_other}}) {
      by_cost.erase({cost[r], r});
      cost[r] = v;
      by_cost.insert({cost[r], r});
    }
    if (work > kMaxBalanceWork) return std::prev(by_cost.end())->first;
  }
}

// Exchanges samples of equal lengths (every micro-step's cost and budget stay
// as they are) so that as many as possible sit on their owner's rank.
using Groups = std::vector<std::vector<std::vector<size_t>>>;  // [rank][micro-step] -> members

void KeepHome(std::span<const SampleMeta> samples, Groups& layout) {
  struct Position {
    size_t rank, step, slot_index;
  };
  using Lengths = std::tuple<uint32_t, uint32_t, uint32_t>;
  std::map<Lengths, std::vector<Position>> positions;
  for (size_t r = 0; r < layout.size(); ++r) {
    for (size_t k = 0; k < layout[r].size(); ++k) {
      for (size_t j = 0; j < layout[r][k].size(); ++j) {
        const SampleLengths& l = samples[layout[r][k][j]].lengths;
        positions[{l.tokens, l.vision_patches, l.audio_frames}].push_back({r, k, j});
      }
    }
  }
  for (auto& [lengths, where] : positions) {
    if (where.size() < 2) continue;
    std::vector<size_t> who;
    for (const Position& p : where) who.push_back(layout[p.rank][p.step][p.slot_index]);
    std::sort(who.begin(), who.end(),
              [&](size_t a, size_t b) { return KeyOf(samples[a]) < KeyOf(samples[b]); });
    std::vector<bool> taken(where.size(), false), placed(who.size(), false);
    for (size_t w = 0; w < who.size(); ++w) {
      for (size_t p = 0; p < where.size(); ++p) {
        if (!taken[p] && static_cast<int32_t>(where[p].rank) == samples[who[w]].owner_rank) {
          layout[where[p].rank][where[p].step][where[p].slot_index] = who[w];
          taken[p] = placed[w] = true;
          break;
        }
      }
    }
    size_t p = 0;
    for (size_t w = 0; w < who.size(); ++w) {
      if (placed[w]) continue;
      while (taken[p]) ++p;
      layout[where[p].rank][where[p].step][where[p].slot_index] = who[w];
      taken[p] = true;
    }
  }
}

}  // namespace

// MoveSamples and MergeMicroSteps: window_balance.h.
bool MoveSamples(const WindowBalanceConfig& c, std::vector<GlobalStep>& window, bool within_steps) {
  if (window.empty()) return false;
  const size_t world = window.front().size();
  const size_t m = window.size();
  if (world < 2) return false;
  std::vector<SampleMeta> samples;
  Layout layout(world, std::vector<Slot>(m, Slot(c.budget)));
  for (size_t k = 0; k < m; ++k) {
    for (size_t r = 0; r < world; ++r) {
      std::vector<SampleMeta> in = window[k][r].samples;
      std::sort(in.begin(), in.end(),
                [](const SampleMeta& a, const SampleMeta& b) { return KeyOf(a) < KeyOf(b); });
      for (const SampleMeta& x : in) {
        Slot& slot = layout[r][k];
        slot.tally.Add(x.lengths);
        slot.sum_sq += Square(x.lengths.tokens);
        slot.members.push_back(samples.size());
        samples.push_back(x);
      }
    }
  }
  auto rebuilt = [&](const Slot& from, size_t drop, size_t add) {
    Slot out(c.budget);
    auto take = [&](size_t i) {
      out.tally.Add(samples[i].lengths);
      out.sum_sq += Square(samples[i].lengths.tokens);
      out.members.push_back(i);
    };
    for (size_t i : from.members) {
      if (i != drop) take(i);
    }
    if (add != SIZE_MAX) take(add);
    return out;
  };
  std::vector<std::vector<double>> cost(world, std::vector<double>(m));
  std::vector<double> sum(world, 0.0);
  for (size_t r = 0; r < world; ++r) {
    for (size_t k = 0; k < m; ++k) sum[r] += cost[r][k] = SlotCost(c, layout[r][k]);
  }
  uint64_t work = 0;
  bool changed = false;
  while (work <= kMaxBalanceWork) {
    const size_t top = static_cast<size_t>(std::max_element(sum.begin(), sum.end()) - sum.begin());
    // Receivers: the kCandidateRanks least loaded ranks (all of them at W <= 16).
    std::vector<size_t> others;
    others.reserve(world - 1);
    for (size_t q = 0; q < world; ++q) {
      if (q != top) others.push_back(q);
    }
    const size_t n = std::min(others.size(), kCandidateRanks);
    std::partial_sort(others.begin(), others.begin() + static_cast<std::ptrdiff_t>(n), others.end(),
                      [&](size_t a, size_t b) { return sum[a] != sum[b] ? sum[a] < sum[b] : a < b; });
    others.resize(n);
    work += world;
    double best = sum[top] * (1.0 - 1e-9);
    size_t best_k = m, best_x = SIZE_MAX, best_q = world, best_k2 = m;
    for (size_t k = 0; k < m; ++k) {
      for (size_t x : layout[top][k].members) {
        ++work;
        const double left = sum[top] - cost[top][k] + SlotCost(c, rebuilt(layout[top][k], x, SIZE_MAX));
        if (left >= best) continue;
        const SampleLengths& len = samples[x].lengths;
        for (size_t q : others) {
          for (size_t k2 = within_steps ? k : 0; k2 < (within_steps ? k + 1 : m); ++k2) {
            ++work;
            const Slot& to = layout[q][k2];
            if (!to.tally.CanAdd(len)) continue;
            const double v = std::max(left, sum[q] - cost[q][k2] + SlotCostWith(c, to, len));
            if (v < best) {
              best = v;
              best_k = k;
              best_x = x;
              best_q = q;
              best_k2 = k2;
            }
          }
        }
      }
    }
    if (best_q == world) break;
    layout[top][best_k] = rebuilt(layout[top][best_k], best_x, SIZE_MAX);
    layout[best_q][best_k2] = rebuilt(layout[best_q][best_k2], SIZE_MAX, best_x);
    for (auto [r, k] : {std::pair<size_t, size_t>{top, best_k}, std::pair<size_t, size_t>{best_q, best_k2}}) {
      sum[r] -= cost[r][k];
      cost[r][k] = SlotCost(c, layout[r][k]);
      sum[r] += cost[r][k];
    }
    changed = true;
  }
  if (!changed) return false;
  std::vector<GlobalStep> out(m, GlobalStep(world));
  for (size_t r = 0; r < world; ++r) {
    std::vector<size_t> by_cost(m);
    for (size_t k = 0; k < m; ++k) {
      by_cost[k] = k;
      std::sort(layout[r][k].members.begin(), layout[r][k].members.end(),
                [&](size_t a, size_t b) { return KeyOf(samples[a]) < KeyOf(samples[b]); });
    }
    if (!within_steps) {
      std::stable_sort(by_cost.begin(), by_cost.end(),
                       [&](size_t a, size_t b) { return cost[r][a] > cost[r][b]; });
    }
    for (size_t k = 0; k < m; ++k) {
      out[k][r] = MakeStep(c.budget.model, samples, layout[r][by_cost[k]].members, false);
    }
  }
  if (!within_steps) {
    std::erase_if(out, [](const GlobalStep& g) {
      return std::all_of(g.begin(), g.end(), [](const PlannedStep& s) { return s.samples.empty(); });
    });
  }
  window = std::move(out);
  return true;
}

bool MergeMicroSteps(const WindowBalanceConfig& c, std::vector<GlobalStep>& window) {
  bool changed = false;
  while (window.size() >= 2) {
    const size_t world = window.front().size();
    const size_t m = window.size();
    std::vector<std::vector<double>> cost(m, std::vector<double>(world));
    std::vector<double> sum(world, 0.0);
    for (size_t k = 0; k < m; ++k) {
      for (size_t r = 0; r < world; ++r) {
        cost[k][r] = MicroStepCost(c, window[k][r]);
        sum[r] += cost[k][r];
      }
    }
    double best = *std::max_element(sum.begin(), sum.end()) * (1.0 - 1e-9);
    size_t best_a = m, best_b = m;
    for (size_t a = 0; a < m; ++a) {
      for (size_t b = a + 1; b < m; ++b) {
        double worst = 0.0;
        bool fits = true;
        for (size_t r = 0; r < world && fits; ++r) {
          grouping::GroupTally tally(c.budget);
          uint32_t longest = 0;
          uint64_t tokens = 0;
          double sum_sq = 0.0;
          for (const PlannedStep* s : {&window[a][r], &window[b][r]}) {
            for (const SampleMeta& x : s->samples) {
              if (!tally.CanAdd(x.lengths)) {
                fits = false;
                break;
              }
              tally.Add(x.lengths);
              longest = std::max(longest, x.lengths.tokens);
              tokens += x.lengths.tokens;
              sum_sq += Square(x.lengths.tokens);
            }
            if (!fits) break;
          }
          if (!fits) break;
          const double merged = SlotCost(c, tally.size(), longest, tokens, sum_sq);
          worst = std::max(worst, sum[r] - cost[a][r] - cost[b][r] + merged);
        }
        if (fits && worst < best) {
          best = worst;
          best_a = a;
          best_b = b;
        }
      }
    }
    if (best_a == m) break;
    for (size_t r = 0; r < world; ++r) {
      std::vector<SampleMeta> both = window[best_a][r].samples;
      both.insert(both.end(), window[best_b][r].samples.begin(), window[best_b][r].samples.end());
      std::sort(both.begin(), both.end(),
                [](const SampleMeta& x, const SampleMeta& y) { return KeyOf(x) < KeyOf(y); });
      std::vector<size_t> all(both.size());
      for (size_t i = 0; i < all.size(); ++i) all[i] = i;
      window[best_a][r] = MakeStep(c.budget.model, both, all, false);
    }
    window.erase(window.begin() + static_cast<std::ptrdiff_t>(best_b));
    changed = true;
  }
  return changed;
}

double MicroStepCost(const WindowBalanceConfig& config, const PlannedStep& step) {
  if (step.samples.empty()) return config.step_model.per_step;
  uint32_t longest = 0;
  uint64_t sum = 0;
  double sum_sq = 0.0;
  for (const SampleMeta& m : step.samples) {
    longest = std::max(longest, m.lengths.tokens);
    sum += m.lengths.tokens;
    sum_sq += Square(m.lengths.tokens);
  }
  return SlotCost(config, step.samples.size(), longest, sum, sum_sq);
}

double WindowCost(const WindowBalanceConfig& config, std::span<const GlobalStep> window) {
  if (window.empty()) return 0.0;
  double worst = 0.0;
  for (size_t r = 0; r < window.front().size(); ++r) {
    double sum = 0.0;
    for (const GlobalStep& g : window) sum += MicroStepCost(config, g[r]);
    worst = std::max(worst, sum);
  }
  return worst;
}

namespace {

// Time model (a): the sum over micro-steps of the slowest rank's cost.
double SyncCost(const WindowBalanceConfig& config, std::span<const GlobalStep> window) {
  double total = 0.0;
  for (const GlobalStep& g : window) {
    double worst = 0.0;
    for (const PlannedStep& s : g) worst = std::max(worst, MicroStepCost(config, s));
    total += worst;
  }
  return total;
}

// The layout search of BalanceWindow (its comment in window_balance.h).
bool SearchLayout(const WindowBalanceConfig& config, std::vector<GlobalStep>& window) {
  const size_t world = window.front().size();
  const size_t steps = window.size();
  std::vector<SampleMeta> samples;
  uint64_t tokens = 0;
  for (const GlobalStep& g : window) {
    for (const PlannedStep& s : g) {
      if (s.over_budget) return false;
      for (const SampleMeta& m : s.samples) {
        samples.push_back(m);
        tokens += m.lengths.tokens;
      }
    }
  }
  if (samples.empty()) return false;
  std::vector<size_t> order(samples.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const SampleLengths& x = samples[a].lengths;
    const SampleLengths& y = samples[b].lengths;
    if (x.tokens != y.tokens) return x.tokens > y.tokens;
    if (x.vision_patches != y.vision_patches) return x.vision_patches > y.vision_patches;
    if (x.audio_frames != y.audio_frames) return x.audio_frames > y.audio_frames;
    return KeyOf(samples[a]) < KeyOf(samples[b]);
  });
  const size_t first = FewestMicroSteps(config.budget, world, tokens, samples.size());
  uint64_t greedy_work = 0;
  for (size_t m = first; m <= steps; ++m) {
    greedy_work += uint64_t{samples.size()} * std::min<uint64_t>(world, kCandidateRanks) * m;
  }
  if (greedy_work > kMaxBalanceWork) return false;

  const double before = WindowCost(config, window);
  double best_cost = before * (1.0 - 1e-9);  // a new layout must be cheaper, not equal within rounding
  std::optional<Groups> best;
  std::vector<size_t> position(samples.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  uint64_t work = 0;
  for (size_t m = first; m <= steps && work <= kMaxBalanceWork; ++m) {
    // The starts: the greedy's layout and, padded, the length-sorted runs;
    // each rank's samples, longest first, packed the cheapest way. The moves
    // (Improve) then run on the start whose slowest rank is cheaper (the
    // greedy's on ties).
    struct Start {
      std::vector<std::vector<size_t>> assign;
      std::vector<double> cost;
      double worst = 0.0;
    };
    auto packed = [&](std::vector<std::vector<size_t>> assign) -> std::optional<Start> {
      Start s{std::move(assign), std::vector<double>(world), 0.0};
      for (size_t r = 0; r < world; ++r) {
        std::sort(s.assign[r].begin(), s.assign[r].end(),
                  [&](size_t a, size_t b) { return position[a] < position[b]; });
        const std::optional<double> c = PackRank(config, samples, s.assign[r], m, work);
        if (!c) return std::nullopt;  // the start's own micro-steps fit: never here
        s.cost[r] = *c;
        s.worst = std::max(s.worst, *c);
      }
      return s;
    };
    std::optional<Start> start;
    double greedy = 0.0;
    if (std::optional<Layout> layout = Lay(config, samples, order, world, m, greedy)) {
      std::vector<std::vector<size_t>> assign(world);
      for (size_t r = 0; r < world; ++r) {
        for (const Slot& slot : (*layout)[r])
          assign[r].insert(assign[r].end(), slot.members.begin(), slot.members.end());
      }
      start = packed(std::move(assign));
    }
    if (!start && config.budget.model == grouping::CostModel::kPacked) {
      if (auto assign = BestFit(config, samples, order, world, m, work)) start = packed(std::move(*assign));
    }
    std::optional<Start> even, other;
    if (config.budget.model == grouping::CostModel::kPadded) {
      if (auto assign = SortedRuns(config, samples, order, world, m, work)) {
        std::optional<Start> sorted = packed(std::move(*assign));
        if (sorted && (!start || sorted->worst < start->worst)) std::swap(start, sorted);
        other = std::move(sorted);
      }
      if (auto assign = SortedRuns(config, samples, order, world, m, work, /*even=*/true))
        even = packed(std::move(*assign));
    }
    // The moves run on the cheaper start and, on their own budget, on the
    // even runs and on the costlier of the greedy's and the length-sorted
    // runs (padded: the moves often end at a local optimum, not at the work
    // bound, so another start is another optimum); the cheapest is kept.
    const uint64_t work_before = work;
    for (std::optional<Start>* s : {&start, &even, &other}) {
      if (!*s) continue;
      uint64_t own = s != &start ? work_before + kMaxBalanceWork / 2 : work_before;
      const double worst = Improve(config, samples, position, m, (*s)->assign, (*s)->cost, own);
      work = std::max(work, own);
      if (worst < best_cost) {
        best_cost = worst;
        Groups groups(world);
        for (size_t r = 0; r < world; ++r) PackRank(config, samples, (*s)->assign[r], m, work, &groups[r]);
        best = std::move(groups);
      }
    }
  }
  if (!best) return false;
  KeepHome(samples, *best);

  std::vector<GlobalStep> out(best->front().size(), GlobalStep(world));
  for (size_t r = 0; r < world; ++r) {
    std::vector<std::vector<size_t>>& slots = (*best)[r];
    std::vector<double> cost(slots.size());
    for (size_t k = 0; k < slots.size(); ++k) {
      std::sort(slots[k].begin(), slots[k].end(),
                [&](size_t a, size_t b) { return KeyOf(samples[a]) < KeyOf(samples[b]); });
      cost[k] = MicroStepCost(config, MakeStep(config.budget.model, samples, slots[k], false));
    }
    std::vector<size_t> by_cost(slots.size());
    for (size_t k = 0; k < by_cost.size(); ++k) by_cost[k] = k;
    std::sort(by_cost.begin(), by_cost.end(), [&](size_t a, size_t b) {
      if (cost[a] != cost[b]) return cost[a] > cost[b];
      if (slots[a].empty() || slots[b].empty()) return !slots[a].empty();
      return KeyOf(samples[slots[a].front()]) < KeyOf(samples[slots[b].front()]);
    });
    for (size_t k = 0; k < by_cost.size(); ++k) {
      out[k][r] = MakeStep(config.budget.model, samples, slots[by_cost[k]], false);
    }
  }
  // Micro-steps no rank uses (every rank's samples fit fewer) are dropped.
  std::erase_if(out, [](const GlobalStep& g) {
    return std::all_of(g.begin(), g.end(), [](const PlannedStep& s) { return s.samples.empty(); });
  });
  window = std::move(out);
  return true;
}

}  // namespace

size_t FewestMicroSteps(const grouping::Budget& budget, size_t world, uint64_t tokens, uint64_t samples) {
  size_t first = 1;
  const uint64_t cap = budget.max_tokens;
  if (cap > 0 && world > 0) {
    first = std::max<size_t>(1, static_cast<size_t>((tokens + world * cap - 1) / (world * cap)));
  }
  if (budget.max_group_size > 0 && world > 0) {
    const uint64_t per = uint64_t{world} * budget.max_group_size;
    first = std::max<size_t>(first, static_cast<size_t>((samples + per - 1) / per));
  }
  return first;
}

bool BalanceWindow(const WindowBalanceConfig& config, std::vector<GlobalStep>& window) {
  if (window.empty() || window.front().empty()) return false;
  for (const GlobalStep& g : window) {
    for (const PlannedStep& s : g) {
      if (s.over_budget) return false;
    }
  }
  const bool searched = SearchLayout(config, window);
  // Then single moves and merges, on the steps in an order of their own
  // (by their first sample's key; the search's layout has one already), so
  // the result depends on the window's samples only.
  std::vector<GlobalStep> refined = window;
  if (!searched) {
    auto first_key = [](const GlobalStep& g) {
      std::optional<SampleKey> key;
      for (const PlannedStep& s : g) {
        for (const SampleMeta& m : s.samples) {
          if (!key || KeyOf(m) < *key) key = KeyOf(m);
        }
      }
      return key;
    };
    std::stable_sort(refined.begin(), refined.end(), [&](const GlobalStep& a, const GlobalStep& b) {
      const auto ka = first_key(a), kb = first_key(b);
      if (ka.has_value() != kb.has_value()) return ka.has_value();
      return ka.has_value() && *ka < *kb;
    });
  }
  // Two refinements, each followed by merges: the free moves alone, and
  // within-step moves before them (they lower the slowest rank's sum by
  // moving its samples to other ranks of the same micro-step, which also
  // evens the micro-steps themselves: under FSDP each waits for its slowest
  // rank). The free one is kept unless it changed nothing or the other is no
  // costlier under both time models, the window's slowest rank's sum (b) and
  // the sum of its micro-steps' slowest ranks (a), and cheaper under one.
  std::vector<GlobalStep> evened = refined;
  const bool moved = MoveSamples(config, refined);
  const bool merged = MergeMicroSteps(config, refined);
  const bool evened_moved = MoveSamples(config, evened, /*within_steps=*/true);
  const bool evened_more = MoveSamples(config, evened);
  const bool evened_merged = MergeMicroSteps(config, evened);
  bool changed = moved || merged;
  if (evened_moved || evened_more || evened_merged) {
    const double free_cost = WindowCost(config, refined), evened_cost = WindowCost(config, evened);
    const double tie = 1e-12 * std::max(free_cost, evened_cost);
    const double free_sync = SyncCost(config, refined), evened_sync = SyncCost(config, evened);
    const double sync_tie = 1e-12 * std::max(free_sync, evened_sync);
    const bool take = !changed || (evened_cost <= free_cost + tie && evened_sync <= free_sync + sync_tie &&
                                   (evened_cost < free_cost - tie || evened_sync < free_sync - sync_tie));
    if (take) {
      refined = std::move(evened);
      changed = true;
    }
  }
  // Kept only when the window's slowest rank got cheaper (moves off one of
  // two equally slow ranks alone do not make it so).
  if (changed && WindowCost(config, refined) < WindowCost(config, window) * (1.0 - 1e-12)) {
    window = std::move(refined);
    return true;
  }
  return searched;
}

}  // namespace odb::align
