#include "src/balance/node_placement.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

#include "src/balance/assignment.h"

namespace odb::balance {
namespace {

// Node of a sample's owner, or -1 when the owner is not a rank of the step.
int32_t OwnerNode(const SampleMeta& m, size_t world, uint32_t lws) {
  if (m.owner_rank < 0 || static_cast<size_t>(m.owner_rank) >= world) return -1;
  return m.owner_rank / static_cast<int32_t>(lws);
}

// The padded step time of a group of `n` samples whose longest has `longest`
// tokens: the same terms, in the same order, as the planner's CostOf (whose
// per_len_sq term is 0 here), hence the same double.
double GroupTime(const grouping::StepTimeModel& model, uint64_t n, uint32_t longest) {
  return model.per_step + model.per_padded_token * static_cast<double>(static_cast<uint64_t>(longest) * n);
}

// Does a group of `n` samples of longest `longest` fit the budget and the
// step time `capacity`? A group of one always fits the budget (an over-budget
// sample runs alone).
bool Fits(const grouping::Budget& budget, const grouping::StepTimeModel& model, uint64_t n, uint32_t longest,
          double capacity) {
  if (GroupTime(model, n, longest) > capacity) return false;
  if (n > 1) {
    if (budget.max_group_size != 0 && n > budget.max_group_size) return false;
    if (budget.max_tokens != 0 &&
        grouping::PaddedBudgetCost(budget, n, longest) > static_cast<double>(budget.max_tokens)) {
      return false;
    }
  }
  return true;
}

// cap(L): the most samples (<= limit) a group of longest L may hold; Fits is
// monotone in n, so a binary search. 0 when even a lone sample is too slow
// (cannot happen for a sample of the step: its group cost >= its own).
uint32_t Cap(const grouping::Budget& budget, const grouping::StepTimeModel& model, uint32_t longest,
             double capacity, uint32_t limit) {
  if (!Fits(budget, model, 1, longest, capacity)) return 0;
  uint32_t lo = 1, hi = limit;  // Fits(lo); answer in [lo, hi]
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo + 1) / 2;
    if (Fits(budget, model, mid, longest, capacity)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// One side (node) of a pair's DP state: groups opened, room left in the open
// group, and samples taken capped at the node's rank count.
struct Side {
  uint32_t opened = 0;
  uint32_t room = 0;
  uint32_t taken = 0;
  auto Tie() const { return std::tie(opened, room, taken); }
};

struct State {
  Side a, b;
  uint64_t cost = 0;
  uint32_t parent = 0;  // index in the previous layer
  uint8_t to_b = 0;     // the layer's sample went to node B

  auto Key() const { return std::tuple(a.opened, a.room, a.taken, b.opened, b.room, b.taken); }
};

// Adds the layer's sample to `s` (cap `cap` when it opens a group); false
// when the node has no room left for it.
bool Take(Side& s, uint32_t ranks, uint32_t cap) {
  if (s.room > 0) {
    --s.room;
  } else if (s.opened < ranks && cap > 0) {
    ++s.opened;
    s.room = cap - 1;
  } else {
    return false;
  }
  s.taken = std::min(s.taken + 1, ranks);
  return true;
}

class Placer {
 public:
  Placer(const grouping::Budget& budget, const grouping::StepTimeModel& model, const std::vector<SampleMeta>& metas,
         std::vector<std::vector<size_t>>& groups, uint32_t lws, const NodePlacementOptions& options)
      : budget_(budget), model_(model), metas_(metas), groups_(groups), lws_(lws), options_(options) {
    world_ = groups_.size();
    nodes_ = (world_ + lws_ - 1) / lws_;
    size_t n = 0;
    for (const auto& g : groups_) {
      n += g.size();
      uint32_t longest = 0;
      for (size_t i : g) longest = std::max(longest, metas_[i].lengths.tokens);
      capacity_ = std::max(capacity_, GroupTime(model_, g.size(), longest));
    }
    samples_ = n;
    budget_work_ = options_.work_base + options_.work_per_sample * n;
  }

  NodePlacementStats Run() {
    stats_.inter_node_bytes_before = InterNodeBytes(metas_, groups_, lws_);
    for (uint32_t pass = 0; pass < options_.passes; ++pass) {
      bool improved = false;
      for (const auto& [a, b] : PairsByExchange()) {
        if (stats_.work >= budget_work_) break;
        ++stats_.pairs_tried;
        if (ImprovePair(a, b)) {
          ++stats_.pairs_improved;
          improved = true;
        }
      }
      if (!improved || stats_.work >= budget_work_) break;
    }
    stats_.inter_node_bytes_after = InterNodeBytes(metas_, groups_, lws_);
    return stats_;
  }

 private:
  size_t FirstRank(uint32_t node) const { return static_cast<size_t>(node) * lws_; }
  size_t EndRank(uint32_t node) const { return std::min(world_, FirstRank(node) + lws_); }

  // Node pairs that exchange bytes (a sample of one's runs on the other),
  // most bytes first, ties by node ids.
  std::vector<std::pair<uint32_t, uint32_t>> PairsByExchange() const {
    std::vector<std::pair<uint64_t, uint64_t>> flows;  // (a * nodes + b with a < b, bytes)
    for (size_t r = 0; r < world_; ++r) {
      const auto here = static_cast<int32_t>(r / lws_);
      for (size_t i : groups_[r]) {
        const int32_t owner = OwnerNode(metas_[i], world_, lws_);
        if (owner < 0 || owner == here) continue;
        const uint64_t lo = std::min(owner, here), hi = std::max(owner, here);
        flows.emplace_back(lo * nodes_ + hi, metas_[i].payload_bytes);
      }
    }
    std::sort(flows.begin(), flows.end());
    std::vector<std::pair<uint64_t, uint64_t>> merged;  // (bytes, pair key)
    for (const auto& [key, bytes] : flows) {
      if (!merged.empty() && merged.back().second == key) {
        merged.back().first += bytes;
      } else {
        merged.emplace_back(bytes, key);
      }
    }
    std::sort(merged.begin(), merged.end(), [](const auto& x, const auto& y) {
      return x.first != y.first ? x.first > y.first : x.second < y.second;
    });
    std::vector<std::pair<uint32_t, uint32_t>> out;
    out.reserve(merged.size());
    for (const auto& [bytes, key] : merged) {
      out.emplace_back(static_cast<uint32_t>(key / nodes_), static_cast<uint32_t>(key % nodes_));
    }
    return out;
  }

  uint64_t CostOn(size_t i, uint32_t node) const {
    return OwnerNode(metas_[i], world_, lws_) == static_cast<int32_t>(node) ? 0 : metas_[i].payload_bytes;
  }

  // Re-splits the samples of nodes a and b (see the header); true when it
  // strictly lowered their inter-node bytes.
  bool ImprovePair(uint32_t a, uint32_t b) {
    std::vector<size_t> u;
    uint64_t current = 0;
    for (uint32_t node : {a, b}) {
      for (size_t r = FirstRank(node); r < EndRank(node); ++r) {
        for (size_t i : groups_[r]) {
          u.push_back(i);
          current += CostOn(i, node);
        }
      }
    }
    if (current == 0) return false;
    std::sort(u.begin(), u.end(), [&](size_t x, size_t y) {
      const SampleMeta& mx = metas_[x];
      const SampleMeta& my = metas_[y];
      if (mx.lengths.tokens != my.lengths.tokens) return mx.lengths.tokens > my.lengths.tokens;
      return std::tie(mx.owner_rank, mx.id) < std::tie(my.owner_rank, my.id);
    });
    const auto ka = static_cast<uint32_t>(EndRank(a) - FirstRank(a));
    const auto kb = static_cast<uint32_t>(EndRank(b) - FirstRank(b));
    const auto limit = static_cast<uint32_t>(std::min<size_t>(u.size(), std::numeric_limits<uint32_t>::max()));
    std::vector<uint32_t> cap(u.size());
    for (size_t k = 0; k < u.size(); ++k) {
      const uint32_t len = metas_[u[k]].lengths.tokens;
      cap[k] = k > 0 && metas_[u[k - 1]].lengths.tokens == len ? cap[k - 1]
                                                               : Cap(budget_, model_, len, capacity_, limit);
    }

    std::vector<std::vector<State>> layers(u.size() + 1);
    layers[0].push_back(State{});
    std::vector<State> next;
    for (size_t k = 0; k < u.size(); ++k) {
      const std::vector<State>& prev = layers[k];
      next.clear();
      stats_.work += 2 * prev.size();
      const uint64_t on_a = CostOn(u[k], a), on_b = CostOn(u[k], b);
      for (uint32_t p = 0; p < prev.size(); ++p) {
        State s = prev[p];
        s.parent = p;
        State sa = s;
        if (Take(sa.a, ka, cap[k])) {
          sa.cost += on_a;
          sa.to_b = 0;
          next.push_back(sa);
        }
        State sb = s;
        if (Take(sb.b, kb, cap[k])) {
          sb.cost += on_b;
          sb.to_b = 1;
          next.push_back(sb);
        }
      }
      // One state per key, the cheapest (ties: earliest parent, A first).
      std::sort(next.begin(), next.end(), [](const State& x, const State& y) {
        return std::tuple(x.Key(), x.cost, x.parent, x.to_b) < std::tuple(y.Key(), y.cost, y.parent, y.to_b);
      });
      next.erase(std::unique(next.begin(), next.end(),
                             [](const State& x, const State& y) { return x.Key() == y.Key(); }),
                 next.end());
      if (next.size() > options_.beam) {
        std::nth_element(next.begin(), next.begin() + options_.beam, next.end(), [](const State& x, const State& y) {
          return std::tuple(x.cost, x.Key()) < std::tuple(y.cost, y.Key());
        });
        next.resize(options_.beam);
      }
      if (next.empty()) return false;
      layers[k + 1] = next;
    }
    // The cheapest end state where both nodes have a sample for every rank.
    const std::vector<State>& last = layers[u.size()];
    size_t best = last.size();
    for (size_t s = 0; s < last.size(); ++s) {
      if (last[s].a.taken < ka || last[s].b.taken < kb) continue;
      if (best == last.size() || std::tuple(last[s].cost, last[s].Key()) < std::tuple(last[best].cost, last[best].Key())) {
        best = s;
      }
    }
    if (best == last.size() || last[best].cost >= current) return false;
    std::vector<uint8_t> to_b(u.size());
    for (size_t k = u.size(), s = best; k > 0; --k) {
      to_b[k - 1] = layers[k][s].to_b;
      s = layers[k][s].parent;
    }
    std::vector<size_t> share_a, share_b;
    std::vector<uint32_t> cap_a, cap_b;
    for (size_t k = 0; k < u.size(); ++k) {
      (to_b[k] ? share_b : share_a).push_back(u[k]);
      (to_b[k] ? cap_b : cap_a).push_back(cap[k]);
    }
    std::vector<std::vector<size_t>> packed_a, packed_b;
    if (!Pack(share_a, cap_a, ka, packed_a) || !Pack(share_b, cap_b, kb, packed_b)) return false;
    Install(a, std::move(packed_a));
    Install(b, std::move(packed_b));
    return true;
  }

  // Longest first, each group filled up to cap(its longest) before the next
  // opens; then, while a rank has no group, the group with the most samples
  // (ties: the first) gives its shortest to a new one (a smaller group still
  // fits). Checks every group against the budget and the step time.
  bool Pack(const std::vector<size_t>& share, const std::vector<uint32_t>& cap, uint32_t ranks,
            std::vector<std::vector<size_t>>& out) const {
    out.clear();
    uint32_t room = 0;
    for (size_t k = 0; k < share.size(); ++k) {
      if (!out.empty() && room > 0) {
        out.back().push_back(share[k]);
        --room;
      } else {
        out.push_back({share[k]});
        room = cap[k] - 1;
      }
    }
    while (out.size() < ranks) {
      size_t donor = 0;
      for (size_t g = 1; g < out.size(); ++g) {
        if (out[g].size() > out[donor].size()) donor = g;
      }
      if (out.empty() || out[donor].size() < 2) return false;
      out.push_back({out[donor].back()});
      out[donor].pop_back();
    }
    if (out.size() != ranks) return false;
    for (const auto& g : out) {
      if (!Fits(budget_, model_, g.size(), metas_[g.front()].lengths.tokens, capacity_)) return false;
    }
    return true;
  }

  // Gives the node's groups to its ranks, keeping the most bytes on their
  // owner rank (exact assignment over the node's ranks).
  void Install(uint32_t node, std::vector<std::vector<size_t>> packed) {
    const size_t first = FirstRank(node), k = EndRank(node) - first;
    std::vector<std::vector<int64_t>> w(k, std::vector<int64_t>(k, 0));
    for (size_t g = 0; g < k; ++g) {
      for (size_t i : packed[g]) {
        const int32_t owner = metas_[i].owner_rank;
        if (owner >= static_cast<int32_t>(first) && static_cast<size_t>(owner) < first + k) {
          w[g][owner - first] += static_cast<int64_t>(metas_[i].payload_bytes) + 1;
        }
      }
    }
    const std::vector<int> rank_of = MaxWeightAssignment(w);
    for (size_t g = 0; g < k; ++g) groups_[first + rank_of[g]] = std::move(packed[g]);
  }

  const grouping::Budget& budget_;
  const grouping::StepTimeModel& model_;
  const std::vector<SampleMeta>& metas_;
  std::vector<std::vector<size_t>>& groups_;
  const uint32_t lws_;
  const NodePlacementOptions& options_;
  size_t world_ = 0;
  uint64_t nodes_ = 0;
  size_t samples_ = 0;
  double capacity_ = 0.0;
  uint64_t budget_work_ = 0;
  NodePlacementStats stats_;
};

}  // namespace

bool NodePlacementApplies(const grouping::Budget& budget, const grouping::StepTimeModel& model) {
  return budget.model == grouping::CostModel::kPadded && model.per_len_sq == 0.0 && model.per_padded_token >= 0.0 &&
         budget.quadratic_q >= 0.0 && budget.max_vision_patches == 0 && budget.max_audio_frames == 0;
}

uint64_t InterNodeBytes(const std::vector<SampleMeta>& metas, const std::vector<std::vector<size_t>>& groups,
                        uint32_t local_world_size) {
  if (local_world_size == 0) return 0;
  uint64_t bytes = 0;
  for (size_t r = 0; r < groups.size(); ++r) {
    const auto here = static_cast<int32_t>(r / local_world_size);
    for (size_t i : groups[r]) {
      if (OwnerNode(metas[i], groups.size(), local_world_size) != here) bytes += metas[i].payload_bytes;
    }
  }
  return bytes;
}

NodePlacementStats PlaceOnNodes(const grouping::Budget& budget, const grouping::StepTimeModel& model,
                                const std::vector<SampleMeta>& metas, std::vector<std::vector<size_t>>& groups,
                                uint32_t local_world_size, const NodePlacementOptions& options) {
  NodePlacementStats stats;
  const bool usable = local_world_size != 0 && groups.size() > local_world_size &&
                      NodePlacementApplies(budget, model) && options.beam > 0 &&
                      std::none_of(groups.begin(), groups.end(), [](const auto& g) { return g.empty(); });
  if (!usable) {
    stats.inter_node_bytes_before = stats.inter_node_bytes_after = InterNodeBytes(metas, groups, local_world_size);
    return stats;
  }
  return Placer(budget, model, metas, groups, local_world_size, options).Run();
}

}  // namespace odb::balance
