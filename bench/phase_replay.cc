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
// Costs and memory models come from the daemon config (--config, e.g.
// configs/multimodal_train.yaml); --memory-cap-margin and --memory-slack
// override what it says.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
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

  balance::EncoderStepPlanner planner(e);
  std::ifstream in(steps_path);
  if (!in) {
    std::cerr << "phase_replay: cannot read " << steps_path << "\n";
    return 2;
  }
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
    std::vector<balance::EncoderItem> items;
    std::vector<uint32_t> patches, frames;
    for (size_t r = 0; r < step.samples.size(); ++r) {
      for (const SampleLengths& l : step.samples[r]) {
        items.push_back({static_cast<int32_t>(r), l});
        patches.push_back(l.vision_patches);
        frames.push_back(l.audio_frames);
      }
    }
    const int active = static_cast<int>(step.ranks.size());
    const balance::EncoderStepPlan plan = planner.Plan(items, step.ranks);
    for (int r = 0; r < active; ++r) {
      std::printf("%sv=", r ? "|" : "");
      PrintLayout(plan.vision, patches, r);
      std::printf(" a=");
      if (e.audio_phase) PrintLayout(plan.audio, frames, r);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace odb::bench

int main(int argc, char** argv) { return odb::bench::Main(argc, argv); }
