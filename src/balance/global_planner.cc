#include "src/balance/global_planner.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "src/align/planned_groups.h"
#include "src/balance/assignment.h"
#include "src/balance/locality.h"
#include "src/balance/node_placement.h"
#include "src/balance/partition.h"
#include "src/grouping/budget.h"
#include "src/grouping/grouper.h"

namespace odb::balance {

using align::KeyOf;
using align::MinKey;
using align::PlannedStep;
using align::RankPlan;
using align::RankRound;
using align::RoundPlan;
using align::RoundState;
using align::SampleKey;

BytesMoved& BytesMoved::operator+=(const BytesMoved& o) {
  stay_bytes += o.stay_bytes;
  intra_node_bytes += o.intra_node_bytes;
  inter_node_bytes += o.inter_node_bytes;
  stay_samples += o.stay_samples;
  intra_node_samples += o.intra_node_samples;
  inter_node_samples += o.inter_node_samples;
  return *this;
}

BytesMoved ComputeBytesMoved(const RoundPlan& plan, uint32_t local_world_size) {
  BytesMoved out;
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const int32_t rank = static_cast<int32_t>(r);
    for (const PlannedStep& s : plan.ranks[r].steps) {
      for (const SampleMeta& m : s.samples) {
        if (m.owner_rank == rank) {
          out.stay_bytes += m.payload_bytes;
          ++out.stay_samples;
        } else if (NodeOf(m.owner_rank, local_world_size) == NodeOf(rank, local_world_size)) {
          out.intra_node_bytes += m.payload_bytes;
          ++out.intra_node_samples;
        } else {
          out.inter_node_bytes += m.payload_bytes;
          ++out.inter_node_samples;
        }
      }
    }
  }
  return out;
}

namespace {

using internal::CrossStepHomeSwaps;
using internal::ImproveAssignment;
using internal::LocalityGain;
using internal::LocalitySwaps;
using internal::Members;
using internal::PartitionedSteps;
using internal::PlaceStep;
using internal::PlanBlockInto;
using internal::PlanRanks;
using internal::Pool;

// One (step, rank) group under construction: indices into the pool, with
// running aggregates so that "cost if I add s" is O(1).
class Bin {
 public:
  explicit Bin(const grouping::Budget& budget) : tally_(budget) {}

  void Add(const SampleLengths& s) {
    ++n_;
    tally_.Add(s);
    longest_ = std::max(longest_, s.tokens);
    sum_ += s.tokens;
    sum_sq_ += static_cast<double>(s.tokens) * static_cast<double>(s.tokens);
  }
  bool CanAdd(const SampleLengths& s) const { return n_ == 0 || tally_.CanAdd(s); }
  double Cost(const align::PlannerConfig& cfg) const { return CostWith(cfg, n_, longest_, sum_, sum_sq_); }
  double CostIfAdded(const align::PlannerConfig& cfg, const SampleLengths& s) const {
    return CostWith(cfg, n_ + 1, std::max(longest_, s.tokens), sum_ + s.tokens,
                    sum_sq_ + static_cast<double>(s.tokens) * static_cast<double>(s.tokens));
  }
  bool empty() const { return n_ == 0; }

 private:
  // grouping::StepTime from aggregates: the same terms summed in the same
  // (insertion) order as CostOf over the members, hence the same value.
  static double CostWith(const align::PlannerConfig& cfg, uint64_t n, uint32_t longest, uint64_t sum,
                         double sum_sq) {
    if (n == 0) return 0.0;
    const uint64_t padded =
        cfg.budget.model == grouping::CostModel::kPadded ? static_cast<uint64_t>(longest) * n : sum;
    return cfg.step_model.per_step + cfg.step_model.per_padded_token * static_cast<double>(padded) +
           cfg.step_model.per_len_sq * sum_sq;
  }

