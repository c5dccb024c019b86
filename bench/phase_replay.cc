// phase_replay: the daemon's per-step encoder plans (balance::EncoderStepPlanner,
// what odbd runs with alignment.phase_plans) replayed on a run's recorded steps,
// so that a change to the placement or its memory cap is compared on the same
// steps instead of across runs whose plans differ (the daemon's rounds depend
// on timing).
//
// Input (--steps, written by `bench/phase_replay.py` from an
// examples/multimodal_train.py --json run of odb_phases*): one step per line,
// its active ranks separated by '|', each rank as "@world_rank" and its LLM
// samples (in LLM order) as "tokens,patches,frames", separated by spaces ("@w"
// left out: the rank's place in the line); '#' starts a comment.
// Output (stdout): one line per step, per active rank "v=u,u,... a=f,f,..."
// (the vision patches and audio frames of the items that rank encodes), ranks
// separated by '|'; bench/phase_replay.py prices them with the run's fitted
// costs.
//
// Rounds: each step planned on its own (Plan), or --round-steps K / --round-lengths
// (the run's own rounds) grouping consecutive steps into rounds (PlanRound, as
// the daemon plans them).
//
// Costs and memory models come from the daemon config (--config, e.g.
// configs/multimodal_train.yaml); --memory-cap-margin and --memory-slack
// override what it says.

#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "src/balance/phase_plan.h"
#include "src/daemon/aligned_round_runner.h"
#include "src/daemon/config.h"

