#include "src/align/planned_groups.h"

#include <algorithm>
#include <limits>

namespace odb::align {

SampleKey MinKey(std::span<const SampleMeta> samples, std::span<const size_t> members) {
  SampleKey best{std::numeric_limits<int32_t>::max(), std::numeric_limits<uint64_t>::max()};
  for (size_t i : members) best = std::min(best, KeyOf(samples[i]));
  return best;
}

uint64_t PaddedOf(grouping::CostModel model, std::span<const SampleMeta> samples, std::span<const size_t> members) {
  uint64_t longest = 0, sum = 0;
  for (size_t i : members) {
    longest = std::max<uint64_t>(longest, samples[i].lengths.tokens);
    sum += samples[i].lengths.tokens;
  }
  return model == grouping::CostModel::kPadded ? longest * members.size() : sum;
}

std::vector<size_t> FillOrder(grouping::CostModel model, std::span<const SampleMeta> samples,
                              const std::vector<std::span<const size_t>>& groups) {
  struct Keyed {
    size_t n;
    uint64_t padded;
    SampleKey key;
    size_t g;
  };
  std::vector<Keyed> keyed;
  keyed.reserve(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    keyed.push_back({groups[i].size(), PaddedOf(model, samples, groups[i]), MinKey(samples, groups[i]), i});
  }
  std::sort(keyed.begin(), keyed.end(), [](const Keyed& a, const Keyed& b) {
    if (a.n != b.n) return a.n > b.n;
    if (a.padded != b.padded) return a.padded > b.padded;
    return a.key < b.key;
  });
  std::vector<size_t> order;
  order.reserve(keyed.size());
  for (const Keyed& k : keyed) order.push_back(k.g);
  return order;
}

PlannedStep MakeStep(grouping::CostModel model, std::span<const SampleMeta> samples,
                     std::span<const size_t> members, bool over_budget) {
  PlannedStep s;
  if (members.empty()) return s;  // IDLE
  s.idle = false;
  s.over_budget = over_budget;
  s.samples.reserve(members.size());
  for (size_t i : members) {
    s.samples.push_back(samples[i]);
    s.real_tokens += samples[i].lengths.tokens;
  }
  s.padded_tokens = PaddedOf(model, samples, members);
  return s;
}

}  // namespace odb::align