  uint64_t n_ = 0;
  grouping::GroupTally tally_;
  uint32_t longest_ = 0;
  uint64_t sum_ = 0;
  double sum_sq_ = 0.0;
};

// grouping::StepTime of the group, without building a lengths vector (the
// same terms summed in the same order, hence the same value).
double CostOf(const align::PlannerConfig& cfg, const Pool& pool, const Members& g) {
  if (g.empty()) return 0.0;
  uint64_t longest = 0, sum = 0;
  double sum_sq = 0.0;
  for (size_t i : g) {
    const uint64_t t = pool.lens[i].tokens;
    longest = std::max(longest, t);
    sum += t;
    sum_sq += static_cast<double>(t * t);
  }
  const uint64_t padded = cfg.budget.model == grouping::CostModel::kPadded ? longest * g.size() : sum;
  return cfg.step_model.per_step + cfg.step_model.per_padded_token * static_cast<double>(padded) +
         cfg.step_model.per_len_sq * sum_sq;
}

// Splits the most expensive group of >= 2 samples into its shorter and longer
// half (a subset of a fitting group fits). Returns false when none can split.
// `cost` and `key` cache CostOf and MinKey of every group (kept in step with
// `groups`), so that a run of splits is O(G) per split, not O(n) per split.
bool SplitCostliest(const align::PlannerConfig& cfg, const Pool& pool, std::vector<Members>& groups,
                    std::vector<double>& cost, std::vector<SampleKey>& key) {
  size_t best = groups.size();
  double best_cost = -1.0;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].size() < 2) continue;
    const double c = cost[i];
    if (best == groups.size() || c > best_cost || (c == best_cost && key[i] < key[best])) {
      best = i;
      best_cost = c;
    }
  }
  if (best == groups.size()) return false;
  Members m = std::move(groups[best]);
  std::sort(m.begin(), m.end(), [&](size_t x, size_t y) {
    if (pool.lens[x].tokens != pool.lens[y].tokens) return pool.lens[x].tokens < pool.lens[y].tokens;
    return KeyOf(pool.metas[x]) < KeyOf(pool.metas[y]);
  });
  const size_t half = m.size() / 2;
  groups[best].assign(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(half));
  groups.emplace_back(m.begin() + static_cast<std::ptrdiff_t>(half), m.end());
  cost[best] = CostOf(cfg, pool, groups[best]);
  key[best] = MinKey(pool.metas, groups[best]);
  cost.push_back(CostOf(cfg, pool, groups.back()));
  key.push_back(MinKey(pool.metas, groups.back()));
  return true;
}

double MaxCost(const align::PlannerConfig& cfg, const Pool& pool, const std::vector<Members>& bins) {
  double mx = 0.0;
  for (const Members& b : bins) mx = std::max(mx, CostOf(cfg, pool, b));
  return mx;
}

// Dispatches the samples of one step into W non-empty bins whose cost stays
// within `capacity` and whose budget holds; longest first. Without
// `rank_of_bin` each sample goes to the least-loaded feasible bin (LPT); with
// it, to its owner's bin, else a bin on its owner's node, else the least
// loaded. nullopt when the greedy finds no feasible bin for some sample.
std::optional<double> Dispatch(const align::PlannerConfig& cfg, const Pool& pool, const std::vector<size_t>& desc,
                               size_t num_bins, double capacity, const std::vector<int>* rank_of_bin, uint32_t lws,
                               std::vector<uint32_t>& bin_of) {
  std::vector<Bin> bins(num_bins, Bin(cfg.budget));
  std::vector<double> load(num_bins, 0.0);
  // Without classes the pick is the feasible bin of least (load, index): walk
  // the bins in that order and stop at the first feasible one, instead of
  // testing all W bins per sample. Loads only grow, so a bin that received a
  // sample moves right by insertion.
  std::vector<size_t> order(num_bins);
  for (size_t b = 0; b < num_bins; ++b) order[b] = b;
  auto before = [&](size_t a, size_t b) { return load[a] != load[b] ? load[a] < load[b] : a < b; };
  size_t empty = num_bins;
  for (size_t k = 0; k < desc.size(); ++k) {
    const size_t idx = desc[k];
    const SampleLengths& s = pool.lens[idx];
    const bool only_empty = empty == desc.size() - k;
    size_t best = num_bins;
    size_t best_pos = num_bins;
    int best_class = 3;
    for (size_t pos = 0; pos < num_bins; ++pos) {
      const size_t b = order[pos];
      if (only_empty && !bins[b].empty()) continue;
      if (!bins[b].CanAdd(s)) continue;
      if (!bins[b].empty() && bins[b].CostIfAdded(cfg, s) > capacity) continue;
      int cls = 0;
      if (rank_of_bin != nullptr) {
        const int32_t owner = pool.metas[idx].owner_rank;
        const int32_t rank = (*rank_of_bin)[b];
        cls = rank == owner ? 0 : NodeOf(rank, lws) == NodeOf(owner, lws) ? 1 : 2;
      }
      if (best == num_bins || cls < best_class || (cls == best_class && before(b, best))) {
        best = b;
        best_pos = pos;
        best_class = cls;
      }
      if (rank_of_bin == nullptr || cls == 0) break;  // nothing later in the order beats it
    }
    if (best == num_bins) return std::nullopt;
    if (bins[best].empty()) --empty;
    bins[best].Add(s);
    bin_of[k] = static_cast<uint32_t>(best);
    load[best] = bins[best].Cost(cfg);
    // Binary search for the bin's new place, then one memmove.
    const auto from = order.begin() + static_cast<std::ptrdiff_t>(best_pos);
    const auto to = std::upper_bound(from + 1, order.end(), best, before);
    std::rotate(from, from + 1, to);
  }
  return *std::max_element(load.begin(), load.end());
}

// The bins of a dispatch: members in `desc` order.
std::vector<Members> BinsOf(const std::vector<size_t>& desc, const std::vector<uint32_t>& bin_of, size_t num_bins) {
  std::vector<Members> out(num_bins);
  for (size_t k = 0; k < desc.size(); ++k) out[bin_of[k]].push_back(desc[k]);
  return out;
}

