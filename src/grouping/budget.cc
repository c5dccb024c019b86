#include "src/grouping/budget.h"

#include <algorithm>
#include <limits>
#include <sstream>

namespace odb::grouping {
namespace {

uint64_t Square(uint32_t tokens) { return static_cast<uint64_t>(tokens) * tokens; }

const char* ModelName(CostModel model) {
  switch (model) {
    case CostModel::kPadded:
      return "padded";
    case CostModel::kPacked:
      return "packed";
  }
  return "unknown";
}

}  // namespace

double GroupBudgetCost(const Budget& budget, std::span<const SampleLengths> members) {
  GroupTally tally(budget);
  for (const SampleLengths& m : members) tally.Add(m);
  return tally.BudgetCost();
}

uint64_t PaddedTokens(CostModel model, std::span<const SampleLengths> members) {
  uint64_t longest = 0;
  uint64_t sum = 0;
  for (const SampleLengths& m : members) {
    longest = std::max<uint64_t>(longest, m.tokens);
    sum += m.tokens;
  }
  return model == CostModel::kPadded ? longest * members.size() : sum;
}

bool FitsBudget(const Budget& budget, std::span<const SampleLengths> members) {
  GroupTally tally(budget);
  for (const SampleLengths& m : members) tally.Add(m);
  return tally.Fits();
}

bool FitsAlone(const Budget& budget, const SampleLengths& sample) {
  return FitsBudget(budget, std::span<const SampleLengths>(&sample, 1));
}

double StepTime(const StepTimeModel& model, CostModel cost_model,
                std::span<const SampleLengths> members) {
  // An empty group is no step at all.
  if (members.empty()) return 0.0;
  double sum_sq = 0.0;
  for (const SampleLengths& m : members) sum_sq += static_cast<double>(Square(m.tokens));
  return model.per_step +
         model.per_padded_token * static_cast<double>(PaddedTokens(cost_model, members)) +
         model.per_len_sq * sum_sq;
}

std::string DescribeBudget(const Budget& budget) {
  // Zero limits are printed as 0, meaning "no limit", exactly as configured.
  std::ostringstream out;
  out << "max_tokens=" << budget.max_tokens << " model=" << ModelName(budget.model)
      << " quadratic_q=" << budget.quadratic_q << " max_group_size=" << budget.max_group_size
      << " max_vision_patches=" << budget.max_vision_patches
      << " max_audio_frames=" << budget.max_audio_frames;
  return out.str();
}

}  // namespace odb::grouping
