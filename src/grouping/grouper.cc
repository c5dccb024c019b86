#include "src/grouping/grouper.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

namespace odb::grouping {

// How FormGroups works.
//
// Samples that fit no budget alone are set aside as flagged singletons. The
// rest are sorted by (tokens, window index) ascending; every algorithm below
// walks that one order (or its exact reverse), so "contiguous" means the same
// thing for all of them.
//
// Padded model: a group costs per_step + per_padded_token * n * max(len). For
// any feasible grouping, re-assigning samples so that groups become runs of the
// sorted order keeps every group's size and never raises any group's longest
// member, so an optimum over contiguous runs is an optimum overall when only
// the token budget and the group-size cap apply. An exact dynamic program over
// runs finds it: best[i] = min_j best[j] + cost(run j..i). Feasibility is
// monotone in the run (growing it only adds load), so the inner loop walks j
// down from i-1 and stops at the first infeasible run: at most
// min(L_max / len, max_group_size) steps, which keeps a 4096-sample window in
// the low milliseconds for realistic lengths. The per_len_sq term is the same
// for every grouping (a sum over samples), so it does not steer the choice.
// Per-modality budgets break the contiguity argument (vision patches need not
// follow token order), so with them the fewest-steps greedy, which may skip
// samples, is also computed and the cheaper of the two is kept.
//
// Packed model: padded tokens are sum(len) whatever the grouping, so the
// objective reduces to the number of groups: bin packing (multi-dimensional
// when modality budgets are set), where runs of the sorted order are not
// optimal. Three candidates are built and the one with the lowest total step
// time wins: best-fit decreasing improved by pool repacking (PoolRepack: the
// least-filled groups emptied and the others refilled exactly; never more
// groups than best-fit decreasing alone), the fill-to-budget greedy (for plain
// bin packing it is first-fit decreasing, within 11/9 OPT + 6/9 bins), and the
// contiguous DP (rarely better than the others for a pure token budget, but it
// bounds the result by the best run partition whatever the modality limits do).
//
// By construction FormGroups' cost is never above ReferenceOdbGroups' (whose
// groups are runs of the same order that respect the budget) nor, for packed or
// modality budgets, above GreedyFewestSteps'.
namespace {

using Window = std::span<const SampleLengths>;

// Indices of the samples that fit alone, sorted by (tokens, index), plus the
// over-budget singletons.
struct SplitWindow {
  std::vector<size_t> sorted;
  std::vector<Group> over;
};

SplitWindow Split(Window window, const Budget& budget) {
  SplitWindow split;
  // Sorting packed (tokens << 32 | index) keys is several times faster than
  // an indirect comparator; windows never approach 2^32 samples, but stay
  // correct if one does.
  const bool pack_keys = window.size() <= std::numeric_limits<uint32_t>::max();
  std::vector<uint64_t> keys;
  keys.reserve(window.size());
  for (size_t i = 0; i < window.size(); ++i) {
    if (FitsAlone(budget, window[i])) {
      split.sorted.push_back(i);
      if (pack_keys) keys.push_back(static_cast<uint64_t>(window[i].tokens) << 32 | i);
    } else {
      split.over.push_back(Group{{i}, true});
    }
  }
  if (pack_keys) {
    std::sort(keys.begin(), keys.end());
    for (size_t k = 0; k < keys.size(); ++k) split.sorted[k] = keys[k] & 0xffffffffULL;
  } else {
    std::sort(split.sorted.begin(), split.sorted.end(), [&](size_t a, size_t b) {
      return window[a].tokens != window[b].tokens ? window[a].tokens < window[b].tokens : a < b;
    });
  }
  return split;
}

// Canonical output: members ascending by (tokens, index), groups ascending by
// their longest member (ties by that member's index), over-budget ones included.
std::vector<Group> Finish(Window window, std::vector<Group> groups, std::vector<Group> over) {
  auto less = [&](size_t a, size_t b) {
    return window[a].tokens != window[b].tokens ? window[a].tokens < window[b].tokens : a < b;
  };
  for (Group& g : over) groups.push_back(std::move(g));
  for (Group& g : groups) {
    // Runs come out ascending and the greedy algorithms descending.
    if (std::is_sorted(g.members.rbegin(), g.members.rend(), less)) {
      std::reverse(g.members.begin(), g.members.end());
    } else if (!std::is_sorted(g.members.begin(), g.members.end(), less)) {
      std::sort(g.members.begin(), g.members.end(), less);
    }
  }
  std::sort(groups.begin(), groups.end(), [&](const Group& a, const Group& b) {
    return less(a.members.back(), b.members.back());
  });
  return groups;
}

// Smallest index >= i that is still unused (m when none), with path compression.
class NextUnused {
 public:
  explicit NextUnused(size_t m) : next_(m + 1) {
    for (size_t i = 0; i <= m; ++i) next_[i] = i;
  }
  size_t Find(size_t i) {
    size_t root = i;
    while (next_[root] != root) root = next_[root];
    while (next_[i] != root) i = std::exchange(next_[i], root);
    return root;
  }
  void Use(size_t i) { next_[i] = i + 1; }