// Post-balancing of one full step (W groups): binary search on the capacity
// with the LPT dispatcher, then the locality pass within C* / (1 - locality).
// Returns the step's groups in rank order (index = rank).
std::vector<Members> BalanceStep(const GlobalPlannerConfig& gcfg, const Pool& pool, std::vector<Members> bins,
                                 int world) {
  const align::PlannerConfig& cfg = gcfg.base;
  const uint32_t lws = gcfg.local_world_size;
  std::vector<size_t> desc;
  for (const Members& b : bins) desc.insert(desc.end(), b.begin(), b.end());
  std::sort(desc.begin(), desc.end(), [&](size_t x, size_t y) {
    if (pool.lens[x].tokens != pool.lens[y].tokens) return pool.lens[x].tokens > pool.lens[y].tokens;
    return KeyOf(pool.metas[x]) < KeyOf(pool.metas[y]);
  });
  double lo = 0.0;
  for (size_t i : desc) lo = std::max(lo, CostOf(cfg, pool, Members{i}));
  double hi = MaxCost(cfg, pool, bins);
  if (lo < hi) {
    // Dispatches record a bin per sample (no member lists); only the best
    // one is turned into groups.
    std::optional<double> best;
    std::vector<uint32_t> best_bin_of, bin_of(desc.size());
    for (uint32_t it = 0; it <= gcfg.capacity_search_iters && lo < hi; ++it) {
      const double mid = it == 0 ? hi : lo + (hi - lo) / 2;
      const std::optional<double> mx = Dispatch(cfg, pool, desc, bins.size(), mid, nullptr, lws, bin_of);
      if (mx) {
        if (*mx < hi || !best) {
          best = mx;
          best_bin_of.swap(bin_of);
          bin_of.resize(desc.size());
        }
        hi = std::min(hi, *mx);
      } else {
        if (it == 0) break;  // the greedy cannot even match the dealt groups
        lo = mid;
      }
    }
    if (best && *best < MaxCost(cfg, pool, bins)) bins = BinsOf(desc, best_bin_of, bins.size());
  }
  const double c_star = MaxCost(cfg, pool, bins);
  std::vector<int> rank_of_bin;
  LocalityGain(pool, bins, world, lws, gcfg.exact_assignment_max_world, &rank_of_bin);
  // Locality pass: moves and swaps that bring samples home, within the budget
  // and within the relaxed capacity C* / (1 - locality).
  const double capacity = c_star / (1.0 - std::clamp(gcfg.locality, 0.0, 0.999));
  if (LocalitySwaps(cfg, pool, bins, rank_of_bin, capacity, lws)) {
    ImproveAssignment(pool, bins, world, lws, gcfg.exact_assignment_max_world, rank_of_bin, 4);
  }
  std::vector<Members> by_rank(world);
  for (size_t b = 0; b < bins.size(); ++b) by_rank[rank_of_bin[b]] = std::move(bins[b]);
  // Node-aware re-split of the step's samples between pairs and triples of nodes, within
  // the step time just reached (node_placement.h; issue 22, item 4).
  PlaceOnNodes(cfg.budget, cfg.step_model, pool.metas, by_rank, lws);
  return by_rank;
}

// A group's costs in the step composition of StepPhaseCosts: its LLM cost in
// seconds, and per encoder phase the sum and the largest of its items.
struct GroupPhaseLoad {
  double llm = 0.0;
  double vision_sum = 0.0, vision_max = 0.0;
  double audio_sum = 0.0, audio_max = 0.0;
};

// One step's aggregates over its groups: per maximum the largest and second
// largest value and the slot holding the largest, so that the step's value
// without one of its groups is O(1).
class StepPhaseTally {
 public:
  void Reset() { *this = StepPhaseTally(); }
  void Add(const GroupPhaseLoad& g, size_t slot) {
    ++n_;
    vision_sum_ += g.vision_sum;
    audio_sum_ += g.audio_sum;
    llm_.Add(g.llm, slot);
    vision_max_.Add(g.vision_max, slot);
    audio_max_.Add(g.audio_max, slot);
  }
  // The step's modelled time: LLM (its costliest group) plus each encoder
  // phase's minimax bound over the step's n active ranks.
  double Time() const {
    return TimeWith(llm_.first, vision_max_.first, audio_max_.first, vision_sum_, audio_sum_);
  }
  // ... with the group in `slot` (load `out`) replaced by `in`.
  double TimeSwapped(size_t slot, const GroupPhaseLoad& out, const GroupPhaseLoad& in) const {
    return TimeWith(std::max(llm_.Without(slot), in.llm), std::max(vision_max_.Without(slot), in.vision_max),
                    std::max(audio_max_.Without(slot), in.audio_max),
                    vision_sum_ - out.vision_sum + in.vision_sum, audio_sum_ - out.audio_sum + in.audio_sum);
  }

