#include "src/grouping/budget.h"

#include <algorithm>
#include <limits>
#include <sstream>

namespace odb::grouping {
namespace {

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  const uint64_t sum = a + b;
  return sum < a ? std::numeric_limits<uint64_t>::max() : sum;
}

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

double PackedBudgetCost(const Budget& budget, uint64_t sum_tokens, uint64_t sum_tokens_sq) {
  double cost = static_cast<double>(sum_tokens);
  if (budget.quadratic_q > 0.0) cost += static_cast<double>(sum_tokens_sq) / budget.quadratic_q;
  return cost;
}

double EffectiveLength(const Budget& budget, uint32_t tokens) {
  // Same arithmetic as a packed group of one, so singletons agree everywhere.
  return PackedBudgetCost(budget, tokens, Square(tokens));
}

double PaddedBudgetCost(const Budget& budget, uint64_t group_size, uint32_t longest_tokens) {
  // Effective length is monotone in tokens, so the longest member has the
  // longest effective length.
  return static_cast<double>(group_size) * EffectiveLength(budget, longest_tokens);
}

void GroupTally::Add(const SampleLengths& sample) {
  ++size_;
  longest_tokens_ = std::max(longest_tokens_, sample.tokens);
  sum_tokens_ += sample.tokens;
  sum_tokens_sq_ = SaturatingAdd(sum_tokens_sq_, Square(sample.tokens));
  sum_vision_ += sample.vision_patches;
  sum_audio_ += sample.audio_frames;
}

bool GroupTally::CanAdd(const SampleLengths& sample) const {
  GroupTally next = *this;
  next.Add(sample);
  return next.Fits();
}

double GroupTally::BudgetCost() const {
  if (size_ == 0) return 0.0;
  if (budget_->model == CostModel::kPadded) {
    return PaddedBudgetCost(*budget_, size_, longest_tokens_);
  }
  return PackedBudgetCost(*budget_, sum_tokens_, sum_tokens_sq_);
}

bool GroupTally::FitsTokens() const {
  return budget_->max_tokens == 0 || BudgetCost() <= static_cast<double>(budget_->max_tokens);
}

bool GroupTally::FitsSize() const {
  return budget_->max_group_size == 0 || size_ <= budget_->max_group_size;
}

bool GroupTally::FitsModalities() const {
  return (budget_->max_vision_patches == 0 || sum_vision_ <= budget_->max_vision_patches) &&
         (budget_->max_audio_frames == 0 || sum_audio_ <= budget_->max_audio_frames);
}

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
