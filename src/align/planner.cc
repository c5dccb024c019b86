#include "src/align/planner.h"

#include <algorithm>
#include <optional>
#include <cassert>
#include <limits>
#include <numeric>
#include <span>
#include <string>

#include "src/align/planned_groups.h"
#include "src/align/window.h"
#include "src/grouping/grouper.h"

namespace odb::align {

const char* EpochModeName(EpochMode mode) {
  switch (mode) {
    case EpochMode::kJoin:
      return "every_sample";
    case EpochMode::kNonJoin:
      return "first_dry";
  }
  return "unknown";
}

uint64_t MixSeed(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::vector<grouping::Group> PlannerGroups(const PlannerConfig& config, std::span<const SampleLengths> lens,
                                           uint64_t epoch, uint64_t round, uint64_t salt) {
  if (!config.mix_lengths) return grouping::FormGroups(lens, config.budget, config.step_model);
  const uint64_t seed = MixSeed(MixSeed(config.seed, epoch), MixSeed(round, MixSeed(salt, 0x6d1c5ULL)));
  return grouping::FormMixedGroups(lens, config.budget, seed);
}

void AssignLossWeights(RoundPlan& plan) {
  const size_t world = plan.ranks.size();
  for (uint32_t k = 0; k < plan.num_steps; ++k) {
    uint64_t total = 0;
    for (RankPlan& rp : plan.ranks) {
      PlannedStep& s = rp.steps[k];
      s.loss_tokens = 0;
      for (const SampleMeta& m : s.samples) s.loss_tokens += LossTokensOf(m);
      total += s.loss_tokens;
    }
    for (RankPlan& rp : plan.ranks) {
      PlannedStep& s = rp.steps[k];
      s.window_loss_tokens = total;
      s.loss_weight = (total == 0 || s.idle)
                          ? 0.0
                          : static_cast<double>(world) * static_cast<double>(s.loss_tokens) /
                                static_cast<double>(total);
    }
  }
}

namespace {

// A group under construction: indices into the rank's window.
struct WorkGroup {
  std::vector<size_t> members;
  bool over_budget = false;
};

// Splits the largest group in two (shorter half / longer half, which keeps
// the budget: any subset of a fitting group fits). Precondition: some group
// has >= 2 members.
void SplitLargest(const PlannerConfig& cfg, const std::vector<SampleMeta>& window,
                  std::vector<WorkGroup>& groups) {
  size_t best = groups.size();
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].members.size() < 2) continue;
    if (best == groups.size()) {
      best = i;
      continue;
    }
    const auto& a = groups[i].members;
    const auto& b = groups[best].members;
    if (a.size() != b.size()) {
      if (a.size() > b.size()) best = i;
      continue;
    }
    const uint64_t pa = PaddedOf(cfg.budget.model, window, a), pb = PaddedOf(cfg.budget.model, window, b);
    if (pa != pb) {
      if (pa > pb) best = i;
      continue;
    }
    if (MinKey(window, a) < MinKey(window, b)) best = i;
  }
  assert(best < groups.size() && "SplitLargest needs a group of >= 2 samples");
  std::vector<size_t> m = std::move(groups[best].members);
  std::sort(m.begin(), m.end(), [&](size_t x, size_t y) {
    const uint32_t lx = window[x].lengths.tokens, ly = window[y].lengths.tokens;
    if (lx != ly) return lx < ly;
    return KeyOf(window[x]) < KeyOf(window[y]);
  });
  const size_t half = m.size() / 2;
  groups[best].members.assign(m.begin(), m.begin() + half);
  groups[best].over_budget = false;
  groups.push_back(WorkGroup{std::vector<size_t>(m.begin() + half, m.end()), false});
}

}  // namespace

void KeepEverything(const RoundState& state, RoundPlan& plan) {
  for (size_t r = 0; r < state.ranks.size(); ++r) {
    for (const SampleMeta& m : state.ranks[r].pending) plan.ranks[r].keep_pending.push_back(KeyOf(m));
  }
}

RankSummary SummaryOf(const RankRound& round, double group_bound) {
  RankSummary s;
  s.pending = round.pending.size();
  s.free_slots = round.free_slots;
  s.stream_finished = round.stream_finished;
  s.stream_started = round.stream_started;
  s.wait_rounds = round.wait_rounds;
  s.wait_expired = round.wait_expired;
  s.input_blocked = round.input_blocked;
  s.group_bound = group_bound;
  return s;
}

RoundPlan Planner::PlanBlock(const BlockRoundState& block) const {
  // A planner without partitioning plans the block as if it were the world
  // (never reached: BlockRanks is the world for such planners).
  RoundState state;
  state.epoch = block.epoch;
  state.round = block.round;
  state.first_step = block.first_step;
  state.ranks = block.ranks;
  RoundPlan part = Plan(state);
  RoundPlan plan = part;
  plan.ranks.assign(block.summaries.size(), RankPlan{});
  for (size_t i = 0; i < part.ranks.size(); ++i) plan.ranks[block.begin + i] = std::move(part.ranks[i]);
  return plan;
}