 private:
  struct Top2 {
    double first = 0.0, second = 0.0;
    size_t first_slot = SIZE_MAX;
    void Add(double v, size_t slot) {
      if (first_slot == SIZE_MAX || v > first) {
        second = first;
        first = v;
        first_slot = slot;
      } else {
        second = std::max(second, v);
      }
    }
    double Without(size_t slot) const { return slot == first_slot ? second : first; }
  };
  double TimeWith(double llm, double vision_max, double audio_max, double vision_sum,
                  double audio_sum) const {
    const double n = static_cast<double>(std::max<size_t>(n_, 1));
    return llm + std::max(vision_max, vision_sum / n) + std::max(audio_max, audio_sum / n);
  }
  size_t n_ = 0;
  double vision_sum_ = 0.0, audio_sum_ = 0.0;
  Top2 llm_, vision_max_, audio_max_;
};

// Step composition with the encoder phases in view (StepPhaseCosts): from
// the sorted chunking `dealt` (step k holds the groups dealt[k * world ..
// (k + 1) * world)), exchanges of two groups between two steps while one
// lowers the sum over steps of StepPhaseTally::Time (first improvement, in
// slot order; at most kPasses passes over all pairs and kMaxPairs pairs in
// all, O(1) per pair, so a round of thousands of groups stops short
// of a local optimum instead of stalling the round). The
// LLM-only chunking is the start, so a step's LLM cost rises only where the
// encoders gain more: in practice large encoder items (a 1024-patch image
// next to 16-patch icons) gather in the same steps, where the encoder plan
// spreads them over the ranks, instead of one per step with the other ranks
// idle in that phase. Deterministic.
void ComposeWithPhases(const GlobalPlannerConfig& config, const Pool& pool,
                       const std::vector<Members>& groups, size_t world, std::vector<size_t>& dealt) {
  constexpr int kPasses = 8;
  constexpr uint64_t kMaxPairs = uint64_t{1} << 24;
  const StepPhaseCosts& pc = config.phase_costs;
  const size_t n = dealt.size();
  if (n <= world) return;
  std::vector<GroupPhaseLoad> load(n);  // by slot (position in dealt)
  for (size_t j = 0; j < n; ++j) {
    GroupPhaseLoad& g = load[j];
    g.llm = pc.llm_seconds * CostOf(config.base, pool, groups[dealt[j]]);
    for (size_t i : groups[dealt[j]]) {
      const double v = pc.vision.OfInput(pool.lens[i].vision_patches);
      const double a = pc.audio.OfInput(pool.lens[i].audio_frames);
      g.vision_sum += v;
      g.vision_max = std::max(g.vision_max, v);
      g.audio_sum += a;
      g.audio_max = std::max(g.audio_max, a);
    }
  }
  const size_t t = (n + world - 1) / world;
  auto begin = [&](size_t k) { return k * world; };
  auto end = [&](size_t k) { return std::min(n, (k + 1) * world); };
  std::vector<StepPhaseTally> tally(t);
  std::vector<double> time(t);
  auto retally = [&](size_t k) {
    tally[k].Reset();
    for (size_t j = begin(k); j < end(k); ++j) tally[k].Add(load[j], j);
    time[k] = tally[k].Time();
  };
  for (size_t k = 0; k < t; ++k) retally(k);
  uint64_t pairs = 0;
  for (int pass = 0; pass < kPasses && pairs < kMaxPairs; ++pass) {
    bool improved = false;
    for (size_t a = 0; a < t && pairs < kMaxPairs; ++a) {
      for (size_t b = a + 1; b < t; ++b) {
        pairs += (end(a) - begin(a)) * (end(b) - begin(b));
        for (size_t x = begin(a); x < end(a); ++x) {
          for (size_t y = begin(b); y < end(b); ++y) {
            const double ta = tally[a].TimeSwapped(x, load[x], load[y]);
            const double tb = tally[b].TimeSwapped(y, load[y], load[x]);
            // A relative margin: float noise never counts as a gain.
            if (ta + tb >= (time[a] + time[b]) * (1.0 - 1e-9)) continue;
            std::swap(load[x], load[y]);
            std::swap(dealt[x], dealt[y]);
            retally(a);
            retally(b);
            improved = true;
          }
        }
      }
    }
    if (!improved) break;
  }
}

