#include "src/balance/node_placement.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
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

// cap(L): the most samples (<= limit) a group of longest L may hold. Fits is
// monotone in n: start from the closed-form bounds (one above, for rounding)
// and step down to the exact verdict. 0 when even a lone sample is too slow
// (cannot happen for a sample of the step: its group costs at least as much).
uint32_t Cap(const grouping::Budget& budget, const grouping::StepTimeModel& model, uint32_t longest,
             double capacity, uint32_t limit) {
  if (!Fits(budget, model, 1, longest, capacity)) return 0;
  double n = limit;
  if (model.per_padded_token > 0.0) {
    n = std::min(n, std::floor((capacity - model.per_step) / (model.per_padded_token * longest)) + 1.0);
  }
  if (budget.max_tokens != 0) {
    n = std::min(
        n, std::floor(static_cast<double>(budget.max_tokens) / grouping::EffectiveLength(budget, longest)) +
               1.0);
  }
  if (budget.max_group_size != 0) n = std::min(n, static_cast<double>(budget.max_group_size));
  auto cap = static_cast<uint32_t>(std::max(1.0, n));
  while (cap > 1 && !Fits(budget, model, cap, longest, capacity)) --cap;
  return cap;
}

// A DP state over a set of two or three nodes, packed: per node 8 bits of
// groups opened, 8 bits of samples taken (capped at the node's ranks: only "a
// sample for every rank" matters) and 16 bits of room left in the open group
// (capped at the samples still to place: more room is worth nothing); node 0
// of the set in the high half of `hi`, node 1 in its low half, node 2 in
// `lo`. Hence ranks per node <= 255 and sets of <= 65535 samples (ImproveSet
// skips others).
constexpr uint32_t kMaxRanks = 255;
constexpr size_t kMaxSetSamples = 65535;
// Narrower beams than this are not worth a set's setup.
constexpr uint64_t kMinBeam = 8;
// One-rank nodes: home flows per step, at most (each on the previous one's longest).
constexpr int kHomeRounds = 4;

struct Key {
  uint64_t hi = 0;
  uint64_t lo = 0;
  bool operator==(const Key& o) const { return hi == o.hi && lo == o.lo; }
  bool operator<(const Key& o) const { return hi != o.hi ? hi < o.hi : lo < o.lo; }
};

struct State {
  Key key;
  uint64_t cost = 0;
  uint32_t from = 0;  // index in the previous layer << 2 | the set's node the layer's sample went to
};

uint32_t Side(const Key& key, int side) {
  return side == 0   ? static_cast<uint32_t>(key.hi >> 32)
         : side == 1 ? static_cast<uint32_t>(key.hi)
                     : static_cast<uint32_t>(key.lo);
}

void SetSide(Key& key, int side, uint32_t packed) {
  if (side == 0) {
    key.hi = (key.hi & 0xffffffffull) | (static_cast<uint64_t>(packed) << 32);
  } else if (side == 1) {
    key.hi = (key.hi & ~0xffffffffull) | packed;
  } else {
    key.lo = packed;
  }
}

// Adds a sample to node `side` of the set: into the open group while it has
// room, else into a new group of room cap - 1 (capped at `left`, the samples
// after this one). False when the node has no group left to open.
bool Take(Key& key, int side, uint32_t ranks, uint32_t cap, uint32_t left) {
  const uint32_t packed = Side(key, side);
  uint32_t opened = packed >> 24, taken = (packed >> 16) & 0xff, room = packed & 0xffff;
  if (room > 0) {
    --room;
  } else if (opened < ranks && cap > 0) {
    ++opened;
    room = std::min(cap - 1, left);
  } else {
    return false;
  }
  taken = std::min(taken + 1, ranks);
  SetSide(key, side, (opened << 24) | (taken << 16) | room);
  return true;
}

uint32_t Taken(const Key& key, int side) { return Side(key, side) >> 16 & 0xff; }