 private:
  std::vector<size_t> next_;
};

// Largest token count that might still fit the packed group's token budget
// (rounded up by one: the exact check is GroupTally::CanAdd).
uint64_t PackedTokenHint(const Budget& budget, const GroupTally& tally) {
  const double room = static_cast<double>(budget.max_tokens) - tally.BudgetCost();
  if (room < 0.0) return 0;
  double t = room;
  if (budget.quadratic_q > 0.0) {
    const double q = budget.quadratic_q;
    t = (-q + std::sqrt(q * q + 4.0 * q * room)) / 2.0;  // t + t^2/q = room
  }
  const double hint = std::floor(t) + 1.0;
  return hint >= 4294967296.0 ? std::numeric_limits<uint32_t>::max()
                              : static_cast<uint64_t>(hint);
}

// Fill-to-budget greedy over the descending order: seed a group with the
// longest unused sample, then keep adding the longest unused sample that still
// fits, until none does. Without modality budgets a padded group is then a run
// of the order (the seed fixes the padded length, so only the count limits it).
std::vector<Group> GreedyFill(Window window, const std::vector<size_t>& sorted,
                              const Budget& budget) {
  const std::vector<size_t> desc(sorted.rbegin(), sorted.rend());
  const size_t m = desc.size();
  const bool padded = budget.model == CostModel::kPadded;
  NextUnused unused(m);
  std::vector<Group> groups;
  for (size_t seed = unused.Find(0); seed < m; seed = unused.Find(0)) {
    GroupTally tally(budget);
    Group group;
    tally.Add(window[desc[seed]]);
    group.members.push_back(desc[seed]);
    unused.Use(seed);
    size_t pos = seed + 1;
    while (budget.max_group_size == 0 || tally.size() < budget.max_group_size) {
      if (!padded && budget.max_tokens != 0) {
        // Jump over samples longer than the room left (desc is sorted).
        const uint64_t hint = PackedTokenHint(budget, tally);
        pos = static_cast<size_t>(
            std::partition_point(desc.begin() + static_cast<std::ptrdiff_t>(std::min(pos, m)),
                                 desc.end(),
                                 [&](size_t idx) { return window[idx].tokens > hint; }) -
            desc.begin());
      }
      pos = unused.Find(std::min(pos, m));
      if (pos >= m) break;
      const SampleLengths& s = window[desc[pos]];
      GroupTally probe = tally;
      probe.Add(s);
      if (probe.Fits()) {
        tally = probe;
        group.members.push_back(desc[pos]);
        unused.Use(pos);
      } else if (padded && !probe.FitsTokens()) {
        break;  // the padded cost depends only on the count now: nothing fits
      }
      ++pos;
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

// Best-fit decreasing for the packed model: each sample of `sorted`, longest
// first, goes to the group with the least token room that can still take it,
// else opens a new one. `groups` are the groups to start from (empty for a
// plain BFD; PoolRepack passes the groups it keeps).
std::vector<Group> BestFitDecreasing(Window window, const std::vector<size_t>& sorted, const Budget& budget,
                                     std::vector<Group> groups = {}) {
  std::vector<GroupTally> tallies;
  std::multimap<double, size_t> by_room;  // token room left -> group
  const bool limited = budget.max_tokens != 0;
  const double slack = 1e-9 * (static_cast<double>(budget.max_tokens) + 1.0);
  auto room = [&](const GroupTally& t) {
    return limited ? static_cast<double>(budget.max_tokens) - t.BudgetCost() : 0.0;
  };
  for (const Group& g : groups) {
    tallies.emplace_back(budget);
    for (size_t i : g.members) tallies.back().Add(window[i]);
    by_room.emplace(room(tallies.back()), tallies.size() - 1);
  }
  for (auto it = sorted.rbegin(); it != sorted.rend(); ++it) {
    const SampleLengths& s = window[*it];
    auto slot = limited ? by_room.lower_bound(EffectiveLength(budget, s.tokens) - slack)
                        : by_room.begin();
    while (slot != by_room.end() && !tallies[slot->second].CanAdd(s)) ++slot;
    size_t g;
    if (slot == by_room.end()) {
      g = groups.size();
      tallies.emplace_back(budget);
      groups.emplace_back();
    } else {
      g = slot->second;
      by_room.erase(slot);
    }
    tallies[g].Add(s);
    groups[g].members.push_back(*it);
    by_room.emplace(room(tallies[g]), g);
  }
  return groups;
}

// Pool repacking after a packing (the local search of Levine and Ducatelle,
// "Ant colony optimization and local search for bin packing and cutting stock
// problems", J. Oper. Res. Soc. 55(7), 2004, applied here without the ants):
// the least-filled groups (one in kRepackPoolShare, at least
// kRepackPoolGroups, at most half) are emptied into a free pool; every other
// group with room left, most room first, is refilled with the fullest subset
// of its own members and the pool that fits the budget (their search tries
// swaps of up to two members for up to two free items; here the subset is
// exact, a subset-sum over token counts), its other members going to the
// pool; then the pool is packed best-fit decreasing into the groups' room,
// else into new groups. A pass is kept only when it ends with fewer groups;
// passes stop at the first that does not, at ceil(sum of tokens / max_tokens)
// groups (no packing has fewer), or after kRepackPasses. Best-fit decreasing
// leaves rows of near-equal samples with a gap no sample of that size fills
// (five 717-token samples in 4096 leave 511); refilled groups mix sizes
// instead (grouper_test, "pool repacking").
//
// Work: a refill's subset-sum costs one bitset of max_tokens bits per item it
// reads (it stops once a subset fills the budget exactly); a call reads at
// most kRepackItemsPerSample items per window sample, then ends its pass.
// Only for budgets a sum of token counts decides (packed, no quadratic term,
// no modality limit, max_tokens <= kRepackMaxTokens for the bitsets);
// max_group_size is checked on every refill. Deterministic: every order is a
// function of the window.
constexpr size_t kRepackPoolGroups = 8;
constexpr size_t kRepackPoolShare = 64;
constexpr size_t kRepackPasses = 4;
constexpr size_t kRepackItemsPerSample = 32;
constexpr uint64_t kRepackMaxTokens = 1 << 16;
// Repacking saves only the fixed per_step of each group it removes, and the
// fuller rows it leaves give the planner's balance of a step less room. Where
// per_step is under this share of the grouping's step time it is not run
// (batching_sim, cpu_calibrated: per_step ~0.3% of a row, repacked rows lost
// 0.0003-0.0010 of the bound at W = 64; every other step model there has
// 5% or more and gains).
constexpr double kRepackMinStepShare = 0.01;

bool RepackApplies(const Budget& budget) {
  return budget.model == CostModel::kPacked && budget.max_tokens != 0 &&
         budget.max_tokens <= kRepackMaxTokens && budget.quadratic_q <= 0.0 &&
         budget.max_vision_patches == 0 && budget.max_audio_frames == 0;
}

// Subset-sum over `items` (token counts) up to `cap`: the positions of a
// subset with the largest sum <= cap, preferring the earlier items (the
// reconstruction walks back and leaves out every item it can). `masks` is
// scratch: one bitset of reachable sums per prefix.
uint64_t FullestSubset(std::span<const uint32_t> items, uint64_t cap, std::vector<uint64_t>& masks,
                       std::vector<size_t>& chosen, size_t& items_read) {
  const size_t words = cap / 64 + 1;
  const uint64_t top_mask = (cap % 64 == 63) ? ~0ULL : ((1ULL << (cap % 64 + 1)) - 1);
  // Grown, never shrunk: a prefix's bitset is written whole before it is read.
  if (masks.size() < words * (items.size() + 1)) masks.resize(words * (items.size() + 1));
  std::fill(masks.begin(), masks.begin() + static_cast<std::ptrdiff_t>(words), 0);
  masks[0] = 1;
  size_t used = 0;  // items processed (prefix length)
  auto bit = [&](size_t prefix, uint64_t v) { return (masks[prefix * words + v / 64] >> (v % 64)) & 1ULL; };
  while (used < items.size() && !bit(used, cap)) {
    const uint64_t* prev = &masks[used * words];
    uint64_t* next = &masks[(used + 1) * words];
    const uint64_t s = items[used];
    const size_t shift_words = s / 64, shift_bits = s % 64;
    // next = prev | (prev << s), in three branch-free runs of words.
    const size_t low = std::min(shift_words, words);
    for (size_t w = 0; w < low; ++w) next[w] = prev[w];
    if (low < words) {
      next[low] = prev[low] | (prev[0] << shift_bits);
      if (shift_bits == 0) {
        for (size_t w = low + 1; w < words; ++w) next[w] = prev[w] | prev[w - shift_words];
      } else {
        for (size_t w = low + 1; w < words; ++w) {
          next[w] = prev[w] | (prev[w - shift_words] << shift_bits) |
                    (prev[w - shift_words - 1] >> (64 - shift_bits));
        }
      }
    }
    next[words - 1] &= top_mask;
    ++used;
  }
  items_read += used;
  uint64_t best = cap;
  while (!bit(used, best)) --best;  // bit 0 is always set
  chosen.clear();
  for (uint64_t v = best, i = used; i > 0; --i) {
    if (bit(i - 1, v)) continue;
    chosen.push_back(i - 1);
    v -= items[i - 1];
  }
  return best;
}

std::vector<Group> PoolRepack(Window window, std::vector<Group> groups, const Budget& budget) {
  // Half the groups at most go to the pool, so that small windows repack too.
  const size_t pool_groups =
      std::min(std::max(kRepackPoolGroups, groups.size() / kRepackPoolShare), groups.size() / 2);
  if (!RepackApplies(budget) || pool_groups == 0) return groups;
  const size_t max_items_read = kRepackItemsPerSample * window.size();
  size_t items_read = 0;
  const uint64_t cap = budget.max_tokens;
  auto tokens_of = [&](const Group& g) {
    uint64_t sum = 0;
    for (size_t i : g.members) sum += window[i].tokens;
    return sum;
  };
  uint64_t total = 0;
  for (const Group& g : groups) total += tokens_of(g);
  const uint64_t lower = (total + cap - 1) / cap;
  std::vector<uint64_t> masks;
  std::vector<size_t> chosen;
  std::vector<uint32_t> items;
  std::vector<size_t> members;
  for (size_t pass = 0; pass < kRepackPasses && groups.size() > lower && items_read < max_items_read;
       ++pass) {
    // Least filled first (ties: the current order, itself deterministic).
    std::vector<std::pair<uint64_t, size_t>> by_fill;
    by_fill.reserve(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) by_fill.emplace_back(tokens_of(groups[g]), g);
    std::stable_sort(by_fill.begin(), by_fill.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<size_t> pool;
    for (size_t k = 0; k < pool_groups; ++k) {
      for (size_t i : groups[by_fill[k].second].members) pool.push_back(i);
    }
    std::vector<Group> kept;
    kept.reserve(groups.size());
    for (size_t k = pool_groups; k < by_fill.size(); ++k) {
      Group g = groups[by_fill[k].second];
      if (by_fill[k].first < cap && !pool.empty() && items_read < max_items_read) {
        members = g.members;
        members.insert(members.end(), pool.begin(), pool.end());
        items.clear();
        for (size_t i : members) items.push_back(window[i].tokens);
        const uint64_t fill = FullestSubset(items, cap, masks, chosen, items_read);
        if (fill > by_fill[k].first &&
            (budget.max_group_size == 0 || chosen.size() <= budget.max_group_size)) {
          std::vector<bool> in(members.size(), false);
          for (size_t c : chosen) in[c] = true;
          g.members.clear();
          pool.clear();
          for (size_t c = 0; c < members.size(); ++c) (in[c] ? g.members : pool).push_back(members[c]);
        }
      }
      kept.push_back(std::move(g));
    }
    std::sort(pool.begin(), pool.end(), [&](size_t a, size_t b) {
      return window[a].tokens != window[b].tokens ? window[a].tokens < window[b].tokens : a < b;
    });
    std::vector<Group> repacked = BestFitDecreasing(window, pool, budget, std::move(kept));
    if (repacked.size() >= groups.size()) break;
    groups = std::move(repacked);
  }
  return groups;
}

// Largest group size whose padded budget cost, at longest length `tokens`,
// stays within the token limit (and max_group_size), capped at `limit`. Uses
// PaddedBudgetCost itself so the DP agrees bit for bit with FitsBudget.
size_t PaddedCountCap(const Budget& budget, uint32_t tokens, size_t limit) {
  if (budget.max_group_size != 0) limit = std::min<size_t>(limit, budget.max_group_size);
  if (budget.max_tokens == 0) return limit;
  const double max_tokens = static_cast<double>(budget.max_tokens);
  const double eff = EffectiveLength(budget, tokens);
  if (eff <= 0.0) return limit;
  const double guess = std::floor(max_tokens / eff);
  size_t n = guess >= static_cast<double>(limit) ? limit : static_cast<size_t>(guess);
  while (n > 0 && PaddedBudgetCost(budget, n, tokens) > max_tokens) --n;
  while (n < limit && PaddedBudgetCost(budget, n + 1, tokens) <= max_tokens) ++n;
  return n;
}

// Exact DP over runs of the ascending order (see the comment at the top).
// A run j..i (samples sorted[j..i-1]) is feasible iff j >= lo(i); lo is
// non-decreasing in i because every limit is monotone in the run, so it is
// tracked with one pointer per limit and the inner loop is a plain scan.
std::vector<Group> ContiguousDp(Window window, const std::vector<size_t>& sorted,
                                const Budget& budget, const StepTimeModel& model) {
  const size_t m = sorted.size();
  const bool padded = budget.model == CostModel::kPadded;
  // Exact prefix sums; len^2 in 128 bits so run differences are exact, then
  // saturated like GroupTally does.
  std::vector<uint64_t> sum(m + 1, 0), vision(m + 1, 0), audio(m + 1, 0);
  std::vector<unsigned __int128> sum_sq(m + 1, 0);
  for (size_t k = 0; k < m; ++k) {
    const SampleLengths& s = window[sorted[k]];
    sum[k + 1] = sum[k] + s.tokens;
    sum_sq[k + 1] = sum_sq[k] + static_cast<unsigned __int128>(s.tokens) * s.tokens;
    vision[k + 1] = vision[k] + s.vision_patches;
    audio[k + 1] = audio[k] + s.audio_frames;
  }
  auto packed_fits = [&](size_t j, size_t i) {
    if (budget.max_tokens == 0) return true;
    const unsigned __int128 sq = sum_sq[i] - sum_sq[j];
    const uint64_t sq64 =
        sq > std::numeric_limits<uint64_t>::max() ? std::numeric_limits<uint64_t>::max()
                                                  : static_cast<uint64_t>(sq);
    return PackedBudgetCost(budget, sum[i] - sum[j], sq64) <=
           static_cast<double>(budget.max_tokens);
  };

  std::vector<double> best(m + 1, std::numeric_limits<double>::infinity());
  std::vector<size_t> start(m + 1, 0);
  best[0] = 0.0;
  size_t lo_tokens = 0, lo_vision = 0, lo_audio = 0;
  for (size_t i = 1; i <= m; ++i) {
    size_t lo;
    if (padded) {
      lo = i - PaddedCountCap(budget, window[sorted[i - 1]].tokens, i);
    } else {
      while (!packed_fits(lo_tokens, i)) ++lo_tokens;
      lo = lo_tokens;
      if (budget.max_group_size != 0 && i - lo > budget.max_group_size) {
        lo = i - budget.max_group_size;
      }
    }
    if (budget.max_vision_patches != 0) {
      while (vision[i] - vision[lo_vision] > budget.max_vision_patches) ++lo_vision;
      lo = std::max(lo, lo_vision);
    }
    if (budget.max_audio_frames != 0) {
      while (audio[i] - audio[lo_audio] > budget.max_audio_frames) ++lo_audio;
      lo = std::max(lo, lo_audio);
    }
    // Every sample fits alone, so lo <= i - 1 and best[i] is always finite.
    // The run cost is Monge (for j <= j' < i <= i': w(j,i) + w(j',i') <=
    // w(j,i') + w(j',i), since lengths are sorted and lo(i) is monotone), so
    // the leftmost optimal start never moves left as i grows: start the scan
    // there. This cuts the inner loop from the budget's count cap to about
    // the size of the group being formed.
    lo = std::max(lo, start[i - 1]);
    const double step = model.per_step;
    const double per_token = model.per_padded_token;
    double best_i = std::numeric_limits<double>::infinity();
    size_t start_i = i - 1;
    if (padded) {
      const double longest = window[sorted[i - 1]].tokens;
      for (size_t j = i; j-- > lo;) {
        const double cost = best[j] + step + per_token * static_cast<double>(i - j) * longest;
        // Ties prefer the larger group (fewer steps). Branch-free: the
        // comparison is unpredictable and this is the hot loop.
        const bool better = cost <= best_i;
        best_i = better ? cost : best_i;
        start_i = better ? j : start_i;
      }
    } else {
      for (size_t j = i; j-- > lo;) {
        const double cost = best[j] + step + per_token * static_cast<double>(sum[i] - sum[j]);
        const bool better = cost <= best_i;
        best_i = better ? cost : best_i;
        start_i = better ? j : start_i;
      }
    }
    best[i] = best_i;
    start[i] = start_i;
  }
  std::vector<Group> groups;
  for (size_t i = m; i > 0; i = start[i]) {
    groups.push_back(Group{std::vector<size_t>(sorted.begin() + static_cast<std::ptrdiff_t>(start[i]),
                                               sorted.begin() + static_cast<std::ptrdiff_t>(i)),
                           false});
  }
  return groups;
}

// splitmix64 (Steele, Lea, Flood 2014): fixed arithmetic, same stream on every
// platform and standard library, unlike std:: distributions.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound), bound > 0, by rejection (no modulo bias).
  uint64_t Below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t r = Next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  uint64_t state_;
};

}  // namespace

std::vector<Group> FormGroups(Window window, const Budget& budget, const StepTimeModel& model) {
  SplitWindow split = Split(window, budget);
  std::vector<Group> best = ContiguousDp(window, split.sorted, budget, model);
  double best_cost = TotalStepTime(window, best, model, budget.model);
  auto consider = [&](std::vector<Group> candidate) {
    const double cost = TotalStepTime(window, candidate, model, budget.model);
    if (cost < best_cost) {
      best = std::move(candidate);
      best_cost = cost;
    }
  };
  const bool modalities = budget.max_vision_patches != 0 || budget.max_audio_frames != 0;
  if (budget.model == CostModel::kPacked) {
    std::vector<Group> bfd = BestFitDecreasing(window, split.sorted, budget);
    if (model.per_step * static_cast<double>(bfd.size()) >=
        kRepackMinStepShare * TotalStepTime(window, bfd, model, budget.model)) {
      bfd = PoolRepack(window, std::move(bfd), budget);
    }
    consider(std::move(bfd));
    consider(GreedyFill(window, split.sorted, budget));
  } else if (modalities) {
    consider(GreedyFill(window, split.sorted, budget));
  }
  return Finish(window, std::move(best), std::move(split.over));
}

std::vector<Group> FormMixedGroups(Window window, const Budget& budget, uint64_t seed) {
  SplitWindow split = Split(window, budget);
  // Fisher-Yates over the (tokens, index) order: the draw depends only on the
  // seed and the window, not on how the window arrived.
  std::vector<size_t>& order = split.sorted;
  SplitMix64 rng(seed);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.Below(i)]);
  std::vector<Group> groups;
  std::vector<GroupTally> tallies;
  size_t first_open = 0;  // groups [first_open, size) are open
  for (size_t idx : order) {
    const SampleLengths& s = window[idx];
    size_t g = first_open;
    while (g < groups.size() && !tallies[g].CanAdd(s)) ++g;
    if (g == groups.size()) {
      groups.push_back(Group{});
      tallies.emplace_back(budget);
      if (groups.size() - first_open > kMixOpenGroups) ++first_open;
    }
    tallies[g].Add(s);
    groups[g].members.push_back(idx);
  }
  return Finish(window, std::move(groups), std::move(split.over));
}

std::vector<Group> ReferenceOdbGroups(Window window, const Budget& budget) {
  SplitWindow split = Split(window, budget);
  const std::vector<size_t> desc(split.sorted.rbegin(), split.sorted.rend());
  const size_t m = desc.size();
  std::vector<Group> groups;
  size_t i = 0;
  while (i < m) {
    // The reference's target size, from the group's first (longest) sample.
    // It ignores the other limits; we additionally cut a group where the next
    // sample would break them, so the baseline stays a valid grouping.
    double target = static_cast<double>(m);
    if (budget.max_tokens != 0) {
      const double eff = EffectiveLength(budget, window[desc[i]].tokens);
      if (eff > 0.0) {
        target = std::min(target,
                          std::max(std::floor(static_cast<double>(budget.max_tokens) / eff), 1.0));
      }
    }
    GroupTally tally(budget);
    Group group;
    while (i < m && static_cast<double>(group.members.size()) < target &&
           tally.CanAdd(window[desc[i]])) {
      tally.Add(window[desc[i]]);
      group.members.push_back(desc[i]);
      ++i;
    }
    groups.push_back(std::move(group));
  }
  return Finish(window, std::move(groups), std::move(split.over));
}

std::vector<Group> GreedyFewestSteps(Window window, const Budget& budget) {
  SplitWindow split = Split(window, budget);
  return Finish(window, GreedyFill(window, split.sorted, budget), std::move(split.over));
}

double TotalStepTime(Window window, const std::vector<Group>& groups, const StepTimeModel& model,
                     CostModel cost_model) {
  double total = 0.0;
  std::vector<SampleLengths> members;
  for (const Group& g : groups) {
    members.clear();
    for (size_t idx : g.members) members.push_back(window[idx]);
    total += StepTime(model, cost_model, members);
  }
  return total;
}

void ShuffleGroups(std::vector<Group>& groups, uint64_t seed) {
  // Fisher-Yates, back to front, with splitmix64 draws.
  SplitMix64 rng(seed);
  for (size_t i = groups.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng.Below(i));
    std::swap(groups[i - 1], groups[j]);
  }
}

}  // namespace odb::grouping
