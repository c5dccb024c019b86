// phase_sim: per-phase balancing of a multimodal model (vision encoder, audio
// encoder, LLM) on modality-mixed traces, under per-phase cost models, against
// each phase's lower bound.
//
// OrchMLLM (Zheng et al., 2025, "Orchestrate Multimodal Data with Batch
// Post-Balancing") argues that balancing the LLM's tokens leaves the encoders
// unbalanced when the modality mix varies per sample; this simulator measures
// that on a trace ("tokens vision_patches audio_frames" per line, bench/trace.h)
// with the costs fitted from the real run (examples/multimodal_train.py prints
// them as `_fitted_phase_costs`).
//
// Steps: the trace in arrival order, cut into steps of W * --batch samples
// (the same samples per step for every policy, so only the assignment to ranks
// differs). Policies (rank r's arrival share is samples [r*B, (r+1)*B)):
//   standard         every phase runs the arrival share; the LLM pads to the
//                    rank's longest sample (B x max len)
//   standard_packed  the same, the LLM packed (sum over samples)
//   odb_llm          the LLM phase balanced (balance::BalancePhase on the
//                    samples' LLM costs, packed: odb groups by length, so its
//                    padding is small), the encoders run on the LLM rank
//   odb_phases       the LLM as odb_llm, each encoder phase balanced on its
//                    own cost (home = the LLM rank): the daemon's phase_plans
//   odb_joint        balance::PlanPhases: vision first, then the LLM with
//                    home = the vision rank, audio on its own
// Per step and phase: the slowest rank's cost, and the phase's bound
// max(largest item, total / W) (balance::MinimaxLowerBound); a per-step
// constant (the fitted per_step term) is added to every rank's phase time.
// Reported per policy: each phase's sum of bounds / sum of slowest ranks
// (1.0 = at the bound), the synchronous step time (sum over steps and phases
// of the slowest rank), and odb_phases' speedups.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench/trace.h"
#include "src/balance/phase_plan.h"

namespace odb::bench {
namespace {

struct Costs {
  balance::PhaseCost vision, audio, llm;
  double vision_step = 0.0, audio_step = 0.0, llm_step = 0.0;  // per rank-step constants
};

// "per_step,per_sample,per_unit,per_unit_sq" -> (constant, PhaseCost).
bool ParseCost(const std::string& text, double* step, balance::PhaseCost* cost) {
  std::vector<double> v;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) v.push_back(std::stod(part));
  if (v.size() != 4) return false;
  *step = v[0];
  *cost = {v[1], v[2], v[3]};
  return true;
}

enum Phase { kVision = 0, kAudio = 1, kLlm = 2 };
const char* const kPhaseNames[] = {"vision", "audio", "llm"};

struct Totals {
  double slowest[3] = {0, 0, 0};
  double bound[3] = {0, 0, 0};
  double sync = 0.0;
};

// Per-rank load of one phase from a rank-of-item assignment.
std::vector<double> Loads(const std::vector<double>& cost, const std::vector<int32_t>& rank_of, int world) {
  std::vector<double> load(world, 0.0);
  for (size_t i = 0; i < cost.size(); ++i) load[rank_of[i]] += cost[i];
  return load;
}

std::vector<int32_t> RanksOf(const balance::PhaseAssignment& a) {
  std::vector<int32_t> r(a.slot_of.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = a.slot_of[i].rank;
  return r;
}

Totals Simulate(const Trace& trace, const std::string& policy, int world, int batch, const Costs& c) {
  Totals t;
  const size_t per_step = static_cast<size_t>(world) * batch;
  for (size_t start = 0; start + per_step <= trace.samples.size(); start += per_step) {
    std::vector<double> cost[3];
    std::vector<int32_t> home(per_step);
    std::vector<balance::PhaseSample> samples(per_step);
    for (size_t i = 0; i < per_step; ++i) {
      const SampleLengths& s = trace.samples[start + i];
      cost[kVision].push_back(c.vision.OfInput(s.vision_patches));
      cost[kAudio].push_back(c.audio.OfInput(s.audio_frames));
      cost[kLlm].push_back(c.llm.Of(s.tokens));
      home[i] = static_cast<int32_t>(i / batch);
      samples[i].key.id = start + i;
      samples[i].home_rank = home[i];
      samples[i].lengths = s;
    }
    std::vector<double> load[3];
    if (policy == "standard" || policy == "standard_packed") {
      for (int p : {kVision, kAudio}) load[p] = Loads(cost[p], home, world);
      if (policy == "standard_packed") {
        load[kLlm] = Loads(cost[kLlm], home, world);
      } else {  // padded: B x the rank's longest sample, per token at the per-token rate
        load[kLlm].assign(world, 0.0);
        for (int r = 0; r < world; ++r) {
          uint32_t longest = 0;
          for (int i = 0; i < batch; ++i)
            longest = std::max(longest, trace.samples[start + r * batch + i].tokens);
          load[kLlm][r] = batch * c.llm.Of(longest);
        }
      }
    } else if (policy == "odb_llm" || policy == "odb_phases") {
      const balance::PhaseAssignment llm = balance::BalancePhase(cost[kLlm], home, world);
      const std::vector<int32_t> llm_rank = RanksOf(llm);
      load[kLlm] = llm.load;
      for (int p : {kVision, kAudio}) {
        load[p] = policy == "odb_llm" ? Loads(cost[p], llm_rank, world)
                                      : balance::BalancePhase(cost[p], llm_rank, world).load;
      }
    } else if (policy == "odb_joint") {
      const balance::MultimodalPlan plan = balance::PlanPhases(samples, world, c.vision, c.audio, c.llm);
      load[kVision] = plan.encoder.load;
      load[kAudio] = plan.audio.load;
      load[kLlm] = plan.llm.load;
    } else {
      std::fprintf(stderr, "phase_sim: unknown policy %s\n", policy.c_str());
      std::exit(2);
    }
    const double step_const[3] = {c.vision_step, c.audio_step, c.llm_step};
    for (int p = 0; p < 3; ++p) {
      const double slowest = *std::max_element(load[p].begin(), load[p].end()) + step_const[p];
      t.slowest[p] += slowest;
      t.bound[p] += balance::MinimaxLowerBound(cost[p], world) + step_const[p];
      t.sync += slowest;
    }
  }
  return t;
}

}  // namespace
}  // namespace odb::bench

