#include "src/align/window_partitioned.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace odb::align {

namespace {

uint64_t StepLossOf(const PlannedStep& s) {
  uint64_t n = 0;
  for (const SampleMeta& m : s.samples) n += LossTokensOf(m);
  return n;
}

// splitmix64's finaliser: a number every rank computes alike from shared values.
uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

bool LongerFirst(const SampleMeta& a, const SampleMeta& b);
double CostOf(const WindowBalanceConfig& config, const std::vector<SampleMeta>& samples);
PlannedStep MakeStep(const WindowBalanceConfig& config, std::vector<SampleMeta> samples);
std::optional<std::vector<std::vector<SampleMeta>>> LayPart(const WindowBalanceConfig& config,
                                                            const std::vector<SampleMeta>& samples,
                                                            size_t ranks);

}  // namespace

absl::Status CheckWindowTargetCounts(uint64_t tokens_per_step, uint64_t samples, uint64_t loss,
                                     size_t world) {
  if (tokens_per_step == 0 || samples == 0 || loss == 0) return absl::OkStatus();
  if (static_cast<unsigned __int128>(tokens_per_step) * samples >= loss) return absl::OkStatus();
  // The same verdict and message as CheckWindowTarget: a plan of `samples`
  // samples carrying `loss` loss tokens, spread as evenly as they go.
  RoundPlan plan;
  plan.num_steps = 1;
  plan.ranks.resize(std::max<size_t>(world, 1));
  PlannedStep step;
  step.idle = false;
  step.samples.resize(samples);
  for (uint64_t i = 0; i < samples; ++i) {
    SampleMeta& m = step.samples[i];
    m.id = i;
    m.loss_tokens = loss / samples + (i < loss % samples ? 1 : 0);
    m.lengths.tokens = static_cast<uint32_t>(std::min<uint64_t>(m.loss_tokens, UINT32_MAX));
  }
  plan.ranks[0].steps.push_back(std::move(step));
  for (size_t r = 1; r < plan.ranks.size(); ++r) plan.ranks[r].steps.emplace_back();
  return CheckWindowTarget(tokens_per_step, plan);
}

uint64_t SquaredLossTokens(const std::vector<PlannedStep>& steps) {
  uint64_t sum_sq = 0;
  for (const PlannedStep& s : steps) {
    for (const SampleMeta& m : s.samples) {
      const uint64_t l = LossTokensOf(m);
      sum_sq = SaturatingAdd(sum_sq, l * l);
    }
  }
  return sum_sq;
}

PartitionedWindows::PartitionedWindows(uint64_t target, std::vector<uint64_t> step_loss,
                                       std::vector<uint64_t> step_real, size_t world, uint64_t tol)
    : target_(target),
      step_loss_(std::move(step_loss)),
      step_real_(std::move(step_real)),
      world_(world),
      tol_(tol) {
  step_begin_.resize(step_loss_.size());
  uint64_t total = 0;
  for (size_t k = 0; k < step_loss_.size(); ++k) {
    step_begin_[k] = total;
    total += step_loss_[k];
  }
  if (target_ == 0) return;
  // The nominal ends j x target <= total, each in the first step whose end
  // reaches it (a step of no loss tokens after an end joins the next window).
  // With tol, an end inside a step may move to the step's start or end
  // (window_partitioned.h, "Micro-step-aware ends"); `prev` is the previous
  // end as planned here: its boundary when it moved, else its nominal
  // position (where a split lands is known only after the offers).
  const uint64_t band_lo = target_ > tol_ ? target_ - tol_ : 0, band_hi = target_ + tol_;
  auto in_band = [&](uint64_t from, uint64_t to) {
    return to > from && to - from >= band_lo && to - from <= band_hi;
  };
  size_t k = 0;
  uint64_t prev = 0;
  for (uint64_t x = target_; x <= total; x += target_) {
    while (step_begin_[k] + step_loss_[k] < x) ++k;
    End e;
    e.step = static_cast<uint32_t>(k);
    e.offset = x - step_begin_[k];
    e.inside = e.offset < step_loss_[k];
    uint64_t at = x;
    if (e.inside && tol_ > 0) {
      const uint64_t start = step_begin_[k], stop = step_begin_[k] + step_loss_[k];
      const bool to_start = x - start <= tol_ && in_band(prev, start);
      const bool to_stop = stop - x <= tol_ && in_band(prev, stop);
      if (to_start && (!to_stop || x - start <= stop - x)) {
        e.moved = -1;
        at = start;
      } else if (to_stop) {
        e.moved = 1;
        at = stop;
      }
      if (e.moved != 0) {
        e.inside = false;
        ++moved_;
      }
    }
    if (e.inside) inside_.push_back(ends_.size());
    ends_.push_back(e);
    prev = at;
    if (total - x < target_) break;  // no overflow of x
  }
  // Merge candidates: the boundaries next to a step with an inside end.
  first_inside_.assign(step_loss_.size(), -1);
  last_inside_.assign(step_loss_.size(), -1);
  for (size_t i : inside_) {
    const uint32_t s = ends_[i].step;
    if (first_inside_[s] < 0) first_inside_[s] = static_cast<int>(i);
    last_inside_[s] = static_cast<int>(i);
  }
  for (size_t k = 0; k + 1 < step_loss_.size(); ++k) {
    if (last_inside_[k] >= 0 || first_inside_[k + 1] >= 0) boundaries_.push_back(static_cast<uint32_t>(k));
  }
}