// Fills `t` steps of `world` slots with `groups` (at most t * world of them):
// splits the costliest groups while slots are left, then deals most expensive
// first, `world` per step (for fixed groups and one group per (step, rank),
// sorted chunking minimises sum_k max_r cost; with config.phase_costs,
// ComposeWithPhases then exchanges groups between steps), balances every full step
// (BalanceStep) and places a partial one (PlaceStep). Returns steps[k][rank].
// PlannerConfig::mix_steps: the cost-ordered deal re-dealt inside bands of
// near-equal cost (each group within kMixStepsBand of the band's costliest),
// so that each step of a band holds one group from each length stratum of
// the band (its groups sorted by mean length, cut into `world` strata of
// `steps in the band` groups; step s takes the s-th of the even strata and
// the s-th from the end of the odd ones, so long groups meet short ones). The groups are unchanged (the
// same padding); a step's costliest group, which sets its time, rises by less
// than the band's width. `dealt` holds the group indices in cost order on
// entry and the re-dealt order on return.
constexpr double kMixStepsBand = 0.01;

void FoldByLength(const Pool& pool, const std::vector<Members>& groups,
                  const std::vector<std::pair<double, size_t>>& by_cost, size_t world,
                  std::vector<size_t>& dealt) {
  auto mean_length = [&](size_t g) {
    uint64_t sum = 0;
    for (size_t i : groups[g]) sum += pool.lens[i].tokens;
    return groups[g].empty() ? 0.0 : static_cast<double>(sum) / static_cast<double>(groups[g].size());
  };
  size_t start = 0;
  while (start + 2 * world <= by_cost.size()) {
    size_t end = start + 1;
    while (end < by_cost.size() && by_cost[end].first >= (1.0 - kMixStepsBand) * by_cost[start].first) ++end;
    const size_t steps = (end - start) / world;
    if (steps < 2) {
      start += world;  // a band of one step: the deal as it was
      continue;
    }
    std::vector<std::pair<double, size_t>> by_length;
    by_length.reserve(steps * world);
    for (size_t j = start; j < start + steps * world; ++j)
      by_length.emplace_back(mean_length(dealt[j]), dealt[j]);
    std::stable_sort(by_length.begin(), by_length.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t step = 0; step < steps; ++step) {
      for (size_t r = 0; r < world; ++r) {
        const size_t in_stratum = r % 2 == 0 ? step : steps - 1 - step;  // antithetic: long with short
        dealt[start + step * world + r] = by_length[r * steps + in_stratum].second;
      }
    }
    start += steps * world;
  }
}

std::vector<std::vector<Members>> DealSteps(const GlobalPlannerConfig& config, const Pool& pool,
                                            std::vector<Members> groups, size_t t, size_t world) {
  const align::PlannerConfig& cfg = config.base;
  const size_t slots = t * world;
  if (groups.size() < slots) {
    std::vector<double> cost(groups.size());
    std::vector<SampleKey> key(groups.size());
    for (size_t i = 0; i < groups.size(); ++i) {
      cost[i] = CostOf(cfg, pool, groups[i]);
      key[i] = MinKey(pool.metas, groups[i]);
    }
    while (groups.size() < slots && SplitCostliest(cfg, pool, groups, cost, key)) {
    }
  }
  std::vector<std::pair<double, size_t>> by_cost;
  by_cost.reserve(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) by_cost.emplace_back(CostOf(cfg, pool, groups[i]), i);
  std::vector<SampleKey> min_keys(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) min_keys[i] = MinKey(pool.metas, groups[i]);
  std::sort(by_cost.begin(), by_cost.end(), [&](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first > b.first;
    return min_keys[a.second] < min_keys[b.second];
  });
  std::vector<size_t> dealt(by_cost.size());  // step k: dealt[k * world, (k + 1) * world)
  for (size_t j = 0; j < dealt.size(); ++j) dealt[j] = by_cost[j].second;
  if (cfg.mix_steps) FoldByLength(pool, groups, by_cost, world, dealt);
  if (config.phase_costs.enabled()) ComposeWithPhases(config, pool, groups, world, dealt);
  std::vector<std::vector<Members>> steps(t);
  for (size_t k = 0; k < t; ++k) {
    std::vector<Members> bins;
    for (size_t j = k * world; j < std::min((k + 1) * world, dealt.size()); ++j) {
      bins.push_back(std::move(groups[dealt[j]]));
    }
    steps[k] = bins.size() == world ? BalanceStep(config, pool, std::move(bins), static_cast<int>(world))
                                    : PlaceStep(config, pool, std::move(bins), static_cast<int>(world));
  }
  return steps;
}

// The groups grouping::FormGroups makes of the pool samples `members`, as
// pool indices.
std::vector<Members> GroupsOf(const align::PlannerConfig& cfg, const Pool& pool,
                              std::span<const size_t> members) {
  std::vector<SampleLengths> lens;
  lens.reserve(members.size());
  for (size_t i : members) lens.push_back(pool.lens[i]);
  std::vector<Members> groups;
  for (grouping::Group& g : grouping::FormGroups(lens, cfg.budget, cfg.step_model)) {
    Members m;
    m.reserve(g.members.size());
    for (size_t j : g.members) m.push_back(members[j]);
    groups.push_back(std::move(m));
  }
  return groups;
}

