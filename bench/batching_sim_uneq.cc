#include "bench/batching_sim_uneq.h"

#include <algorithm>
#include <memory>
#include <numeric>

#include "bench/window_bound.h"
#include "src/align/planner.h"
#include "src/align/window_balance.h"
#include "src/balance/global_planner.h"

namespace odb::bench {

absl::StatusOr<TracedSchedule> RunOdbTraced(const std::string& policy,
                                            const std::vector<SampleLengths>& arrival, const SimConfig& cfg) {
  if (!TakesWindows(policy)) return absl::InvalidArgumentError("not an odb policy: " + policy);
  if (cfg.partitioned_windows && cfg.window_tokens > 0) {
    return absl::InvalidArgumentError("unequal micro-steps: partitioned windows are not supported");
  }
  TracedSchedule out;
  absl::StatusOr<Schedule> schedule = RunPolicy(policy, arrival, cfg, &out.members);
  if (!schedule.ok()) return schedule.status();
  out.schedule = *std::move(schedule);
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

namespace {

// The window's samples, heaviest first (b-part plus attention; ties: longer first).
std::vector<SampleLengths> AllSamples(const UnequalConfig& config, const WindowLayout& window) {
  std::vector<SampleLengths> all;
  for (const auto& rank : window) {
    for (const auto& s : rank) all.insert(all.end(), s.begin(), s.end());
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const SampleLengths& x, const SampleLengths& y) { return x.tokens > y.tokens; });
  return all;
}

// A first layout of `samples` (longest first) within the budget: runs cut
// where the next sample no longer fits.
std::vector<std::vector<SampleLengths>> Runs(const UnequalConfig& config,
                                             const std::vector<SampleLengths>& samples) {
  std::vector<std::vector<SampleLengths>> runs;
  for (const SampleLengths& l : samples) {
    if (!runs.empty()) {
      runs.back().push_back(l);
      if (Fits(config.budget, runs.back())) continue;
      runs.back().pop_back();
    }
    runs.push_back({l});
  }
  return runs;
}

// Each rank's dealt micro-steps packed (PackRank), with one IDLE micro-step
// more so that the packing may also try one more micro-step.
WindowLayout PackAll(const UnequalConfig& config,
                     std::vector<std::vector<std::vector<SampleLengths>>> dealt) {
  WindowLayout out(dealt.size());
  for (size_t r = 0; r < dealt.size(); ++r) {
    dealt[r].emplace_back();
    out[r] = PackRank(config, dealt[r]);
  }
  return out;
}

// Single moves off the slowest rank with unequal counts: a sample of the
// slowest rank goes into the micro-step of another rank (or a new one there)
// where the larger of the two ranks' sums is smallest, while that lowers the
// slowest rank's sum (a rank whose last sample leaves keeps one IDLE
// micro-step); each changed rank is packed again (PackRank). At most `limit`
// moves.
WindowLayout MoveOffSlowest(const UnequalConfig& config, WindowLayout w, int limit = 4096) {
  const size_t world = w.size();
  std::vector<double> sums(world);
  for (size_t r = 0; r < world; ++r) sums[r] = RankSum(config, w[r]);
  for (int move = 0; move < limit; ++move) {
    const size_t slow = std::max_element(sums.begin(), sums.end()) - sums.begin();
    double best = sums[slow];
    size_t best_i = 0, best_j = 0, best_q = world, best_k = 0;
    for (size_t i = 0; i < w[slow].size(); ++i) {
      const double step_cost = MicroCost(config, w[slow][i]);
      for (size_t j = 0; j < w[slow][i].size(); ++j) {
        std::vector<SampleLengths> rest = w[slow][i];
        const SampleLengths l = rest[j];
        rest.erase(rest.begin() + j);
        // An emptied micro-step is dropped unless it was the rank's only one.
        const double rest_cost = rest.empty() && w[slow].size() > 1 ? 0.0 : MicroCost(config, rest);
        const double slow_after = sums[slow] - step_cost + rest_cost;
        if (slow_after >= best) continue;
        for (size_t q = 0; q < world; ++q) {
          if (q == slow || sums[q] >= best) continue;
          // k == size: a new micro-step; an IDLE-only rank's step is filled.
          for (size_t k = 0; k <= w[q].size(); ++k) {
            std::vector<SampleLengths> to = k < w[q].size() ? w[q][k] : std::vector<SampleLengths>{};
            const double before = k < w[q].size() ? MicroCost(config, to) : 0.0;
            to.push_back(l);
            if (!Fits(config.budget, to)) continue;
            const double q_after = sums[q] - before + MicroCost(config, to);
            const double worst = std::max(slow_after, q_after);
            if (worst < best - 1e-9) {
              best = worst;
              best_i = i, best_j = j, best_q = q, best_k = k;
            }
          }
        }
      }
    }
    if (best_q == world) break;
    const SampleLengths l = w[slow][best_i][best_j];
    w[slow][best_i].erase(w[slow][best_i].begin() + best_j);
    if (w[slow][best_i].empty() && w[slow].size() > 1) w[slow].erase(w[slow].begin() + best_i);
    if (best_k == w[best_q].size()) {
      // A new micro-step, unless the rank's only one is IDLE.
      if (w[best_q].size() == 1 && w[best_q][0].empty()) {
        w[best_q][0].push_back(l);
      } else {
        w[best_q].push_back({l});
      }
    } else {
      w[best_q][best_k].push_back(l);
    }
    for (size_t r : {slow, best_q}) {
      w[r] = PackRank(config, w[r]);
      sums[r] = RankSum(config, w[r]);
    }
  }
  return w;
}

}  // namespace

WindowLayout Redealt(const UnequalConfig& config, const WindowLayout& window, RedealMode mode) {
  const size_t world = window.size();
  const std::vector<SampleLengths> all = AllSamples(config, window);
  WindowLayout best;
  if (mode == RedealMode::kSamples || mode == RedealMode::kBest) {
    // Samples LPT by their weight (longest first is heaviest first: the
    // weight b t + c t^2 grows with t), then each rank's samples in runs.
    auto weight = [&](const SampleLengths& l) {
      const double t = l.tokens;
      return config.model.b * t + config.model.c * t * t;
    };
    std::vector<std::vector<SampleLengths>> dealt(world);
    std::vector<double> load(world, 0.0);
    for (const SampleLengths& l : all) {
      const size_t r = std::min_element(load.begin(), load.end()) - load.begin();
      dealt[r].push_back(l);
      load[r] += weight(l);
    }
    std::vector<std::vector<std::vector<SampleLengths>>> steps(world);
    for (size_t r = 0; r < world; ++r) steps[r] = Runs(config, dealt[r]);
    best = PackAll(config, std::move(steps));
    if (mode == RedealMode::kSamples) return best;
  }
  if (mode == RedealMode::kSteps || mode == RedealMode::kBest) {
    // The window's samples in length-sorted runs within the budget (padded
    // micro-steps of like lengths), the runs dealt LPT by their cost.
    std::vector<std::vector<SampleLengths>> runs = Runs(config, all);
    std::vector<std::vector<std::vector<SampleLengths>>> steps(world);
    std::vector<double> load(world, 0.0);
    for (auto& run : runs) {  // longest first; costs fall roughly with them
      const size_t r = std::min_element(load.begin(), load.end()) - load.begin();
      load[r] += MicroCost(config, run);
      steps[r].push_back(std::move(run));
    }
    WindowLayout by_steps = PackAll(config, std::move(steps));
    if (mode == RedealMode::kSteps) return by_steps;
    if (WindowTimeB(config, by_steps) < WindowTimeB(config, best)) best = std::move(by_steps);
  }
  if (mode == RedealMode::kMoves) return MoveOffSlowest(config, OwnCounts(config, window));
  WindowLayout own = OwnCounts(config, window);
  WindowLayout moved = MoveOffSlowest(config, own);
  if (WindowTimeB(config, moved) < WindowTimeB(config, own)) own = std::move(moved);
  return WindowTimeB(config, best) < WindowTimeB(config, own) ? best : own;
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
    const WindowLayout by_samples = Redealt(config, w, RedealMode::kSamples);
    const WindowLayout by_steps = Redealt(config, w, RedealMode::kSteps);
    const WindowLayout& lpt =
        WindowTimeB(config, by_steps) < WindowTimeB(config, by_samples) ? by_steps : by_samples;
    const WindowLayout moved = MoveOffSlowest(config, own);
    const double moved_t = WindowTimeB(config, moved);
    m.moves_time += std::min(moved_t, WindowTimeB(config, own));
    const double own_t = WindowTimeB(config, own), lpt_t = WindowTimeB(config, lpt);
    const WindowLayout& own_or_moved = moved_t < own_t ? moved : own;
    const double om_t = std::min(moved_t, own_t);
    const WindowLayout& re = lpt_t < om_t ? lpt : own_or_moved;
    ++m.windows;
    m.equal_time += WindowTimeB(config, w);
    m.own_time += own_t;
    m.lpt_time += lpt_t;
    m.redealt_time += std::min(om_t, lpt_t);
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
    // No layout of this window's samples on W ranks, whatever the counts,
    // beats its own bound (T_b,w >= the mean rank's sum >= the window's
    // padded / any-layout optimum over W; and see below).
    std::vector<SampleLengths> samples;
    for (const auto& rank : w) {
      for (const auto& s : rank) samples.insert(samples.end(), s.begin(), s.end());
    }
    if (!samples.empty()) {
      const Bounds b = LowerBounds(samples, config.budget, config.model, static_cast<int>(world));
      // And some rank runs at least ceil(G_min / W) micro-steps (G_min: the
      // bin-packing bound on the window's non-IDLE rank-steps), each >= a.
      const double steps = static_cast<double>((b.min_rank_steps + world - 1) / world);
      double bound = std::max(config.budget.model == grouping::CostModel::kPacked ? b.any_layout : b.padded,
                              steps * config.model.a);
      // Two micro-steps: when one micro-step per rank cannot hold the window
      // (G_min > W), the s >= 1 ranks that run two or more carry all the
      // compute the one-step ranks cannot. A step costs at least a' + b p +
      // c sum l^2 (a' = a + b k; the floor m only adds), so with x = b p +
      // c sum l^2 per step the ranks' x add up to at least X = b R + c Q (R
      // real tokens, Q their squares: padding only adds), a one-step rank's
      // x is at most X1 = b L + c L l_max, and some rank costs >= 2 a' + (X -
      // (W - s) X1) / s, whose least over s in [1, W] is at s = W when X >=
      // W X1 and at s = 1 otherwise.
      if (b.min_rank_steps > world) {
        double real = 0, sq = 0, longest = 0;
        for (const SampleLengths& l : samples) {
          real += l.tokens;
          sq += static_cast<double>(l.tokens) * l.tokens;
          longest = std::max(longest, static_cast<double>(l.tokens));
        }
        const double a1 = config.model.a + config.model.b * config.model.k;
        const double x = config.model.b * real + config.model.c * sq;
        const double l_max = static_cast<double>(config.budget.max_tokens);
        const double x1 = config.model.b * l_max + config.model.c * l_max * longest;
        const double w_ranks = static_cast<double>(world);
        const double rest = x >= w_ranks * x1 ? x / w_ranks : x - (w_ranks - 1) * x1;
        bound = std::max(bound, 2 * a1 + std::max(0.0, rest));
      }
      m.per_window_bound += bound;
      // Equal counts (the daemon's): the schedule as planned is one such
      // layout, so it is never below the bound.
      const double equal = std::max(
          bound, EqualCountsWindowBound(samples, config.budget, config.model, static_cast<int>(world)).bound);
      m.equal_counts_bound += equal;
      m.equal_counts_violations += equal > WindowTimeB(config, w) * (1 + 1e-9);
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
