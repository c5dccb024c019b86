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
  return Build(cost, best, world);
}

PhaseAssignment BalancePhaseMemory(std::span<const double> cost, std::span<const double> memory,
                                   std::span<const int32_t> home, int world, std::vector<double>& rank_memory,
                                   double slack) {
  assert(memory.size() == cost.size() && rank_memory.size() == static_cast<size_t>(world));
  PhaseAssignment by_time = BalancePhase(cost, home, world);
  const double capacity = by_time.max_load * (1 + slack + 1e-12);
  std::vector<size_t> desc(cost.size());
  std::iota(desc.begin(), desc.end(), size_t{0});
  std::stable_sort(desc.begin(), desc.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<double> load(world, 0.0), held = rank_memory;
  std::vector<int32_t> rank_of(cost.size(), 0);
  bool fits = true;
  for (size_t i : desc) {
    int32_t r = home[i];
    if (cost[i] > 0 || memory[i] > 0) {
      r = -1;
      for (int32_t c = 0; c < world; ++c) {
        if (load[c] + cost[i] > capacity) continue;
        if (r < 0 || held[c] < held[r] || (held[c] == held[r] && c == home[i])) r = c;
      }
    }
    if (r < 0) {
      fits = false;
      break;
    }
    load[r] += cost[i];
    held[r] += memory[i];
    rank_of[i] = r;
  }
  std::vector<double> time_held = rank_memory;
  for (size_t i = 0; i < cost.size(); ++i) time_held[by_time.slot_of[i].rank] += memory[i];
  if (!fits ||
      *std::max_element(held.begin(), held.end()) > *std::max_element(time_held.begin(), time_held.end())) {
    rank_memory = std::move(time_held);
    return by_time;
  }
  rank_memory = std::move(held);
  return Build(cost, rank_of, world);
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
