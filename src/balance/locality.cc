#include "src/balance/locality.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "src/align/planned_groups.h"
#include "src/balance/assignment.h"
#include "src/grouping/budget.h"

namespace odb::balance::internal {

using align::KeyOf;

// Assignment weights of one step: gain of giving slot group g to rank r =
// units kept on r + kNodeWeight * units kept on r's node, where a sample's
// units are payload_bytes + 1 (so metadata-only tests still prefer locality).
// Maximising it minimises intra_bytes + (kNodeWeight + 1) * inter_bytes.
std::vector<std::vector<int64_t>> LocalityWeights(const Pool& pool, const std::vector<const Members*>& slots,
                                                  int world, uint32_t lws) {
  const int nodes = lws == 0 ? 1 : (world + static_cast<int>(lws) - 1) / static_cast<int>(lws);
  std::vector<std::vector<int64_t>> w(world, std::vector<int64_t>(world, 0));
  std::vector<int64_t> on_rank(world), on_node(nodes);
  for (int g = 0; g < world; ++g) {
    if (slots[g] == nullptr) continue;
    std::fill(on_rank.begin(), on_rank.end(), 0);
    std::fill(on_node.begin(), on_node.end(), 0);
    for (size_t i : *slots[g]) {
      const SampleMeta& m = pool.metas[i];
      const int64_t units = static_cast<int64_t>(m.payload_bytes) + 1;
      on_rank[m.owner_rank] += units;
      on_node[NodeOf(m.owner_rank, lws)] += units;
    }
    for (int r = 0; r < world; ++r) w[g][r] = on_rank[r] + kNodeWeight * on_node[NodeOf(r, lws)];
  }
  return w;
}

// Above GlobalPlannerConfig::exact_assignment_max_world ranks the locality
// permutation of a step is found by SparseAssignment (greedy + pairwise
// exchanges on the non-zero weights) instead of the exact Hungarian
// algorithm: O(n^3) time and an n x n matrix per step made the assignment
// most of a round's CPU at W = 1024 and nearly all of it at 2560
// (bench/results/scale_before.md). A permutation changes no rank's cost, so
// the switch only affects bytes moved, never balance.
constexpr int kSparseAssignmentPasses = 4;

// LocalityWeights as sparse entries: a group has samples of few owners, so
// its row is non-zero only at those owners and at the ranks of their nodes.
// The same weights, except that with a single node the node term (the same
// for every rank, so no permutation's choice) is left out: it would make
// every row dense.
std::vector<WeightedEdge> LocalityEdges(const Pool& pool, const std::vector<const Members*>& slots, int world,
                                        uint32_t lws) {
  const int nodes = lws == 0 ? 1 : (world + static_cast<int>(lws) - 1) / static_cast<int>(lws);
  std::vector<WeightedEdge> edges;
  std::vector<std::pair<int32_t, int64_t>> owners;  // (owner rank, units), sorted by owner
  std::vector<std::pair<int32_t, int64_t>> merged;  // one node's owners, units summed
  for (int g = 0; g < world; ++g) {
    if (slots[g] == nullptr) continue;
    owners.clear();
    for (size_t i : *slots[g]) {
      const SampleMeta& m = pool.metas[i];
      owners.emplace_back(m.owner_rank, static_cast<int64_t>(m.payload_bytes) + 1);
    }
    std::sort(owners.begin(), owners.end());
    // Merge each owner's units, then emit the row in column order with no
    // duplicate (so SparseAssignment need not sort it): per node of the
    // owners (owners sorted => nodes sorted), every rank of the node with
    // kNodeWeight x the node's units plus its own units if it is an owner.
    size_t i = 0;
    while (i < owners.size()) {
      const int32_t node = NodeOf(owners[i].first, lws);
      const size_t merged_begin = merged.size();
      int64_t node_units = 0;
      while (i < owners.size() && NodeOf(owners[i].first, lws) == node) {
        const int32_t owner = owners[i].first;
        int64_t units = 0;
        for (; i < owners.size() && owners[i].first == owner; ++i) units += owners[i].second;
        if (owner >= 0 && owner < world) merged.emplace_back(owner, units);
        node_units += units;
      }
      if (nodes > 1) {
        const int32_t first = node * static_cast<int32_t>(lws);
        const int32_t last = std::min<int32_t>(world, first + static_cast<int32_t>(lws));
        size_t next = merged_begin;
        for (int32_t r = first; r < last; ++r) {
          int64_t w = kNodeWeight * node_units;
          if (next < merged.size() && merged[next].first == r) w += merged[next++].second;
          edges.push_back({g, r, w});
        }
      } else {
        for (size_t k = merged_begin; k < merged.size(); ++k) {
          edges.push_back({g, merged[k].first, merged[k].second});
        }
      }
      merged.resize(merged_begin);
    }
  }
  return edges;
}

int64_t LocalityGain(const Pool& pool, const std::vector<Members>& bins, int world, uint32_t lws,
                     uint32_t exact_max_world, std::vector<int>* rank_of_bin) {
  std::vector<const Members*> slots(world, nullptr);
  for (size_t b = 0; b < bins.size(); ++b) slots[b] = &bins[b];
  if (static_cast<uint32_t>(world) > exact_max_world) {
    const std::vector<WeightedEdge> edges = LocalityEdges(pool, slots, world, lws);
    std::vector<int> assign = SparseAssignment(world, edges, kSparseAssignmentPasses);
    const int64_t gain = SparseAssignmentWeight(world, edges, assign);
    if (rank_of_bin != nullptr) *rank_of_bin = std::move(assign);
    return gain;
  }
  const auto w = LocalityWeights(pool, slots, world, lws);
  std::vector<int> assign = MaxWeightAssignment(w);
  const int64_t gain = AssignmentWeight(w, assign);
  if (rank_of_bin != nullptr) *rank_of_bin = std::move(assign);
  return gain;
}

// Pairwise exchanges of two bins' ranks while one raises the assignment
// weight (at most `passes` sweeps). Used after the local search instead of a
// second Hungarian run: the swaps only brought samples to the ranks their
// bins already hold, so the assignment is near-optimal and an O(W^2) polish
// replaces an O(W^3) solve.
void ImproveAssignment(const Pool& pool, const std::vector<Members>& bins, int world, uint32_t lws,
                       uint32_t exact_max_world, std::vector<int>& rank_of_bin, int passes) {
  std::vector<const Members*> slots(world, nullptr);
  for (size_t b = 0; b < bins.size(); ++b) slots[b] = &bins[b];
  if (static_cast<uint32_t>(world) > exact_max_world) {
    ImproveSparseAssignment(world, LocalityEdges(pool, slots, world, lws), rank_of_bin, passes);
    return;
  }
  const auto w = LocalityWeights(pool, slots, world, lws);
  for (int pass = 0; pass < passes; ++pass) {
    bool improved = false;
    for (int b1 = 0; b1 < world; ++b1) {
      for (int b2 = b1 + 1; b2 < world; ++b2) {
        const int r1 = rank_of_bin[b1], r2 = rank_of_bin[b2];
        if (w[b1][r2] + w[b2][r1] > w[b1][r1] + w[b2][r2]) {
          std::swap(rank_of_bin[b1], rank_of_bin[b2]);
          improved = true;
        }
      }
    }
    if (!improved) break;
  }
}

// Gain of emitting a sample owned by `owner` on `rank` (same scale as
// LocalityWeights: 1 + kNodeWeight at home, kNodeWeight on its node).
int64_t HomeScore(int32_t owner, int32_t rank, const std::vector<int32_t>& node) {
  if (owner == rank) return 1 + kNodeWeight;
  return node[owner] == node[rank] ? kNodeWeight : 0;
}

// Exact aggregates of a group, so that "X - a + b still fits the budget and
// stays within the capacity" is O(1): the same PaddedBudgetCost /
// PackedBudgetCost that GroupTally (hence FitsBudget) uses.
struct Agg {
  uint64_t n = 0;
  uint32_t max1 = 0, max2 = 0;  // longest, and longest after removing one longest
  uint64_t sum = 0;
  unsigned __int128 sum_sq = 0;
  uint64_t vision = 0, audio = 0;
};

Agg AggOf(const Pool& pool, const Members& g) {
  Agg a;
  for (size_t i : g) {
    const SampleLengths& s = pool.lens[i];
    ++a.n;
    if (s.tokens >= a.max1) {
      a.max2 = a.max1;
      a.max1 = s.tokens;
    } else {
      a.max2 = std::max(a.max2, s.tokens);
    }
    a.sum += s.tokens;
    a.sum_sq += static_cast<unsigned __int128>(s.tokens) * s.tokens;
    a.vision += s.vision_patches;
    a.audio += s.audio_frames;
  }
  return a;
}

// Does the group `g` (aggregates) with `out` removed (optional) and `in`
// added (optional) fit the budget (when it has > 1 member) and the capacity?
bool FitsAfter(const align::PlannerConfig& cfg, const Agg& g, const SampleLengths* out,
               const SampleLengths* in, double capacity) {
  uint64_t n = g.n;
  uint32_t longest = g.max1;
  uint64_t sum = g.sum, vision = g.vision, audio = g.audio;
  unsigned __int128 sum_sq = g.sum_sq;
  if (out != nullptr) {
    --n;
    if (out->tokens == g.max1) longest = g.max2;
    sum -= out->tokens;
    sum_sq -= static_cast<unsigned __int128>(out->tokens) * out->tokens;
    vision -= out->vision_patches;
    audio -= out->audio_frames;
  }
  if (in != nullptr) {
    ++n;
    longest = std::max(longest, in->tokens);
    sum += in->tokens;
    sum_sq += static_cast<unsigned __int128>(in->tokens) * in->tokens;
    vision += in->vision_patches;
    audio += in->audio_frames;
  }
  if (n == 0) return false;
  const grouping::Budget& b = cfg.budget;
  // Cheapest tests first: this runs for every candidate move and swap.
  if (n > 1) {
    if (b.max_group_size != 0 && n > b.max_group_size) return false;
    if (b.max_vision_patches != 0 && vision > b.max_vision_patches) return false;
    if (b.max_audio_frames != 0 && audio > b.max_audio_frames) return false;
  }
  const bool sq_fits = sum_sq <= std::numeric_limits<uint64_t>::max();
  const uint64_t sq = sq_fits ? static_cast<uint64_t>(sum_sq) : std::numeric_limits<uint64_t>::max();
  // Same value as converting the 128-bit sum (both round correctly), without
  // the slow 128-bit conversion in the common case.
  const double sq_d = sq_fits ? static_cast<double>(sq) : static_cast<double>(sum_sq);
  const uint64_t padded = b.model == grouping::CostModel::kPadded ? static_cast<uint64_t>(longest) * n : sum;
  const double cost = cfg.step_model.per_step +
                      cfg.step_model.per_padded_token * static_cast<double>(padded) +
                      cfg.step_model.per_len_sq * sq_d;
  if (cost > capacity) return false;
  if (n > 1 && b.max_tokens != 0) {
    const double bc = b.model == grouping::CostModel::kPadded ? grouping::PaddedBudgetCost(b, n, longest)
                                                              : grouping::PackedBudgetCost(b, sum, sq);
    if (bc > static_cast<double>(b.max_tokens)) return false;
  }
  return true;
}

// Local search over one step with ranks fixed (bin b runs on rank_of_bin[b]):
// a sample away from home moves to its owner's bin (then a bin on its node),
// or swaps with a sample of that bin, when the locality gain is positive and
// both bins keep the budget and stay within `capacity` (and non-empty). A few
// passes; returns whether anything changed.
bool LocalitySwaps(const align::PlannerConfig& cfg, const Pool& pool, std::vector<Members>& bins,
                   const std::vector<int>& rank_of_bin, double capacity, uint32_t lws) {
  const size_t nb = bins.size();
  std::vector<size_t> bin_of_rank(nb);
  for (size_t b = 0; b < nb; ++b) bin_of_rank[rank_of_bin[b]] = b;
  std::vector<int32_t> node(nb);  // node of each rank, without a division per lookup
  for (size_t r = 0; r < nb; ++r) node[r] = NodeOf(static_cast<int32_t>(r), lws);
  std::vector<Agg> agg(nb);
  for (size_t b = 0; b < nb; ++b) agg[b] = AggOf(pool, bins[b]);
  // Bins of each node, ascending: the candidate targets of a sample off its
  // node, without a scan of all W bins per sample.
  const int32_t num_nodes = node.empty() ? 0 : *std::max_element(node.begin(), node.end()) + 1;
  std::vector<std::vector<size_t>> node_bins(num_nodes);
  for (size_t y = 0; y < nb; ++y) node_bins[node[rank_of_bin[y]]].push_back(y);
  // FitsAfter is monotone in one sample's token count when no modality limit
  // applies and the step-time coefficients are non-negative.
  const bool monotone = cfg.budget.max_vision_patches == 0 && cfg.budget.max_audio_frames == 0 &&
                        cfg.budget.quadratic_q >= 0.0 && cfg.step_model.per_padded_token >= 0.0 &&
                        cfg.step_model.per_len_sq >= 0.0;
  // add_fails_from[y]: shortest sample that did not fit into bin y since y
  // last changed; with `monotone`, no longer one fits either.
  constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  std::vector<uint32_t> add_fails_from(nb, kNone);
  bool changed = false;
  std::vector<size_t> targets;
  for (int pass = 0; pass < 2; ++pass) {
    bool pass_changed = false;
    for (size_t x = 0; x < nb; ++x) {
      const int32_t p = rank_of_bin[x];
      for (size_t ai = 0; ai < bins[x].size();) {
        const size_t a = bins[x][ai];
        const SampleLengths& al = pool.lens[a];
        const int32_t owner = pool.metas[a].owner_rank;
        const int64_t here = HomeScore(owner, p, node);
        bool done = false;
        if (here < 1 + kNodeWeight && static_cast<size_t>(owner) < nb) {
          // Candidate bins: the owner's, then the others on its node.
          targets.assign(1, bin_of_rank[owner]);
          if (here < kNodeWeight) {
            for (size_t y : node_bins[node[owner]]) {
              if (y != x && y != bin_of_rank[owner]) targets.push_back(y);
            }
          }
          for (size_t y : targets) {
            if (y == x || done) continue;
            const int32_t q = rank_of_bin[y];
            bool fits_y = false;
            if (bins[x].size() > 1 && !(monotone && al.tokens >= add_fails_from[y])) {
              fits_y = FitsAfter(cfg, agg[y], nullptr, &al, capacity);
              if (!fits_y) add_fails_from[y] = std::min(add_fails_from[y], al.tokens);
            }
            if (fits_y && FitsAfter(cfg, agg[x], &al, nullptr, capacity)) {  // move
              bins[y].push_back(a);
              bins[x].erase(bins[x].begin() + static_cast<std::ptrdiff_t>(ai));
              agg[x] = AggOf(pool, bins[x]);
              agg[y] = AggOf(pool, bins[y]);
              add_fails_from[x] = add_fails_from[y] = kNone;
              done = true;
              break;
            }
            // Swaps only with the owner's own bin: trying every bin of the
            // node multiplies the search by local_world_size for little gain.
            if (y != targets[0]) continue;
            // Pruning (exact when `monotone`): x - a + b only gets heavier
            // as b grows, y - b + a only lighter, so a failed test rules out
            // every b at least as long (x side) or at most as long (y side).
            uint32_t x_fails_from = std::numeric_limits<uint32_t>::max();
            int64_t y_fails_upto = -1;
            for (size_t bi = 0; bi < bins[y].size(); ++bi) {  // swap
              const size_t b = bins[y][bi];
              const int32_t b_owner = pool.metas[b].owner_rank;
              const int64_t delta = HomeScore(owner, q, node) + HomeScore(b_owner, p, node) - here -
                                    HomeScore(b_owner, q, node);
              if (delta <= 0) continue;
              const SampleLengths& bl = pool.lens[b];
              if (monotone &&
                  (bl.tokens >= x_fails_from || static_cast<int64_t>(bl.tokens) <= y_fails_upto)) {
                continue;
              }
              if (!FitsAfter(cfg, agg[x], &al, &bl, capacity)) {
                x_fails_from = std::min(x_fails_from, bl.tokens);
                continue;
              }
              if (!FitsAfter(cfg, agg[y], &bl, &al, capacity)) {
                y_fails_upto = std::max<int64_t>(y_fails_upto, bl.tokens);
                continue;
              }
              {
                bins[x][ai] = b;
                bins[y][bi] = a;
                agg[x] = AggOf(pool, bins[x]);
                agg[y] = AggOf(pool, bins[y]);
                add_fails_from[x] = add_fails_from[y] = kNone;
                done = true;
                ++ai;
                break;
              }
            }
          }
        }
        if (done) {
          pass_changed = true;
        } else {
          ++ai;
        }
      }
    }
    changed = changed || pass_changed;
    if (!pass_changed) break;
  }
  return changed;
}

// After the deal, across steps: a sample i on rank r owned by o and a sample
// j on rank o owned by r trade places, so both run at home, when both groups
// keep the budget and stay within their step's capacity. Groups are formed on
// the global length order, so a step's W groups span different lengths and a
// within-step swap rarely fits the budget; but groups of i's length sit in
// many steps, so a partner of about i's length usually exists in some other
// step. For every rank pair, the away samples of each side are sorted by
// length and each tries the few nearest-length partners on the other side.
// Returns the number of swaps.
size_t CrossStepHomeSwaps(const align::PlannerConfig& cfg, const Pool& pool,
                          std::vector<std::vector<Members>>& steps, const std::vector<double>& capacity) {
  const size_t t = steps.size();
  if (t == 0) return 0;
  const size_t world = steps[0].size();
  std::vector<std::vector<Agg>> agg(t, std::vector<Agg>(world));
  for (size_t k = 0; k < t; ++k) {
    for (size_t r = 0; r < world; ++r) agg[k][r] = AggOf(pool, steps[k][r]);
  }
  struct Away {
    uint32_t step;
    size_t sample;
  };
  std::vector<std::vector<Away>> away(world * world);  // [rank * world + owner]
  for (size_t k = 0; k < t; ++k) {
    for (size_t r = 0; r < world; ++r) {
      for (size_t i : steps[k][r]) {
        const auto owner = static_cast<size_t>(pool.metas[i].owner_rank);
        if (owner != r && owner < world) away[r * world + owner].push_back({static_cast<uint32_t>(k), i});
      }
    }
  }
  const auto by_length = [&](const Away& x, const Away& y) {
    if (pool.lens[x.sample].tokens != pool.lens[y.sample].tokens) {
      return pool.lens[x.sample].tokens < pool.lens[y.sample].tokens;
    }
    return KeyOf(pool.metas[x.sample]) < KeyOf(pool.metas[y.sample]);
  };
  constexpr size_t kPartners = 4;  // nearest-length candidates tried on each side of i's length
  size_t swaps = 0;
  for (size_t r = 0; r < world; ++r) {
    for (size_t o = r + 1; o < world; ++o) {
      auto& a = away[r * world + o];  // on r, owned by o
      auto& b = away[o * world + r];  // on o, owned by r
      if (a.empty() || b.empty()) continue;
      std::sort(a.begin(), a.end(), by_length);
      std::sort(b.begin(), b.end(), by_length);
      std::vector<bool> taken(b.size(), false);
      for (const Away& x : a) {
        const SampleLengths& xl = pool.lens[x.sample];
        const size_t mid =
            static_cast<size_t>(std::lower_bound(b.begin(), b.end(), x, by_length) - b.begin());
        const size_t lo = mid > kPartners ? mid - kPartners : 0;
        const size_t hi = std::min(b.size(), mid + kPartners);
        for (size_t c = lo; c < hi; ++c) {
          if (taken[c]) continue;
          const Away& y = b[c];
          const SampleLengths& yl = pool.lens[y.sample];
          if (!FitsAfter(cfg, agg[x.step][r], &xl, &yl, capacity[x.step]) ||
              !FitsAfter(cfg, agg[y.step][o], &yl, &xl, capacity[y.step])) {
            continue;
          }
          Members& gx = steps[x.step][r];
          Members& gy = steps[y.step][o];
          *std::find(gx.begin(), gx.end(), x.sample) = y.sample;
          *std::find(gy.begin(), gy.end(), y.sample) = x.sample;
          agg[x.step][r] = AggOf(pool, gx);
          agg[y.step][o] = AggOf(pool, gy);
          taken[c] = true;
          ++swaps;
          break;
        }
      }
    }
  }
  return swaps;
}

// A partial (end-of-epoch) step: fewer groups than ranks; only the permutation.
std::vector<Members> PlaceStep(const GlobalPlannerConfig& gcfg, const Pool& pool, std::vector<Members> bins,
                               int world) {
  std::vector<int> rank_of_bin;
  LocalityGain(pool, bins, world, gcfg.local_world_size, gcfg.exact_assignment_max_world, &rank_of_bin);
  std::vector<Members> by_rank(world);
  for (size_t b = 0; b < bins.size(); ++b) by_rank[rank_of_bin[b]] = std::move(bins[b]);
  return by_rank;
}

}  // namespace odb::balance::internal
