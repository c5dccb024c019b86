#include "src/balance/phase_plan.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <numeric>
#include <optional>

namespace odb::balance {
namespace {

// Greedy at capacity C: items by cost descending; home rank if it stays within
// C, else the least-loaded rank (which must stay within C). With C = +inf and
// home ignored this is LPT.
std::optional<std::vector<int32_t>> Greedy(std::span<const double> cost, std::span<const int32_t> home,
                                           const std::vector<size_t>& desc, int world, double capacity,
                                           bool use_home) {
  std::vector<double> load(world, 0.0);
  std::vector<int32_t> rank_of(cost.size(), 0);
  for (size_t i : desc) {
    int32_t r = -1;
    if (use_home && load[home[i]] + cost[i] <= capacity) {
      r = home[i];
    } else {
      r = static_cast<int32_t>(std::min_element(load.begin(), load.end()) - load.begin());
      if (load[r] + cost[i] > capacity) return std::nullopt;
    }
    load[r] += cost[i];
    rank_of[i] = r;
  }
  return rank_of;
}

double MaxLoad(std::span<const double> cost, const std::vector<int32_t>& rank_of, int world) {
  std::vector<double> load(world, 0.0);
  for (size_t i = 0; i < cost.size(); ++i) load[rank_of[i]] += cost[i];
  return *std::max_element(load.begin(), load.end());
}

// Work bound of Improve: item pairs and (item, rank) moves looked at, over all its passes.
constexpr uint64_t kMaxImproveWork = uint64_t{1} << 22;

// Local improvement of a layout's max load: while one lowers it, move an item
// off the most loaded rank to another, or exchange it with a cheaper item of
// another rank, taking the change that leaves the pair's larger load
// smallest (ties: the first item, rank and partner in index order). With
// `held` (per rank: the memory it holds, this layout's items included) a
// change may not raise the most memory any rank holds. Stops after
// kMaxImproveWork candidates looked at.
void Improve(std::span<const double> cost, std::span<const double> memory, std::vector<int32_t>& rank_of,
             int world, std::vector<double>* held) {
  std::vector<double> load(world, 0.0);
  for (size_t i = 0; i < cost.size(); ++i) load[rank_of[i]] += cost[i];
  uint64_t work = 0;
  while (work < kMaxImproveWork) {
    const int32_t top = static_cast<int32_t>(std::max_element(load.begin(), load.end()) - load.begin());
    const double peak = held == nullptr ? 0.0 : *std::max_element(held->begin(), held->end());
    auto mem_ok = [&](int32_t to, double gain_to, double gain_top) {
      return held == nullptr || ((*held)[to] + gain_to <= peak && (*held)[top] + gain_top <= peak);
    };
    double best = load[top] * (1 - 1e-12);  // a change must leave both ranks below this
    size_t move_i = cost.size(), swap_j = cost.size();
    int32_t move_to = -1;
    for (size_t i = 0; i < cost.size(); ++i) {
      if (rank_of[i] != top || cost[i] <= 0) continue;
      const double mi = memory.empty() ? 0.0 : memory[i];
      work += static_cast<uint64_t>(world);
      for (int32_t s = 0; s < world; ++s) {
        if (s == top) continue;
        const double moved = std::max(load[top] - cost[i], load[s] + cost[i]);
        if (moved < best && mem_ok(s, mi, -mi)) {
          best = moved;
          move_i = i, move_to = s, swap_j = cost.size();
        }
      }
      for (size_t j = 0; j < cost.size(); ++j) {
        ++work;
        const int32_t s = rank_of[j];
        if (s == top || cost[j] >= cost[i]) continue;
        const double d = cost[i] - cost[j];
        const double swapped = std::max(load[top] - d, load[s] + d);
        const double mj = memory.empty() ? 0.0 : memory[j];
        if (swapped < best && mem_ok(s, mi - mj, mj - mi)) {
          best = swapped;
          move_i = i, move_to = s, swap_j = j;
        }
      }
    }
    if (move_to < 0) return;
    auto place = [&](size_t item, int32_t from, int32_t to) {
      load[from] -= cost[item];
      load[to] += cost[item];
      if (held != nullptr && !memory.empty()) {
        (*held)[from] -= memory[item];
        (*held)[to] += memory[item];
      }
      rank_of[item] = to;
    };
    if (swap_j < cost.size()) place(swap_j, move_to, top);
    place(move_i, top, move_to);
  }
}

PhaseAssignment Build(std::span<const double> cost, const std::vector<int32_t>& rank_of, int world) {
  PhaseAssignment a;
  a.order.resize(world);
  a.load.assign(world, 0.0);
  a.slot_of.resize(cost.size());
  for (size_t i = 0; i < cost.size(); ++i) {
    const int32_t r = rank_of[i];
    a.slot_of[i] = Slot{r, static_cast<uint32_t>(a.order[r].size())};
    a.order[r].push_back(i);
    a.load[r] += cost[i];
  }
  a.max_load = world == 0 ? 0.0 : *std::max_element(a.load.begin(), a.load.end());
  return a;
}

}  // namespace

double MinimaxLowerBound(std::span<const double> cost, int world) {
  double mx = 0.0, sum = 0.0;
  for (double c : cost) {
    mx = std::max(mx, c);
    sum += c;
  }
  return std::max(mx, sum / world);
}

PhaseAssignment BalancePhase(std::span<const double> cost, std::span<const int32_t> home, int world,
                             uint32_t capacity_iters) {
  assert(world >= 1 && cost.size() == home.size());
  std::vector<size_t> desc(cost.size());
  std::iota(desc.begin(), desc.end(), size_t{0});
  std::stable_sort(desc.begin(), desc.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<int32_t> best = *Greedy(cost, home, desc, world, inf, false);  // LPT
  double hi = MaxLoad(cost, best, world);
  double lo = MinimaxLowerBound(cost, world);
  // Home-first at the LPT capacity keeps the balance and moves less.
  if (auto at_hi = Greedy(cost, home, desc, world, hi, true)) best = std::move(*at_hi);
  for (uint32_t it = 0; it < capacity_iters && hi - lo > 1e-9 * hi; ++it) {
    const double mid = lo + (hi - lo) / 2;
    if (auto got = Greedy(cost, home, desc, world, mid, true)) {
      hi = MaxLoad(cost, *got, world);
      best = std::move(*got);
    } else {
      lo = mid;
    }
  }
  Improve(cost, {}, best, world, nullptr);
  return Build(cost, best, world);
}

namespace {

// BalancePhaseMemory's greedy at capacity C: items by cost, descending, each
// on the rank holding the least memory among those it keeps within C (ties:
// home); an item of cost and memory 0 stays home. Then Improve under the
// memory guard. nullopt when an item fits no rank. `held` gets the layout's
// memory.
std::optional<std::vector<int32_t>> MemoryGreedy(std::span<const double> cost, std::span<const double> memory,
                                                 std::span<const int32_t> home,
                                                 const std::vector<size_t>& desc, int world, double capacity,
                                                 std::vector<double>& held) {
  std::vector<double> load(world, 0.0);
  std::vector<int32_t> rank_of(cost.size(), 0);
  for (size_t i : desc) {
    int32_t r = home[i];
    if (cost[i] > 0 || memory[i] > 0) {
      r = -1;
      for (int32_t c = 0; c < world; ++c) {
        if (load[c] + cost[i] > capacity) continue;
        if (r < 0 || held[c] < held[r] || (held[c] == held[r] && c == home[i])) r = c;
      }
    }
    if (r < 0) return std::nullopt;
    load[r] += cost[i];
    held[r] += memory[i];
    rank_of[i] = r;
  }
  Improve(cost, memory, rank_of, world, &held);
  return rank_of;
}

double MaxOf(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

}  // namespace

PhaseAssignment BalancePhaseMemory(std::span<const double> cost, std::span<const double> memory,
                                   std::span<const int32_t> home, int world, std::vector<double>& rank_memory,
                                   double slack, double memory_cap) {
  assert(memory.size() == cost.size() && rank_memory.size() == static_cast<size_t>(world));
  PhaseAssignment best = BalancePhase(cost, home, world);
  std::vector<double> best_held = rank_memory;
  for (size_t i = 0; i < cost.size(); ++i) best_held[best.slot_of[i].rank] += memory[i];
  const double time_capacity = best.max_load;
  std::vector<size_t> desc(cost.size());
  std::iota(desc.begin(), desc.end(), size_t{0});
  std::stable_sort(desc.begin(), desc.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  // Without a cap: one layout at the full slack. With one: the time layout if
  // it keeps within the cap, else the least slack that does.
  std::vector<double> slacks = {slack};
  if (memory_cap > 0) slacks = {slack / 4, slack / 2, slack};
  for (size_t k = 0; k < slacks.size(); ++k) {
    if (memory_cap > 0 && MaxOf(best_held) <= memory_cap) break;
    if (k > 0 && slacks[k] == slacks[k - 1]) continue;
    std::vector<double> held = rank_memory;
    auto got = MemoryGreedy(cost, memory, home, desc, world, time_capacity * (1 + slacks[k] + 1e-12), held);
    if (got && MaxOf(held) < MaxOf(best_held)) {
      best = Build(cost, *got, world);
      best_held = std::move(held);
    }
  }
  rank_memory = std::move(best_held);
  return best;
}

std::vector<std::vector<Slot>> ComposeRoutes(const PhaseAssignment& from, const PhaseAssignment& to) {
  assert(from.slot_of.size() == to.slot_of.size());
  std::vector<std::vector<Slot>> route(from.order.size());
  for (size_t r = 0; r < from.order.size(); ++r) {
    route[r].reserve(from.order[r].size());
    for (size_t item : from.order[r]) route[r].push_back(to.slot_of[item]);
  }
  return route;
}

namespace {

std::vector<std::vector<uint32_t>> SendCounts(const std::vector<std::vector<Slot>>& route, int world) {
  std::vector<std::vector<uint32_t>> counts(world, std::vector<uint32_t>(world, 0));
  for (int r = 0; r < world; ++r) {
    for (const Slot& s : route[r]) ++counts[r][s.rank];
  }
  return counts;
}

MultimodalPlan Plan(std::span<const PhaseSample> samples, int world, const PhaseCost& vision_cost,
                    const PhaseCost* audio_cost, const PhaseCost& llm_cost) {
  const size_t n = samples.size();
  std::vector<double> vision(n), audio(n, 0.0), llm(n);
  std::vector<int32_t> home(n);
  for (size_t i = 0; i < n; ++i) {
    vision[i] = vision_cost.OfInput(samples[i].lengths.vision_patches);
    if (audio_cost != nullptr) audio[i] = audio_cost->OfInput(samples[i].lengths.audio_frames);
    llm[i] = llm_cost.Of(samples[i].lengths.tokens);
    home[i] = samples[i].home_rank;
  }
  MultimodalPlan plan;
  plan.encoder = BalancePhase(vision, home, world);
  plan.audio = BalancePhase(audio, home, world);
  std::vector<int32_t> enc_rank(n);
  for (size_t i = 0; i < n; ++i) enc_rank[i] = plan.encoder.slot_of[i].rank;
  plan.llm = BalancePhase(llm, enc_rank, world);
  plan.encoder_to_llm = ComposeRoutes(plan.encoder, plan.llm);
  plan.send_counts = SendCounts(plan.encoder_to_llm, world);
  plan.audio_to_llm = ComposeRoutes(plan.audio, plan.llm);
  plan.audio_send_counts = SendCounts(plan.audio_to_llm, world);
  return plan;
}

}  // namespace

MultimodalPlan PlanPhases(std::span<const PhaseSample> samples, int world, const PhaseCost& encoder_cost,
                          const PhaseCost& llm_cost) {
  return Plan(samples, world, encoder_cost, nullptr, llm_cost);
}

MultimodalPlan PlanPhases(std::span<const PhaseSample> samples, int world, const PhaseCost& vision_cost,
                          const PhaseCost& audio_cost, const PhaseCost& llm_cost) {
  return Plan(samples, world, vision_cost, &audio_cost, llm_cost);
}

}  // namespace odb::balance