void PartitionedWindows::EnableMerges(const WindowBalanceConfig& config, bool move_samples) {
  merge_config_ = config;
  merge_moves_ = move_samples;
  merge_enabled_ = true;
}

void PartitionedWindows::LargestParts(const RoundPlan& plan, int r, uint32_t k, std::vector<SampleMeta>* left,
                                      std::vector<SampleMeta>* right) const {
  // The largest parts either side of k | k+1: from the prefix of step k's
  // last inside end (its cut is there or one sample later), to one sample
  // past the prefix of step k+1's first inside end.
  const PlannedStep& l = plan.ranks[r].steps[k];
  const PlannedStep& h = plan.ranks[r].steps[k + 1];
  const size_t from = last_inside_[k] < 0 ? 0 : PrefixAt(l, ends_[last_inside_[k]], nullptr);
  const size_t to = first_inside_[k + 1] < 0
                        ? h.samples.size()
                        : std::min(h.samples.size(), PrefixAt(h, ends_[first_inside_[k + 1]], nullptr) + 1);
  left->insert(left->end(), l.samples.begin() + static_cast<std::ptrdiff_t>(from), l.samples.end());
  right->insert(right->end(), h.samples.begin(), h.samples.begin() + static_cast<std::ptrdiff_t>(to));
}

std::optional<std::vector<std::vector<SampleMeta>>> PartitionedWindows::MergedLayout(const RoundPlan& plan,
                                                                                     int begin, int end,
                                                                                     uint32_t k) const {
  const size_t ranks = static_cast<size_t>(end - begin);
  double worst_left = 0.0, worst_right = 0.0;
  std::vector<SampleMeta> all;
  for (int r = begin; r < end; ++r) {
    if (plan.ranks[r].steps[k].over_budget || plan.ranks[r].steps[k + 1].over_budget) return std::nullopt;
    std::vector<SampleMeta> left, right;
    LargestParts(plan, r, k, &left, &right);
    worst_left = std::max(worst_left, CostOf(merge_config_, left));
    worst_right = std::max(worst_right, CostOf(merge_config_, right));
    all.insert(all.end(), left.begin(), left.end());
    all.insert(all.end(), right.begin(), right.end());
  }
  std::optional<std::vector<std::vector<SampleMeta>>> groups;
  if (merge_moves_) {
    // A group's budget cost is at least its tokens: more tokens than the
    // block's ranks hold never lay out (the common case where a window is
    // about a step: no layout to search).
    uint64_t tokens = 0;
    for (const SampleMeta& m : all) tokens += m.lengths.tokens;
    if (merge_config_.budget.max_tokens > 0 && tokens > ranks * merge_config_.budget.max_tokens)
      return std::nullopt;
    std::sort(all.begin(), all.end(), LongerFirst);
    groups = LayPart(merge_config_, all, ranks);
    if (!groups) return std::nullopt;
  } else {
    // The planner moves no sample: each rank keeps its own parts.
    groups.emplace();
    for (int r = begin; r < end; ++r) {
      std::vector<SampleMeta> left, right;
      LargestParts(plan, r, k, &left, &right);
      left.insert(left.end(), right.begin(), right.end());
      grouping::GroupTally tally(merge_config_.budget);
      for (const SampleMeta& m : left) {
        if (tally.size() > 0 && !tally.CanAdd(m.lengths)) return std::nullopt;
        tally.Add(m.lengths);
      }
      if (!tally.Fits()) return std::nullopt;
      groups->push_back(std::move(left));
    }
  }
  // One micro-step never costs the block's slowest rank more than the two.
  for (const std::vector<SampleMeta>& g : *groups) {
    if (CostOf(merge_config_, g) > worst_left + worst_right) return std::nullopt;
  }
  return groups;
}

std::vector<uint8_t> PartitionedWindows::MergeFits(const RoundPlan& plan, int begin, int end) const {
  std::vector<uint8_t> out(boundaries_.size(), 0);
  if (!merge_enabled_) return out;
  for (size_t b = 0; b < boundaries_.size(); ++b) {
    auto layout = MergedLayout(plan, begin, end, boundaries_[b]);
    out[b] = layout.has_value() ? 1 : 0;
    // Apply lays the merged micro-step out as judged here: keep it (the
    // block's plan does not change in between).
    if (layout) layouts_[{begin, boundaries_[b]}] = std::move(*layout);
  }
  return out;
}

size_t MergeBitEntries(size_t bits) { return (bits + 63) / 64; }

void AppendMergeBits(const std::vector<uint8_t>& bits, std::vector<uint64_t>& loss,
                     std::vector<uint64_t>& real) {
  for (size_t m = 0; m < MergeBitEntries(bits.size()); ++m) {
    uint64_t words[2] = {0, 0};
    for (size_t i = 64 * m; i < std::min(bits.size(), 64 * m + 64); ++i) {
      if (bits[i]) words[(i - 64 * m) / 32] |= uint64_t{1} << (i % 32);
    }
    loss.push_back(words[0]);
    real.push_back(words[1]);
  }
}

absl::StatusOr<std::vector<uint8_t>> ReadMergeBits(const std::vector<uint64_t>& loss,
                                                   const std::vector<uint64_t>& real, size_t offset,
                                                   size_t bits) {
  std::vector<uint8_t> out(bits, 0);
  for (size_t m = 0; m < MergeBitEntries(bits); ++m) {
    const uint64_t words[2] = {loss[offset + m], real[offset + m]};
    if (words[0] >> 32 || words[1] >> 32)
      return absl::DataLossError("window merge bits over 32 bits an entry");
    for (size_t i = 64 * m; i < std::min(bits, 64 * m + 64); ++i) {
      out[i] = (words[(i - 64 * m) / 32] >> (i % 32)) & 1;
    }
  }
  return out;
}

