#include "src/align/window.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <utility>
#include <vector>

namespace odb::align {

uint64_t LossTokensOf(const SampleMeta& sample) {
  return sample.loss_tokens == kEveryTokenBearsLoss ? sample.lengths.tokens
                                                    : std::min(sample.loss_tokens, sample.lengths.tokens);
}

namespace {

using GlobalStep = std::vector<PlannedStep>;  // one aligned step: index = rank

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

// Samples [begin, end) of a step, its counts recomputed (a subset of a step
// within the budget is within the budget).
PlannedStep Part(const PlannedStep& s, size_t begin, size_t end, grouping::CostModel model) {
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

// Splits an aligned step in two so that the first part carries about `need`
// of its `total` loss tokens: every rank gives the prefix of its samples whose
// loss tokens are nearest to its own share (need / total of them).
std::pair<GlobalStep, GlobalStep> Split(const GlobalStep& g, uint64_t need, uint64_t total,
                                        grouping::CostModel model) {
  GlobalStep a, b;
  a.reserve(g.size());
  b.reserve(g.size());
  const double share = static_cast<double>(need) / static_cast<double>(total);
  for (const PlannedStep& s : g) {
    const double want = share * static_cast<double>(StepLoss(s));
    size_t cut = 0;
    double best = want;  // |0 - want|: no sample
    double running = 0;
    for (size_t i = 0; i < s.samples.size(); ++i) {
      running += static_cast<double>(LossTokensOf(s.samples[i]));
      if (std::abs(running - want) < best) {
        best = std::abs(running - want);
        cut = i + 1;
      }
    }
    a.push_back(Part(s, 0, cut, model));
    b.push_back(Part(s, cut, s.samples.size(), model));
  }
  return {std::move(a), std::move(b)};
}

// Sets the window fields and weights of steps [begin, end) of `out`, one window.
void CloseWindow(std::vector<GlobalStep>& out, size_t begin, bool is_short, WindowState& windows,
                 uint64_t target) {
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

void ApplyWindows(const WindowConfig& config, RoundPlan& plan, WindowState& windows) {
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
      CloseWindow(out, out.size() - 1, false, windows, 0);
    }
    open = out.size();
  } else {
    const uint64_t goal = target;
    const uint64_t limit = target + target / 10;                     // never more than 10% over if avoidable
    uint64_t acc = 0;
    while (!queue.empty()) {
      GlobalStep g = std::move(queue.front());
      queue.pop_front();
      const uint64_t tok = GlobalLoss(g);
      if (acc + tok < goal) {
        out.push_back(std::move(g));
        acc += tok;
        continue;
      }
      // This step reaches the goal: end the window before it, inside it (split)
      // or after it, whichever lands nearest the goal without going more than
      // 10% over the target when some choice avoids that.
      auto score = [&](uint64_t total) {
        const uint64_t off = total > goal ? total - goal : goal - total;
        return std::make_pair(total > limit ? 1 : 0, off);
      };
      enum { kBefore, kSplit, kAfter } choice = kAfter;
      auto best = score(acc + tok);
      std::pair<GlobalStep, GlobalStep> parts;
      if (acc + tok > goal) {
        parts = Split(g, goal - acc, tok, config.cost_model);
        const uint64_t first = GlobalLoss(parts.first);
        if (first > 0 && first < tok && score(acc + first) < best) {
          choice = kSplit;
          best = score(acc + first);
        }
        if (acc > 0 && score(acc) < best) choice = kBefore;
      }
      switch (choice) {
        case kBefore:
          CloseWindow(out, open, false, windows, target);
          queue.push_front(std::move(g));
          break;
        case kSplit:
          out.push_back(std::move(parts.first));
          CloseWindow(out, open, false, windows, target);
          queue.push_front(std::move(parts.second));
          break;
        case kAfter:
          out.push_back(std::move(g));
          CloseWindow(out, open, false, windows, target);
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
    // rounds cannot reach its goal (every rank's planner window is full, a
    // buffer is full, the producers stopped): it closes short rather than
    // holding the job.
    const bool no_growth = !closed_any && tail <= windows.held_tokens;
    const uint32_t held_rounds = no_growth ? windows.held_rounds + 1 : 0;
    if (plan.epoch_finished || held_rounds >= kMaxHeldRounds) {
      CloseWindow(out, open, true, windows, target);
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