std::optional<RoundPlan> ApplyRoundGates(const PlannerConfig& config, const RoundState& state,
                                         uint32_t& min_free) {
  std::vector<RankSummary> summaries;
  summaries.reserve(state.ranks.size());
  for (const RankRound& rr : state.ranks) summaries.push_back(SummaryOf(rr, 0.0));
  std::optional<RoundPlan> plan = ApplyRoundGates(config, summaries, min_free);
  if (plan) FillGatedLists(config, state.ranks, 0, *plan);
  return plan;
}

void FillGatedLists(const PlannerConfig& config, std::span<const RankRound> ranks, int32_t begin,
                    RoundPlan& plan) {
  const bool closure = config.mode == EpochMode::kNonJoin && plan.epoch_finished;
  for (size_t i = 0; i < ranks.size(); ++i) {
    RankPlan& rp = plan.ranks[begin + i];
    for (const SampleMeta& m : ranks[i].pending) (closure ? rp.not_emitted : rp.keep_pending).push_back(KeyOf(m));
  }
}

std::optional<RoundPlan> ApplyRoundGates(const PlannerConfig& config, std::span<const RankSummary> ranks,
                                         uint32_t& min_free) {
  const size_t world = ranks.size();
  RoundPlan plan;
  plan.ranks.resize(world);
  // End of epoch.
  size_t drained_count = 0;
  int first_drained = -1;
  for (size_t r = 0; r < world; ++r) {
    const RankSummary& rr = ranks[r];
    if (rr.stream_finished && rr.pending == 0) {
      ++drained_count;
      if (first_drained < 0) first_drained = static_cast<int>(r);
    }
  }
  if (config.mode == EpochMode::kNonJoin && drained_count > 0) {
    plan.epoch_finished = true;
    plan.reason = "non-join closure: rank " + std::to_string(first_drained) +
                  " finished its stream and holds nothing";
    return std::optional<RoundPlan>(std::move(plan));
  }
  if (drained_count == world) {
    plan.epoch_finished = true;
    plan.reason = "join: every rank finished and nothing is pending";
    return std::optional<RoundPlan>(std::move(plan));
  }

  // Bounded wait: a rank with a thin window and an open stream may hold the
  // round back, at most max_wait_rounds consecutive rounds.
  const size_t window_cap = config.window == 0 ? std::numeric_limits<size_t>::max() : config.window;
  for (size_t r = 0; r < world; ++r) {
    const RankSummary& rr = ranks[r];
    // Deterministic: wait, however long, until the window is full and one
    // more sample shows it is not the remainder (or the stream finished).
    const bool asks = config.deterministic
                          ? !rr.stream_finished && rr.pending <= window_cap
                          : config.max_wait_rounds > 0 && !rr.stream_finished &&
                                rr.pending < window_cap && !rr.wait_expired &&
                                (rr.wait_rounds < config.max_wait_rounds || !rr.stream_started);
    if (asks) {
      plan.ranks[r].waited = true;
      plan.waiting = true;
    }
  }
  if (plan.waiting) {
    plan.reason = "waiting for samples:";
    for (size_t r = 0; r < world; ++r) {
      if (!plan.ranks[r].waited) continue;
      plan.reason += " rank " + std::to_string(r);
      if (!ranks[r].stream_started) plan.reason += " (nothing of the epoch arrived there yet)";
    }
    return std::optional<RoundPlan>(std::move(plan));
  }

  min_free = std::numeric_limits<uint32_t>::max();
  size_t min_free_rank = 0;
  for (size_t r = 0; r < world; ++r) {
    if (ranks[r].free_slots < min_free) {
      min_free = ranks[r].free_slots;
      min_free_rank = r;
    }
  }
  if (min_free < std::max<uint32_t>(config.min_free_slots, 1)) {
    plan.reason = "rank " + std::to_string(min_free_rank) + " has " + std::to_string(min_free) +
                  " free output slots (a round waits for " + std::to_string(std::max<uint32_t>(config.min_free_slots, 1)) +
                  ")";
    return std::optional<RoundPlan>(std::move(plan));
  }
  // Deterministic: the credit only delays a round; how many steps it plans
  // must not depend on how far the trainer got.
  if (config.deterministic || config.full_rounds) {
    min_free = static_cast<uint32_t>(std::min<size_t>(window_cap, UINT32_MAX));
  }

  return std::nullopt;
}