// The last round of an epoch with a partial step: the fewest shortest samples
// that leave the rest groupable into t - 1 full steps (binary search on their
// number, FormGroups deciding) make the t-th step, spread over the ranks; the
// rest is dealt as usual. nullopt when the shortest samples that must go do
// not fit one step. A partial step then costs what its longest rank holds of
// short samples, not a lone long sample next to W - 1 nearly empty ranks.
std::optional<std::vector<std::vector<Members>>> LightLastStep(const GlobalPlannerConfig& config,
                                                               const Pool& pool, size_t t, size_t world) {
  const align::PlannerConfig& cfg = config.base;
  std::vector<size_t> asc(pool.lens.size());
  for (size_t i = 0; i < asc.size(); ++i) asc[i] = i;
  std::sort(asc.begin(), asc.end(), [&](size_t x, size_t y) {
    if (pool.lens[x].tokens != pool.lens[y].tokens) return pool.lens[x].tokens < pool.lens[y].tokens;
    return KeyOf(pool.metas[x]) < KeyOf(pool.metas[y]);
  });
  const std::span<const size_t> all(asc);
  const size_t full = (t - 1) * world;
  // The smallest k whose rest makes <= full groups is in [lo, hi]; one step
  // holds at most W x L tokens, so the search stops at the first prefix of
  // the shortest samples above that.
  size_t lo = 1, hi = 1;
  const double step_tokens = static_cast<double>(cfg.budget.max_tokens) * static_cast<double>(world);
  for (double sum = pool.lens[asc[0]].tokens;
       hi < asc.size() && (cfg.budget.max_tokens == 0 || sum <= step_tokens); ++hi) {
    sum += pool.lens[asc[hi]].tokens;
  }
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (GroupsOf(cfg, pool, all.subspan(mid)).size() <= full) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  std::vector<Members> rest = GroupsOf(cfg, pool, all.subspan(lo));
  std::vector<Members> light = GroupsOf(cfg, pool, all.first(lo));
  if (rest.size() > full || light.size() > world) return std::nullopt;
  std::vector<std::vector<Members>> steps = DealSteps(config, pool, std::move(rest), t - 1, world);
  steps.push_back(DealSteps(config, pool, std::move(light), 1, world)[0]);
  return steps;
}

// The step of rank group `g`: members in key order; a lone sample that fits
// no budget is over budget (dispatch may leave any sample alone).
PlannedStep StepOf(const align::PlannerConfig& cfg, const Pool& pool, const Members& g) {
  Members sorted = g;
  std::sort(sorted.begin(), sorted.end(),
            [&](size_t x, size_t y) { return KeyOf(pool.metas[x]) < KeyOf(pool.metas[y]); });
  const bool over = sorted.size() == 1 && !grouping::FitsAlone(cfg.budget, pool.lens[sorted[0]]);
  return align::MakeStep(cfg.budget.model, pool.metas, sorted, over);
}

// Expected number of groups a sample accounts for: its share of the token
// budget (a group rarely fills it completely, hence the margin the caller
// adds), at least its share of the group-size cap, and 1 if it fits no budget.
double GroupShare(const grouping::Budget& b, const SampleLengths& s) {
  double share = 0.0;
  if (b.max_tokens != 0) {
    share = grouping::EffectiveLength(b, s.tokens) / static_cast<double>(b.max_tokens);
  }
  if (b.max_group_size != 0) share = std::max(share, 1.0 / static_cast<double>(b.max_group_size));
  return std::min(share, 1.0);
}

// Grouping the whole pool only to hold most groups back is the dominant cost
// of a round when credit is small against the pending work (W = 64 ranks x
// 1024 samples, 8 free slots: ~7600 groups for 512 slots). When the pool
// would form at least twice `target` groups (estimated from GroupShare), the
// pool is cut to its oldest samples, taken depth by depth across the ranks
// (the i-th pending sample of every rank before any (i+1)-th), until their
// estimate reaches `target`. Returns whether it cut; `take[r]` is then the
// number of rank r's first pending samples kept in the pool (it is the
// window size on entry). Every rank keeps an equal share, and the oldest
// samples go first, so no sample waits behind later arrivals for ever.
// The cut never goes below one window of samples per rank (256 when the
// window is unbounded) for up to 4 ranks: grouping quality comes from choice.
// With a slow trainer (one free slot a round, W = 2) a pool cut to a few
// groups' worth of samples cost 1.38x LocalPlanner's plan, and a one-window
// floor still 1.09x (global_planner_test, "a slow trainer").
bool SelectOldest(const align::PlannerConfig& cfg, const RoundState& state, double target,
                  std::vector<size_t>& take) {
  const grouping::Budget& b = cfg.budget;
  if (b.max_tokens == 0 && b.max_group_size == 0) return false;  // no estimate: group everything
  const size_t min_pool = (cfg.window == 0 ? 256 : cfg.window) * std::min<size_t>(take.size(), 4);
  size_t pool_size = 0;
  for (size_t n : take) pool_size += n;
  if (pool_size <= min_pool) return false;
  double total = 0.0;
  size_t depth = 0;
  for (size_t r = 0; r < take.size(); ++r) depth = std::max(depth, take[r]);
  for (size_t r = 0; r < take.size() && total < 2.0 * target; ++r) {
    for (size_t i = 0; i < take[r] && total < 2.0 * target; ++i) {
      total += GroupShare(b, state.ranks[r].pending[i].lengths);
    }
  }
  if (total < 2.0 * target) return false;
  std::vector<size_t> cut(take.size(), 0);
  double est = 0.0;
  size_t kept = 0;
  for (size_t i = 0; i < depth && (est < target || kept < min_pool); ++i) {
    for (size_t r = 0; r < take.size(); ++r) {
      if (i >= take[r]) continue;
      est += GroupShare(b, state.ranks[r].pending[i].lengths);
      cut[r] = i + 1;
      ++kept;
    }
  }
  take = std::move(cut);
  return true;
}