// Scored triples of nodes handed out best first (most bytes, then node ids),
// each once: a heap, so that taking the first k of n costs O(n + k log n).
struct TripleQueue {
  using Scored = std::pair<uint64_t, std::array<uint32_t, 3>>;
  // Heap order: x comes after y.
  static bool After(const Scored& x, const Scored& y) {
    return x.first != y.first ? x.first < y.first : x.second > y.second;
  }
  // The next triple in order, skipping copies of the last one (a triple is
  // scored from each of its exchanging pairs, always alike: equal entries
  // leave the heap one after another). False when none is left.
  bool Next(std::array<uint32_t, 3>& out) {
    while (!scored.empty()) {
      std::pop_heap(scored.begin(), scored.end(), After);
      const Scored top = scored.back();
      scored.pop_back();
      if (has_last && top == last) continue;
      last = top;
      has_last = true;
      out = top.second;
      return true;
    }
    return false;
  }
  std::vector<Scored> scored;
  Scored last{};
  bool has_last = false;
};

class Placer {
 public:
  Placer(const grouping::Budget& budget, const grouping::StepTimeModel& model,
         const std::vector<SampleMeta>& metas, std::vector<std::vector<size_t>>& groups, uint32_t lws,
         const NodePlacementOptions& options)
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
    version_.assign(nodes_, 0);
    budget_work_ = std::max(options_.work_base, options_.work_per_sample * n);
    // The small-step allowance is for a few nodes of several ranks; one-rank
    // nodes have the home flow instead.
    const bool one_rank = lws_ == 1 && options_.one_rank_homes;
    if (n <= options_.small_step_samples && !one_rank) {
      budget_work_ = std::max(budget_work_, options_.small_step_work);
    }
  }

  NodePlacementStats Run() {
    stats_.inter_node_bytes_before = InterNodeBytes(metas_, groups_, lws_);
    // One rank per node: the home flow first (every exchange cycle within the
    // ranks' longest at once), then pairs and triples, which may also change a
    // rank's longest, within the step's work (no small-step allowance).
    const bool one_rank = lws_ == 1 && options_.one_rank_homes;
    if (one_rank) {
      for (int round = 0; round < kHomeRounds && OneRankHomes(); ++round) ++stats_.home_rounds_improved;
    }
    for (uint32_t pass = 0; pass < options_.passes; ++pass) {
      bool improved = false;
      const auto pairs = PairsByExchange();
      for (const auto& [bytes, a, b] : pairs) {
        if (stats_.work >= budget_work_) break;
        ++stats_.pairs_tried;
        if (ImproveSet({a, b, a}, 2)) {
          ++stats_.pairs_improved;
          improved = true;
        }
      }
      // Moves around a cycle of three nodes (A's sample leaves B for A, A's
      // short ones leave for C, C's for B) that no pair can make: after the
      // pairs, triples by the bytes their three pairs exchange.
      if (options_.triples && nodes_ >= 3 && !starved_) {
        uint32_t tried = 0;
        TripleQueue queue = TriplesByExchange();
        std::array<uint32_t, 3> t{};
        while (queue.Next(t)) {
          if (starved_ || stats_.work >= budget_work_ || tried >= options_.max_triples) break;
          if (KnownToFail(t, 3)) continue;
          ++tried;
          ++stats_.triples_tried;
          if (ImproveSet(t, 3)) {
            ++stats_.triples_improved;
            improved = true;
          }
        }
      }
      if (!improved || starved_ || stats_.work >= budget_work_) break;
    }
    stats_.inter_node_bytes_after = InterNodeBytes(metas_, groups_, lws_);
    return stats_;
  }

 private:
  size_t FirstRank(uint32_t node) const { return static_cast<size_t>(node) * lws_; }
  size_t EndRank(uint32_t node) const { return std::min(world_, FirstRank(node) + lws_); }

  // Bytes exchanged by each pair of nodes (a sample of one's runs on the
  // other), most bytes first, ties by node ids: (bytes, a, b), a < b.
  std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> PairsByExchange() const {
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
    std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> out;
    for (const auto& [key, bytes] : flows) {
      const auto a = static_cast<uint32_t>(key / nodes_), b = static_cast<uint32_t>(key % nodes_);
      if (!out.empty() && std::get<1>(out.back()) == a && std::get<2>(out.back()) == b) {
        std::get<0>(out.back()) += bytes;
      } else {
        out.emplace_back(bytes, a, b);
      }
    }
    std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) {
      return std::get<0>(x) != std::get<0>(y) ? std::get<0>(x) > std::get<0>(y) : x < y;
    });
    return out;
  }

  // Triples of nodes {a, b, c} that contain an exchanging pair (a, b), by
  // the bytes all three of their pairs exchange, most first (ties: node
  // ids); the third node may exchange nothing (it can lend room). From the
  // first max_triples exchanging pairs: O(max_triples * nodes) triples,
  // handed out lazily (a pass tries at most max_triples of them, so sorting
  // them all cost more than the sets it tried at one-rank nodes).
  TripleQueue TriplesByExchange() const {
    const auto pairs = PairsByExchange();
    const size_t top = std::min<size_t>(pairs.size(), options_.max_triples);
    // exchange(x, c) for the nodes x of the first `top` pairs: a dense row
    // per such node, filled from every pair once.
    std::vector<int32_t> row_of(nodes_, -1);
    size_t rows = 0;
    for (size_t p = 0; p < top; ++p) {
      for (uint32_t x : {std::get<1>(pairs[p]), std::get<2>(pairs[p])}) {
        if (row_of[x] < 0) row_of[x] = static_cast<int32_t>(rows++);
      }
    }
    std::vector<uint64_t> exchange(rows * nodes_, 0);
    for (const auto& [bytes, a, b] : pairs) {
      if (row_of[a] >= 0) exchange[row_of[a] * nodes_ + b] = bytes;
      if (row_of[b] >= 0) exchange[row_of[b] * nodes_ + a] = bytes;
    }
    TripleQueue queue;
    queue.scored.reserve(top * nodes_);
    for (size_t p = 0; p < top; ++p) {
      const auto& [bytes, a, b] = pairs[p];
      const uint64_t* row_a = &exchange[row_of[a] * nodes_];
      const uint64_t* row_b = &exchange[row_of[b] * nodes_];
      for (uint32_t c = 0; c < nodes_; ++c) {
        if (c == a || c == b) continue;
        std::array<uint32_t, 3> t = {a, b, c};
        std::sort(t.begin(), t.end());
        queue.scored.emplace_back(bytes + row_a[c] + row_b[c], t);
      }
    }
    std::make_heap(queue.scored.begin(), queue.scored.end(), TripleQueue::After);
    return queue;
  }

  // cap(L) for this step (no limit on the samples): Cap with a limit n is
  // min(n, this), since Fits is monotone in the group size.
  uint32_t CapOf(uint32_t longest) {
    auto [it, fresh] = cap_of_.try_emplace(longest, 0);
    if (fresh) it->second = Cap(budget_, model_, longest, capacity_, std::numeric_limits<uint32_t>::max());
    return it->second;
  }

  uint64_t CostOn(size_t i, uint32_t node) const {
    return OwnerNode(metas_[i], world_, lws_) == static_cast<int32_t>(node) ? 0 : metas_[i].payload_bytes;
  }

  using Memo = std::array<uint64_t, 3>;
  static Memo MemoKey(const std::array<uint32_t, 3>& set, int count) {
    return {set[0], set[1], count == 3 ? uint64_t{set[2]} : ~uint64_t{0}};
  }
  Memo Versions(const std::array<uint32_t, 3>& set, int count) const {
    return {version_[set[0]], version_[set[1]], count == 3 ? version_[set[2]] : 0};
  }
  bool KnownToFail(const std::array<uint32_t, 3>& set, int count) const {
    auto it = failed_.find(MemoKey(set, count));
    return it != failed_.end() && it->second == Versions(set, count);
  }

  // One-rank nodes (local_world_size 1): each rank runs one group, and a
  // group of longest L fits iff it holds at most cap(L) samples. With every
  // rank's longest L_r held (its group may take samples no longer than L_r,
  // up to c_r = cap(L_r) of them: the current groups qualify), which samples
  // can stay on their owner? Samples of length >= x can only go to ranks with
  // L_r >= x, so the samples not at home can be placed iff for every length
  // x, those of length >= x are at most the room left on the ranks with L_r
  // >= x (Hall's condition for nested sets). Samples are taken home most
  // bytes first while that holds (a sample of length l going home to rank o
  // takes one room of o: the condition loses one of slack at every x in
  // (l, L_o]); the others are placed longest first (home where there is room,
  // else on the eligible rank of least L_r). A rank left empty takes the
  // shortest sample away from home of a rank with two or more. Installs the
  // result when it has fewer inter-node bytes; true then.
  bool OneRankHomes() {
    std::vector<size_t> all;
    std::vector<uint32_t> limit(world_, 0), room(world_, 0);
    for (size_t r = 0; r < world_; ++r) {
      for (size_t i : groups_[r]) {
        all.push_back(i);
        limit[r] = std::max(limit[r], metas_[i].lengths.tokens);
      }
    }
    for (size_t r = 0; r < world_; ++r) room[r] = CapOf(limit[r]);
    // Distinct lengths, ascending; slack[t] for x = lengths[t].
    std::vector<uint32_t> lengths;
    for (size_t i : all) lengths.push_back(metas_[i].lengths.tokens);
    std::sort(lengths.begin(), lengths.end());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    auto index = [&](uint32_t len) {
      return static_cast<size_t>(std::lower_bound(lengths.begin(), lengths.end(), len) - lengths.begin());
    };
    std::vector<int64_t> slack(lengths.size() + 1, 0);  // difference array first
    for (size_t r = 0; r < world_; ++r) {
      slack[0] += room[r];
      slack[index(limit[r]) + 1] -= room[r];
    }
    for (size_t i : all) {
      slack[0] -= 1;
      slack[index(metas_[i].lengths.tokens) + 1] += 1;
    }
    for (size_t t = 1; t < slack.size(); ++t) slack[t] += slack[t - 1];
    auto key = [&](size_t x, size_t y) {  // longest first, then owner and id
      const SampleMeta& mx = metas_[x];
      const SampleMeta& my = metas_[y];
      if (mx.lengths.tokens != my.lengths.tokens) return mx.lengths.tokens > my.lengths.tokens;
      return std::tie(mx.owner_rank, mx.id) < std::tie(my.owner_rank, my.id);
    };
    std::vector<size_t> by_bytes = all;
    std::sort(by_bytes.begin(), by_bytes.end(), [&](size_t x, size_t y) {
      if (metas_[x].payload_bytes != metas_[y].payload_bytes)
        return metas_[x].payload_bytes > metas_[y].payload_bytes;
      return key(x, y);
    });
    std::vector<std::vector<size_t>> out(world_);
    std::vector<size_t> away;
    for (size_t i : by_bytes) {
      const int32_t owner = OwnerNode(metas_[i], world_, lws_);
      const uint32_t len = metas_[i].lengths.tokens;
      bool home = owner >= 0 && room[owner] > 0 && len <= limit[owner];
      const size_t from = index(len) + 1, to = home ? index(limit[owner]) : 0;
      for (size_t t = from; home && t <= to; ++t) home = slack[t] >= 1;
      if (!home) {
        away.push_back(i);
        continue;
      }
      for (size_t t = from; t <= to; ++t) --slack[t];
      --room[owner];
      out[owner].push_back(i);
    }
    std::sort(away.begin(), away.end(), key);
    for (size_t i : away) {
      const int32_t owner = OwnerNode(metas_[i], world_, lws_);
      const uint32_t len = metas_[i].lengths.tokens;
      size_t to = world_;
      if (owner >= 0 && room[owner] > 0 && len <= limit[owner]) {
        to = static_cast<size_t>(owner);
      } else {
        for (size_t r = 0; r < world_; ++r) {
          if (room[r] > 0 && len <= limit[r] && (to == world_ || limit[r] < limit[to])) to = r;
        }
      }
      if (to == world_) return false;  // cannot happen: Hall's condition held
      --room[to];
      out[to].push_back(i);
    }
    for (size_t e = 0; e < world_; ++e) {
      if (!out[e].empty()) continue;
      size_t donor = world_, pos = 0;
      for (size_t r = 0; r < world_; ++r) {
        if (out[r].size() < 2) continue;
        for (size_t k = 0; k < out[r].size(); ++k) {
          const size_t i = out[r][k];
          if (OwnerNode(metas_[i], world_, lws_) == static_cast<int32_t>(r)) continue;  // at home
          if (donor == world_ || key(out[donor][pos], i)) {
            donor = r;
            pos = k;
          }
        }
      }
      if (donor == world_) return false;
      out[e].push_back(out[donor][pos]);
      out[donor].erase(out[donor].begin() + static_cast<std::ptrdiff_t>(pos));
    }
    for (const auto& g : out) {
      uint32_t longest = 0;
      for (size_t i : g) longest = std::max(longest, metas_[i].lengths.tokens);
      if (!Fits(budget_, model_, g.size(), longest, capacity_)) return false;
    }
    if (InterNodeBytes(metas_, out, lws_) >= InterNodeBytes(metas_, groups_, lws_)) return false;
    groups_ = std::move(out);
    for (auto& v : version_) ++v;
    return true;
  }

  // Re-splits the samples of the first `count` (2 or 3) nodes of `set` (see
  // the header); true when it strictly lowered their inter-node bytes.
  bool ImproveSet(const std::array<uint32_t, 3>& set, int count) {
    size_t m = 0;
    for (int s = 0; s < count; ++s) {
      for (size_t r = FirstRank(set[s]); r < EndRank(set[s]); ++r) m += groups_[r].size();
    }
    // At most count * m * beam expansions (plus m to set up): a set that would
    // overrun the step's work budget runs with a narrower beam, or not at all.
    const uint64_t left_work = budget_work_ - std::min(budget_work_, stats_.work);
    const uint64_t wanted = count == 3 ? options_.triple_beam : options_.beam;
    const uint64_t beam = std::min<uint64_t>(wanted, left_work / (count * m + 1));
    if (m > kMaxSetSamples) return false;
    if (beam < kMinBeam) {
      // Too little work is left for this set: a later, smaller pair may
      // still fit, but no triple (larger than the pairs it holds), and
      // another pass would only find the budget spent.
      starved_ = true;
      return false;
    }
    // The DP is a pure function of the set's samples and its beam: a set that
    // found nothing with the full beam finds nothing again until one of its
    // nodes changes (a later pass then skips it for free).
    if (KnownToFail(set, count)) return false;
    const auto memo_key = MemoKey(set, count);
    const auto versions = Versions(set, count);
    const bool full_beam = beam == wanted;
    auto fail = [&]() {
      if (full_beam) failed_[memo_key] = versions;
      return false;
    };
    stats_.work += m;
    std::vector<size_t> u;
    u.reserve(m);
    uint64_t current = 0;
    for (int s = 0; s < count; ++s) {
      for (size_t r = FirstRank(set[s]); r < EndRank(set[s]); ++r) {
        for (size_t i : groups_[r]) {
          u.push_back(i);
          current += CostOn(i, set[s]);
        }
      }
    }
    if (current == 0) return fail();
    std::sort(u.begin(), u.end(), [&](size_t x, size_t y) {
      const SampleMeta& mx = metas_[x];
      const SampleMeta& my = metas_[y];
      if (mx.lengths.tokens != my.lengths.tokens) return mx.lengths.tokens > my.lengths.tokens;
      return std::tie(mx.owner_rank, mx.id) < std::tie(my.owner_rank, my.id);
    });
    std::array<uint32_t, 3> ranks{};
    for (int s = 0; s < count; ++s) ranks[s] = static_cast<uint32_t>(EndRank(set[s]) - FirstRank(set[s]));
    const auto limit =
        static_cast<uint32_t>(std::min<size_t>(u.size(), std::numeric_limits<uint32_t>::max()));
    std::vector<uint32_t> cap(u.size());
    for (size_t k = 0; k < u.size(); ++k) {
      const uint32_t len = metas_[u[k]].lengths.tokens;
      cap[k] = k > 0 && metas_[u[k - 1]].lengths.tokens == len ? cap[k - 1] : std::min(CapOf(len), limit);
    }

    // forced[k]: the bytes samples k.. cost wherever they go (owned by no
    // node of the set). A state whose cost plus that is not below `current`
    // cannot end in a strict improvement: dropping it changes no result (it
    // is dearer than every state kept) and saves its subtree.
    std::vector<uint64_t> forced(u.size() + 1, 0);
    for (size_t k = u.size(); k > 0; --k) {
      uint64_t least = std::numeric_limits<uint64_t>::max();
      for (int s = 0; s < count; ++s) least = std::min(least, CostOn(u[k - 1], set[s]));
      forced[k - 1] = forced[k] + least;
    }
    // froms_[begin[k] + s]: the `from` of state s after sample k, for the
    // walk back (one buffer for all layers, reused across sets).
    std::vector<State>& layer = layer_;
    std::vector<State>& next = next_;
    layer.assign(1, State{});
    froms_.clear();
    std::vector<size_t> begin(u.size() + 1, 0);
    for (size_t k = 0; k < u.size(); ++k) {
      next.clear();
      stats_.work += count * layer.size();
      std::array<uint64_t, 3> on{};
      for (int s = 0; s < count; ++s) on[s] = CostOn(u[k], set[s]);
      const auto left = static_cast<uint32_t>(u.size() - k - 1);
      for (uint32_t p = 0; p < layer.size(); ++p) {
        for (int s = 0; s < count; ++s) {
          State t{layer[p].key, layer[p].cost + on[s], p << 2 | static_cast<uint32_t>(s)};
          if (t.cost + forced[k + 1] >= current) continue;
          if (Take(t.key, s, ranks[s], cap[k], left)) next.push_back(t);
        }
      }
      Dedupe(next);
      if (next.size() > beam) {
        std::nth_element(next.begin(), next.begin() + beam, next.end(), [](const State& x, const State& y) {
          return x.cost != y.cost ? x.cost < y.cost : x.key < y.key;
        });
        next.resize(beam);
      }
      if (next.empty()) return fail();
      begin[k] = froms_.size();
      for (const State& t : next) froms_.push_back(t.from);
      layer.swap(next);
    }
    // The cheapest end state where every node has a sample for every rank.
    size_t best = layer.size();
    for (size_t s = 0; s < layer.size(); ++s) {
      bool full = true;
      for (int n = 0; n < count; ++n) full &= Taken(layer[s].key, n) >= ranks[n];
      if (!full) continue;
      if (best == layer.size() || layer[s].cost < layer[best].cost ||
          (layer[s].cost == layer[best].cost && layer[s].key < layer[best].key)) {
        best = s;
      }
    }
    if (best == layer.size() || layer[best].cost >= current) return fail();
    std::vector<uint8_t> to(u.size());
    for (size_t k = u.size(), s = best; k > 0; --k) {
      to[k - 1] = froms_[begin[k - 1] + s] & 3;
      s = froms_[begin[k - 1] + s] >> 2;
    }
    std::array<std::vector<size_t>, 3> share;
    std::array<std::vector<uint32_t>, 3> share_cap;
    for (size_t k = 0; k < u.size(); ++k) {
      share[to[k]].push_back(u[k]);
      share_cap[to[k]].push_back(cap[k]);
    }
    std::array<std::vector<std::vector<size_t>>, 3> packed;
    for (int s = 0; s < count; ++s) {
      if (!Pack(share[s], share_cap[s], ranks[s], packed[s])) return fail();
    }
    for (int s = 0; s < count; ++s) Install(set[s], std::move(packed[s]));
    return true;
  }

  // Keeps one state per key, the cheapest (ties: the first generated, i.e.
  // the earliest parent, node A first), in order of first appearance: an
  // open-addressing table instead of a sort (this is the DP's inner loop).
  void Dedupe(std::vector<State>& states) {
    size_t size = 16;
    while (size < 2 * states.size()) size *= 2;
    if (slot_.size() < size) {
      slot_.assign(size, 0);
      stamp_.assign(size, 0);
    }
    const uint64_t mask = size - 1;
    ++generation_;
    size_t kept = 0;
    for (size_t i = 0; i < states.size(); ++i) {
      uint64_t h =
          ((states[i].key.hi ^ (states[i].key.lo * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull) >> 40;
      while (true) {
        h &= mask;
        if (stamp_[h] != generation_) {
          stamp_[h] = generation_;
          slot_[h] = static_cast<uint32_t>(kept);
          states[kept++] = states[i];
          break;
        }
        State& seen = states[slot_[h]];
        if (seen.key == states[i].key) {
          if (states[i].cost < seen.cost) seen = states[i];
          break;
        }
        ++h;
      }
    }
    states.resize(kept);
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
    ++version_[node];
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
  bool starved_ = false;                // a set was skipped for want of work: the step is done
  std::vector<uint64_t> version_;       // per node: how many times Install changed it
  std::map<Memo, Memo> failed_;         // set -> its nodes' versions
  std::vector<uint32_t> slot_, stamp_;  // Dedupe's table
  std::vector<State> layer_, next_;     // ImproveSet's DP layers, reused
  std::vector<uint32_t> froms_;         // ImproveSet's back-pointers, reused
  std::map<uint32_t, uint32_t> cap_of_;  // CapOf's memo: capacity_ is fixed per step
  uint32_t generation_ = 0;
};

}  // namespace

bool NodePlacementApplies(const grouping::Budget& budget, const grouping::StepTimeModel& model) {
  return budget.model == grouping::CostModel::kPadded && model.per_len_sq == 0.0 &&
         model.per_padded_token >= 0.0 && budget.quadratic_q >= 0.0 && budget.max_vision_patches == 0 &&
         budget.max_audio_frames == 0;
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
                                const std::vector<SampleMeta>& metas,
                                std::vector<std::vector<size_t>>& groups, uint32_t local_world_size,
                                const NodePlacementOptions& options) {
  NodePlacementStats stats;
  const bool usable = local_world_size != 0 && local_world_size <= kMaxRanks &&
                      groups.size() > local_world_size && NodePlacementApplies(budget, model) &&
                      options.beam > 0 &&
                      std::none_of(groups.begin(), groups.end(), [](const auto& g) { return g.empty(); });
  if (!usable) {
    stats.inter_node_bytes_before = stats.inter_node_bytes_after =
        InterNodeBytes(metas, groups, local_world_size);
    return stats;
  }
  return Placer(budget, model, metas, groups, local_world_size, options).Run();
}

}  // namespace odb::balance