namespace odb::bench {
namespace {

// One step: per active rank, its LLM samples' lengths, and the ranks' world ranks.
struct Step {
  std::vector<std::vector<SampleLengths>> samples;
  std::vector<int32_t> ranks;
};

bool ParseStep(const std::string& line, Step* step, std::string* error) {
  std::stringstream ranks(line);
  std::string rank_text;
  while (std::getline(ranks, rank_text, '|')) {
    std::vector<SampleLengths> samples;
    std::stringstream words(rank_text);
    std::string word;
    int32_t world_rank = static_cast<int32_t>(step->ranks.size());
    while (words >> word) {
      if (word[0] == '@') {
        world_rank = std::atoi(word.c_str() + 1);
        continue;
      }
      SampleLengths l;
      if (std::sscanf(word.c_str(), "%u,%u,%u", &l.tokens, &l.vision_patches, &l.audio_frames) != 3) {
        *error = "not tokens,patches,frames: '" + word + "'";
        return false;
      }
      samples.push_back(l);
    }
    if (samples.empty()) {
      *error = "a rank without samples (list only the step's active ranks)";
      return false;
    }
    step->samples.push_back(std::move(samples));
    step->ranks.push_back(world_rank);
  }
  return !step->ranks.empty() || (*error = "no ranks", false);
}

void PrintLayout(const balance::PhaseAssignment& a, const std::vector<uint32_t>& units, int rank) {
  bool first = true;
  for (size_t i : a.order[rank]) {
    if (units[i] == 0) continue;
    std::printf("%s%u", first ? "" : ",", units[i]);
    first = false;
  }
}

int Main(int argc, char** argv) {
  CLI::App app{"Replays the daemon's encoder phase plans on a run's recorded steps"};
  std::string config_path, steps_path;
  double margin = -1, slack = -1;
  app.add_option("--config", config_path, "odbd config (costs, memory models)")->required();
  app.add_option("--steps", steps_path, "recorded steps (see the file's header)")->required();
  app.add_option("--memory-cap-margin", margin, "override EncoderPlanConfig::memory_cap_margin");
  app.add_option("--memory-slack", slack, "override alignment.memory_slack");
  bool even_peaks = false, no_even_peaks = false;
  app.add_flag("--even-peaks", even_peaks, "EncoderPlanConfig::even_peaks");
  app.add_flag("--no-even-peaks", no_even_peaks, "EncoderPlanConfig::even_peaks off");
  double peak_ratio = -1;
  app.add_option("--memory-peak-ratio", peak_ratio, "override alignment.memory_peak_ratio (0: off)");
  bool run_so_far = false;
  app.add_flag(
      "--run-so-far-peaks", run_so_far,
      "EncoderPlanConfig::forecast_peaks off (the peak ratio against the run so far, the rule before)");
  bool greedy_relabel = false;
  app.add_flag("--greedy-relabel", greedy_relabel,
               "EncoderPlanConfig::relabel_search off (each phase relabeled greedily, the rule before)");
  int round_steps = 0;
  app.add_option("--round-steps", round_steps,
                 "plan the recorded steps in rounds of this many consecutive steps "
                 "(EncoderStepPlanner::PlanRound, as the daemon plans a round's steps; the runs do not "
                 "record their rounds); 0: each step on its own (Plan)");
  std::vector<int> round_lengths;
  app.add_option("--round-lengths", round_lengths,
                 "plan the recorded steps in rounds of these many consecutive steps each (the run's own "
                 "rounds: bench/phase_replay.py --recorded-rounds; they must add up to the steps)")
      ->delimiter(',')
      ->excludes("--round-steps");
  bool round_joint = false;
  app.add_flag("--round-joint", round_joint,
               "EncoderPlanConfig::round_joint (the round's caps chosen together for its run peaks)");
  double time_floor = -1;
  app.add_option("--memory-time-floor", time_floor, "override alignment.memory_time_floor (0: off)");
  double llm_slack = -1;
  app.add_option("--memory-llm-slack", llm_slack,
                 "override alignment.memory_llm_slack (0: off; the LLM samples' moves are printed as l=)");
  bool timing = false;
  app.add_flag("--timing", timing,
               "stderr: the planner's thread CPU time per step (mean) and the most one round (or step) took");
  CLI11_PARSE(app, argc, argv);
  auto config = LoadConfigFile(config_path);
  if (!config.ok()) {
    std::cerr << "phase_replay: " << config.status().message() << "\n";
    return 2;
  }
  balance::EncoderPlanConfig e = EncoderPlanConfigFrom(*config);
  if (margin >= 0) e.memory_cap_margin = margin;
  if (slack >= 0) e.memory_slack = slack;
  e.even_peaks = (e.even_peaks || even_peaks) && !no_even_peaks;
  if (greedy_relabel) e.relabel_search = false;
  if (peak_ratio >= 0) e.peak_ratio = peak_ratio;
  if (run_so_far) e.forecast_peaks = false;
  if (round_joint) e.round_joint = true;
  if (time_floor >= 0) e.time_floor = time_floor;
  if (llm_slack >= 0) e.llm_slack = llm_slack;

  balance::EncoderStepPlanner planner(e);
  std::ifstream in(steps_path);
  if (!in) {
    std::cerr << "phase_replay: cannot read " << steps_path << "\n";
    return 2;
  }
  std::vector<Step> steps;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    if (line.find_first_not_of(" \t|") == std::string::npos) continue;
    Step step;
    std::string error;
    if (!ParseStep(line, &step, &error)) {
      std::cerr << "phase_replay: " << steps_path << ":" << number << ": " << error << "\n";
      return 2;
    }
    steps.push_back(std::move(step));
  }
  // Per step: its items (LLM rank order) and their patches and frames.
  std::vector<std::vector<balance::EncoderItem>> items(steps.size());
  std::vector<std::vector<uint32_t>> patches(steps.size()), frames(steps.size());
  for (size_t k = 0; k < steps.size(); ++k) {
    for (size_t r = 0; r < steps[k].samples.size(); ++r) {
      for (const SampleLengths& l : steps[k].samples[r]) {
        items[k].push_back({static_cast<int32_t>(r), l});
        patches[k].push_back(l.vision_patches);
        frames[k].push_back(l.audio_frames);
      }
    }
  }
  // Each round's first step and its end: --round-lengths, or rounds of --round-steps (1: Plan per step).
  std::vector<std::pair<size_t, size_t>> rounds;
  if (!round_lengths.empty()) {
    size_t first = 0;
    for (int n : round_lengths) {
      if (n <= 0 || first + static_cast<size_t>(n) > steps.size()) {
        std::cerr << "phase_replay: --round-lengths must be positive and add up to the " << steps.size()
                  << " steps\n";
        return 2;
      }
      rounds.emplace_back(first, first + static_cast<size_t>(n));
      first += static_cast<size_t>(n);
    }
    if (first != steps.size()) {
      std::cerr << "phase_replay: --round-lengths add up to " << first << ", not the " << steps.size()
                << " steps\n";
      return 2;
    }
  } else {
    const size_t round = round_steps > 0 ? static_cast<size_t>(round_steps) : 1;
    for (size_t first = 0; first < steps.size(); first += round) {
      rounds.emplace_back(first, std::min(steps.size(), first + round));
    }
  }
  const bool in_rounds = round_steps > 0 || !round_lengths.empty();
  auto thread_cpu = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  double total_cpu = 0.0, most_cpu = 0.0;
  for (const auto& [first, end] : rounds) {
    std::vector<balance::EncoderStepPlan> plans;
    const double start = thread_cpu();
    if (in_rounds) {
      std::vector<balance::EncoderRoundStep> in_round;
      for (size_t k = first; k < end; ++k) in_round.push_back({items[k], steps[k].ranks});
      plans = planner.PlanRound(in_round);
    } else {
      plans.push_back(planner.Plan(items[first], steps[first].ranks));
    }
    const double spent = thread_cpu() - start;
    total_cpu += spent;
    most_cpu = std::max(most_cpu, spent);
    for (size_t k = first; k < end; ++k) {
      const balance::EncoderStepPlan& plan = plans[k - first];
      for (int r = 0; r < static_cast<int>(steps[k].ranks.size()); ++r) {
        std::printf("%sv=", r ? "|" : "");
        PrintLayout(plan.vision, patches[k], r);
        std::printf(" a=");
        if (e.audio_phase) PrintLayout(plan.audio, frames[k], r);
        // The rank's LLM samples' tokens (memory_llm_slack's moves: its own in order, then the moved ones,
        // as the daemon lays them out).
        std::printf(" l=");
        bool first_sample = true;
        for (int own = 1; own >= 0; --own) {
          for (size_t i = 0; i < items[k].size(); ++i) {
            const int32_t at = plan.llm_rank.empty() ? items[k][i].llm_rank : plan.llm_rank[i];
            if (at != r || (items[k][i].llm_rank == r) != (own == 1)) continue;
            std::printf("%s%u", first_sample ? "" : ",", items[k][i].lengths.tokens);
            first_sample = false;
          }
        }
      }
      std::printf("\n");
    }
  }
  if (timing && !steps.empty()) {
    std::fprintf(stderr, "phase_replay: %zu steps, %.3f ms/step planner thread CPU, at most %.3f ms per %s\n",
                 steps.size(), 1e3 * total_cpu / static_cast<double>(steps.size()), 1e3 * most_cpu,
                 in_rounds ? "round" : "step");
  }
  return 0;
}

}  // namespace
}  // namespace odb::bench

int main(int argc, char** argv) { return odb::bench::Main(argc, argv); }