std::string FormatLocality(double l) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", l);
  return buf;
}

}  // namespace

GlobalPlanner::GlobalPlanner(GlobalPlannerConfig config) : config_(std::move(config)), local_(config_.base) {}

std::string GlobalPlanner::Name() const {
  // The assignment threshold changes plans above it, so ranks must agree on
  // it too; named only when not the default, so default names are unchanged.
  const std::string exact =
      config_.exact_assignment_max_world == GlobalPlannerConfig{}.exact_assignment_max_world
          ? ""
          : ",exact_assignment_max_world=" + std::to_string(config_.exact_assignment_max_world);
  const std::string partition =
      config_.partition_ranks == 0 ? "" : ",partition_ranks=" + std::to_string(config_.partition_ranks);
  const std::string phases = config_.phase_costs.enabled() ? ",phase_steps" : "";
  return "global(locality=" + FormatLocality(config_.locality) +
         ",local_world_size=" + std::to_string(config_.local_world_size) + exact + partition + phases + ")";
}

RoundPlan GlobalPlanner::Plan(const RoundState& state) const {
  if (config_.locality >= 1.0) return local_.Plan(state);
  // End of epoch, waits and credit: the rules every planner shares.
  uint32_t min_free = 0;
  if (auto gated = align::ApplyRoundGates(config_.base, state, min_free)) return std::move(*gated);
  const size_t world = state.ranks.size();
  const size_t block = BlockRanks(world);
  if (block >= world) return PlanRanks(config_, state, min_free, std::nullopt);
  std::vector<align::RankSummary> summaries;
  summaries.reserve(world);
  for (const RankRound& rr : state.ranks) summaries.push_back(align::SummaryOf(rr, GroupBound(rr)));
  RoundPlan plan;
  const size_t t = PartitionedSteps(config_, summaries, block, min_free, plan);
  if (t == 0) {
    align::KeepEverything(state, plan);
    return plan;
  }
  const std::span<const RankRound> all(state.ranks);
  for (size_t begin = 0; begin < world; begin += block) {
    PlanBlockInto(config_, state.epoch, state.round, state.first_step,
                  all.subspan(begin, std::min(block, world - begin)), begin, t, plan);
  }
  align::AssignLossWeights(plan);
  return plan;
}

