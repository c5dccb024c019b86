// batching_sim: batching-policy simulator. Runs every policy of
// bench/policies.h on length traces (generated presets and trace files) for W
// data-parallel ranks under a step-time model, and prints per trace x policy
// the simulated samples/s, the ratio to Standard, the fraction of the lower
// bounds (bench/bound.h: no schedule beats them), padding, steps, IDLE and
// over-budget rank-steps and the max/mean rank cost. With --window-tokens the
// odb policies also run with accumulation windows (the daemon's
// align::ApplyWindows on every round's plan), and a second table per trace
// gives their fraction of the bounds under both time models (every
// micro-step synchronised, or only each window's last), IDLE rank-steps and
// the windows' size over the target. --partition-ranks P plans the global odb
// policies in blocks of P ranks; --partitioned-windows then cuts and balances
// their windows as a partitioned daemon does (align::PartitionedWindows,
// align::BalanceBlockWindows; bench/policies.h ApplyRoundPartitionedWindows)
// instead of over the whole plan. See docs/benchmarks.md.
//
//   bazel build -c opt //bench:batching_sim
//   bazel-bin/bench/batching_sim --model cpu_calibrated --world 8
//       --traces chat_longtail,image_text,high_variance,production_mix,bench/traces/debian_docs.txt
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/batching_sim_uneq.h"
#include "bench/policies.h"
#include "bench/trace.h"

