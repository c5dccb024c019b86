#include "bench/batching_sim_uneq.h"

#include <algorithm>
#include <memory>
#include <numeric>

#include "src/align/planner.h"
#include "src/align/window_balance.h"
#include "src/balance/global_planner.h"

namespace odb::bench {

absl::StatusOr<TracedSchedule> RunOdbTraced(const std::string& policy, const std::vector<SampleLengths>& arrival,
                                            const SimConfig& cfg) {
  absl::StatusOr<PolicySpec> parsed = ParsePolicy(policy);
  if (!parsed.ok()) return parsed.status();
  const PolicySpec& spec = *parsed;
  if (!TakesWindows(policy)) return absl::InvalidArgumentError("not an odb policy: " + policy);
  if (cfg.partitioned_windows && cfg.window_tokens > 0) {
    return absl::InvalidArgumentError("unequal micro-steps: partitioned windows are not supported");
  }
  // From here to the end of the loop: bench/policies.cc RunOdb (its loop, the
  // partitioned windows left out), with each step's samples recorded.
  const int world = cfg.world;
  const uint32_t window = spec.window ? spec.window : cfg.window;
  align::PlannerConfig pc;
  pc.budget = cfg.budget;
  if (spec.packed) pc.budget.model = grouping::CostModel::kPacked;
  pc.step_model = cfg.model.PlannerModel();
  pc.mode = align::EpochMode::kJoin;
  pc.seed = cfg.seed;
  pc.window = window;
  pc.deterministic = spec.deterministic;
  pc.full_rounds = spec.full_rounds;
  pc.mix_lengths = spec.mix_groups;
  pc.mix_steps = spec.mix_steps;
  pc.window_spread = cfg.window_spread;
  std::unique_ptr<align::Planner> planner;
  if (spec.global) {
    balance::GlobalPlannerConfig g;
    g.base = pc;
    g.locality = 0.0;
    g.partition_ranks = cfg.partition_ranks;
    planner = std::make_unique<balance::GlobalPlanner>(g);
  } else {
    planner = std::make_unique<align::LocalPlanner>(pc);
  }
  const uint32_t queue = spec.queue_steps == 0 ? (1u << 20) : spec.queue_steps;
  uint32_t free_slots = queue;
  std::vector<std::vector<SampleMeta>> shares(world);
  for (size_t i = 0; i < arrival.size(); ++i) {
    const int r = static_cast<int>(i % world);
    SampleMeta m;
    m.id = i;
    m.owner_rank = r;
    m.lengths = arrival[i];
    shares[r].push_back(m);
  }
  std::vector<size_t> next(world, 0);
  std::vector<std::vector<SampleMeta>> pending(world);
  uint32_t wait_rounds = 0;
  uint64_t first_step = 0, idle_rounds = 0;
  align::WindowState windows;
  TracedSchedule out;
  for (uint64_t round = 0;; ++round) {
    align::RoundState state;
    state.epoch = 0;
    state.round = round;
    state.first_step = first_step;
    state.ranks.resize(world);
    for (int r = 0; r < world; ++r) {
      const size_t fill = spec.deterministic ? window + 1 : window;
      while (pending[r].size() < fill && next[r] < shares[r].size()) pending[r].push_back(shares[r][next[r]++]);
      align::RankRound& rr = state.ranks[r];
      rr.pending = pending[r];
      rr.free_slots = free_slots;
      rr.stream_finished = next[r] == shares[r].size() && (!spec.deterministic || pending[r].size() <= window);
      rr.wait_rounds = wait_rounds;
    }
    align::RoundPlan plan = planner->Plan(state);
    const uint32_t planned = plan.num_steps;
    if (absl::Status s = ApplyRoundWindows(cfg.window_tokens, *planner, cfg.window_balance, state, plan, windows);
        !s.ok()) {
      return s;
    }
    AppendRoundSteps(plan, world, &out.schedule);
    for (uint32_t k = 0; k < plan.num_steps; ++k) {
      std::vector<std::vector<SampleLengths>> step(world);
      for (int r = 0; r < world; ++r) {
        for (const SampleMeta& m : plan.ranks[r].steps[k].samples) step[r].push_back(m.lengths);
      }
      out.members.push_back(std::move(step));
    }
    first_step += plan.num_steps;
    if (plan.epoch_finished) break;
    if (spec.paced > 0 && spec.queue_steps != 0) {
      const uint32_t fire_at = queue - std::min(queue, spec.paced);
      uint32_t queued = std::min({queue, queue - free_slots + plan.num_steps, fire_at});
      if (planned > 0 && plan.num_steps == 0 && queued > 0) --queued;
      free_slots = queue - queued;
    }
    KeepPending(plan, &pending);
    wait_rounds = plan.waiting ? wait_rounds + 1 : 0;
    idle_rounds = plan.num_steps == 0 ? idle_rounds + 1 : 0;
    if (idle_rounds > 1000) {
      return absl::InternalError("odb simulation made no progress for 1000 rounds: " + plan.reason);
    }
  }
  return out;
}

double MicroCost(const UnequalConfig& config, const std::vector<SampleLengths>& members) {
  if (members.empty()) return config.model.a;
  double sum_sq = 0.0;
  for (const SampleLengths& m : members) sum_sq += static_cast<double>(m.tokens) * m.tokens;
  return config.model.Step(static_cast<double>(grouping::PaddedTokens(config.budget.model, members)), sum_sq);
}

double RankSum(const UnequalConfig& config, const std::vector<std::vector<SampleLengths>>& micro_steps) {
  double sum = 0.0;
  for (const auto& s : micro_steps) sum += MicroCost(config, s);
  return sum;
}

double WindowTimeB(const UnequalConfig& config, const WindowLayout& window) {
  double worst = 0.0;
  for (const auto& rank : window) worst = std::max(worst, RankSum(config, rank));
  return worst;
}

namespace {

// A rank's non-IDLE micro-steps (at least one: an IDLE one if it has no samples).
std::vector<std::vector<SampleLengths>> Busy(const std::vector<std::vector<SampleLengths>>& micro_steps) {
  std::vector<std::vector<SampleLengths>> busy;
  for (const auto& s : micro_steps) {
    if (!s.empty()) busy.push_back(s);
  }
  if (busy.empty()) busy.emplace_back();
  return busy;
}

// Packs one rank's micro-steps the cheapest way the window balance finds
// (align::BalanceWindow on a one-rank window: micro-step counts from the
// budget's fewest up to the input's own); kept only when it is no costlier
// under the simulator's model than the input without its IDLE micro-steps.
std::vector<std::vector<SampleLengths>> PackRank(const UnequalConfig& config,
                                                 const std::vector<std::vector<SampleLengths>>& micro_steps) {
  std::vector<std::vector<SampleLengths>> busy = Busy(micro_steps);
  if (busy.size() == 1 && busy[0].size() <= 1) return busy;
  align::WindowBalanceConfig wb{config.budget, config.model.PlannerModel()};
  std::vector<align::GlobalStep> window;
  uint64_t id = 0;
  for (const auto& s : micro_steps) {
    align::PlannedStep ps;
    if (!s.empty()) {
      ps.idle = false;
      for (const SampleLengths& l : s) {
        SampleMeta m;
        m.id = id++;
        m.lengths = l;
        ps.samples.push_back(m);
        ps.real_tokens += l.tokens;
      }
      ps.padded_tokens = grouping::PaddedTokens(config.budget.model, s);
      ps.over_budget = ps.padded_tokens > config.budget.max_tokens;
    }
    window.push_back(align::GlobalStep{std::move(ps)});
  }
  align::BalanceWindow(wb, window);
  std::vector<std::vector<SampleLengths>> packed;
  for (const align::GlobalStep& g : window) {
    std::vector<SampleLengths> s;
    for (const SampleMeta& m : g[0].samples) s.push_back(m.lengths);
    packed.push_back(std::move(s));
  }
  packed = Busy(packed);
  return RankSum(config, packed) <= RankSum(config, busy) ? packed : busy;
}

bool Fits(const grouping::Budget& budget, const std::vector<SampleLengths>& members) {
  if (budget.max_group_size != 0 && members.size() > budget.max_group_size) return false;
  return grouping::PaddedTokens(budget.model, members) <= budget.max_tokens;
}

bool CountsDiffer(const WindowLayout& w) {
  for (const auto& rank : w) {
    if (rank.size() != w[0].size()) return true;
  }
  return false;
}

}  // namespace

WindowLayout OwnCounts(const UnequalConfig& config, const WindowLayout& window) {
  WindowLayout out;
  out.reserve(window.size());
  for (const auto& rank : window) out.push_back(PackRank(config, rank));
  return out;
}

WindowLayout Redealt(const UnequalConfig& config, const WindowLayout& window, bool lpt_only) {
  std::vector<SampleLengths> all;
  for (const auto& rank : window) {
    for (const auto& s : rank) all.insert(all.end(), s.begin(), s.end());
  }
  auto weight = [&](const SampleLengths& l) {
    const double t = l.tokens;
    return config.model.b * t + config.model.c * t * t;
  };
  std::stable_sort(all.begin(), all.end(), [&](const SampleLengths& x, const SampleLengths& y) {
    return weight(x) > weight(y) || (weight(x) == weight(y) && x.tokens > y.tokens);
  });
  const size_t world = window.size();
  std::vector<std::vector<SampleLengths>> dealt(world);
  std::vector<double> load(world, 0.0);
  for (const SampleLengths& l : all) {
    const size_t r = std::min_element(load.begin(), load.end()) - load.begin();
    dealt[r].push_back(l);
    load[r] += weight(l);
  }
  WindowLayout lpt(world);
  for (size_t r = 0; r < world; ++r) {
    // A first layout within the budget (each rank's samples longest first,
    // cut where the next one no longer fits), one IDLE micro-step more so
    // that the packing may also try one more micro-step; then PackRank.
    std::vector<std::vector<SampleLengths>> start(1);
    for (const SampleLengths& l : dealt[r]) {
      start.back().push_back(l);
      if (!Fits(config.budget, start.back()) && start.back().size() > 1) {
        start.back().pop_back();
        start.push_back({l});
      }
    }
    start.emplace_back();
    lpt[r] = PackRank(config, start);
  }
  if (lpt_only) return lpt;
  WindowLayout own = OwnCounts(config, window);
  return WindowTimeB(config, lpt) < WindowTimeB(config, own) ? lpt : own;
}

UnequalMetrics EvaluateUnequal(const TracedSchedule& traced, const UnequalConfig& config) {
  UnequalMetrics m;
  const Schedule& sched = traced.schedule;
  size_t begin = 0;
  auto tally = [&](int which, const WindowLayout& w) {
    for (const auto& rank : w) {
      for (const auto& s : rank) {
        m.samples[which] += s.size();
        for (const SampleLengths& l : s) {
          m.tokens[which] += l.tokens;
          m.sum_sq[which] += static_cast<double>(l.tokens) * l.tokens;
        }
      }
    }
  };
  auto close = [&](size_t end) {
    if (end == begin) return;
    const size_t world = sched[begin].size();
    WindowLayout w(world);
    for (size_t k = begin; k < end; ++k) {
      for (size_t r = 0; r < world; ++r) w[r].push_back(traced.members[k][r]);
    }
    const WindowLayout own = OwnCounts(config, w);
    const WindowLayout lpt = Redealt(config, w, /*lpt_only=*/true);
    const double own_t = WindowTimeB(config, own), lpt_t = WindowTimeB(config, lpt);
    const WindowLayout& re = lpt_t < own_t ? lpt : own;
    ++m.windows;
    m.equal_time += WindowTimeB(config, w);
    m.own_time += own_t;
    m.lpt_time += lpt_t;
    m.redealt_time += std::min(own_t, lpt_t);
    m.own_differ += CountsDiffer(own);
    m.redealt_differ += CountsDiffer(re);
    m.equal_rank_steps += world * (end - begin);
    for (const auto& rank : own) {
      m.own_rank_steps += rank.size();
      m.own_idle_rank_steps += rank.size() == 1 && rank[0].empty();
    }
    for (const auto& rank : re) {
      m.redealt_rank_steps += rank.size();
      m.redealt_idle_rank_steps += rank.size() == 1 && rank[0].empty();
    }
    tally(0, w);
    tally(1, own);
    tally(2, re);
    begin = end;
  };
  for (size_t k = 0; k < sched.size(); ++k) {
    if (sched[k].empty() || sched[k][0].closes_window) close(k + 1);
  }
  close(sched.size());
  return m;
}

}  // namespace odb::bench
