#ifndef ODB_GROUPING_BUDGET_H_
#define ODB_GROUPING_BUDGET_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "src/common/sample.h"

namespace odb::grouping {

// How a group's size is charged against the token budget.
enum class CostModel {
  kPadded,  // group size x longest (effective) length <= max_tokens
  kPacked,  // sum of (effective) lengths <= max_tokens
};

// The budget every group must respect. A zero limit means "no limit".
struct Budget {
  CostModel model = CostModel::kPadded;
  // L_max: padded or packed tokens per group. Default 4096.
  uint64_t max_tokens = 4096;
  // Quadratic attention term: effective length = len + len*len/q. 0 disables it.
  // Use it when long samples cost more than their length (attention is O(len^2)).
  double quadratic_q = 0.0;
  // Most samples in one group; 0 = unbounded.
  uint32_t max_group_size = 0;
  // Per-modality budgets on the group's sum; 0 = unbounded.
  uint64_t max_vision_patches = 0;
  uint64_t max_audio_frames = 0;
};

// Step-time model used as the grouping objective and by the simulator:
// cost(step) = per_step + per_padded_token * padded_tokens + per_len_sq * sum(len^2).
struct StepTimeModel {
  double per_step = 512.0;  // fixed cost of a step, in units of one padded token
  double per_padded_token = 1.0;
  double per_len_sq = 0.0;
};

// Effective length of one sample under the budget's quadratic term.
inline double EffectiveLength(const Budget& budget, uint32_t tokens);

// Budget-charged size of a group (padded: n * max eff. length; packed: sum).
double GroupBudgetCost(const Budget& budget, std::span<const SampleLengths> members);

// Tokens the trainer computes on for the group: padded -> n * max(len), packed -> sum(len).
uint64_t PaddedTokens(CostModel model, std::span<const SampleLengths> members);

// True when the group respects every limit of the budget.
bool FitsBudget(const Budget& budget, std::span<const SampleLengths> members);

// True when the sample alone fits; a sample that does not is "over budget".
bool FitsAlone(const Budget& budget, const SampleLengths& sample);

// Step time of one group under the model.
double StepTime(const StepTimeModel& model, CostModel cost_model,
                std::span<const SampleLengths> members);

// "max_tokens=4096 model=padded ..." for logs and error messages.
std::string DescribeBudget(const Budget& budget);

// --- Additions beyond the original contract -------------------------------
//
// Every budget check in the project goes through the two cost functions below,
// computed from exact integer aggregates, so that a group's verdict does not
// depend on the order its members are summed in (the grouper builds groups
// incrementally, FitsBudget re-checks them from scratch: both must agree to the
// last bit).

// Padded budget cost of `group_size` samples whose longest has `longest_tokens`.
inline double PaddedBudgetCost(const Budget& budget, uint64_t group_size, uint32_t longest_tokens);

// Packed budget cost from sum(len) and sum(len^2) (the latter saturating at
// UINT64_MAX; such a group never fits any realistic budget anyway).
inline double PackedBudgetCost(const Budget& budget, uint64_t sum_tokens, uint64_t sum_tokens_sq);

// Running aggregates of a group, to test "does this group still fit if I add
// that sample" in O(1). FitsBudget is defined as "a tally of the members fits".
class GroupTally {
 public:
  explicit GroupTally(const Budget& budget) : budget_(&budget) {}

  void Add(const SampleLengths& sample);
  // Would the group still fit every limit with `sample` added?
  bool CanAdd(const SampleLengths& sample) const;
  bool Fits() const { return FitsTokens() && FitsSize() && FitsModalities(); }

  // The individual limits, for callers that prune differently per limit.
  bool FitsTokens() const;
  bool FitsSize() const;
  bool FitsModalities() const;
  double BudgetCost() const;

  uint64_t size() const { return size_; }
  uint32_t longest_tokens() const { return longest_tokens_; }
  uint64_t sum_tokens() const { return sum_tokens_; }

 private:
  const Budget* budget_;  // not owned; outlives the tally
  uint64_t size_ = 0;
  uint32_t longest_tokens_ = 0;
  uint64_t sum_tokens_ = 0;
  uint64_t sum_tokens_sq_ = 0;  // saturating
  uint64_t sum_vision_ = 0;
  uint64_t sum_audio_ = 0;
};

// Inline: the window balance's packing (window_balance.cc) tests a tally
// millions of times a round.
inline double PackedBudgetCost(const Budget& budget, uint64_t sum_tokens, uint64_t sum_tokens_sq) {
  double cost = static_cast<double>(sum_tokens);
  if (budget.quadratic_q > 0.0) cost += static_cast<double>(sum_tokens_sq) / budget.quadratic_q;
  return cost;
}

inline double EffectiveLength(const Budget& budget, uint32_t tokens) {
  // Same arithmetic as a packed group of one, so singletons agree everywhere.
  return PackedBudgetCost(budget, tokens, static_cast<uint64_t>(tokens) * tokens);
}

inline double PaddedBudgetCost(const Budget& budget, uint64_t group_size, uint32_t longest_tokens) {
  // Effective length is monotone in tokens, so the longest member has the
  // longest effective length.
  return static_cast<double>(group_size) * EffectiveLength(budget, longest_tokens);
}

inline void GroupTally::Add(const SampleLengths& sample) {
  ++size_;
  longest_tokens_ = std::max(longest_tokens_, sample.tokens);
  sum_tokens_ += sample.tokens;
  const uint64_t sq = static_cast<uint64_t>(sample.tokens) * sample.tokens;
  sum_tokens_sq_ =
      sum_tokens_sq_ + sq < sum_tokens_sq_ ? std::numeric_limits<uint64_t>::max() : sum_tokens_sq_ + sq;
  sum_vision_ += sample.vision_patches;
  sum_audio_ += sample.audio_frames;
}

inline bool GroupTally::CanAdd(const SampleLengths& sample) const {
  GroupTally next = *this;
  next.Add(sample);
  return next.Fits();
}

inline double GroupTally::BudgetCost() const {
  if (size_ == 0) return 0.0;
  if (budget_->model == CostModel::kPadded) {
    return PaddedBudgetCost(*budget_, size_, longest_tokens_);
  }
  return PackedBudgetCost(*budget_, sum_tokens_, sum_tokens_sq_);
}

inline bool GroupTally::FitsTokens() const {
  return budget_->max_tokens == 0 || BudgetCost() <= static_cast<double>(budget_->max_tokens);
}

inline bool GroupTally::FitsSize() const {
  return budget_->max_group_size == 0 || size_ <= budget_->max_group_size;
}

inline bool GroupTally::FitsModalities() const {
  return (budget_->max_vision_patches == 0 || sum_vision_ <= budget_->max_vision_patches) &&
         (budget_->max_audio_frames == 0 || sum_audio_ <= budget_->max_audio_frames);
}

}  // namespace odb::grouping

#endif  // ODB_GROUPING_BUDGET_H_