int main(int argc, char** argv) {
  using namespace odb::bench;
  std::string trace_path, vision = "0,0,1,0", audio = "0,0,1,0", llm = "0,0,1,0", policies_arg;
  std::vector<int> worlds = {2, 4, 8};
  int batch = 8;
  CLI::App app{"phase_sim: per-phase balancing of a multimodal model on modality-mixed traces"};
  app.add_option("--trace", trace_path, "trace file: tokens vision_patches audio_frames per line")
      ->required();
  app.add_option("--vision-cost", vision, "per_step,per_sample,per_unit,per_unit_sq (seconds)");
  app.add_option("--audio-cost", audio, "per_step,per_sample,per_unit,per_unit_sq (seconds)");
  app.add_option("--llm-cost", llm, "per_step,per_sample,per_unit,per_unit_sq (seconds; units = tokens)");
  app.add_option("--worlds", worlds, "ranks W")->delimiter(',');
  app.add_option("--batch", batch, "samples per rank and step");
  app.add_option("--policies", policies_arg, "comma list (default: all)");
  CLI11_PARSE(app, argc, argv);
  Costs c;
  if (!ParseCost(vision, &c.vision_step, &c.vision) || !ParseCost(audio, &c.audio_step, &c.audio) ||
      !ParseCost(llm, &c.llm_step, &c.llm)) {
    std::fprintf(stderr, "phase_sim: a cost is four comma-separated numbers\n");
    return 2;
  }
  auto trace = LoadTrace(trace_path, 1u << 30);
  if (!trace.ok()) {
    std::fprintf(stderr, "phase_sim: %s\n", std::string(trace.status().message()).c_str());
    return 2;
  }
  std::vector<std::string> policies = {"standard", "standard_packed", "odb_llm", "odb_phases", "odb_joint"};
  if (!policies_arg.empty()) {
    policies.clear();
    std::stringstream in(policies_arg);
    for (std::string p; std::getline(in, p, ',');) policies.push_back(p);
  }
  std::printf("{\"trace\": \"%s\", \"samples\": %zu, \"batch\": %d, \"results\": [\n", trace_path.c_str(),
              trace->samples.size(), batch);
  bool first = true;
  for (int world : worlds) {
    double sync_of[8] = {0};
    for (size_t k = 0; k < policies.size(); ++k) {
      const Totals t = Simulate(*trace, policies[k], world, batch, c);
      if (k < 8) sync_of[k] = t.sync;
      std::printf("%s {\"world\": %d, \"policy\": \"%s\", \"sync_time\": %.6g", first ? "" : ",\n", world,
                  policies[k].c_str(), t.sync);
      first = false;
      for (int p = 0; p < 3; ++p) {
        std::printf(", \"%s_bound_fraction\": %.4f", kPhaseNames[p],
                    t.slowest[p] > 0 ? t.bound[p] / t.slowest[p] : 1.0);
      }
      double bound_sum = t.bound[0] + t.bound[1] + t.bound[2];
      std::printf(", \"sync_bound_fraction\": %.4f", t.sync > 0 ? bound_sum / t.sync : 1.0);
      if (policies[k] == "odb_phases") {
        for (size_t b = 0; b < policies.size() && b < 8; ++b) {
          if (policies[b] == "odb_llm" || policies[b] == "standard" || policies[b] == "standard_packed") {
            if (b < k) std::printf(", \"speedup_over_%s\": %.4f", policies[b].c_str(), sync_of[b] / t.sync);
          }
        }
      }
      std::printf("}");
    }
  }
  std::printf("\n]}\n");
  return 0;
}
