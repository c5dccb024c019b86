// batching_sim: batching-policy simulator. Runs every policy of
// bench/policies.h on length traces (generated presets and trace files) for W
// data-parallel ranks under a step-time model, and prints per trace x policy
// the simulated samples/s, the ratio to Standard and to the offline oracle,
// padding, steps, IDLE rank-steps and the max/mean rank cost. See
// docs/benchmarks.md.
//
//   bazel build -c opt //bench:batching_sim
//   bazel-bin/bench/batching_sim --model cpu_calibrated --world 8
//       --traces chat_longtail,image_text,high_variance,production_mix,bench/traces/debian_docs.txt
#include <CLI/CLI.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

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
  std::string csv, md, steps_csv, stats_csv, save_traces_dir;
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

absl::StatusOr<grouping::StepTimeModel> LoadModel(const std::string& path, const std::string& name) {
  try {
    YAML::Node root = YAML::LoadFile(path);
    YAML::Node node = root[name];
    if (!node) return absl::NotFoundError("step model '" + name + "' not in " + path);
    grouping::StepTimeModel m;
    m.per_step = node["a"].as<double>();
    m.per_padded_token = node["b"].as<double>();
    m.per_len_sq = node["c"].as<double>();
    return m;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(path + ": " + e.what());
  }
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
  const std::vector<std::string> policies = o.policies.empty() ? PolicyNames() : Split(o.policies);

  std::FILE* csv = o.csv.empty() ? nullptr : std::fopen(o.csv.c_str(), "w");
  std::FILE* steps_csv = o.steps_csv.empty() ? nullptr : std::fopen(o.steps_csv.c_str(), "w");
  std::FILE* stats_csv = o.stats_csv.empty() ? nullptr : std::fopen(o.stats_csv.c_str(), "w");
  if (csv) {
    std::fprintf(csv,
                 "trace,policy,world,model,samples,steps,idle_rank_steps,padding_fraction,sim_seconds,samples_per_s,"
                 "vs_standard,vs_oracle,max_over_mean\n");
  }
  if (steps_csv) std::fprintf(steps_csv, "trace,policy,step,cost\n");
  if (stats_csv) std::fprintf(stats_csv, "trace,n,mean,cv,p50,p90,p99,max,short_fraction,vision_fraction,truncated,source\n");

  std::ostringstream md;
  md << "Model `" << o.model << "`: cost(rank step) = " << cfg.model.per_step << " + " << cfg.model.per_padded_token
     << " * padded_tokens + " << cfg.model.per_len_sq << " * sum(len^2); W = " << o.world << " ranks, L_max = "
     << o.max_tokens << " (padded budget), odb window = " << o.window << ", seed " << o.seed << ".\n\n";
  std::ostringstream stats_md;
  stats_md << "| trace | samples | mean | CV | p50 | p90 | p99 | max | short (<" << o.max_tokens / 16
           << ") | with image | truncated | source |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::ostringstream tables;

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
    char line[512];
    std::snprintf(line, sizeof line, "| %s | %zu | %.0f | %.2f | %u | %u | %u | %u | %.1f%% | %.0f%% | %zu | %s |\n",
                  trace->name.c_str(), st.n, st.mean, st.cv, st.p50, st.p90, st.p99, st.max,
                  100 * st.short_fraction, 100 * st.vision_fraction, trace->truncated, trace->source.c_str());
    stats_md << line;
    if (stats_csv) {
      std::fprintf(stats_csv, "%s,%zu,%.2f,%.4f,%u,%u,%u,%u,%.4f,%.4f,%zu,\"%s\"\n", trace->name.c_str(), st.n, st.mean,
                   st.cv, st.p50, st.p90, st.p99, st.max, st.short_fraction, st.vision_fraction, trace->truncated,
                   trace->source.c_str());
    }
    std::fprintf(stderr, "batching_sim: %s: %zu samples, mean %.0f, CV %.2f, max %u\n", trace->name.c_str(), st.n,
                 st.mean, st.cv, st.max);

    std::map<std::string, Metrics> results;
    for (const std::string& p : policies) {
      auto schedule = RunPolicy(p, arrival, cfg);
      if (!schedule.ok()) {
        std::fprintf(stderr, "batching_sim: %s on %s: %s\n", p.c_str(), trace->name.c_str(),
                     std::string(schedule.status().message()).c_str());
        return 3;
      }
      Metrics m = Evaluate(*schedule, cfg.model);
      if (m.samples != arrival.size()) {
        std::fprintf(stderr, "batching_sim: %s on %s covered %lu of %zu samples\n", p.c_str(), trace->name.c_str(),
                     static_cast<unsigned long>(m.samples), arrival.size());
        return 4;
      }
      results[p] = std::move(m);
    }
    const double standard = results.count("standard") ? results["standard"].samples_per_s() : 0.0;
    const double oracle = results.count("oracle") ? results["oracle"].samples_per_s() : 0.0;
    tables << "\n#### " << trace->name << " (fixed batch size for standard/sorted/length_grouped: "
           << FixedBatchSize(arrival, cfg.budget) << ")\n\n"
           << "| policy | samples/s | vs standard | vs oracle | padding | steps | idle rank-steps | max/mean rank cost |\n"
           << "|---|---|---|---|---|---|---|---|\n";
    for (const std::string& p : policies) {
      const Metrics& m = results[p];
      const double sps = m.samples_per_s();
      const double vs_std = standard > 0 ? sps / standard : 0.0;
      const double vs_orc = oracle > 0 ? sps / oracle : 0.0;
      std::snprintf(line, sizeof line, "| %s | %.2f | %.3f | %.3f | %.1f%% | %lu | %lu | %.3f |\n", p.c_str(), sps,
                    vs_std, vs_orc, 100 * m.padding_fraction(), static_cast<unsigned long>(m.steps),
                    static_cast<unsigned long>(m.idle_rank_steps), m.max_over_mean());
      tables << line;
      if (csv) {
        std::fprintf(csv, "%s,%s,%d,%s,%lu,%lu,%lu,%.6f,%.6g,%.6g,%.6f,%.6f,%.6f\n", trace->name.c_str(), p.c_str(),
                     o.world, o.model.c_str(), static_cast<unsigned long>(m.samples),
                     static_cast<unsigned long>(m.steps), static_cast<unsigned long>(m.idle_rank_steps),
                     m.padding_fraction(), m.time, sps, vs_std, vs_orc, m.max_over_mean());
      }
      if (steps_csv) {
        for (size_t k = 0; k < m.step_costs.size(); ++k) {
          std::fprintf(steps_csv, "%s,%s,%zu,%.6g\n", trace->name.c_str(), p.c_str(), k, m.step_costs[k]);
        }
      }
    }
  }
  md << "Traces (measured):\n\n" << stats_md.str() << tables.str();
  std::printf("%s", md.str().c_str());
  if (!o.md.empty()) std::ofstream(o.md) << md.str();
  for (std::FILE* f : {csv, steps_csv, stats_csv}) {
    if (f) std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace odb::bench

int main(int argc, char** argv) {
  odb::bench::Options o;
  CLI::App app{"batching_sim: batching policies on length traces under a step-time model"};
  app.add_option("--traces", o.traces, "comma list of presets and/or trace files");
  app.add_option("--policies", o.policies, "comma list (default: all)");
  app.add_option("--samples", o.samples, "samples per generated trace");
  app.add_option("--world", o.world, "data-parallel ranks W");
  app.add_option("--max-tokens", o.max_tokens, "L_max: padded tokens per rank step");
  app.add_option("--window", o.window, "odb/reference window per rank");
  app.add_option("--models-file", o.models_file, "step-time models (YAML)");
  app.add_option("--model", o.model, "model name in --models-file");
  app.add_option("--seed", o.seed);
  app.add_option("--csv", o.csv, "per trace x policy results");
  app.add_option("--md", o.md, "markdown report");
  app.add_option("--steps-csv", o.steps_csv, "slowest-rank cost of every step");
  app.add_option("--stats-csv", o.stats_csv, "measured trace statistics");
  app.add_option("--save-traces-dir", o.save_traces_dir, "write generated traces there");
  CLI11_PARSE(app, argc, argv);
  if (o.world < 1) {
    std::fprintf(stderr, "batching_sim: --world must be >= 1\n");
    return 2;
  }
  return odb::bench::Main(o);
}
