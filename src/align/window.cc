#include "src/align/window.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <iterator>
#include <queue>
#include <string>
#include <utility>
#include <vector>

namespace odb::align {

uint64_t LossTokensOf(const SampleMeta& sample) {
  return sample.loss_tokens == kEveryTokenBearsLoss ? sample.lengths.tokens
                                                    : std::min(sample.loss_tokens, sample.lengths.tokens);
}

PlannedStep StepPart(const PlannedStep& s, size_t begin, size_t end, grouping::CostModel model) {
  PlannedStep p;
  p.samples.assign(s.samples.begin() + static_cast<std::ptrdiff_t>(begin),
                   s.samples.begin() + static_cast<std::ptrdiff_t>(end));
  p.idle = p.samples.empty();
  std::vector<SampleLengths> lens;
  lens.reserve(p.samples.size());
  for (const SampleMeta& m : p.samples) {
    p.real_tokens += m.lengths.tokens;
    lens.push_back(m.lengths);
  }
  p.padded_tokens = p.idle ? 0 : grouping::PaddedTokens(model, lens);
  p.over_budget = s.over_budget && !p.idle;
  return p;
}

namespace {

uint64_t StepLoss(const PlannedStep& s) {
  uint64_t n = 0;
  for (const SampleMeta& m : s.samples) n += LossTokensOf(m);
  return n;
}

uint64_t GlobalLoss(const GlobalStep& g) {
  uint64_t n = 0;
  for (const PlannedStep& s : g) n += StepLoss(s);
  return n;
}

// Where each rank cuts its part of a step: samples [0, cut[r]) go first.
using Cuts = std::vector<size_t>;

std::pair<GlobalStep, GlobalStep> SplitAt(const GlobalStep& g, const Cuts& cuts, grouping::CostModel model) {
  GlobalStep a, b;
  a.reserve(g.size());
  b.reserve(g.size());
  for (size_t r = 0; r < g.size(); ++r) {
    a.push_back(StepPart(g[r], 0, cuts[r], model));
    b.push_back(StepPart(g[r], cuts[r], g[r].samples.size(), model));
  }
  return {std::move(a), std::move(b)};
}

// The two ways to cut an aligned step so that its first part carries about
// `need` of its loss tokens, the largest first part not above `need` and the
// smallest not below it (a first part may be empty or whole). Every rank
// starts at the longest prefix within its own share (need / total of its loss
// tokens); then the ranks' next samples are added one at a time, smallest
// first, until the first part reaches `need`. The two cuts differ by one
// sample, so a window can end within a sample of its goal on either side.
std::pair<Cuts, Cuts> BracketCuts(const GlobalStep& g, uint64_t need, uint64_t total) {
  Cuts cut(g.size(), 0);
  uint64_t first = 0;
  for (size_t r = 0; r < g.size(); ++r) {
    const PlannedStep& s = g[r];
    // running <= need * StepLoss(s) / total, compared without rounding.
    const unsigned __int128 share = static_cast<unsigned __int128>(need) * StepLoss(s);
    uint64_t running = 0;
    while (cut[r] < s.samples.size()) {
      const uint64_t next = running + LossTokensOf(s.samples[cut[r]]);
      if (static_cast<unsigned __int128>(next) * total > share) break;
      running = next;
      ++cut[r];
    }
    first += running;
  }
  Cuts under = cut;
  // Each rank's next sample, smallest first (ties: the lowest rank).
  using Next = std::pair<uint64_t, size_t>;  // (its loss tokens, rank)
  std::priority_queue<Next, std::vector<Next>, std::greater<Next>> next;
  for (size_t r = 0; r < g.size(); ++r) {
    if (cut[r] < g[r].samples.size()) next.push({LossTokensOf(g[r].samples[cut[r]]), r});
  }
  while (first < need && !next.empty()) {  // empty: the whole step is under `need`
    const auto [smallest, pick] = next.top();
    next.pop();
    first += smallest;
    ++cut[pick];
    if (cut[pick] < g[pick].samples.size()) next.push({LossTokensOf(g[pick].samples[cut[pick]]), pick});
    if (first <= need) under = cut;
  }
  return {std::move(under), std::move(cut)};
}

// A number in [0, 1) that every rank computes alike from the step's samples
// and the window's progress (the plan is identical on every rank), so a
// dithered choice is the same everywhere and again after a resume.
double SharedUniform(const GlobalStep& g, uint64_t acc, uint64_t goal) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ acc ^ (goal << 17);
  auto mix = [&h](uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 29;
  };
  for (const PlannedStep& s : g) {
    for (const SampleMeta& m : s.samples) {
      mix(m.id);
      mix(static_cast<uint64_t>(static_cast<uint32_t>(m.owner_rank)));
    }
  }
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// Closes steps [begin, end) of `out` as one window: lays them out again over
// the ranks when the config says so (window_balance.h; the step count may
// drop), then sets their window fields and weights.
void CloseWindow(const WindowConfig& config, std::vector<GlobalStep>& out, size_t begin, bool is_short,
                 WindowState& windows, uint64_t target) {
  if (config.balance && target != 0 && begin < out.size()) {
    std::vector<GlobalStep> window(std::make_move_iterator(out.begin() + static_cast<std::ptrdiff_t>(begin)),
                                   std::make_move_iterator(out.end()));
    BalanceWindow(*config.balance, window);
    out.resize(begin);
    for (GlobalStep& g : window) out.push_back(std::move(g));
  }
  uint64_t total = 0;
  for (size_t k = begin; k < out.size(); ++k) total += GlobalLoss(out[k]);
  const double world = out.empty() ? 0.0 : static_cast<double>(out[begin].size());
  for (size_t k = begin; k < out.size(); ++k) {
    for (PlannedStep& s : out[k]) {
      s.loss_tokens = StepLoss(s);
      s.window = windows.next_window;
      s.window_steps = static_cast<uint32_t>(out.size() - begin);
      s.window_loss_tokens = total;
      s.closes_window = k + 1 == out.size();
      s.window_short = is_short;
      s.window_target = target;
      s.loss_weight = (s.idle || total == 0)
                          ? 0.0
                          : world * static_cast<double>(s.loss_tokens) / static_cast<double>(total);
    }
  }
  ++windows.next_window;
}

}  // namespace

absl::Status CheckWindowTarget(uint64_t tokens_per_step, const RoundPlan& plan) {
  if (tokens_per_step == 0) return absl::OkStatus();
  uint64_t samples = 0, loss = 0;
  for (const RankPlan& rp : plan.ranks) {
    for (const PlannedStep& s : rp.steps) {
      samples += s.samples.size();
      loss += StepLoss(s);
    }
  }
  const uint64_t world = plan.ranks.size();
  if (samples == 0 || loss == 0) return absl::OkStatus();
  const uint64_t mean = (loss + samples / 2) / samples;  // loss tokens of a sample, rounded
  // Below one sample: target * samples < loss, compared without rounding. (Below one sample per
  // rank is allowed: at a large world a window may be smaller than one sample per rank.)
  if (static_cast<unsigned __int128>(tokens_per_step) * samples >= loss) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "optimizer.tokens_per_step " + std::to_string(tokens_per_step) +
      " is less than one sample: the first " + "samples carry " + std::to_string(mean) +
      " loss tokens on average, so every optimizer step would be a " +
      "single sample, far over its target. The setting counts loss tokens summed over all " +
      std::to_string(world) + " rank(s), not samples: for N samples per optimizer step set about N x " +
      std::to_string(mean) + " (16 samples: " + std::to_string(16 * mean) + "). 0 turns windows off (one " +
      "optimizer step per micro-step).");
}

