// Grouping benchmark: FormGroups' time per window and its step-time cost
// against the reference ODB rule and the fewest-steps greedy, for several
// length distributions, window sizes and both cost models. Prints a table.
//
//   bazel run -c opt //src/grouping:grouper_bench

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <vector>

#include "src/grouping/budget.h"
#include "src/grouping/grouper.h"
#include "src/grouping/synthetic_lengths.h"

namespace odb::grouping {
namespace {

// CPU time of this thread: the build machines are shared, and wall time
// mostly measures the neighbours.
double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Row {
  double form_us = 0.0;     // mean FormGroups time per window
  double ref_us = 0.0;      // mean ReferenceOdbGroups time per window
  double form_cost = 0.0;   // summed over windows
  double ref_cost = 0.0;
  double greedy_cost = 0.0;
  size_t form_steps = 0;
  size_t ref_steps = 0;
  size_t greedy_steps = 0;
  size_t lower_bound_steps = 0;  // sum over windows of ceil(sum(len) / L_max)
  double padded_tokens = 0.0;
  double real_tokens = 0.0;
};

Row Measure(LengthDistribution dist, size_t n, const Budget& budget, const StepTimeModel& model) {
  // Enough windows for a stable mean without making the run long.
  const size_t windows = std::max<size_t>(8, 65536 / n);
  Row row;
  double form_s = 0.0;
  double ref_s = 0.0;
  for (size_t k = 0; k < windows; ++k) {
    const auto w = SyntheticWindow(dist, n, 4096, 1000 + k);
    auto t0 = CpuSeconds();
    const auto form = FormGroups(w, budget, model);
    auto t1 = CpuSeconds();
    const auto ref = ReferenceOdbGroups(w, budget);
    auto t2 = CpuSeconds();
    const auto greedy = GreedyFewestSteps(w, budget);
    form_s += t1 - t0;
    ref_s += t2 - t1;
    row.form_cost += TotalStepTime(w, form, model, budget.model);
    row.ref_cost += TotalStepTime(w, ref, model, budget.model);
    row.greedy_cost += TotalStepTime(w, greedy, model, budget.model);
    row.form_steps += form.size();
    row.ref_steps += ref.size();
    row.greedy_steps += greedy.size();
    uint64_t total_tokens = 0;
    for (const SampleLengths& s : w) total_tokens += s.tokens;
    row.lower_bound_steps += (total_tokens + budget.max_tokens - 1) / budget.max_tokens;
    for (const Group& g : form) {
      std::vector<SampleLengths> members;
      for (size_t i : g.members) {
        members.push_back(w[i]);
        row.real_tokens += w[i].tokens;
      }
      row.padded_tokens += static_cast<double>(PaddedTokens(budget.model, members));
    }
  }
  row.form_us = 1e6 * form_s / static_cast<double>(windows);
  row.ref_us = 1e6 * ref_s / static_cast<double>(windows);
  return row;
}

void Run() {
  const StepTimeModel model;  // per_step 512, 1 per padded token
  std::printf("StepTimeModel: per_step=%.0f per_padded_token=%.1f per_len_sq=%.1f\n",
              model.per_step, model.per_padded_token, model.per_len_sq);
  std::printf("times: thread CPU microseconds per window (mean)\n");
  std::printf("lb_st: ceil(sum(len) / max_tokens) per window, a floor on any grouping's steps\n");
  std::printf("cost ratio < 1 means FormGroups is cheaper; steps summed over all windows\n\n");
  const LengthDistribution dists[] = {LengthDistribution::kUniform, LengthDistribution::kLogNormal,
                                      LengthDistribution::kBimodal, LengthDistribution::kShort,
                                      LengthDistribution::kImageText};
  for (CostModel cm : {CostModel::kPadded, CostModel::kPacked}) {
    Budget budget;
    budget.model = cm;
    std::printf("budget: %s\n", DescribeBudget(budget).c_str());
    std::printf("%-10s %6s %11s %10s %9s %9s %8s %8s %8s %8s %9s\n", "dist", "window", "form_us/win",
                "ref_us/win", "vs_ref", "vs_greedy", "steps", "ref_st", "grdy_st", "lb_st", "pad_waste");
    for (LengthDistribution dist : dists) {
      for (size_t n : {64, 256, 1024, 4096}) {
        const Row r = Measure(dist, n, budget, model);
        std::printf("%-10s %6zu %11.1f %10.1f %9.4f %9.4f %8zu %8zu %8zu %8zu %8.2f%%\n",
                    DistributionName(dist), n, r.form_us, r.ref_us, r.form_cost / r.ref_cost,
                    r.form_cost / r.greedy_cost, r.form_steps, r.ref_steps, r.greedy_steps,
                    r.lower_bound_steps, 100.0 * (r.padded_tokens - r.real_tokens) / r.padded_tokens);
      }
    }
    std::printf("\n");
  }
}

}  // namespace
}  // namespace odb::grouping

int main() {
  odb::grouping::Run();
  return 0;
}