RoundPlan LocalPlanner::Plan(const RoundState& state) const {
  const size_t world = state.ranks.size();
  RoundPlan plan;
  plan.ranks.resize(world);

  uint32_t min_free = 0;
  if (auto gated = ApplyRoundGates(config_, state, min_free)) return std::move(*gated);
  const size_t window_cap = config_.window == 0 ? std::numeric_limits<size_t>::max() : config_.window;

  // Local grouping on each rank's window.
  std::vector<std::vector<SampleMeta>> windows(world);
  std::vector<std::vector<WorkGroup>> groups(world);
  size_t max_groups = 0, min_samples = std::numeric_limits<size_t>::max();
  for (size_t r = 0; r < world; ++r) {
    const auto& pending = state.ranks[r].pending;
    const size_t n = std::min(pending.size(), window_cap);
    windows[r].assign(pending.begin(), pending.begin() + n);
    if (n == 0) continue;
    std::vector<SampleLengths> lens;
    lens.reserve(n);
    for (const SampleMeta& m : windows[r]) {
      assert(m.lengths.tokens > 0 && "length-0 samples must be rejected before alignment");
      lens.push_back(m.lengths);
    }
    for (grouping::Group& g : PlannerGroups(config_, lens, state.epoch, state.round, r)) {
      groups[r].push_back(WorkGroup{std::move(g.members), g.over_budget});
    }
    max_groups = std::max(max_groups, groups[r].size());
    // Under Join only a rank that may still receive samples caps T by its
    // window: one whose stream ended has all it will ever have, and capping T
    // by its last few samples would plan the same few steps round after round
    // (a fixed point that holds an accumulation window open until it closes
    // short mid-epoch, and holds everyone else back); it idles once they run
    // out. Non-Join ends the epoch with that rank's last sample: no IDLE step.
    if (config_.mode != EpochMode::kJoin || !state.ranks[r].stream_finished) min_samples = std::min(min_samples, n);
  }
  if (max_groups == 0) {
    plan.reason = "no rank has pending samples";
    KeepEverything(state, plan);
    return plan;
  }
  const size_t t = std::min<size_t>({min_free, max_groups, min_samples});
  plan.num_steps = static_cast<uint32_t>(t);
  plan.reason = "T=min(free=" + std::to_string(min_free) + ", max groups=" + std::to_string(max_groups) +
                ", min samples of open streams=" +
                (min_samples == std::numeric_limits<size_t>::max() ? std::string("none") : std::to_string(min_samples)) + ")";

  for (size_t r = 0; r < world; ++r) {
    RankPlan& rp = plan.ranks[r];
    const auto& window = windows[r];
    auto& gs = groups[r];
    std::vector<bool> emitted(window.size(), false);
    if (gs.size() > t) {
      SortByFill(config_.budget.model, window, gs,
                 [](const WorkGroup& g) { return std::span<const size_t>(g.members); });
      gs.resize(t);
    }
    // Split down to single samples at most (a finished rank may have fewer
    // samples than T: its other steps are IDLE).
    while (!gs.empty() && gs.size() < t && gs.size() < window.size()) SplitLargest(config_, window, gs);
    // Every rank's groups sorted by step time, then placed through the SAME
    // seeded permutation of step slots: the k-th costliest group of every rank
    // lands in one step, so the ranks of a step cost alike (a step costs its
    // slowest rank), while the order of steps is still a seeded shuffle, never
    // length order. Ranks with fewer groups idle in the cheapest positions.
    std::vector<std::pair<double, size_t>> by_cost;
    by_cost.reserve(gs.size());
    for (size_t g = 0; g < gs.size(); ++g) {
      std::vector<SampleLengths> lens;
      for (size_t i : gs[g].members) lens.push_back(window[i].lengths);
      by_cost.emplace_back(grouping::StepTime(config_.step_model, config_.budget.model, lens), g);
    }
    std::sort(by_cost.begin(), by_cost.end(), [&](const auto& a, const auto& b) {
      if (a.first != b.first) return a.first > b.first;
      return KeyOf(window[gs[a.second].members.front()]) < KeyOf(window[gs[b.second].members.front()]);
    });
    std::vector<grouping::Group> slots(t);
    for (size_t k = 0; k < t; ++k) slots[k].members = {k};
    grouping::ShuffleGroups(slots, MixSeed(MixSeed(config_.seed, state.epoch), state.round));
    rp.steps.assign(t, PlannedStep{});  // IDLE unless filled below
    // A finished rank with fewer samples than T (Join, see above) takes the
    // round's first steps and idles after them: it is then done as early as
    // it can be (a `join` trainer leaves the loop after its last sample, and
    // IDLE steps before that would be dummy steps it must run).
    const bool idles_last = state.ranks[r].stream_finished && gs.size() < t;
    for (size_t k = 0; k < t; ++k) {
      const size_t position = idles_last ? k : slots[k].members.front();
      if (position >= by_cost.size()) continue;
      const WorkGroup& g = gs[by_cost[position].second];
      rp.steps[k] = MakeStep(config_.budget.model, window, g.members, g.over_budget);
      for (size_t i : g.members) emitted[i] = true;
    }
    for (size_t i = 0; i < window.size(); ++i) {
      if (!emitted[i]) rp.keep_pending.push_back(KeyOf(window[i]));
    }
    const auto& pending = state.ranks[r].pending;
    for (size_t i = window.size(); i < pending.size(); ++i) rp.keep_pending.push_back(KeyOf(pending[i]));
  }
  AssignLossWeights(plan);
  return plan;
}

}  // namespace odb::align