bool InputsOpen(const RoundState& state, uint32_t window) {
  for (const RankRound& rr : state.ranks) {
    if (!rr.stream_finished && !rr.input_blocked && (window == 0 || rr.pending.size() < window)) return true;
  }
  return false;
}

void ApplyWindows(const WindowConfig& config, RoundPlan& plan, WindowState& windows, bool inputs_open) {
  const size_t world = plan.ranks.size();
  if (plan.num_steps == 0 || world == 0) return;
  std::deque<GlobalStep> queue(plan.num_steps, GlobalStep(world));
  for (size_t r = 0; r < world; ++r) {
    for (uint32_t k = 0; k < plan.num_steps; ++k) queue[k][r] = std::move(plan.ranks[r].steps[k]);
  }
  std::vector<GlobalStep> out;
  out.reserve(queue.size());
  const uint64_t target = config.tokens_per_step;
  size_t open = 0;  // first step of the open window in `out`
  if (target == 0) {
    // Every step is its own window: the weights of one step, as without windows.
    for (GlobalStep& g : queue) {
      out.push_back(std::move(g));
      CloseWindow(config, out, out.size() - 1, false, windows, 0);
    }
    open = out.size();
  } else {
    const uint64_t limit = target + target / 10;  // never more than 10% over if avoidable
    // When the end over the goal is refused (more than 10% over the target),
    // the end under it is taken with no draw: what that window fell short of
    // its goal is carried into the next window's goal (at most 10% of the
    // target), else windows of a few samples with a long tail of lengths ran
    // 2.6% short of their target on average (window_test, sigma 1.2). Only
    // then: carrying every draw's residue moves the goals of all windows and
    // costs splits (batching_sim, packed, 1m windows: 0.940 -> 0.862 of the
    // bound). Per round, like every window decision (window.h: a resumed
    // round cuts the same windows).
    const int64_t max_carry = static_cast<int64_t>(target / 10);
    int64_t carry = 0;
    uint64_t acc = 0;
    while (!queue.empty()) {
      const uint64_t goal = static_cast<uint64_t>(static_cast<int64_t>(target) + carry);
      GlobalStep g = std::move(queue.front());
      queue.pop_front();
      const uint64_t tok = GlobalLoss(g);
      if (acc + tok < goal) {
        out.push_back(std::move(g));
        acc += tok;
        continue;
      }
      // This step reaches the goal. The window can end before it, inside it
      // (split within a sample of the goal, under or over) or after it. Of these, take
      // the nearest end at or under the goal (L) and the nearest at or over it
      // (H, never more than 10% over the target when L exists), and pick H
      // with probability (goal - L) / (H - L): each window then holds the
      // goal in expectation. Always taking the nearest end is biased: an end
      // far over the limit is refused while one far under is not, and on
      // windows of ~16 samples that cost 2-3% of every optimizer batch.
      enum Choice { kBefore, kSplitDown, kSplitUp, kAfter };
      struct Candidate {
        Choice choice;
        uint64_t total;
      };
      std::vector<Candidate> candidates;
      if (acc > 0) candidates.push_back({kBefore, acc});
      candidates.push_back({kAfter, acc + tok});
      std::pair<GlobalStep, GlobalStep> down, up;
      if (acc + tok > goal) {
        const auto [cut_down, cut_up] = BracketCuts(g, goal - acc, tok);
        down = SplitAt(g, cut_down, config.cost_model);
        up = SplitAt(g, cut_up, config.cost_model);
        const uint64_t first_down = GlobalLoss(down.first);
        const uint64_t first_up = GlobalLoss(up.first);
        if (first_down > 0 && first_down < tok) candidates.push_back({kSplitDown, acc + first_down});
        if (first_up > 0 && first_up < tok) candidates.push_back({kSplitUp, acc + first_up});
      }
      const Candidate* under = nullptr;  // L: the largest total <= goal
      const Candidate* over = nullptr;   // H: the smallest total >= goal
      for (const Candidate& c : candidates) {
        if (c.total <= goal && (!under || c.total > under->total)) under = &c;
        if (c.total >= goal && (!over || c.total < over->total)) over = &c;
      }
      const Candidate* pick = over;  // kAfter always reaches the goal: `over` exists
      carry = 0;
      if (under && (over->total > limit || under->total == goal)) {
        pick = under;
        carry = std::min(static_cast<int64_t>(goal - under->total), max_carry);
      } else if (under && over->total > under->total) {
        const double p_over = static_cast<double>(goal - under->total) / static_cast<double>(over->total - under->total);
        pick = SharedUniform(g, acc, goal) < p_over ? over : under;
      }
      switch (pick->choice) {
        case kBefore:
          CloseWindow(config, out, open, false, windows, target);
          queue.push_front(std::move(g));
          break;
        case kSplitDown:
          out.push_back(std::move(down.first));
          CloseWindow(config, out, open, false, windows, target);
          queue.push_front(std::move(down.second));
          break;
        case kSplitUp:
          out.push_back(std::move(up.first));
          CloseWindow(config, out, open, false, windows, target);
          queue.push_front(std::move(up.second));
          break;
        case kAfter:
          out.push_back(std::move(g));
          CloseWindow(config, out, open, false, windows, target);
          break;
      }
      open = out.size();
      acc = 0;
    }
  }
  const bool closed_any = open > 0;
  if (open < out.size()) {
    // An open window: its weights need its total, so it waits for the next
    // round unless the epoch ends or it stopped growing (see window.h).
    uint64_t tail = 0;
    for (size_t k = open; k < out.size(); ++k) tail += GlobalLoss(out[k]);
    // A tail that neither grew nor let a window close for kMaxHeldRounds
    // rounds while no input could reach it (every rank's planner window or
    // buffer is full, or its stream ended) cannot reach its goal: it closes
    // short rather than holding the job. Rounds with inputs still open do not
    // count (their number is a matter of timing, see window.h).
    const bool no_growth = !closed_any && !inputs_open && tail <= windows.held_tokens;
    const uint32_t held_rounds = no_growth ? windows.held_rounds + 1 : 0;
    if (plan.epoch_finished || held_rounds >= kMaxHeldRounds) {
      CloseWindow(config, out, open, true, windows, target);
      windows.held_rounds = 0;
      windows.held_tokens = 0;
    } else {
      for (size_t k = open; k < out.size(); ++k) {
        for (const PlannedStep& s : out[k]) {
          for (const SampleMeta& m : s.samples) {
            plan.ranks[static_cast<size_t>(m.owner_rank)].keep_pending.push_back(KeyOf(m));
          }
        }
      }
      out.resize(open);
      windows.held_rounds = held_rounds;
      windows.held_tokens = tail;
    }
  } else {
    windows.held_rounds = 0;
    windows.held_tokens = 0;
  }
  plan.num_steps = static_cast<uint32_t>(out.size());
  for (size_t r = 0; r < world; ++r) {
    plan.ranks[r].steps.clear();
    plan.ranks[r].steps.reserve(out.size());
    for (GlobalStep& g : out) plan.ranks[r].steps.push_back(std::move(g[r]));
  }
}

}  // namespace odb::align