namespace internal {

RoundPlan PlanRanks(const GlobalPlannerConfig& config, const RoundState& state, uint32_t min_free,
                    std::optional<size_t> fixed_steps) {
  const align::PlannerConfig& cfg = config.base;
  const size_t world = state.ranks.size();
  RoundPlan plan;
  plan.ranks.resize(world);
  size_t finished_count = 0;
  for (const RankRound& rr : state.ranks) finished_count += rr.stream_finished ? 1 : 0;
  const size_t window_cap = cfg.window == 0 ? std::numeric_limits<size_t>::max() : cfg.window;

  // The pool: the union of the windows. Samples past a window stay pending.
  // When the windows hold far more than T*W groups can carry, only the oldest
  // part of them is grouped (see SelectOldest); the rest stays pending too.
  std::vector<size_t> take(world, 0);
  for (size_t r = 0; r < world; ++r) take[r] = std::min(state.ranks[r].pending.size(), window_cap);
  const size_t max_slots = static_cast<size_t>(min_free) * world;
  Pool pool;
  std::vector<Members> groups;
  for (double target = 1.15 * static_cast<double>(max_slots) + static_cast<double>(world) / 2;; target *= 1.5) {
    const bool subset = SelectOldest(cfg, state, target, take);
    pool.metas.clear();
    pool.lens.clear();
    for (size_t r = 0; r < world; ++r) {
      const auto& pending = state.ranks[r].pending;
      for (size_t i = 0; i < take[r]; ++i) {
        assert(pending[i].lengths.tokens > 0 && "length-0 samples must be rejected before alignment");
        pool.metas.push_back(pending[i]);
        pool.lens.push_back(pending[i].lengths);
      }
    }
    groups.clear();
    for (grouping::Group& g : align::PlannerGroups(cfg, pool.lens, state.epoch, state.round, 0)) {
      groups.push_back(std::move(g.members));
    }
    // A subset must still fill every slot; otherwise group more of the pool.
    if (!subset || groups.size() >= max_slots) break;
    for (size_t r = 0; r < world; ++r) take[r] = std::min(state.ranks[r].pending.size(), window_cap);
  }
  for (size_t r = 0; r < world; ++r) {
    const auto& pending = state.ranks[r].pending;
    for (size_t i = take[r]; i < pending.size(); ++i) plan.ranks[r].keep_pending.push_back(KeyOf(pending[i]));
  }
  if (groups.empty()) {
    plan.reason = "no rank has pending samples";
    plan.ranks.assign(world, RankPlan{});
    align::KeepEverything(state, plan);
    return plan;
  }

  // T: whole steps only, except once every stream has finished (then the last
  // step may have IDLE slots and groups are split to fill slots).
  const bool all_finished = finished_count == world;
  const size_t g_count = groups.size();
  size_t t = std::min<size_t>(min_free, all_finished ? (g_count + world - 1) / world : g_count / world);
  // Deterministic rounds see a fixed window, so holding back would wait for
  // ever: fill the step (some slots IDLE) instead.
  if (t == 0 && cfg.deterministic) t = std::min<size_t>(min_free, (g_count + world - 1) / world);
  // A block of a partitioned round plans the round's T, decided from every
  // block (PartitionedSteps), not its own.
  if (fixed_steps) t = *fixed_steps;
  if (t == 0) {
    plan.reason = "holding back: " + std::to_string(g_count) + " groups do not fill a step of " +
                  std::to_string(world) + " ranks and some stream is open";
    plan.ranks.assign(world, RankPlan{});
    align::KeepEverything(state, plan);
    return plan;
  }
  plan.num_steps = static_cast<uint32_t>(t);
  plan.reason = "T=min(free=" + std::to_string(min_free) + ", " + (all_finished ? "ceil" : "floor") +
                "(groups=" + std::to_string(g_count) + " / W=" + std::to_string(world) + "))";
  const size_t slots = t * world;
  if (groups.size() > slots) {
    align::SortByFill(cfg.budget.model, pool.metas, groups, [](const Members& g) { return std::span<const size_t>(g); });
    for (size_t i = slots; i < groups.size(); ++i) {
      for (size_t idx : groups[i]) {
        const SampleMeta& m = pool.metas[idx];
        plan.ranks[m.owner_rank].keep_pending.push_back(KeyOf(m));
      }
    }
    groups.resize(slots);
  }
  std::vector<std::vector<Members>> steps = DealSteps(config, pool, groups, t, world);  // steps[k][rank]
  // The end of an epoch leaves a step only partly filled. Its cost is its
  // costliest rank's, so a lone long sample that lands in it costs the whole
  // step while the other ranks hold little: keep that step for the shortest
  // samples instead (LightLastStep), when the planner's model says so.
  // (Not with mix_lengths: a step of the shortest samples is what it avoids.)
  if (groups.size() < slots && t >= 2 && !fixed_steps && !cfg.mix_lengths) {
    if (std::optional<std::vector<std::vector<Members>>> light = LightLastStep(config, pool, t, world)) {
      double before = 0.0, after = 0.0;
      for (const auto& step : steps) before += MaxCost(cfg, pool, step);
      for (const auto& step : *light) after += MaxCost(cfg, pool, step);
      if (after < before) steps = std::move(*light);
    }
  }

  // Locality across steps, within each step's capacity relaxed by the knob
  // (at locality 0 it would only save ~2.5% of the bytes, for ~2x the
  // planner time at W = 64: not run).
  if (world > 1 && config.locality > 0.0) {
    std::vector<double> capacity(t);
    const double relax = 1.0 / (1.0 - std::clamp(config.locality, 0.0, 0.999));
    for (size_t k = 0; k < t; ++k) capacity[k] = MaxCost(cfg, pool, steps[k]) * relax;
    CrossStepHomeSwaps(cfg, pool, steps, capacity);
  }

  // Step order: shuffled, never cost (= length) order.
  std::vector<grouping::Group> order(t);
  for (size_t k = 0; k < t; ++k) order[k].members = {k};
  grouping::ShuffleGroups(order, align::MixSeed(align::MixSeed(cfg.seed, state.epoch),
                                                align::MixSeed(state.round, 0x9106a1ULL)));
  for (size_t r = 0; r < world; ++r) {
    RankPlan& rp = plan.ranks[r];
    rp.steps.reserve(t);
    for (size_t k = 0; k < t; ++k) rp.steps.push_back(StepOf(cfg, pool, steps[order[k].members[0]][r]));
  }
  align::AssignLossWeights(plan);
  return plan;
}

}  // namespace internal

}  // namespace odb::balance