size_t PartitionedWindows::PrefixAt(const PlannedStep& step, const End& e, CutOffer* offer) const {
  // The longest prefix with prefix * step_total <= offset * own, compared
  // without rounding: this rank's share of the nominal end.
  const uint64_t own = StepLossOf(step);
  const unsigned __int128 share = static_cast<unsigned __int128>(e.offset) * own;
  const uint64_t total = step_loss_[e.step];
  CutOffer o;
  size_t n = 0;
  while (n < step.samples.size()) {
    const SampleMeta& m = step.samples[n];
    const uint64_t next = o.loss + LossTokensOf(m);
    if (static_cast<unsigned __int128>(next) * total > share) {
      o.next_loss = LossTokensOf(m);  // > 0: a sample of 0 loss tokens never crosses the share
      o.next_real = m.lengths.tokens;
      break;
    }
    o.loss = next;
    o.real += m.lengths.tokens;
    ++n;
  }
  if (offer) *offer = o;
  return n;
}

std::vector<CutOffer> PartitionedWindows::Offers(const std::vector<PlannedStep>& steps) const {
  std::vector<CutOffer> out(inside_.size());
  for (size_t i = 0; i < inside_.size(); ++i) {
    const End& e = ends_[inside_[i]];
    PrefixAt(steps[e.step], e, &out[i]);
  }
  return out;
}

absl::Status PartitionedWindows::Decide(const std::vector<std::vector<CutOffer>>& offers,
                                        const std::vector<std::vector<uint8_t>>& fits) {
  if (offers.size() != world_) {
    return absl::InvalidArgumentError("window offers of " + std::to_string(offers.size()) + " ranks for " +
                                      std::to_string(world_));
  }
  for (size_t r = 0; r < world_; ++r) {
    if (offers[r].size() != inside_.size()) {
      return absl::InvalidArgumentError("rank " + std::to_string(r) + " offered " +
                                        std::to_string(offers[r].size()) +
                                        " window ends, this rank expects " + std::to_string(inside_.size()));
    }
  }
  if (!fits.empty() && fits.size() != world_) {
    return absl::InvalidArgumentError("window merge bits of " + std::to_string(fits.size()) + " ranks for " +
                                      std::to_string(world_));
  }
  merge_.assign(boundaries_.size(), fits.empty() ? 0 : 1);
  for (size_t r = 0; r < fits.size(); ++r) {
    if (fits[r].size() != boundaries_.size()) {
      return absl::InvalidArgumentError(
          "rank " + std::to_string(r) + " sent " + std::to_string(fits[r].size()) +
          " window merge bits, this rank expects " + std::to_string(boundaries_.size()));
    }
    for (size_t b = 0; b < boundaries_.size(); ++b) merge_[b] = merge_[b] && fits[r][b];
  }
  chosen_.assign(ends_.size(), Chosen{});
  const uint64_t limit = target_ + target_ / 10;  // never more than 10% over if avoidable
  uint64_t last = 0;                     // the last chosen end, world loss tokens from the round's start
  std::vector<uint64_t> pos(world_, 0);  // per rank: loss tokens before its last cut in pos_step
  uint32_t pos_step = std::numeric_limits<uint32_t>::max();
  std::vector<std::pair<uint64_t, uint32_t>> addable;  // (next sample's loss tokens, rank)
  size_t inside_index = 0;
  for (size_t j = 0; j < ends_.size(); ++j) {
    const End& e = ends_[j];
    Chosen& c = chosen_[j];
    c.step = e.step;
    const uint64_t begin = step_begin_[e.step], total = step_loss_[e.step];
    const uint64_t x = begin + e.offset;  // the nominal end
    const size_t in = e.inside ? inside_index++ : 0;
    if (x <= last) continue;  // the last window already reached it (a sample over a whole target)
    if (e.moved < 0) {        // moved to the step's start (micro-step-aware)
      if (begin <= last) continue;  // a split before it went past it (a sample of over target / 2)
      c.kind = Kind::kBefore;
      last = begin;
      continue;
    }
    if (!e.inside) {  // on the step's end: exact, or moved there
      c.kind = Kind::kAfter;
      last = begin + total;
      continue;
    }
    if (pos_step != e.step) {
      std::fill(pos.begin(), pos.end(), 0);
      pos_step = e.step;
    }
    // Every rank at its prefix within its share (or, where an earlier end of
    // this step took its next sample already, there: cuts never go back);
    // then the ranks' next samples, smallest first, until the end is reached.
    std::vector<uint8_t> over(world_, 0);
    uint64_t base = 0, base_real = 0;
    addable.clear();
    for (size_t r = 0; r < world_; ++r) {
      const CutOffer& o = offers[r][in];
      if (pos[r] > o.loss) {
        over[r] = 1;
        base += o.loss + o.next_loss;
        base_real += o.real + o.next_real;
      } else {
        base += o.loss;
        base_real += o.real;
        if (o.next_loss > 0) addable.emplace_back(o.next_loss, static_cast<uint32_t>(r));
      }
    }
    std::sort(addable.begin(), addable.end());
    std::optional<size_t> under_m, over_m;  // how many next samples the two sides of the bracket add
    uint64_t under_loss = 0, over_loss = 0, first = base;
    if (first <= e.offset) under_m = 0, under_loss = first;
    if (first >= e.offset) over_m = 0, over_loss = first;
    for (size_t m = 0; first < e.offset && m < addable.size();) {
      first += addable[m++].first;
      if (first <= e.offset) under_m = m, under_loss = first;
      if (first >= e.offset && !over_m) over_m = m, over_loss = first;
    }
    if (!over_m || over_loss > total) {
      return absl::InvalidArgumentError("the ranks' window offers at step " + std::to_string(e.step) +
                                        " add up to " + std::to_string(first) +
                                        " loss tokens, the step's total is " + std::to_string(total));
    }
    struct Candidate {
      Kind kind;
      uint64_t at;   // world loss tokens from the round's start
      size_t added;  // kSplit: next samples added
      uint64_t loss;
    };
    std::vector<Candidate> candidates;
    if (begin > last) candidates.push_back({Kind::kBefore, begin, 0, 0});
    candidates.push_back({Kind::kAfter, begin + total, 0, 0});
    auto split_ok = [&](uint64_t l) { return l > 0 && l < total && begin + l > last; };
    if (under_m && split_ok(under_loss))
      candidates.push_back({Kind::kSplit, begin + under_loss, *under_m, under_loss});
    if (split_ok(over_loss)) candidates.push_back({Kind::kSplit, begin + over_loss, *over_m, over_loss});
    const Candidate* lo = nullptr;  // L: the largest end <= x
    const Candidate* hi = nullptr;  // H: the smallest end >= x (kAfter is one)
    for (const Candidate& cand : candidates) {
      if (cand.at <= x && (!lo || cand.at > lo->at)) lo = &cand;
      if (cand.at >= x && (!hi || cand.at < hi->at)) hi = &cand;
    }
    const Candidate* pick = hi;
    if (lo && (hi->at - last > limit || lo->at == x)) {
      pick = lo;
    } else if (lo && hi->at > lo->at) {
      const double p_over = static_cast<double>(x - lo->at) / static_cast<double>(hi->at - lo->at);
      uint64_t h = Mix(0x6f64622d77696e64ULL, e.step);
      for (uint64_t v : {begin, total, e.offset, base, under_loss, over_loss, uint64_t{addable.size()}})
        h = Mix(h, v);
      pick = static_cast<double>(h >> 11) * 0x1.0p-53 < p_over ? hi : lo;
    }
    c.kind = pick->kind;
    last = pick->at;
    if (pick->kind != Kind::kSplit) continue;
    c.loss = pick->loss;
    c.real = base_real;
    for (size_t m = 0; m < pick->added; ++m) {
      const auto r = addable[m].second;
      over[r] = 1;
      c.real += offers[r][in].next_real;
    }
    for (size_t r = 0; r < world_; ++r) {
      const CutOffer& o = offers[r][in];
      pos[r] = over[r] ? o.loss + o.next_loss : o.loss;
    }
    c.over = std::move(over);
  }
  return absl::OkStatus();
}

