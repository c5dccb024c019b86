#include "src/balance/phase_plan.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>

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
// change may not raise a rank above the larger of the most memory any rank
// holds and `memory_limit`. Stops after kMaxImproveWork candidates looked at.
void Improve(std::span<const double> cost, std::span<const double> memory, std::vector<int32_t>& rank_of,
             int world, std::vector<double>* held, double memory_limit = 0.0) {
  std::vector<double> load(world, 0.0);
  for (size_t i = 0; i < cost.size(); ++i) load[rank_of[i]] += cost[i];
  uint64_t work = 0;
  while (work < kMaxImproveWork) {
    const int32_t top = static_cast<int32_t>(std::max_element(load.begin(), load.end()) - load.begin());
    const double peak =
        held == nullptr ? 0.0 : std::max(memory_limit, *std::max_element(held->begin(), held->end()));
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

// The greedies of BalancePhaseMemory: items by cost, descending; an item of
// cost and memory 0 stays home; then Improve under the memory guard. `held`
// gets the layout's memory.
// - kMemoryFirst (`limit` = a time capacity C): each item on the rank holding
//   the least memory among those it keeps within C (ties: home); nullopt when
//   an item fits no rank.
// - kTimeFirst (`limit` = a memory cap, time as the goal, memory as a limit):
//   each item on the least loaded rank among those it keeps within the cap
//   (ties: home, then the lower index); an item no rank takes within the cap
//   goes to the rank holding the least memory. Improve then raises no rank
//   above the cap (or the layout's peak, when that is above it).
enum class Goal { kMemoryFirst, kTimeFirst };

std::optional<std::vector<int32_t>> GoalGreedy(Goal goal, std::span<const double> cost,
                                               std::span<const double> memory, std::span<const int32_t> home,
                                               const std::vector<size_t>& desc, int world, double limit,
                                               std::vector<double>& held) {
  const bool time_first = goal == Goal::kTimeFirst;
  // What a rank is chosen by and what it must keep within the limit.
  std::vector<double> load(world, 0.0);
  const std::vector<double>& prefer = time_first ? load : held;
  const std::vector<double>& limited = time_first ? held : load;
  std::vector<int32_t> rank_of(cost.size(), 0);
  for (size_t i : desc) {
    int32_t r = home[i];
    if (cost[i] > 0 || memory[i] > 0) {
      const double add = time_first ? memory[i] : cost[i];
      r = -1;
      for (int32_t c = 0; c < world; ++c) {
        if (limited[c] + add > limit) continue;
        if (r < 0 || prefer[c] < prefer[r] || (prefer[c] == prefer[r] && c == home[i])) r = c;
      }
      if (r < 0 && !time_first) return std::nullopt;
      if (r < 0) r = static_cast<int32_t>(std::min_element(held.begin(), held.end()) - held.begin());
    }
    load[r] += cost[i];
    held[r] += memory[i];
    rank_of[i] = r;
  }
  Improve(cost, memory, rank_of, world, &held, time_first ? limit : 0.0);
  return rank_of;
}

double MaxOf(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

}  // namespace

PhaseAssignment BalancePhaseMemory(std::span<const double> cost, std::span<const double> memory,
                                   std::span<const int32_t> home, int world, std::vector<double>& rank_memory,
                                   double slack, double memory_cap, double max_time) {
  assert(memory.size() == cost.size() && rank_memory.size() == static_cast<size_t>(world));
  PhaseAssignment best = BalancePhase(cost, home, world);
  std::vector<double> best_held = rank_memory;
  for (size_t i = 0; i < cost.size(); ++i) best_held[best.slot_of[i].rank] += memory[i];
  const double time_capacity = best.max_load;
  if (time_capacity > 0 && max_time < time_capacity * (1 + slack)) {
    slack = std::max(0.0, max_time / time_capacity - 1);
  }
  std::vector<size_t> desc(cost.size());
  std::iota(desc.begin(), desc.end(), size_t{0});
  std::stable_sort(desc.begin(), desc.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  if (memory_cap <= 0) {
    // One layout at the full slack, kept if it holds less at its peak rank.
    std::vector<double> held = rank_memory;
    auto got = GoalGreedy(Goal::kMemoryFirst, cost, memory, home, desc, world,
                          time_capacity * (1 + slack + 1e-12), held);
    if (got && MaxOf(held) < MaxOf(best_held)) {
      best = Build(cost, *got, world);
      best_held = std::move(held);
    }
  } else if (MaxOf(best_held) > memory_cap) {
    // The time layout goes above the cap. Candidates: the most balanced layout
    // within the cap (GoalGreedy kTimeFirst) if it takes at most 1 + slack times the
    // time capacity, and the memory layouts at slack / 4, slack / 2 and slack;
    // of those within the cap the fastest, else the least peak memory.
    auto consider = [&](PhaseAssignment a, std::vector<double> held) {
      const bool within = MaxOf(held) <= memory_cap, best_within = MaxOf(best_held) <= memory_cap;
      if ((within && (!best_within || a.max_load < best.max_load)) ||
          (!within && !best_within && MaxOf(held) < MaxOf(best_held))) {
        best = std::move(a);
        best_held = std::move(held);
      }
    };
    std::vector<double> held = rank_memory;
    PhaseAssignment capped =
        Build(cost, *GoalGreedy(Goal::kTimeFirst, cost, memory, home, desc, world, memory_cap, held), world);
    if (capped.max_load <= time_capacity * (1 + slack + 1e-12)) consider(std::move(capped), std::move(held));
    for (double s : {slack / 4, slack / 2, slack}) {
      held = rank_memory;
      auto got = GoalGreedy(Goal::kMemoryFirst, cost, memory, home, desc, world,
                            time_capacity * (1 + s + 1e-12), held);
      if (got) consider(Build(cost, *got, world), std::move(held));
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

bool EncoderPlanConfig::MemoryAware() const {
  for (const PhaseCost* m : {&vision_memory, &audio_memory, &llm_memory}) {
    if (m->per_sample > 0 || m->per_unit > 0 || m->per_unit_sq > 0) return true;
  }
  return false;
}

namespace {

// `a` with its ranks relabeled: rank r's items (and load) go to rank to[r].
void Relabel(PhaseAssignment& a, const std::vector<int32_t>& to) {
  const size_t world = a.order.size();
  PhaseAssignment out;
  out.order.resize(world);
  out.load.resize(world);
  for (size_t r = 0; r < world; ++r) {
    out.order[to[r]] = std::move(a.order[r]);
    out.load[to[r]] = a.load[r];
  }
  out.max_load = a.max_load;
  out.slot_of = std::move(a.slot_of);
  for (Slot& slot : out.slot_of) slot.rank = to[slot.rank];
  a = std::move(out);
}

// Relabels `a`'s ranks by a permutation (each rank's items move together, so
// every rank's load is one of the layout's and the phase's slowest rank stays)
// to even the ranks' memory peaks over the run: the ranks' item memory
// (`held` minus `before`) by size, descending, each onto the free rank where
// max(its run peak, `before` + that memory) is least (ties: the lower run
// peak, then less held, then the same rank). Kept only if the step's most
// held memory does not rise; `held` follows.
void RelabelForPeaks(PhaseAssignment& a, const std::vector<double>& before, std::vector<double>& held,
                     const std::vector<double>& run_peak) {
  const int world = static_cast<int>(held.size());
  std::vector<double> bucket(world);
  for (int r = 0; r < world; ++r) bucket[r] = held[r] - before[r];
  std::vector<int32_t> by_size(world);
  std::iota(by_size.begin(), by_size.end(), 0);
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](int32_t x, int32_t y) { return bucket[x] > bucket[y]; });
  std::vector<int32_t> to(world, -1);
  std::vector<bool> taken(world, false);
  std::vector<double> relabeled(world);
  for (int32_t b : by_size) {
    int32_t best = -1;
    auto key = [&](int32_t r) {
      return std::make_tuple(std::max(run_peak[r], before[r] + bucket[b]), run_peak[r], before[r], r != b);
    };
    for (int32_t r = 0; r < world; ++r) {
      if (!taken[r] && (best < 0 || key(r) < key(best))) best = r;
    }
    to[b] = best;
    taken[best] = true;
    relabeled[best] = before[best] + bucket[b];
  }
  if (MaxOf(relabeled) > MaxOf(held)) return;
  Relabel(a, to);
  held = std::move(relabeled);
}

}  // namespace

bool RelabelSearches(int world) {
  size_t perms = 1;
  for (int k = 2; k <= world && perms <= kRelabelSearchMaxEvaluations; ++k) perms *= static_cast<size_t>(k);
  return perms <= kRelabelSearchMaxEvaluations;
}

std::optional<std::vector<std::vector<int32_t>>> RelabelForRunPeaks(
    std::span<const double> base, std::span<const std::vector<double>> buckets,
    std::span<const double> run_peak) {
  const int world = static_cast<int>(base.size());
  const size_t phases = buckets.size();
  if (!RelabelSearches(world)) return std::nullopt;
  std::vector<std::vector<int32_t>> best(phases, std::vector<int32_t>(world));
  for (auto& p : best) std::iota(p.begin(), p.end(), 0);
  if (world <= 1 || phases == 0) return best;
  // The permutations searched: every phase's every one when their product is
  // at most kRelabelSearchMaxEvaluations, else one permutation for all phases
  // (an encoder rank's buckets move together, summed), else none (nullopt).
  size_t perms = 1, product = 1;
  for (int k = 2; k <= world; ++k) perms *= static_cast<size_t>(k);
  for (size_t p = 0; p < phases && product <= kRelabelSearchMaxEvaluations; ++p) product *= perms;
  const bool each = product <= kRelabelSearchMaxEvaluations;
  std::vector<std::vector<double>> search(buckets.begin(), buckets.end());
  if (!each) {
    for (size_t p = 1; p < phases; ++p) {
      for (int r = 0; r < world; ++r) search[0][r] += search[p][r];
    }
    search.resize(1);
  }
  // Every combination's run peaks after the step (max(run_peak, held)): its
  // largest and their sum, and the ranks it relabels.
  struct Key {
    double max = 0, sum = 0;
    int moved = 0;
  };
  std::vector<Key> keys;
  std::vector<std::vector<std::vector<int32_t>>> combos;
  std::vector<std::vector<int32_t>> cur(search.size(), std::vector<int32_t>(world));
  for (auto& p : cur) std::iota(p.begin(), p.end(), 0);
  std::vector<double> held(world);
  double least_max = std::numeric_limits<double>::infinity();
  while (true) {  // odometer over the phases' permutations (cur[p]: bucket rank -> rank)
    std::copy(base.begin(), base.end(), held.begin());
    Key key;
    for (size_t p = 0; p < search.size(); ++p) {
      for (int r = 0; r < world; ++r) {
        held[cur[p][r]] += search[p][r];
        key.moved += cur[p][r] != r;
      }
    }
    for (int r = 0; r < world; ++r) {
      const double peak = std::max(run_peak[r], held[r]);
      key.max = std::max(key.max, peak);
      key.sum += peak;
    }
    least_max = std::min(least_max, key.max);
    keys.push_back(key);
    combos.push_back(cur);
    size_t p = 0;
    while (p < cur.size() && !std::next_permutation(cur[p].begin(), cur[p].end())) ++p;
    if (p == cur.size()) break;
  }
  // Of those whose largest run peak is within kRelabelPeakTolerance of the
  // least any gives: the least max / mean, then the least max, then the
  // fewest ranks relabeled (the identity wins ties); within 1e-12 equal.
  auto less = [](double x, double y) { return x < y - 1e-12 * std::max(std::abs(x), std::abs(y)); };
  auto better = [&](const Key& a, const Key& b) {
    if (less(a.max * b.sum, b.max * a.sum)) return true;  // a.max / a.sum < b.max / b.sum
    if (less(b.max * a.sum, a.max * b.sum)) return false;
    if (less(a.max, b.max)) return true;
    if (less(b.max, a.max)) return false;
    return a.moved < b.moved;
  };
  size_t pick = keys.size();
  for (size_t c = 0; c < keys.size(); ++c) {
    if (keys[c].max > least_max * (1 + kRelabelPeakTolerance)) continue;
    if (pick == keys.size() || better(keys[c], keys[pick])) pick = c;
  }
  const std::vector<std::vector<int32_t>>& chosen = combos[pick];
  if (each) return chosen;
  for (auto& p : best) p = chosen[0];
  return best;
}

std::array<EncoderStepPlanner::PhaseTimes, 2> EncoderStepPlanner::TimeLayouts(
    const EncoderRoundStep& step) const {
  const int active = static_cast<int>(step.ranks.size());
  std::vector<int32_t> home;
  for (const EncoderItem& item : step.items) home.push_back(item.llm_rank);
  std::array<PhaseTimes, 2> out{};
  auto phase = [&](const PhaseCost& model, auto units) {
    std::vector<double> cost;
    for (const EncoderItem& item : step.items) cost.push_back(model.OfInput(units(item.lengths)));
    return PhaseTimes{MinimaxLowerBound(cost, active), BalancePhase(cost, home, active).max_load};
  };
  out[0] = phase(config_.vision_cost, [](const SampleLengths& l) { return l.vision_patches; });
  if (config_.audio_phase)
    out[1] = phase(config_.audio_cost, [](const SampleLengths& l) { return l.audio_frames; });
  return out;
}

std::vector<std::array<EncoderStepPlanner::PhaseTimes, 2>> EncoderStepPlanner::RoundAhead(
    std::span<const EncoderRoundStep> steps) const {
  // after[k]: the bounds and time layouts of the steps after k, summed.
  std::vector<std::array<PhaseTimes, 2>> after(steps.size());
  if (!memory_aware_ || config_.time_floor <= 0) return after;
  for (size_t k = steps.size(); k-- > 1;) {
    const std::array<PhaseTimes, 2> t = TimeLayouts(steps[k]);
    for (size_t p = 0; p < 2; ++p) {
      after[k - 1][p].bound = after[k][p].bound + t[p].bound;
      after[k - 1][p].time = after[k][p].time + t[p].time;
    }
  }
  return after;
}

std::vector<EncoderStepPlan> EncoderStepPlanner::PlanRound(std::span<const EncoderRoundStep> steps) {
  if (memory_aware_ && config_.peak_ratio > 0 && config_.round_joint) return PlanRoundJoint(steps);
  const std::vector<std::array<PhaseTimes, 2>> after = RoundAhead(steps);
  std::vector<EncoderStepPlan> plans;
  plans.reserve(steps.size());
  for (size_t k = 0; k < steps.size(); ++k) {
    ahead_ = after[k];
    plans.push_back(PlanStep(steps[k].items, steps[k].ranks, -1.0));
  }
  ahead_ = {};
  return plans;
}

std::vector<double> EncoderStepPlanner::LlmHeld(std::span<const EncoderItem> items, int active) const {
  std::vector<double> base(active, 0.0);
  std::vector<uint32_t> longest(active, 0);
  for (const EncoderItem& item : items)
    longest[item.llm_rank] = std::max(longest[item.llm_rank], item.lengths.tokens);
  for (const EncoderItem& item : items)
    base[item.llm_rank] +=
        config_.llm_memory.Of(config_.llm_padded ? longest[item.llm_rank] : item.lengths.tokens);
  return base;
}

std::vector<double> EncoderStepPlanner::LlmTimes(std::span<const EncoderItem> items, int active) const {
  std::vector<std::vector<SampleLengths>> members(active);
  for (const EncoderItem& item : items) members[item.llm_rank].push_back(item.lengths);
  std::vector<double> time(active, 0.0);
  for (int a = 0; a < active; ++a)
    time[a] = grouping::StepTime(config_.llm_time, config_.llm_budget.model, members[a]);
  return time;
}

std::vector<double> EncoderStepPlanner::Held(std::span<const EncoderItem> items, int active,
                                             const EncoderStepPlan& plan) const {
  std::vector<double> held = LlmHeld(items, active);
  for (size_t i = 0; i < items.size(); ++i) {
    held[plan.vision.slot_of[i].rank] += config_.vision_memory.OfInput(items[i].lengths.vision_patches);
    if (config_.audio_phase)
      held[plan.audio.slot_of[i].rank] += config_.audio_memory.OfInput(items[i].lengths.audio_frames);
  }
  return held;
}

std::vector<EncoderStepPlan> EncoderStepPlanner::PlanRoundJoint(std::span<const EncoderRoundStep> given) {
  const size_t n = given.size();
  // The steps' items, whose LLM ranks the memory moves (llm_slack) change.
  std::vector<std::vector<EncoderItem>> items(n);
  std::vector<EncoderRoundStep> steps(n);
  for (size_t k = 0; k < n; ++k) {
    items[k].assign(given[k].items.begin(), given[k].items.end());
    steps[k] = {items[k], given[k].ranks};
  }
  const double job_peak = memory_peak_;
  const std::vector<double> rank_peak = rank_peak_;
  const std::array<double, 2> bound_sum = bound_sum_, time_sum = time_sum_;
  const std::vector<std::array<PhaseTimes, 2>> after = RoundAhead(steps);
  // Max / mean of the run peaks of the ranks that have held anything (the
  // run so far: no forecast beyond the round).
  auto ratio_of = [](const std::vector<double>& peaks) {
    double mx = 0.0, sum = 0.0;
    int count = 0;
    for (double p : peaks) {
      if (p <= 0) continue;
      mx = std::max(mx, p);
      sum += p;
      ++count;
    }
    return sum > 0 ? mx * count / sum : 1.0;
  };
  // The target is the ratio itself, also when the run so far is more uneven: a round that holds the
  // highest peak can still bring it down (its step is capped until it is no longer the highest, or
  // the ratio holds); one whose highest peak is from before stops at once (below).
  const double allowed = config_.peak_ratio * (1 + 1e-12);
  std::vector<double> fraction(n, 1.0);
  std::vector<EncoderStepPlan> plans(n);
  std::vector<size_t> raised_at;  // per world rank: the step that set its run peak
  // The round planned with `fraction`'s caps from the state before it; the
  // run peaks' ratio after it.
  auto plan_round = [&] {
    memory_peak_ = job_peak;
    rank_peak_ = rank_peak;
    bound_sum_ = bound_sum;
    time_sum_ = time_sum;
    raised_at.assign(rank_peak_.size(), n);
    for (size_t k = 0; k < n; ++k) {
      const std::vector<double> before = rank_peak_;
      ahead_ = after[k];
      plans[k] = PlanStep(steps[k].items, steps[k].ranks, fraction[k]);
      raised_at.resize(rank_peak_.size(), n);
      for (size_t w = 0; w < rank_peak_.size(); ++w) {
        if (w >= before.size() || rank_peak_[w] > before[w]) raised_at[w] = k;
      }
    }
    return ratio_of(rank_peak_);
  };
  double ratio = plan_round();
  // llm_slack: the LLM's layout serves memory first (the LLM phase is the one
  // with time to spare: the encoder phases' memory trades are what the time
  // floor rations), then the encoder caps for what it leaves; and once more
  // after them.
  LlmRound llm;
  if (config_.llm_slack > 0) {
    double bound = 0.0;
    for (size_t k = 0; k < n; ++k) {
      const int active = static_cast<int>(steps[k].ranks.size());
      const std::vector<double> rank_time = LlmTimes(items[k], active);
      const double slowest = *std::max_element(rank_time.begin(), rank_time.end());
      double largest = 0.0;
      for (const EncoderItem& item : items[k]) {
        largest = std::max(largest, grouping::StepTime(config_.llm_time, config_.llm_budget.model,
                                                       std::span<const SampleLengths>(&item.lengths, 1)));
      }
      llm.bound.push_back(std::max(
          largest, std::accumulate(rank_time.begin(), rank_time.end(), 0.0) / static_cast<double>(active)));
      llm.time.push_back(slowest);
      llm.cap.push_back(slowest * (1 + config_.llm_slack));
      bound += llm.bound.back();
    }
    // time_floor: the LLM's slowest ranks summed over the job within its bounds' sum / f, as the
    // encoder phases' are: the round's steps may sum to what the steps before left.
    llm.budget = config_.time_floor > 0 ? (llm_sum_.bound + bound) / config_.time_floor - llm_sum_.time
                                        : std::numeric_limits<double>::infinity();
    if (ratio > allowed)
      ratio = MoveLlmForPeaks(items, steps, plans, plan_round, raised_at, llm, ratio, allowed);
  }
  // The loosest cap in [0, hi] (as a fraction) for step k that keeps the
  // round within `allowed`, by bisection (0 is within it).
  auto loosest = [&](size_t k, double lo, double hi) {
    for (int it = 0; it < kPeakRatioBisections; ++it) {
      fraction[k] = lo + (hi - lo) / 2;
      (plan_round() <= allowed ? lo : hi) = fraction[k];
    }
    fraction[k] = lo;
  };
  // While over the ratio: the step that set the highest rank's peak to its
  // floor (kept there even where that alone does not bring the round within
  // the ratio: the next highest is then lowered too), or, once that brings it
  // within, to the loosest cap that does.
  std::vector<size_t> capped;
  std::vector<double> best_fraction = fraction;
  double best_ratio = ratio;
  for (size_t iter = 0; iter < n && ratio > allowed; ++iter) {
    const size_t top =
        static_cast<size_t>(std::max_element(rank_peak_.begin(), rank_peak_.end()) - rank_peak_.begin());
    const size_t k = raised_at[top];
    if (k >= n || fraction[k] <= 0) break;  // the highest peak is from before the round, or at its floor
    const double was = fraction[k];
    fraction[k] = 0;
    capped.push_back(k);
    ratio = plan_round();
    if (ratio <= allowed) {
      loosest(k, 0, was);
      // The steps capped before it to their floors, loosened as far as the ratio allows.
      for (size_t c = 0; c + 1 < capped.size(); ++c) loosest(capped[c], fraction[capped[c]], 1.0);
      ratio = plan_round();
    }
    if (ratio < best_ratio) best_ratio = ratio, best_fraction = fraction;
  }
  if (ratio > best_ratio) {  // none within the ratio: the most even seen
    fraction = best_fraction;
    ratio = plan_round();
  }
  if (config_.llm_slack > 0 && ratio > allowed) {
    ratio = MoveLlmForPeaks(items, steps, plans, plan_round, raised_at, llm, ratio, allowed);
  }
  ahead_ = {};
  for (size_t k = 0; k < llm.time.size(); ++k) {
    llm_sum_.bound += llm.bound[k];
    llm_sum_.time += llm.time[k];
  }
  for (size_t k = 0; k < n; ++k) {
    bool moved = false;
    for (size_t i = 0; i < items[k].size(); ++i)
      moved = moved || items[k][i].llm_rank != given[k].items[i].llm_rank;
    if (!moved) continue;
    plans[k].llm_rank.reserve(items[k].size());
    for (const EncoderItem& item : items[k]) plans[k].llm_rank.push_back(item.llm_rank);
  }
  return plans;
}

double EncoderStepPlanner::MoveLlmForPeaks(std::vector<std::vector<EncoderItem>>& items,
                                           std::span<const EncoderRoundStep> steps,
                                           const std::vector<EncoderStepPlan>& plans,
                                           const std::function<double()>& plan_round,
                                           const std::vector<size_t>& raised_at, LlmRound& llm, double ratio,
                                           double allowed) {
  const size_t n = steps.size();
  const grouping::CostModel model = config_.llm_budget.model;
  auto members_of = [&](size_t k, int a) {
    std::vector<SampleLengths> m;
    for (const EncoderItem& item : items[k])
      if (item.llm_rank == a) m.push_back(item.lengths);
    return m;
  };
  // How even a round leaves the ranks' run peaks: their max / mean, then the
  // peaks from the highest down (two ranks at the top come down one at a
  // time, a move that lowers the third keeps the ratio).
  struct Evenness {
    double ratio = std::numeric_limits<double>::infinity();
    std::vector<double> peaks;
    bool operator<(const Evenness& o) const {
      if (ratio != o.ratio) return ratio < o.ratio;
      return std::lexicographical_compare(peaks.begin(), peaks.end(), o.peaks.begin(), o.peaks.end());
    }
  };
  auto evenness = [&](double r) {
    Evenness e{r, rank_peak_};
    std::sort(e.peaks.begin(), e.peaks.end(), std::greater<>());
    return e;
  };
  std::vector<std::vector<EncoderItem>> best_items = items;
  std::vector<double> best_time = llm.time;
  Evenness best_score = evenness(ratio);
  size_t since_best = 0;
  auto slowest_of = [&](size_t k) {
    const std::vector<double> t = LlmTimes(items[k], static_cast<int>(steps[k].ranks.size()));
    return *std::max_element(t.begin(), t.end());
  };
  const size_t max_moves = 8 * n + 8;
  for (size_t move = 0; move < max_moves && ratio > allowed; ++move) {
    const size_t top =
        static_cast<size_t>(std::max_element(rank_peak_.begin(), rank_peak_.end()) - rank_peak_.begin());
    const size_t k = raised_at[top];  // plan_round keeps it
    if (k >= n) break;                // the highest peak is from before the round
    const int active = static_cast<int>(steps[k].ranks.size());
    const int from =
        static_cast<int>(std::find(steps[k].ranks.begin(), steps[k].ranks.end(), static_cast<int32_t>(top)) -
                         steps[k].ranks.begin());
    if (from == active) break;  // (it is active where its peak rose)
    // The step's slowest LLM rank may reach its cap as far as the round's
    // other steps leave it room in the budget (time_floor); a move that does
    // not slow the step is always allowed.
    const double round_time = std::accumulate(llm.time.begin(), llm.time.end(), 0.0);
    const double time_cap =
        std::max(llm.time[k], std::min(llm.cap[k], llm.budget - (round_time - llm.time[k])));
    // Per receiving rank, the sample of `from` whose move leaves the pair's
    // larger holding least (as the step is planned now); each such move is
    // then tried by re-planning the round (the encoder layouts follow the
    // LLM's: a relieved rank may attract a large image), and the one leaving
    // the most even run peaks is made.
    const std::vector<double> held = Held(items[k], active, plans[k]);
    const std::vector<double> llm_held = LlmHeld(items[k], active);
    if (members_of(k, from).size() < 2) break;       // a rank keeps one sample
    std::vector<std::pair<size_t, int>> candidates;  // (item, receiving rank)
    for (int to = 0; to < active; ++to) {
      if (to == from) continue;
      size_t best_i = items[k].size();
      double best_pair = std::numeric_limits<double>::infinity();
      const std::vector<SampleLengths> to_members = members_of(k, to);
      for (size_t i = 0; i < items[k].size(); ++i) {
        if (items[k][i].llm_rank != from) continue;
        std::vector<SampleLengths> with = to_members;
        with.push_back(items[k][i].lengths);
        if (!grouping::FitsBudget(config_.llm_budget, with) ||
            grouping::StepTime(config_.llm_time, model, with) > time_cap)
          continue;
        items[k][i].llm_rank = to;
        const std::vector<double> moved = LlmHeld(items[k], active);
        const double slowest = slowest_of(k);
        items[k][i].llm_rank = from;
        if (slowest > time_cap) continue;
        const double pair =
            std::max(held[from] - llm_held[from] + moved[from], held[to] - llm_held[to] + moved[to]);
        if (pair < best_pair) best_pair = pair, best_i = i;
      }
      if (best_i < items[k].size()) candidates.emplace_back(best_i, to);
    }
    if (candidates.empty()) break;
    std::pair<size_t, int> chosen = candidates[0];
    Evenness chosen_score;
    for (const auto& [i, to] : candidates) {
      items[k][i].llm_rank = to;
      const double r = plan_round();
      Evenness score = evenness(r);
      items[k][i].llm_rank = from;
      if (score < chosen_score) {
        chosen = {i, to}, chosen_score = std::move(score);
      }
    }
    items[k][chosen.first].llm_rank = chosen.second;
    llm.time[k] = slowest_of(k);
    ratio = plan_round();
    // The most even round seen is kept. One move may not lower the ratio
    // (two ranks at one peak come down one after the other; the relabeling
    // may put a large image on another rank than the one relieved), so the
    // moves go on a few past the best.
    Evenness score = evenness(ratio);
    if (score < best_score) {
      best_score = std::move(score), best_items = items, best_time = llm.time;
      since_best = 0;
    } else if (++since_best > kLlmMovePatience) {
      break;
    }
  }
  // In place: `steps` views each step's items.
  for (size_t k = 0; k < n; ++k) std::copy(best_items[k].begin(), best_items[k].end(), items[k].begin());
  llm.time = std::move(best_time);
  return plan_round();
}

EncoderStepPlan EncoderStepPlanner::PlanStep(std::span<const EncoderItem> items,
                                             std::span<const int32_t> ranks, double cap_fraction) {
  const int active = static_cast<int>(ranks.size());
  std::vector<int32_t> home;
  home.reserve(items.size());
  for (const EncoderItem& item : items) home.push_back(item.llm_rank);
  // What each active rank holds this step before its encoder phases: its LLM
  // samples' activations.
  std::vector<double> base(active, 0.0);
  double memory_cap = 0.0, floor_cap = 0.0;
  if (memory_aware_) {
    base = LlmHeld(items, active);
    double total = 0.0, largest = 0.0;
    for (double h : base) total += h, largest = std::max(largest, h);
    for (const EncoderItem& item : items) {
      const double v = config_.vision_memory.OfInput(item.lengths.vision_patches);
      const double a = config_.audio_phase ? config_.audio_memory.OfInput(item.lengths.audio_frames) : 0.0;
      total += v + a;
      largest = std::max({largest, v, a});
    }
    const double bound = std::max(total / static_cast<double>(active), largest);
    memory_cap = std::max(memory_peak_, bound * (1 + config_.memory_cap_margin));
    floor_cap = std::max(memory_peak_, bound);
    if (cap_fraction >= 0 && floor_cap < memory_cap) {
      memory_cap = floor_cap + cap_fraction * (memory_cap - floor_cap);
    }
  }
  // Per active rank: the most memory it held in an earlier step.
  std::vector<double> run_peak(active, 0.0);
  for (int a = 0; a < active; ++a) {
    if (static_cast<size_t>(ranks[a]) < rank_peak_.size()) run_peak[a] = rank_peak_[ranks[a]];
  }
  // even_peaks up to W = 8: the step's layouts relabeled together once both are
  // planned (RelabelForRunPeaks); above, each phase's greedily (RelabelForPeaks).
  const bool search =
      memory_aware_ && config_.even_peaks && config_.relabel_search && RelabelSearches(active);
  // The step's layouts under one memory cap; `held`: what each rank holds
  // after them; `time`: the sum over the phases of the slowest rank's.
  struct Candidate {
    EncoderStepPlan plan;
    std::vector<double> held;
    double time = 0.0;
  };
  std::array<double, 2> bounds{};  // per encoder phase: the step's bound (the same under every cap)
  auto plan_at = [&](double cap) {
    Candidate c;
    c.held = base;
    std::vector<std::vector<double>> buckets;  // per phase, per rank: its items' memory
    auto phase = [&](size_t p, const PhaseCost& cost_model, const PhaseCost& memory_model, auto units) {
      std::vector<double> cost, memory;
      for (const EncoderItem& item : items) {
        cost.push_back(cost_model.OfInput(units(item.lengths)));
        memory.push_back(memory_model.OfInput(units(item.lengths)));
      }
      bounds[p] = MinimaxLowerBound(cost, active);
      if (!memory_aware_) return BalancePhase(cost, home, active);
      // time_floor: what the job's budget leaves this step's slowest rank, the
      // round's later steps counted at their time layouts.
      const double max_time = config_.time_floor > 0
                                  ? (bound_sum_[p] + bounds[p] + ahead_[p].bound) / config_.time_floor -
                                        time_sum_[p] - ahead_[p].time
                                  : std::numeric_limits<double>::infinity();
      const std::vector<double> before = c.held;
      PhaseAssignment a =
          BalancePhaseMemory(cost, memory, home, active, c.held, config_.memory_slack, cap, max_time);
      buckets.emplace_back(active);
      for (int r = 0; r < active; ++r) buckets.back()[r] = c.held[r] - before[r];
      if (config_.even_peaks && !search) RelabelForPeaks(a, before, c.held, run_peak);
      return a;
    };
    c.plan.vision = phase(0, config_.vision_cost, config_.vision_memory,
                          [](const SampleLengths& l) { return l.vision_patches; });
    c.time = c.plan.vision.max_load;
    if (config_.audio_phase) {
      c.plan.audio = phase(1, config_.audio_cost, config_.audio_memory,
                           [](const SampleLengths& l) { return l.audio_frames; });
      c.time += c.plan.audio.max_load;
    }
    if (search) {
      const auto to = *RelabelForRunPeaks(base, buckets, run_peak);
      Relabel(c.plan.vision, to[0]);
      if (config_.audio_phase) Relabel(c.plan.audio, to[1]);
      c.held = base;
      for (size_t p = 0; p < buckets.size(); ++p) {
        for (int r = 0; r < active; ++r) c.held[to[p][r]] += buckets[p][r];
      }
    }
    return c;
  };
  Candidate chosen = plan_at(memory_cap);
  if (memory_aware_ && config_.peak_ratio > 0 && cap_fraction < 0) {
    // Max / mean over the ranks of their run peaks after a step holding
    // `held` (none: before it). With forecast_peaks, each rank's peak is
    // forecast to reach at least the level L = max(the job's peak before the
    // step, the step's second-largest holding): a later step may bring any
    // rank what one already held (the weight of a step is the data's, which
    // rank holds it the layout's), and the ranks besides the step's top one
    // show the level steps like this one bring. Without it, L = 0: the run
    // so far, a step may also leave the peaks no less even than before it.
    auto level_of = [&](const std::vector<double>* held) {
      if (!config_.forecast_peaks) return 0.0;
      double level = memory_peak_;
      if (held != nullptr && held->size() >= 2) {
        std::vector<double> sorted = *held;
        std::nth_element(sorted.begin(), sorted.end() - 2, sorted.end());
        level = std::max(level, sorted[sorted.size() - 2]);
      }
      return level;
    };
    auto ratio = [&](const std::vector<double>* held) {
      const double level = level_of(held);
      double mx = 0.0, sum = 0.0;
      for (int r = 0; r < active; ++r) {
        const double peak =
            std::max(level, held == nullptr ? run_peak[r] : std::max(run_peak[r], (*held)[r]));
        mx = std::max(mx, peak);
        sum += peak;
      }
      return sum > 0 ? mx * active / sum : 1.0;
    };
    // The forecast before the step is even (every rank at least the job's peak).
    const double allowed =
        (config_.forecast_peaks ? config_.peak_ratio : std::max(config_.peak_ratio, ratio(nullptr))) *
        (1 + 1e-12);
    if (ratio(&chosen.held) > allowed && floor_cap < memory_cap) {
      // The loosest cap (fastest layouts) in [floor_cap, memory_cap] within
      // the ratio, by bisection; none within it even at floor_cap: the more
      // even of the two ends.
      Candidate tight = plan_at(floor_cap);
      if (ratio(&tight.held) <= allowed) {
        double lo = floor_cap, hi = memory_cap;
        for (int it = 0; it < kPeakRatioBisections; ++it) {
          const double mid = lo + (hi - lo) / 2;
          Candidate c = plan_at(mid);
          if (ratio(&c.held) > allowed) {
            hi = mid;
            continue;
          }
          lo = mid;
          if (c.time < tight.time) tight = std::move(c);
        }
        chosen = std::move(tight);
      } else if (ratio(&tight.held) < ratio(&chosen.held)) {
        chosen = std::move(tight);
      }
    }
  }
  bound_sum_[0] += bounds[0];
  time_sum_[0] += chosen.plan.vision.max_load;
  if (config_.audio_phase) {
    bound_sum_[1] += bounds[1];
    time_sum_[1] += chosen.plan.audio.max_load;
  }
  if (memory_aware_) {
    memory_peak_ = std::max(memory_peak_, MaxOf(chosen.held));
    for (int a = 0; a < active; ++a) {
      if (static_cast<size_t>(ranks[a]) >= rank_peak_.size()) rank_peak_.resize(ranks[a] + 1, 0.0);
      rank_peak_[ranks[a]] = std::max(rank_peak_[ranks[a]], chosen.held[a]);
    }
  }
  return std::move(chosen.plan);
}

}  // namespace odb::balance