namespace odb::bench {
namespace {

struct Options {
  std::string traces = "chat_longtail,image_text,high_variance,production_mix";
  std::string policies;  // empty = all
  size_t samples = 20000;
  int world = 8;
  uint32_t max_tokens = 4096;
  uint32_t window = 256;
  std::string models_file = "bench/step_models.yaml";
  std::string model = "cpu_calibrated";
  uint64_t seed = 1;
  std::string window_tokens = "0";  // comma list of window targets (WindowTarget spellings)
  bool no_window_balance = false;
  double window_spread = align::PlannerConfig{}.window_spread;
  uint32_t partition_ranks = 0;      // --partition-ranks: blocks of the global odb policies
  bool partitioned_windows = false;  // --partitioned-windows: windows as a partitioned daemon cuts them
  bool unequal_microsteps = false;   // --unequal-microsteps: windowed runs re-evaluated with own counts
  std::string csv, md, steps_csv, stats_csv, ranks_csv, save_traces_dir;
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

absl::StatusOr<StepModel> LoadModel(const std::string& path, const std::string& name) {
  try {
    YAML::Node root = YAML::LoadFile(path);
    YAML::Node node = root[name];
    if (!node) return absl::NotFoundError("step model '" + name + "' not in " + path);
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      if (key != "a" && key != "b" && key != "c" && key != "k" && key != "m") {
        return absl::InvalidArgumentError(path + ": model '" + name + "': unknown key '" + key + "'");
      }
    }
    StepModel m;
    m.a = node["a"].as<double>();
    m.b = node["b"].as<double>();
    m.c = node["c"].as<double>();
    m.k = node["k"] ? node["k"].as<double>() : 0.0;
    m.m = node["m"] ? node["m"].as<double>() : 0.0;
    for (double v : {m.a, m.b, m.c, m.k, m.m}) {
      // The bounds need a non-negative, non-decreasing, convex cost.
      if (!(v >= 0.0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(path + ": model '" + name +
                                          "': a, b, c, k, m must be finite and >= 0");
      }
    }
    return m;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(path + ": " + e.what());
  }
}

std::string Describe(const StepModel& m) {
  std::ostringstream out;
  out << "cost(rank step) = " << m.a << " + ";
  if (m.m > 0) out << "max(" << m.m << ", ";
  out << m.b << " * " << (m.k > 0 ? "(padded_tokens + " : "padded_tokens");
  if (m.k > 0) out << m.k << ")";
  if (m.m > 0) out << ")";
  out << " + " << m.c << " * sum(len^2)";
  return out.str();
}

int Main(const Options& o) {
  auto model = LoadModel(o.models_file, o.model);
  if (!model.ok()) {
    std::fprintf(stderr, "batching_sim: %s\n", std::string(model.status().message()).c_str());
    return 2;
  }
  SimConfig cfg;
  cfg.world = o.world;
  cfg.budget.max_tokens = o.max_tokens;
  cfg.model = *model;
  cfg.window = o.window;
  cfg.seed = o.seed;
  cfg.window_balance = !o.no_window_balance;
  cfg.window_spread = o.window_spread;
  cfg.partition_ranks = o.partition_ranks;
  cfg.partitioned_windows = o.partitioned_windows;
  // Every policy runs without windows (the first table); the odb policies
  // again with each window target given.
  std::vector<WindowTarget> targets;
  for (const std::string& t : Split(o.window_tokens)) {
    absl::StatusOr<WindowTarget> target = ParseWindowTarget(t);
    if (!target.ok()) {
      std::fprintf(stderr, "batching_sim: --window-tokens: %s\n",
                   std::string(target.status().message()).c_str());
      return 2;
    }
    if (!target->off()) targets.push_back(*target);
  }
  std::vector<std::string> policies;
  for (const std::string& p : o.policies.empty() ? PolicyNames(o.window) : Split(o.policies)) {
    absl::StatusOr<PolicySpec> spec = ParsePolicy(p);
    if (!spec.ok()) {
      std::fprintf(stderr, "batching_sim: %s\n", std::string(spec.status().message()).c_str());
      return 2;
    }
    policies.push_back(spec->Name(cfg));
  }

  std::FILE* csv = o.csv.empty() ? nullptr : std::fopen(o.csv.c_str(), "w");
  std::FILE* steps_csv = o.steps_csv.empty() ? nullptr : std::fopen(o.steps_csv.c_str(), "w");
  std::FILE* stats_csv = o.stats_csv.empty() ? nullptr : std::fopen(o.stats_csv.c_str(), "w");
  std::FILE* ranks_csv = o.ranks_csv.empty() ? nullptr : std::fopen(o.ranks_csv.c_str(), "w");
  if (csv) {
    std::fprintf(
        csv,
        "trace,policy,world,model,samples,steps,idle_rank_steps,over_budget_rank_steps,padding_fraction,"
        "sim_seconds,samples_per_s,vs_standard,of_bound,of_padded_bound,max_over_mean,bound_seconds,"
        "padded_bound_seconds,batch_size,p99_batch_size,largest_sample_bound_seconds,of_largest_sample_"
        "bound,window_target,window_tokens,window_seconds,of_bound_window,of_padded_bound_window,windows,"
        "short_windows,mean_window_over_target,max_window_over_target,idle_share,window_bound_seconds,"
        "window_bound_window_seconds,of_window_bound,of_window_bound_window,window_balance,partition_ranks,"
        "partitioned_windows,windows_under_90,uneq_equal_seconds,uneq_own_seconds,uneq_redealt_seconds,"
        "uneq_lpt_seconds,uneq_own_differ,uneq_redealt_differ,uneq_equal_rank_steps,uneq_own_rank_steps,"
        "uneq_redealt_rank_steps,uneq_own_idle,uneq_redealt_idle,uneq_moves_seconds,"
        "uneq_per_window_bound_seconds,uneq_equal_counts_bound_seconds,window_sd_over_random\n");
  }
  if (steps_csv) std::fprintf(steps_csv, "trace,policy,step,cost\n");
  if (ranks_csv)
    std::fprintf(ranks_csv,
                 "trace,policy,window_tokens,step,rank,samples,real_tokens,padded_tokens,sum_len_sq,cost,"
                 "closes_window\n");
  if (stats_csv)
    std::fprintf(stats_csv,
                 "trace,n,mean,cv,p50,p90,p99,max,short_fraction,vision_fraction,truncated,source\n");

  std::ostringstream md;
  md << "Model `" << o.model << "`: " << Describe(cfg.model) << "; IDLE rank step = " << cfg.model.a
     << "; W = " << o.world << " ranks, L_max = " << o.max_tokens << " (padded budget), window = " << o.window
     << ", seed " << o.seed;
  if (o.partition_ranks > 0) md << "; global odb policies in blocks of " << o.partition_ranks << " ranks";
  md << ".\n\n"
     << "`of bound` = bound / time, the bound no schedule beats (any layout); `of padded bound` = the exact "
        "single-rank padded optimum / W over time, which no padded schedule beats (n/a: packing computes on "
        "rows, and a schedule over budget is outside both bounds). docs/benchmarks.md has the proofs.\n\n";
  if (!targets.empty()) {
    md << "Accumulation windows (`--window-tokens " << o.window_tokens
       << "`): the odb policies again with `optimizer.tokens_per_step` = each target (loss tokens over all "
          "ranks; `Ns` = N x the trace's mean sample, `Nm` = N x W x L_max), "
       << (cfg.partitioned_windows
               ? "cut as a partitioned daemon cuts them (--partitioned-windows: align::PartitionedWindows "
                 "from "
                 "the world-wide step totals, then align::BalanceBlockWindows in each block unless "
                 "--no-window-balance)"
           : cfg.window_balance ? "cut by the daemon's align::ApplyWindows, with balance over the window for "
                                  "the global planner "
                                  "(as the daemon runs it)"
                                : "cut by the daemon's align::ApplyWindows, without balance over the window "
                                  "(--no-window-balance: the cut alone)")
       << ". (a) = every micro-step synchronised (sum over micro-steps of the slowest "
          "rank, FSDP/ZeRO), (b) = only a window's last micro-step (sum over windows of the slowest rank's "
          "summed cost, DDP no_sync). Both are bounded by the same bounds: windows only constrain a "
          "schedule. Window ends: `optimizer.window_spread` "
       << cfg.window_spread << " (0: the nearest ends).\n\n";
  }
  std::ostringstream stats_md;
  stats_md << "| trace | samples | mean | CV | p50 | p90 | p99 | max | short (<" << o.max_tokens / 16
           << ") | with image | truncated | source |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::ostringstream tables;
  int violations = 0;

  for (size_t ti = 0; ti < Split(o.traces).size(); ++ti) {
    const std::string spec = Split(o.traces)[ti];
    absl::StatusOr<Trace> trace = IsPreset(spec) ? GenerateTrace(spec, o.samples, o.max_tokens, o.seed + ti)
                                                 : LoadTrace(spec, o.max_tokens);
    if (!trace.ok()) {
      std::fprintf(stderr, "batching_sim: %s\n", std::string(trace.status().message()).c_str());
      return 2;
    }
    if (!o.save_traces_dir.empty() && IsPreset(spec)) {
      (void)SaveTrace(*trace, o.save_traces_dir + "/" + trace->name + ".txt");
    }
    // Arrival order: a seeded shuffle, as a DataLoader with shuffle=True gives.
    std::vector<SampleLengths> arrival = trace->samples;
    std::shuffle(arrival.begin(), arrival.end(), std::mt19937_64(o.seed * 7919 + ti));
    const TraceStats st = MeasureTrace(*trace, o.max_tokens / 16);
    char line[768];
    std::snprintf(line, sizeof line,
                  "| %s | %zu | %.0f | %.2f | %u | %u | %u | %u | %.1f%% | %.0f%% | %zu | %s |\n",
                  trace->name.c_str(), st.n, st.mean, st.cv, st.p50, st.p90, st.p99, st.max,
                  100 * st.short_fraction, 100 * st.vision_fraction, trace->truncated, trace->source.c_str());
    stats_md << line;
    if (stats_csv) {
      std::fprintf(stats_csv, "%s,%zu,%.2f,%.4f,%u,%u,%u,%u,%.4f,%.4f,%zu,\"%s\"\n", trace->name.c_str(),
                   st.n, st.mean, st.cv, st.p50, st.p90, st.p99, st.max, st.short_fraction,
                   st.vision_fraction, trace->truncated, trace->source.c_str());
    }
    std::fprintf(stderr, "batching_sim: %s: %zu samples, mean %.0f, CV %.2f, max %u\n", trace->name.c_str(),
                 st.n, st.mean, st.cv, st.max);
    const Bounds bounds = LowerBounds(arrival, cfg.budget, cfg.model, cfg.world);

    // Runs of the windowed policies, by policy and target (in `targets` order).
    std::map<std::string, std::vector<Metrics>> windowed;
    // --unequal-microsteps: the windowed runs re-evaluated (batching_sim_uneq.h), same order.
    std::map<std::string, std::vector<UnequalMetrics>> unequal;
    std::map<std::string, Metrics> results;
    for (const std::string& p : policies) {
      for (size_t ti_w = 0; ti_w <= (TakesWindows(p) ? targets.size() : 0); ++ti_w) {
        SimConfig run_cfg = cfg;
        run_cfg.window_tokens = ti_w == 0 ? 0 : targets[ti_w - 1].Tokens(arrival, o.world, o.max_tokens);
        // With --unequal-microsteps the windowed odb runs keep each rank step's samples (the same
        // schedule: policies_test checks it).
        const bool traced = o.unequal_microsteps && ti_w > 0;
        absl::StatusOr<TracedSchedule> traced_schedule =
            traced ? RunOdbTraced(p, arrival, run_cfg) : absl::StatusOr<TracedSchedule>(TracedSchedule{});
        if (!traced_schedule.ok()) {
          std::fprintf(stderr, "batching_sim: %s on %s: %s\n", p.c_str(), trace->name.c_str(),
                       std::string(traced_schedule.status().message()).c_str());
          return 3;
        }
        auto schedule = traced ? absl::StatusOr<Schedule>(std::move(traced_schedule->schedule))
                               : RunPolicy(p, arrival, run_cfg);
        if (!schedule.ok()) {
          std::fprintf(stderr, "batching_sim: %s on %s: %s\n", p.c_str(), trace->name.c_str(),
                       std::string(schedule.status().message()).c_str());
          return 3;
        }
        Metrics m = Evaluate(*schedule, cfg.model, cfg.budget.max_tokens, run_cfg.window_tokens);
        if (ranks_csv) {
          // Every rank step, to see what limits a policy (which rank is slowest, and why); with
          // windows, where each window closes.
          for (size_t k = 0; k < schedule->size(); ++k) {
            for (size_t r = 0; r < (*schedule)[k].size(); ++r) {
              const RankStep& rs = (*schedule)[k][r];
              std::fprintf(ranks_csv, "%s,%s,%lu,%zu,%zu,%u,%lu,%lu,%.6g,%.6g,%d\n", trace->name.c_str(),
                           p.c_str(), static_cast<unsigned long>(run_cfg.window_tokens), k, r, rs.samples,
                           static_cast<unsigned long>(rs.real_tokens),
                           static_cast<unsigned long>(rs.padded_tokens), rs.sum_len_sq,
                           RankCost(cfg.model, rs), rs.closes_window ? 1 : 0);
            }
          }
        }
        if (ti_w > 0) {
          if (m.samples != arrival.size()) {
            std::fprintf(stderr,
                         "batching_sim: %s with windows of %lu tokens on %s covered %lu of %zu samples\n",
                         p.c_str(), static_cast<unsigned long>(run_cfg.window_tokens), trace->name.c_str(),
                         static_cast<unsigned long>(m.samples), arrival.size());
            return 4;
          }
          if (traced) {
            UnequalConfig uc;
            uc.model = cfg.model;
            uc.budget = cfg.budget;
            if (IsPackedPolicy(p)) uc.budget.model = grouping::CostModel::kPacked;
            traced_schedule->schedule = std::move(*schedule);
            UnequalMetrics u = EvaluateUnequal(*traced_schedule, uc);
            for (int i : {1, 2}) {
              if (u.samples[i] != u.samples[0] || u.tokens[i] != u.tokens[0] || u.sum_sq[i] != u.sum_sq[0] ||
                  u.samples[0] != arrival.size()) {
                std::fprintf(stderr, "batching_sim: unequal micro-steps lost samples: %s on %s\n", p.c_str(),
                             trace->name.c_str());
                return 4;
              }
            }
            if (std::abs(u.equal_time - m.window_time) > 1e-9 * m.window_time) {
              std::fprintf(stderr, "batching_sim: unequal micro-steps: equal-count time %.9g != %.9g\n",
                           u.equal_time, m.window_time);
              return 4;
            }
            unequal[p].push_back(u);
          }
          windowed[p].push_back(std::move(m));
          continue;
        }
        if (m.samples != arrival.size()) {
          std::fprintf(stderr, "batching_sim: %s on %s covered %lu of %zu samples\n", p.c_str(),
                       trace->name.c_str(), static_cast<unsigned long>(m.samples), arrival.size());
          return 4;
        }
        results[p] = std::move(m);
      }
    }
    const double standard = results.count("standard") ? results["standard"].samples_per_s() : 0.0;
    const uint32_t batch = FixedBatchSize(arrival, cfg.budget);
    const uint32_t p99_batch = P99BatchSize(arrival, cfg.budget);
    tables << "\n#### " << trace->name << "\n\n"
           << "Batch size of standard/sorted/length_grouped: " << batch
           << " (the largest that fits the longest sample, " << st.max
           << " tokens); standard_p99: " << p99_batch << " (fits the 99th percentile, " << st.p99
           << " tokens). Bound: " << bounds.any_layout << " (at least " << bounds.min_rank_steps
           << " rank steps); largest-sample bound: " << bounds.largest_sample
           << "; padded bound: " << bounds.padded << " (" << bounds.padded_groups << " groups).\n\n"
           << "| policy | samples/s | vs standard | of bound | of padded bound | padding | steps | idle "
              "rank-steps | "
              "over-budget rank-steps | max/mean rank cost |\n"
           << "|---|---|---|---|---|---|---|---|---|---|\n";
    std::ostringstream window_table;  // the odb policies with and without windows
    std::ostringstream unequal_table;  // --unequal-microsteps
    auto uneq_cells = [](const UnequalMetrics* u) {
      if (u == nullptr) return std::string(",,,,,,,,,,,,,");
      char cells[512];
      std::snprintf(
          cells, sizeof cells, "%.9g,%.9g,%.9g,%.9g,%lu,%lu,%lu,%lu,%lu,%lu,%lu,%.9g,%.9g,%.9g",
          u->equal_time, u->own_time, u->redealt_time, u->lpt_time, static_cast<unsigned long>(u->own_differ),
          static_cast<unsigned long>(u->redealt_differ), static_cast<unsigned long>(u->equal_rank_steps),
          static_cast<unsigned long>(u->own_rank_steps), static_cast<unsigned long>(u->redealt_rank_steps),
          static_cast<unsigned long>(u->own_idle_rank_steps),
          static_cast<unsigned long>(u->redealt_idle_rank_steps), u->moves_time, u->per_window_bound,
          u->equal_counts_bound);
      return std::string(cells);
    };
    // One run's table row and CSV row; checks the bounds under both time
    // models (they hold for every schedule within the budget: a fraction
    // above 1 is a bug in a bound or in a policy, never a result).
    auto report = [&](const std::string& p, const Metrics& m, const std::string& target, uint64_t tokens,
                      const UnequalMetrics* u = nullptr) {
      const double sps = m.samples_per_s();
      const double vs_std = standard > 0 ? sps / standard : 0.0;
      const double of_bound = m.time > 0 ? bounds.any_layout / m.time : 0.0;
      const bool padded_policy = !IsPackedPolicy(p) && m.over_budget_rank_steps == 0;
      const double of_padded = padded_policy && m.time > 0 ? bounds.padded / m.time : 0.0;
      const double of_largest = m.time > 0 ? bounds.largest_sample / m.time : 0.0;
      // Time model (b): the largest-sample bound is a bound on (a) only (a
      // window's slowest rank may sum many micro-steps besides the longest sample's).
      const double of_bound_w = m.window_time > 0 ? bounds.any_layout / m.window_time : 0.0;
      const double of_padded_w = padded_policy && m.window_time > 0 ? bounds.padded / m.window_time : 0.0;
      // The bounds of any schedule with as many windows as this one (bench/bound.h).
      const WindowBounds wb = WindowedBounds(bounds, cfg.model, m.windows, padded_policy);
      const double of_window_bound = m.time > 0 ? wb.synchronous / m.time : 0.0;
      const double of_window_bound_w = m.window_time > 0 ? wb.per_window / m.window_time : 0.0;
      const double slack = 1e-9;
      if (m.over_budget_rank_steps == 0 &&
          (of_bound > 1 + slack || of_padded > 1 + slack || of_largest > 1 + slack ||
           of_bound_w > 1 + slack || of_padded_w > 1 + slack || of_window_bound > 1 + slack ||
           of_window_bound_w > 1 + slack)) {
        std::fprintf(
            stderr,
            "batching_sim: BOUND VIOLATED: %s (windows %s) on %s: time %.9g, per-window time %.9g, bound "
            "%.9g, largest-sample bound %.9g, padded bound %.9g, window bounds %.9g %.9g\n",
            p.c_str(), target.c_str(), trace->name.c_str(), m.time, m.window_time, bounds.any_layout,
            bounds.largest_sample, bounds.padded, wb.synchronous, wb.per_window);
        ++violations;
      }
      if (u != nullptr) {
        // Unequal counts are schedules of the same samples with every rank >= 1 micro-step per window:
        // the bounds under (b) hold for them too (batching_sim_uneq.h).
        const double bound_b = padded_policy ? bounds.padded : bounds.any_layout;
        for (double t : {u->own_time, u->redealt_time, u->lpt_time, u->moves_time, u->equal_time}) {
          if (t > 0 && (bound_b / t > 1 + slack || wb.per_window / t > 1 + slack ||
                        u->per_window_bound / t > 1 + slack)) {
            std::fprintf(stderr,
                         "batching_sim: BOUND VIOLATED: %s (windows %s, unequal counts) on %s: %.9g\n",
                         p.c_str(), target.c_str(), trace->name.c_str(), t);
            ++violations;
          }
        }
        // The equal-counts bound (bench/window_bound.h) holds for the schedule as planned, window by window.
        if (m.over_budget_rank_steps == 0 &&
            (u->equal_counts_violations > 0 || u->equal_counts_bound > u->equal_time * (1 + slack))) {
          std::fprintf(
              stderr,
              "batching_sim: BOUND VIOLATED: %s (windows %s, equal counts) on %s: %.9g > %.9g in %lu "
              "windows\n",
              p.c_str(), target.c_str(), trace->name.c_str(), u->equal_counts_bound, u->equal_time,
              static_cast<unsigned long>(u->equal_counts_violations));
          ++violations;
        }
        if (u->own_time > u->equal_time * (1 + 1e-12) || u->redealt_time > u->own_time * (1 + 1e-12)) {
          std::fprintf(stderr, "batching_sim: unequal counts raised T_b: %s (windows %s) on %s\n", p.c_str(),
                       target.c_str(), trace->name.c_str());
          ++violations;
        }
        std::snprintf(line, sizeof line,
                      "| %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %lu / %lu / %lu | %.1f%% / "
                      "%.1f%% | %lu |\n",
                      p.c_str(), target.c_str(), bound_b / u->equal_time, bound_b / u->own_time,
                      bound_b / u->moves_time, bound_b / u->redealt_time, bound_b / u->lpt_time,
                      bound_b / u->per_window_bound, static_cast<unsigned long>(u->equal_rank_steps),
                      static_cast<unsigned long>(u->own_rank_steps),
                      static_cast<unsigned long>(u->redealt_rank_steps),
                      u->windows ? 100.0 * u->own_differ / u->windows : 0.0,
                      u->windows ? 100.0 * u->redealt_differ / u->windows : 0.0,
                      static_cast<unsigned long>(u->windows));
        unequal_table << line;
      }
      auto padded_cell = [&](double v) {
        char cell[32] = "n/a";
        if (padded_policy) std::snprintf(cell, sizeof cell, "%.3f", v);
        return std::string(cell);
      };
      if (target == "0") {
        std::snprintf(line, sizeof line,
                      "| %s | %.4g | %.3f | %.3f | %s | %.1f%% | %lu | %lu | %lu | %.3f |\n", p.c_str(), sps,
                      vs_std, of_bound, padded_cell(of_padded).c_str(), 100 * m.padding_fraction(),
                      static_cast<unsigned long>(m.steps), static_cast<unsigned long>(m.idle_rank_steps),
                      static_cast<unsigned long>(m.over_budget_rank_steps), m.max_over_mean());
        tables << line;
      }
      if (TakesWindows(p) && !targets.empty()) {
        std::snprintf(
            line, sizeof line,
            "| %s | %s | %lu | %s | %s | %.3f | %.3f | %.3f | %.3f | %lu | %lu (%.1f%%) | %lu (%lu short) | "
            "%.3f | %.3f |\n",
            p.c_str(), target.c_str(), static_cast<unsigned long>(tokens), padded_cell(of_padded).c_str(),
            padded_cell(of_padded_w).c_str(), of_bound, of_bound_w, of_window_bound, of_window_bound_w,
            static_cast<unsigned long>(m.steps), static_cast<unsigned long>(m.idle_rank_steps),
            100 * m.idle_share(), static_cast<unsigned long>(m.windows),
            static_cast<unsigned long>(m.short_windows), m.mean_window_over_target, m.max_window_over_target);
        window_table << line;
      }
      if (csv) {
        std::fprintf(
            csv,
            "%s,%s,%d,%s,%lu,%lu,%lu,%lu,%.6f,%.6g,%.6g,%.6f,%.6f,%s,%.6f,%.6g,%.6g,%u,%u,%.6g,%.6f,"
            "%s,%lu,%.6g,%.6f,%s,%lu,%lu,%.6f,%.6f,%.6f,%.6g,%.6g,%.6f,%.6f,%d,%u,%d,%lu,%s,%.4f\n",
            trace->name.c_str(), p.c_str(), o.world, o.model.c_str(), static_cast<unsigned long>(m.samples),
            static_cast<unsigned long>(m.steps), static_cast<unsigned long>(m.idle_rank_steps),
            static_cast<unsigned long>(m.over_budget_rank_steps), m.padding_fraction(), m.time, sps, vs_std,
            of_bound, padded_policy ? std::to_string(of_padded).c_str() : "", m.max_over_mean(),
            bounds.any_layout, bounds.padded, batch, p99_batch, bounds.largest_sample, of_largest,
            target.c_str(), static_cast<unsigned long>(tokens), m.window_time, of_bound_w,
            padded_policy ? std::to_string(of_padded_w).c_str() : "", static_cast<unsigned long>(m.windows),
            static_cast<unsigned long>(m.short_windows), m.mean_window_over_target, m.max_window_over_target,
            m.idle_share(), wb.synchronous, wb.per_window, of_window_bound, of_window_bound_w,
            cfg.window_balance ? 1 : 0, cfg.partition_ranks, cfg.partitioned_windows ? 1 : 0,
            static_cast<unsigned long>(m.windows_under_90), uneq_cells(u).c_str(), m.window_sd_over_random);
      }
    };
    for (const std::string& p : policies) {
      const Metrics& m = results[p];
      report(p, m, "0", 0);
      for (size_t i = 0; i < windowed[p].size(); ++i) {
        report(p, windowed[p][i], targets[i].Spelling(), targets[i].Tokens(arrival, o.world, o.max_tokens),
               unequal.count(p) ? &unequal[p][i] : nullptr);
      }
      if (steps_csv) {
        for (size_t k = 0; k < m.step_costs.size(); ++k) {
          std::fprintf(steps_csv, "%s,%s,%zu,%.6g\n", trace->name.c_str(), p.c_str(), k, m.step_costs[k]);
        }
      }
    }
    if (!targets.empty()) {
      tables << "\nWith accumulation windows (target 0: none, every micro-step its own optimizer step). (a): "
                "every micro-step synchronised; (b): only each window's last. Window/target over the full "
                "windows (not the epoch's short last one). Window bound: the larger of the bounds above and "
                "N a + the bound's compute part (N windows, each at least one micro-step; bench/bound.h "
                "WindowedBounds).\n\n"
             << "| policy | window target | loss tokens | of padded bound (a) | of padded bound (b) | of "
                "bound (a) "
                "| of bound (b) | of window bound (a) | of window bound (b) | micro-steps | IDLE rank-steps "
                "(share) "
                "| windows | mean window / target | max window / target |\n"
             << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
             << window_table.str();
      if (o.unequal_microsteps) {
        tables
            << "\nUnequal micro-step counts in a window (--unequal-microsteps, time model (b) only): the "
               "windows above re-evaluated with each rank's samples packed into its own number of "
               "micro-steps (>= 1), own counts with single moves off the slowest rank, and re-dealt over the "
               "ranks (LPT of samples or of length-sorted runs, then the same packing; per window the "
               "cheapest of these, own counts and the moves). Ceiling: the bound over the sum over windows "
               "of the "
               "larger of the padded (any-layout) bound of each window's own samples on W ranks and "
               "ceil(G_min / W) a, which no layout of these windows beats, whatever its counts. Fractions of "
               "the padded bound (any-layout for "
               "packed).\n\n"
            << "| policy | window target | equal counts (b) | own counts (b) | own + moves (b) | re-dealt "
               "(b) | LPT alone (b) "
               "| ceiling: these windows' samples, any counts "
               "| rank-steps equal / own / re-dealt | windows with unequal counts, own / re-dealt | windows "
               "|\n"
            << "|---|---|---|---|---|---|---|---|---|---|---|\n"
            << unequal_table.str();
      }
    }
  }
  md << "Traces (measured):\n\n" << stats_md.str() << tables.str();
  std::printf("%s", md.str().c_str());
  if (!o.md.empty()) std::ofstream(o.md) << md.str();
  for (std::FILE* f : {csv, steps_csv, stats_csv, ranks_csv}) {
    if (f) std::fclose(f);
  }
  return violations ? 5 : 0;
}

}  // namespace
}  // namespace odb::bench

int main(int argc, char** argv) {
  odb::bench::Options o;
  CLI::App app{"batching_sim: batching policies on length traces under a step-time model"};
  app.add_option("--traces", o.traces, "comma list of presets and/or trace files");
  app.add_option("--policies", o.policies, "comma list of policy specs (default: all; see bench/policies.h)");
  app.add_option("--samples", o.samples, "samples per generated trace");
  app.add_option("--world", o.world, "data-parallel ranks W");
  app.add_option("--max-tokens", o.max_tokens, "L_max: padded tokens per rank step");
  app.add_option("--window", o.window, "odb/reference window per rank (specs without :wN)");
  app.add_option("--models-file", o.models_file, "step-time models (YAML)");
  app.add_option("--model", o.model, "model name in --models-file");
  app.add_option("--seed", o.seed);
  app.add_option("--window-tokens", o.window_tokens,
                 "comma list of accumulation-window targets for the odb policies (optimizer.tokens_per_step: "
                 "loss tokens, Ns = N samples of the trace's mean, Nm = N x W x L_max; 0 = off)");
  app.add_flag("--no-window-balance", o.no_window_balance,
               "windows without balance over the window (the cut alone; the daemon balances for the global "
               "planner)");
  app.add_option("--window-spread", o.window_spread,
                 "optimizer.window_spread: windows may end this many standard deviations of a random batch's "
                 "loss tokens from their target when that runs fewer micro-steps (0: the nearest ends)");
  app.add_option("--partition-ranks", o.partition_ranks,
                 "partitioned planning for the global odb policies: blocks of this many ranks (0: one pool)");
  app.add_flag(
      "--partitioned-windows", o.partitioned_windows,
      "with --partition-ranks and --window-tokens: windows as a partitioned daemon cuts and balances "
      "them (align::PartitionedWindows, align::BalanceBlockWindows) instead of whole-job windows");
  app.add_flag("--unequal-microsteps", o.unequal_microsteps,
               "re-evaluate the windowed odb runs with unequal micro-step counts per rank (DDP no_sync; time "
               "model (b); simulator only): own counts and re-dealt (bench/batching_sim_uneq.h)");
  app.add_option("--csv", o.csv, "per trace x policy results");
  app.add_option("--md", o.md, "markdown report");
  app.add_option("--steps-csv", o.steps_csv, "slowest-rank cost of every step");
  app.add_option("--stats-csv", o.stats_csv, "measured trace statistics");
  app.add_option(
      "--ranks-csv", o.ranks_csv,
      "every rank step of every run (with and without windows): samples, tokens, sum(len^2), cost, "
      "whether it closes a window");
  app.add_option("--save-traces-dir", o.save_traces_dir, "write generated traces there");
  CLI11_PARSE(app, argc, argv);
  if (o.world < 1) {
    std::fprintf(stderr, "batching_sim: --world must be >= 1\n");
    return 2;
  }
  if (o.unequal_microsteps && o.partitioned_windows) {
    std::fprintf(stderr, "batching_sim: --unequal-microsteps does not support --partitioned-windows\n");
    return 2;
  }
  if (o.partitioned_windows && o.partition_ranks == 0) {
    std::fprintf(stderr, "batching_sim: --partitioned-windows needs --partition-ranks\n");
    return 2;
  }
  return odb::bench::Main(o);
}