void PartitionedWindows::Apply(RoundPlan& plan, int begin, int end, grouping::CostModel model,
                               WindowState& windows, bool inputs_open, bool last_samples,
                               std::vector<uint64_t>& global_real) {
  closed_.clear();
  const size_t steps = step_loss_.size();
  // The round's micro-steps: each step in parts at its chosen splits; a
  // window closes after a split, after a step with a kAfter end, and before a
  // step with a kBefore end.
  struct Segment {
    uint32_t step;
    int from, to;  // indices into chosen_ of the splits around it; -1: the step's start or end
  };
  struct Piece {
    Segment seg[2];
    int segments;  // 2: a merged micro-step (a part of step k, then one of step k + 1)
    uint64_t loss, real;
    bool closes;
  };
  std::vector<Piece> parts;
  std::vector<bool> closes_after(steps, false);
  std::vector<std::vector<int>> splits(steps);
  for (size_t j = 0; j < chosen_.size(); ++j) {
    const Chosen& c = chosen_[j];
    if (c.kind == Kind::kAfter) closes_after[c.step] = true;
    if (c.kind == Kind::kBefore && c.step > 0) closes_after[c.step - 1] = true;
    if (c.kind == Kind::kSplit) splits[c.step].push_back(static_cast<int>(j));
  }
  std::vector<size_t> first_part(steps), last_part(steps);
  for (uint32_t k = 0; k < steps; ++k) {
    int from = -1;
    uint64_t loss = 0, real = 0;
    first_part[k] = parts.size();
    for (int j : splits[k]) {
      parts.push_back({{{k, from, j}, {}}, 1, chosen_[j].loss - loss, chosen_[j].real - real, true});
      loss = chosen_[j].loss;
      real = chosen_[j].real;
      from = j;
    }
    last_part[k] = parts.size();
    parts.push_back({{{k, from, -1}, {}}, 1, step_loss_[k] - loss, step_real_[k] - real, closes_after[k]});
  }
  // Merged parts (window_partitioned.h): left to right, a candidate boundary
  // every rank fits, inside one window, whose parts are the judged ones and
  // whose left part is not merged already.
  merged_ = 0;
  std::vector<int> absorbs(parts.size(), -1);
  std::vector<bool> absorbed(parts.size(), false);
  for (size_t b = 0; b < boundaries_.size() && b < merge_.size(); ++b) {
    if (!merge_[b]) continue;
    const uint32_t k = boundaries_[b];
    const size_t left = last_part[k], right = first_part[k + 1];
    const bool left_judged = last_inside_[k] < 0 || chosen_[last_inside_[k]].kind == Kind::kSplit;
    const bool right_judged = first_inside_[k + 1] < 0 || chosen_[first_inside_[k + 1]].kind == Kind::kSplit;
    if (parts[left].closes || !left_judged || !right_judged || absorbed[left]) continue;
    absorbs[left] = static_cast<int>(right);
    absorbed[right] = true;
    ++merged_;
  }
  std::vector<Piece> pieces;
  pieces.reserve(parts.size() - merged_);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (absorbed[i]) continue;
    Piece p = parts[i];
    if (absorbs[i] >= 0) {
      const Piece& q = parts[static_cast<size_t>(absorbs[i])];
      p.seg[1] = q.seg[0];
      p.segments = 2;
      p.loss += q.loss;
      p.real += q.real;
      p.closes = q.closes;
    }
    pieces.push_back(p);
  }
  // The open window: the pieces after the last close.
  size_t open = pieces.size();
  while (open > 0 && !pieces[open - 1].closes) --open;
  bool close_open = false;
  if (open < pieces.size()) {
    uint64_t tail = 0;
    for (size_t i = open; i < pieces.size(); ++i) tail += pieces[i].loss;
    // As ApplyWindows (window.h): a tail that neither grew nor let a window
    // close for kMaxHeldRounds rounds while no input could reach it closes
    // short; so does every tail at the epoch's end, or of its last samples.
    const bool no_growth = open == 0 && !inputs_open && tail <= windows.held_tokens;
    const uint32_t held_rounds = no_growth ? windows.held_rounds + 1 : 0;
    if (plan.epoch_finished || last_samples || held_rounds >= kMaxHeldRounds) {
      close_open = true;
      windows.held_rounds = 0;
      windows.held_tokens = 0;
    } else {
      windows.held_rounds = held_rounds;
      windows.held_tokens = tail;
    }
  } else {
    windows.held_rounds = 0;
    windows.held_tokens = 0;
  }
  const size_t kept = close_open ? pieces.size() : open;
  // Window of each piece: totals and lengths.
  std::vector<uint64_t> window_of(pieces.size()), window_total, window_steps;
  {
    uint64_t w = 0, total = 0, count = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      window_of[i] = w;
      total += pieces[i].loss;
      ++count;
      if (pieces[i].closes || i + 1 == pieces.size()) {
        window_total.push_back(total);
        window_steps.push_back(count);
        total = count = 0;
        ++w;
      }
    }
  }
  // With moves, a merged micro-step is laid out over the block as MergeFits
  // judged it (the block's largest parts), then each group keeps only the
  // samples of the realised parts: a subset of a group within the budget is
  // within it. Groups go costliest first to the rank that owns most of
  // their samples (then the lower rank).
  std::vector<std::vector<std::vector<SampleMeta>>> laid(pieces.size());
  if (merge_moves_) {
    for (size_t i = 0; i < kept; ++i) {
      if (pieces[i].segments != 2) continue;
      std::optional<std::vector<std::vector<SampleMeta>>> groups;
      if (auto it = layouts_.find({begin, pieces[i].seg[0].step}); it != layouts_.end()) {
        groups = std::move(it->second);
      } else {
        groups = MergedLayout(plan, begin, end, pieces[i].seg[0].step);
      }
      if (!groups) continue;  // not this block's verdict in MergeFits: cannot happen; kept as cut
      std::set<std::pair<int32_t, uint64_t>> realised;
      for (int r = begin; r < end; ++r) {
        for (const Segment& seg : pieces[i].seg) {
          const PlannedStep& s = plan.ranks[r].steps[seg.step];
          const size_t a =
              seg.from < 0 ? 0 : PrefixAt(s, ends_[seg.from], nullptr) + chosen_[seg.from].over[r];
          const size_t b =
              seg.to < 0 ? s.samples.size() : PrefixAt(s, ends_[seg.to], nullptr) + chosen_[seg.to].over[r];
          for (size_t n = a; n < b; ++n) realised.emplace(s.samples[n].owner_rank, s.samples[n].id);
        }
      }
      const size_t ranks = static_cast<size_t>(end - begin);
      std::vector<std::pair<double, size_t>> by_cost;
      for (size_t g = 0; g < groups->size(); ++g)
        by_cost.emplace_back(CostOf(merge_config_, (*groups)[g]), g);
      std::stable_sort(by_cost.begin(), by_cost.end(),
                       [](const auto& x, const auto& y) { return x.first > y.first; });
      std::vector<std::vector<SampleMeta>>& out = laid[i];
      out.assign(ranks, {});
      std::vector<bool> taken(ranks, false);
      for (const auto& [cost, g] : by_cost) {
        std::vector<uint32_t> owned(ranks, 0);
        for (const SampleMeta& m : (*groups)[g]) {
          const int64_t r = static_cast<int64_t>(m.owner_rank) - begin;
          if (r >= 0 && r < static_cast<int64_t>(ranks)) ++owned[static_cast<size_t>(r)];
        }
        size_t pick = ranks;
        for (size_t r = 0; r < ranks; ++r) {
          if (!taken[r] && (pick == ranks || owned[r] > owned[pick])) pick = r;
        }
        taken[pick] = true;
        for (const SampleMeta& m : (*groups)[g]) {
          if (realised.count({m.owner_rank, m.id}) > 0) out[pick].push_back(m);
        }
      }
    }
  }
  const double w = static_cast<double>(world_);
  for (int r = begin; r < end; ++r) {
    RankPlan& rp = plan.ranks[r];
    std::vector<PlannedStep> original = std::move(rp.steps);
    rp.steps.clear();
    rp.steps.reserve(kept);
    std::vector<size_t> cut_at(chosen_.size(), 0);  // this rank's sample index at each split
    for (uint32_t k = 0; k < steps; ++k) {
      for (int j : splits[k]) {
        cut_at[j] = PrefixAt(original[k], ends_[j], nullptr) + chosen_[j].over[r];
      }
    }
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      PlannedStep part;
      for (int g = 0; g < p.segments; ++g) {
        const Segment& seg = p.seg[g];
        const PlannedStep& s = original[seg.step];
        const size_t a = seg.from < 0 ? 0 : cut_at[seg.from];
        const size_t b = seg.to < 0 ? s.samples.size() : cut_at[seg.to];
        if (i >= kept) {
          for (size_t n = a; n < b; ++n)
            plan.ranks[s.samples[n].owner_rank].keep_pending.push_back(KeyOf(s.samples[n]));
          continue;
        }
        if (g == 0) {
          part = (a == 0 && b == s.samples.size()) ? s : StepPart(s, a, b, model);
        } else {
          // A merged micro-step: the second part's samples after the first's.
          const bool over = part.over_budget || (s.over_budget && b > a);
          part.samples.insert(part.samples.end(), s.samples.begin() + static_cast<std::ptrdiff_t>(a),
                              s.samples.begin() + static_cast<std::ptrdiff_t>(b));
          part = StepPart(part, 0, part.samples.size(), model);
          part.over_budget = over && !part.idle;
        }
      }
      if (i >= kept) continue;
      if (!laid[i].empty())
        part = MakeStep(merge_config_, std::move(laid[i][static_cast<size_t>(r - begin)]));
      const uint64_t wi = window_of[i];
      const uint64_t total = window_total[wi];
      part.loss_tokens = StepLossOf(part);
      part.window = windows.next_window + wi;
      part.window_steps = static_cast<uint32_t>(window_steps[wi]);
      part.window_loss_tokens = total;
      part.closes_window = pieces[i].closes || i + 1 == pieces.size();
      part.window_short = close_open && i >= open;
      part.window_target = target_;
      part.loss_weight = (part.idle || total == 0)
                             ? 0.0
                             : w * static_cast<double>(part.loss_tokens) / static_cast<double>(total);
      rp.steps.push_back(std::move(part));
    }
  }
  const uint64_t closed = kept == 0 ? 0 : window_of[kept - 1] + 1;
  for (uint64_t i = 0; i < closed; ++i) closed_.push_back(window_total[i]);
  windows.next_window += closed;
  global_real.clear();
  for (size_t i = 0; i < kept; ++i) global_real.push_back(pieces[i].real);
  plan.num_steps = static_cast<uint32_t>(kept);
}

namespace {

// A layout of the block's part of a window under both time models: (a),
// the sum over micro-steps of the block's slowest rank's cost; (b), the
// block's slowest rank's sum over the window (WindowCost); and its IDLE
// rank-steps.
struct BlockScore {
  double sync = 0.0, window = 0.0;
  size_t idle = 0;
};

BlockScore ScoreOf(const WindowBalanceConfig& config, const std::vector<GlobalStep>& window) {
  BlockScore score;
  if (window.empty()) return score;
  std::vector<double> sums(window.front().size(), 0.0);
  for (const GlobalStep& g : window) {
    double worst = 0.0;
    for (size_t r = 0; r < g.size(); ++r) {
      const double c = MicroStepCost(config, g[r]);
      worst = std::max(worst, c);
      sums[r] += c;
      score.idle += g[r].samples.empty() ? 1 : 0;
    }
    score.sync += worst;
  }
  for (double x : sums) score.window = std::max(score.window, x);
  return score;
}

bool LongerFirst(const SampleMeta& a, const SampleMeta& b) {
  if (a.lengths.tokens != b.lengths.tokens) return a.lengths.tokens > b.lengths.tokens;
  return KeyOf(a) < KeyOf(b);
}

// A rank's micro-step of `samples`, its tokens as StepPart sets them.
PlannedStep MakeStep(const WindowBalanceConfig& config, std::vector<SampleMeta> samples) {
  return StepOf(std::move(samples), config.budget.model);
}

// MicroStepCost of a micro-step of `samples`, without building it.
double CostOf(const WindowBalanceConfig& config, const std::vector<SampleMeta>& samples) {
  const grouping::StepTimeModel& m = config.step_model;
  if (samples.empty()) return m.per_step;
  uint32_t longest = 0;
  uint64_t sum = 0;
  double sum_sq = 0.0;
  for (const SampleMeta& x : samples) {
    longest = std::max(longest, x.lengths.tokens);
    sum += x.lengths.tokens;
    sum_sq += static_cast<double>(x.lengths.tokens) * static_cast<double>(x.lengths.tokens);
  }
  const uint64_t padded =
      config.budget.model == grouping::CostModel::kPadded ? samples.size() * uint64_t{longest} : sum;
  return m.per_step + m.per_padded_token * static_cast<double>(padded) + m.per_len_sq * sum_sq;
}

// The block's samples of one micro-step (`samples`, longest first) in at most
// `ranks` groups within the budget, the costliest as cheap as the layout
// finds: padded, contiguous runs of the length-sorted list (the greedy cut of
// a cap is optimal among contiguous runs; the cap is searched); packed, the
// longest first onto the cheapest rank that holds it. Then, while a rank is
// left empty, the costliest group of two or more samples is halved (never
// costlier). nullopt: no layout within the budget found.
std::optional<std::vector<std::vector<SampleMeta>>> LayPart(const WindowBalanceConfig& config,
                                                            const std::vector<SampleMeta>& samples,
                                                            size_t ranks) {
  std::vector<std::vector<SampleMeta>> groups;
  if (config.budget.model == grouping::CostModel::kPadded) {
    auto cut = [&](double cap, std::vector<std::vector<SampleMeta>>* out) -> size_t {
      size_t used = 0;
      for (size_t i = 0; i < samples.size();) {
        grouping::GroupTally tally(config.budget);
        tally.Add(samples[i].lengths);
        double sum_sq = static_cast<double>(samples[i].lengths.tokens) * samples[i].lengths.tokens;
        size_t n = 1;
        const uint32_t longest = samples[i].lengths.tokens;
        while (i + n < samples.size()) {
          const SampleLengths& next = samples[i + n].lengths;
          const double sq = sum_sq + static_cast<double>(next.tokens) * next.tokens;
          const double cost = config.step_model.per_step +
                              config.step_model.per_padded_token * static_cast<double>((n + 1) * longest) +
                              config.step_model.per_len_sq * sq;
          if (cost > cap || !tally.CanAdd(next)) break;
          tally.Add(next);
          sum_sq = sq;
          ++n;
        }
        if (out)
          out->emplace_back(samples.begin() + static_cast<std::ptrdiff_t>(i),
                            samples.begin() + static_cast<std::ptrdiff_t>(i + n));
        ++used;
        i += n;
        if (used > ranks && !out) return used;
      }
      return used;
    };
    if (cut(std::numeric_limits<double>::infinity(), nullptr) > ranks) return std::nullopt;
    double lo = 0.0, hi = 0.0;  // lo: infeasible (or 0), hi: feasible
    for (const SampleMeta& m : samples) {
      hi = std::max(hi, CostOf(config, {m}));
    }
    // hi: the budget's fullest group is feasible; start from the costliest
    // sample alone and double up to it.
    lo = hi;
    while (cut(hi, nullptr) > ranks) {
      lo = hi;
      hi *= 2.0;
    }
    if (lo < hi) {
      for (int it = 0; it < 40 && hi - lo > 1e-6 * hi; ++it) {
        const double mid = 0.5 * (lo + hi);
        if (cut(mid, nullptr) <= ranks)
          hi = mid;
        else
          lo = mid;
      }
    }
    cut(hi, &groups);
  } else {
    groups.assign(ranks, {});
    std::vector<grouping::GroupTally> tallies(ranks, grouping::GroupTally(config.budget));
    std::vector<double> cost(ranks, config.step_model.per_step);
    for (const SampleMeta& m : samples) {
      size_t best = ranks;
      for (size_t r = 0; r < ranks; ++r) {
        if ((tallies[r].size() == 0 || tallies[r].CanAdd(m.lengths)) &&
            (best == ranks || cost[r] < cost[best]))
          best = r;
      }
      if (best == ranks) return std::nullopt;
      tallies[best].Add(m.lengths);
      groups[best].push_back(m);
      cost[best] = CostOf(config, groups[best]);
    }
    std::erase_if(groups, [](const std::vector<SampleMeta>& g) { return g.empty(); });
  }
  // Fill the empty ranks: halve the costliest group of two or more.
  std::vector<double> costs;
  costs.reserve(ranks);
  for (const std::vector<SampleMeta>& g : groups) costs.push_back(CostOf(config, g));
  while (groups.size() < ranks) {
    size_t best = groups.size();
    for (size_t g = 0; g < groups.size(); ++g) {
      if (groups[g].size() >= 2 && (best == groups.size() || costs[g] > costs[best])) best = g;
    }
    if (best == groups.size()) break;
    std::vector<SampleMeta>& g = groups[best];
    const size_t half = (g.size() + 1) / 2;
    std::vector<SampleMeta> tail(g.begin() + static_cast<std::ptrdiff_t>(half), g.end());
    g.resize(half);
    costs[best] = CostOf(config, g);
    costs.push_back(CostOf(config, tail));
    groups.push_back(std::move(tail));
  }
  return groups;
}

// The block's part of one window (window[k][rank], its micro-steps) laid out
// again: each micro-step's samples by LayPart, its groups handed to the
// block's ranks costliest first, each to a rank of the least cost so far in
// the window, of those the one that owns most of its samples (no payload
// move; then the lower rank). `begin`: the block's first rank (window[k][r]
// is rank begin + r). Every micro-step keeps its samples over the block.
// false: some micro-step has no layout within the budget.
bool RelayBlockWindow(const WindowBalanceConfig& config, const std::vector<GlobalStep>& window, int begin,
                      std::vector<GlobalStep>& out) {
  if (window.empty()) return false;
  const size_t ranks = window.front().size();
  std::vector<double> load(ranks, 0.0);
  out.clear();
  out.reserve(window.size());
  for (const GlobalStep& g : window) {
    std::vector<SampleMeta> samples;
    for (const PlannedStep& s : g) samples.insert(samples.end(), s.samples.begin(), s.samples.end());
    std::sort(samples.begin(), samples.end(), LongerFirst);
    auto groups = LayPart(config, samples, ranks);
    if (!groups) return false;
    std::vector<std::pair<double, size_t>> by_cost;  // (cost, group)
    for (size_t i = 0; i < groups->size(); ++i) by_cost.emplace_back(CostOf(config, (*groups)[i]), i);
    std::stable_sort(by_cost.begin(), by_cost.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    GlobalStep step(ranks);
    std::vector<bool> taken(ranks, false);
    std::vector<uint32_t> owned(ranks, 0);  // of the group at hand, samples each rank owns
    for (const auto& [cost, g] : by_cost) {
      std::vector<SampleMeta>& group = (*groups)[g];
      for (const SampleMeta& m : group) {
        const int64_t r = static_cast<int64_t>(m.owner_rank) - begin;
        if (r >= 0 && r < static_cast<int64_t>(ranks)) ++owned[static_cast<size_t>(r)];
      }
      size_t pick = ranks;
      for (size_t r = 0; r < ranks; ++r) {
        if (taken[r]) continue;
        if (pick == ranks || load[r] < load[pick] || (load[r] == load[pick] && owned[r] > owned[pick]))
          pick = r;
      }
      for (const SampleMeta& m : group) {
        const int64_t r = static_cast<int64_t>(m.owner_rank) - begin;
        if (r >= 0 && r < static_cast<int64_t>(ranks)) owned[static_cast<size_t>(r)] = 0;
      }
      taken[pick] = true;
      step[pick] = MakeStep(config, std::move(group));
      load[pick] += MicroStepCost(config, step[pick]);
    }
    for (size_t r = 0; r < ranks; ++r) {
      if (taken[r]) continue;
      step[r] = MakeStep(config, {});
      load[r] += MicroStepCost(config, step[r]);
    }
    out.push_back(std::move(step));
  }
  return true;
}

}  // namespace

bool BalanceBlockWindows(const WindowBalanceConfig& config, RoundPlan& plan, int begin, int end) {
  if (begin >= end || plan.num_steps == 0) return false;
  const double world = static_cast<double>(plan.ranks.size());
  const uint32_t steps = plan.num_steps;
  bool changed = false;
  for (uint32_t first = 0; first < steps;) {
    // The block's micro-steps of one window: the same window id on every rank.
    const uint64_t id = plan.ranks[begin].steps[first].window;
    uint32_t last = first;
    while (last < steps && plan.ranks[begin].steps[last].window == id) ++last;
    std::vector<GlobalStep> window(last - first, GlobalStep(static_cast<size_t>(end - begin)));
    bool over_budget = false;  // a lone sample no budget holds: left as it is (as BalanceWindow does)
    for (uint32_t k = first; k < last; ++k) {
      for (int r = begin; r < end; ++r) {
        window[k - first][static_cast<size_t>(r - begin)] = plan.ranks[r].steps[k];
        over_budget = over_budget || plan.ranks[r].steps[k].over_budget;
      }
    }
    // Candidates, each keeping every micro-step's samples over the block: the
    // cut as it is, MoveSamples on it, the re-layout (RelayBlockWindow) and
    // MoveSamples on that. MoveSamples on the cut is kept as before when its
    // block's slowest rank over the window (time model b) is no costlier than
    // the cut's; a re-layout replaces it when its (b) is no costlier than
    // that and its (a) + (b) over the block is less ((a): the sum over
    // micro-steps of the slowest rank's cost), or the same (within 1e-9) with
    // fewer IDLE rank-steps; ties keep the earlier.
    std::vector<GlobalStep>* best = nullptr;
    std::vector<GlobalStep> moved, relaid, relaid_moved;
    if (!over_budget) {
      const BlockScore cut = ScoreOf(config, window);
      double best_score = cut.sync + cut.window, cap_b = cut.window;
      size_t best_idle = cut.idle;
      moved = window;
      if (MoveSamples(config, moved, /*within_steps=*/true)) {
        const BlockScore m = ScoreOf(config, moved);
        if (m.window <= cut.window) {
          best = &moved;
          best_score = m.sync + m.window;
          best_idle = m.idle;
          cap_b = m.window;
        }
      }
      auto consider = [&](std::vector<GlobalStep>& w) {
        const BlockScore c = ScoreOf(config, w);
        if (c.window > cap_b) return;
        const double score = c.sync + c.window, eps = 1e-9 * best_score;
        if (score < best_score - eps || (score <= best_score + eps && c.idle < best_idle)) {
          best = &w;
          best_score = score;
          best_idle = c.idle;
        }
      };
      if (RelayBlockWindow(config, window, begin, relaid)) {
        consider(relaid);
        relaid_moved = relaid;
        if (MoveSamples(config, relaid_moved, /*within_steps=*/true)) consider(relaid_moved);
      }
    }
    if (best != nullptr) {
      changed = true;
      for (uint32_t k = first; k < last; ++k) {
        for (int r = begin; r < end; ++r) {
          PlannedStep& s = plan.ranks[r].steps[k];
          PlannedStep& laid = (*best)[k - first][static_cast<size_t>(r - begin)];
          s.samples = std::move(laid.samples);
          s.real_tokens = laid.real_tokens;
          s.padded_tokens = laid.padded_tokens;
          s.idle = laid.idle;
          s.loss_tokens = StepLossOf(s);
          s.loss_weight =
              (s.idle || s.window_loss_tokens == 0)
                  ? 0.0
                  : world * static_cast<double>(s.loss_tokens) / static_cast<double>(s.window_loss_tokens);
        }
      }
    }
    first = last;
  }
  return changed;
}

}  // namespace odb::align
