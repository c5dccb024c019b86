#include "src/align/window.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

namespace odb::align {

uint64_t LossTokensOf(const SampleMeta& sample) {
  return sample.loss_tokens == kEveryTokenBearsLoss ? sample.lengths.tokens
                                                    : std::min(sample.loss_tokens, sample.lengths.tokens);
}

uint64_t SpreadTolerance(uint64_t n, uint64_t sum, uint64_t sum_sq, uint64_t target, double spread) {
  if (spread <= 0.0 || target == 0 || n < 2 || sum == 0) return 0;
  const double count = static_cast<double>(n);
  const double mean = static_cast<double>(sum) / count;
  const double var = std::max(0.0, static_cast<double>(sum_sq) / count - mean * mean);
  const double tol = spread * std::sqrt(var * static_cast<double>(target) / mean);
  return static_cast<uint64_t>(std::min(tol, static_cast<double>(target / 2)));
}

PlannedStep StepOf(std::vector<SampleMeta> samples, grouping::CostModel model) {
  PlannedStep p;
  p.samples = std::move(samples);
  p.idle = p.samples.empty();
  std::vector<SampleLengths> lens;
  lens.reserve(p.samples.size());
  for (const SampleMeta& m : p.samples) {
    p.real_tokens += m.lengths.tokens;
    lens.push_back(m.lengths);
  }
  p.padded_tokens = p.idle ? 0 : grouping::PaddedTokens(model, lens);
  return p;
}

PlannedStep StepPart(const PlannedStep& s, size_t begin, size_t end, grouping::CostModel model) {
  PlannedStep p = StepOf(std::vector<SampleMeta>(s.samples.begin() + static_cast<std::ptrdiff_t>(begin),
                                                 s.samples.begin() + static_cast<std::ptrdiff_t>(end)),
                         model);
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

// The tolerance of micro-step-aware ends (window.h) over the whole plan's
// samples.
uint64_t PlanSpreadTolerance(const RoundPlan& plan, uint64_t target, double spread) {
  if (spread <= 0.0 || target == 0) return 0;
  uint64_t n = 0, sum = 0, sum_sq = 0;
  for (const RankPlan& rp : plan.ranks) {
    for (const PlannedStep& s : rp.steps) {
      for (const SampleMeta& m : s.samples) {
        const uint64_t l = LossTokensOf(m);
        ++n;
        sum += l;
        sum_sq = SaturatingAdd(sum_sq, l * l);
      }
    }
  }
  return SpreadTolerance(n, sum, sum_sq, target, spread);
}

size_t SampleCount(const GlobalStep& g) {
  size_t n = 0;
  for (const PlannedStep& s : g) n += s.samples.size();
  return n;
}

uint64_t PrefixLoss(const GlobalStep& g, const Cuts& cut) {
  uint64_t n = 0;
  for (size_t r = 0; r < g.size(); ++r) {
    for (size_t i = 0; i < cut[r]; ++i) n += LossTokensOf(g[r].samples[i]);
  }
  return n;
}

// One way to end the open window at step g: before it, inside it (a split)
// or after it, and the window's loss tokens then.
struct WindowEnd {
  enum Choice { kBefore, kSplit, kAfter };
  Choice choice = kAfter;
  uint64_t total = 0;
  Cuts cut;  // kSplit: rank r's samples [0, cut[r]) of g go into the window
};

// The ends of the window whose steps so far are out[open..] (`acc` loss
// tokens) at the step g (`tok` loss tokens) that reaches its goal, and the
// micro-steps each would run (window.h, "Micro-step-aware ends").
class WindowEnds {
 public:
  WindowEnds(const WindowConfig& config, const std::vector<GlobalStep>& out, size_t open, const GlobalStep& g,
             uint64_t acc, uint64_t tok)
      : config_(config), out_(out), open_(open), g_(g), acc_(acc), tok_(tok) {
    for (size_t k = open; k < out.size(); ++k) {
      for (const PlannedStep& s : out[k]) {
        over_budget_ = over_budget_ || s.over_budget;
        samples_ += s.samples.size();
        for (const SampleMeta& m : s.samples) tokens_ += m.lengths.tokens;
      }
    }
    for (const PlannedStep& s : g) over_budget_ = over_budget_ || s.over_budget;
  }

  WindowEnd Before() const { return {WindowEnd::kBefore, acc_, {}}; }
  WindowEnd After() const { return {WindowEnd::kAfter, acc_ + tok_, {}}; }
  // The end at `cut`: a split when its first part holds some of g's loss
  // tokens but not all of them, else the end before or after g.
  WindowEnd Split(const Cuts& cut) const {
    const uint64_t first = PrefixLoss(g_, cut);
    if (first == 0) return Before();
    if (first >= tok_) return After();
    return {WindowEnd::kSplit, acc_ + first, cut};
  }
  // The end of about `x` loss tokens, not above it (x >= acc).
  WindowEnd At(uint64_t x) const {
    if (x >= acc_ + tok_) return After();
    if (x <= acc_) return Before();
    return Split(BracketCuts(g_, x - acc_, tok_).first);
  }
  // What the window with end `e` runs: its micro-steps per rank (its steps
  // and parts, after BalanceWindow when the window is balanced, as
  // CloseWindow runs it), its time, WindowCost under the balance's step
  // model (without one: the micro-steps), and the window itself. Each end is
  // balanced once (kept for CloseWindow: Take). An empty window: none
  // possible.
  struct Run {
    size_t micro_steps;
    double cost;
  };
  Run RunOf(const WindowEnd& e) const {
    if (e.total == 0) return {std::numeric_limits<size_t>::max(), std::numeric_limits<double>::infinity()};
    for (const Probe& p : probes_) {
      if (Same(p.end, e)) return p.run;
    }
    std::vector<GlobalStep> window(out_.begin() + static_cast<std::ptrdiff_t>(open_), out_.end());
    if (e.choice == WindowEnd::kAfter) window.push_back(g_);
    if (e.choice == WindowEnd::kSplit) window.push_back(SplitAt(g_, e.cut, config_.cost_model).first);
    if (!config_.balance) return {window.size(), static_cast<double>(window.size())};
    BalanceWindow(*config_.balance, window);
    const Run run{window.size(), WindowCost(*config_.balance, window)};
    probes_.push_back({e, run, std::move(window)});
    return run;
  }
  // The balanced window of an end RunOf ran, moved out (nullopt: not run).
  std::optional<std::vector<GlobalStep>> Take(const WindowEnd& e) const {
    for (Probe& p : probes_) {
      if (Same(p.end, e) && !p.taken) {
        p.taken = true;
        return std::move(p.window);
      }
    }
    return std::nullopt;
  }
  // Whether the end `e`'s window runs fewer than `m` micro-steps (`strict`)
  // or at most `m`: settled without balancing where the bounds decide it
  // (BalanceWindow never runs more micro-steps than the planner's steps, and
  // never fewer than FewestMicroSteps; a window with an over-budget step is
  // left as it is), else by RunOf.
  bool RunsWithin(const WindowEnd& e, size_t m, bool strict) const {
    if (e.total == 0) return false;
    auto within = [&](size_t n) { return strict ? n < m : n <= m; };
    const size_t steps = (out_.size() - open_) + (e.choice == WindowEnd::kBefore ? 0 : 1);
    if (!config_.balance || within(steps)) return within(steps);
    if (!over_budget_) {
      uint64_t tokens = tokens_, samples = samples_;
      if (e.choice != WindowEnd::kBefore) {
        for (size_t r = 0; r < g_.size(); ++r) {
          const size_t n = e.choice == WindowEnd::kAfter ? g_[r].samples.size() : e.cut[r];
          samples += n;
          for (size_t i = 0; i < n; ++i) tokens += g_[r].samples[i].lengths.tokens;
        }
      }
      if (!within(FewestMicroSteps(config_.balance->budget, g_.size(), tokens, samples))) return false;
    }
    return within(RunOf(e).micro_steps);
  }

  // Of the ends in [lo, hi]: the furthest under the goal that runs fewer
  // micro-steps than `under` and the furthest over it that runs no more
  // than `over` (both searched by bisection: a window's micro-steps do not
  // fall as it grows). Returns the pair, of these and the nearest ends,
  // whose time is least per window when its two ends are taken in the
  // proportions that hold the goal on average (H a share (goal - L) / (H -
  // L) of the time; every pair then holds the same tokens); nullopt when that
  // is the nearest ends' pair.
  std::optional<std::pair<WindowEnd, WindowEnd>> FewerMicroSteps(const WindowEnd& under,
                                                                 const WindowEnd& over, uint64_t goal,
                                                                 uint64_t lo, uint64_t hi) const {
    const Run r_under = RunOf(under), r_over = RunOf(over);
    const size_t m_under = r_under.micro_steps, m_over = r_over.micro_steps;
    std::vector<std::pair<WindowEnd, double>> lows{{under, r_under.cost}}, highs{{over, r_over.cost}};
    // Under: the largest x in [max(lo, acc), under.total) whose end needs
    // fewer micro-steps than `under`.
    uint64_t a = std::max(lo, acc_), b = under.total;
    if (a < b && RunsWithin(At(a), m_under, true)) {
      while (b - a > 1) {
        const uint64_t mid = a + (b - a) / 2;
        (RunsWithin(At(mid), m_under, true) ? a : b) = mid;
      }
      const WindowEnd e = At(a);
      if (e.total >= lo && e.total < under.total) lows.push_back({e, RunOf(e).cost});
    }
    // Over: the largest x in (over.total, min(hi, acc + tok)] whose end
    // needs no more micro-steps than `over`.
    const uint64_t top = std::min(hi, acc_ + tok_);
    if (top > over.total) {
      a = over.total;
      b = top;
      if (RunsWithin(At(top), m_over, false)) {
        a = top;
      } else {
        while (b - a > 1) {
          const uint64_t mid = a + (b - a) / 2;
          (RunsWithin(At(mid), m_over, false) ? a : b) = mid;
        }
      }
      const WindowEnd e = At(a);
      if (e.total > over.total) highs.push_back({e, RunOf(e).cost});
    }
    // Mean time of a pair taken in those proportions.
    auto expected = [goal](const std::pair<WindowEnd, double>& l, const std::pair<WindowEnd, double>& h) {
      if (h.first.total <= l.first.total) return l.second;
      const double p =
          static_cast<double>(goal - l.first.total) / static_cast<double>(h.first.total - l.first.total);
      return l.second + p * (h.second - l.second);
    };
    const double nearest = expected(lows[0], highs[0]);
    double best = nearest * (1.0 - 1e-9);
    std::optional<std::pair<WindowEnd, WindowEnd>> pick;
    for (const auto& l : lows) {
      for (const auto& h : highs) {
        const double e = expected(l, h);
        if (e < best && h.first.total > l.first.total) {
          best = e;
          pick = std::make_pair(l.first, h.first);
        }
      }
    }
    return pick;
  }

 private:
  const WindowConfig& config_;
  const std::vector<GlobalStep>& out_;
  size_t open_;
  const GlobalStep& g_;
  uint64_t acc_, tok_;
  // The open window's steps so far: real tokens, samples, any over budget.
  uint64_t tokens_ = 0, samples_ = 0;
  bool over_budget_ = false;
  struct Probe {
    WindowEnd end;
    Run run;
    std::vector<GlobalStep> window;
    bool taken = false;
  };
  static bool Same(const WindowEnd& a, const WindowEnd& b) {
    return a.choice == b.choice && a.total == b.total && (a.choice != WindowEnd::kSplit || a.cut == b.cut);
  }
  mutable std::vector<Probe> probes_;  // the ends RunOf balanced
};

// Realignment (window.h, "Micro-step-aware ends"): the open window (`acc`
// loss tokens so far) would end inside the step g (`tok` loss tokens; the
// steps after it in `queue`) with no step boundary in its stead. The step
// boundaries ahead, B from the window's start, each reachable in n windows
// of [target - tol, target + tol] (n = 1: B is itself such an end), the
// round's drift after them within tol, or no larger than before, or within
// kRealignDriftTols tols (half the target where that is more and the steps
// after B are full: the next kRealignFullSteps of them, one window each,
// each within tol of the target and the drift within that cap) and repaid
// over the round's remaining windows by at most 1/kRealignGoalShare of the
// target each: of these the fewest windows, then the least drift after. The
// end returned lies in g, within tol of the target, and leaves B - end for
// n - 1 windows within tol each (the next window finds the same B); nullopt
// when no boundary qualifies or no end of g lands in that range (samples
// coarser than the range).
constexpr uint64_t kRealignMaxWindows = 3;
constexpr int64_t kRealignDriftTols = 2;
constexpr int64_t kRealignGoalShare = 128;
constexpr size_t kRealignFullSteps = 8;

std::optional<WindowEnd> Realign(const WindowEnds& ends, const GlobalStep& g,
                                 const std::deque<GlobalStep>& queue, uint64_t acc, uint64_t tok,
                                 uint64_t target, uint64_t tol, int64_t drift, uint64_t round_left) {
  const uint64_t lo = target - tol, hi = target + tol;
  // The drift a realignment may take on beyond two tols: up to half the
  // target (a partial step of p loss tokens leaves p or target - p to make
  // up on the way back to the planner's steps, the smaller at most half the
  // target), where the steps after the boundary are full (below).
  const int64_t two_tols = kRealignDriftTols * static_cast<int64_t>(tol);
  const int64_t cap = std::max(two_tols, static_cast<int64_t>(target / 2));
  // Loss tokens of g and of the steps queued after it, as far as the
  // boundaries considered below and kRealignFullSteps steps beyond them.
  std::vector<uint64_t> losses{tok};
  {
    uint64_t sum = acc + tok;
    size_t beyond = 0;
    for (const GlobalStep& q : queue) {
      if (sum > (kRealignMaxWindows + 1) * hi && ++beyond > kRealignFullSteps) break;
      losses.push_back(GlobalLoss(q));
      sum += losses.back();
    }
  }
  // Whether the steps from losses[s] on are full: the next
  // kRealignFullSteps of them (or all the round has left), one window each,
  // each within tol of the target, keep the drift (`d` after the
  // realignment) within the cap, so the windows can stay on them.
  auto full_ahead = [&](size_t s, int64_t d) {
    for (size_t j = s; j < losses.size() && j < s + kRealignFullSteps; ++j) {
      if (losses[j] < lo || losses[j] > hi) return false;
      d += static_cast<int64_t>(losses[j]) - static_cast<int64_t>(target);
      if (std::abs(d) > cap) return false;
    }
    return true;
  };
  struct Best {
    uint64_t n = 0, x_lo = 0, x_hi = 0, b = 0;
    int64_t drift_after = 0;
  };
  std::optional<Best> best;
  auto consider = [&](uint64_t b, size_t s) {
    // n windows within tol each: n x lo <= b <= n x hi.
    for (uint64_t n = std::max<uint64_t>(1, (b + hi - 1) / hi); n <= kRealignMaxWindows && n * lo <= b; ++n) {
      if (b > n * hi) continue;
      const int64_t drift_after = drift + static_cast<int64_t>(b) - static_cast<int64_t>(n * target);
      const uint64_t left = round_left > b ? round_left - b : 0;
      const int64_t mag = std::abs(drift_after);
      // A boundary that leaves the drift no larger than it is qualifies
      // (whole steps after a realignment: the drift it took on stays, the
      // windows stay on the planner's steps); else within tol, or within the
      // cap where the round's remaining windows repay it.
      if (mag > static_cast<int64_t>(tol) && mag > std::abs(drift) &&
          (mag > (full_ahead(s, drift_after) ? cap : two_tols) ||
           static_cast<unsigned __int128>(mag) * kRealignGoalShare > left)) {
        continue;
      }
      // This window's end x: within tol, and b - x for n - 1 windows within tol.
      const uint64_t x_lo = std::max(lo, b > (n - 1) * hi ? b - (n - 1) * hi : 0);
      const uint64_t x_hi = std::min(hi, b - (n - 1) * lo);
      if (x_lo > x_hi) continue;
      if (!best || n < best->n || (n == best->n && mag < std::abs(best->drift_after))) {
        best = Best{n, x_lo, x_hi, b, drift_after};
      }
      return;
    }
  };
  // The boundaries ahead, one window further than the last considered: a
  // boundary qualifies only when whole steps after it make a window within
  // tol (else the windows after it would be cut inside steps again).
  std::vector<uint64_t> bounds;  // and where the steps after each start in `losses`
  std::vector<size_t> starts;
  if (acc > 0) {
    bounds.push_back(acc);
    starts.push_back(0);
  }
  bounds.push_back(acc + tok);
  starts.push_back(1);
  for (size_t k = 1; k < losses.size() && bounds.back() <= (kRealignMaxWindows + 1) * hi; ++k) {
    bounds.push_back(bounds.back() + losses[k]);
    starts.push_back(k + 1);
  }
  for (size_t i = 0; i < bounds.size() && bounds[i] <= kRealignMaxWindows * hi; ++i) {
    bool whole_after = false;
    for (size_t j = i + 1; j < bounds.size() && bounds[j] - bounds[i] <= hi; ++j) {
      whole_after = whole_after || bounds[j] - bounds[i] >= lo;
    }
    if (whole_after) consider(bounds[i], starts[i]);
  }
  if (!best) return std::nullopt;
  if (best->n == 1) {
    if (best->b == acc) return ends.Before();
    if (best->b == acc + tok) return ends.After();
    return std::nullopt;  // the boundary lies past g: not this window's end
  }
  // The end of g nearest b / n (clamped to the range) that lies in the range.
  const uint64_t want = std::clamp(best->b / best->n, best->x_lo, best->x_hi);
  if (want <= acc || want >= acc + tok) return std::nullopt;
  const auto [down, up] = BracketCuts(g, want - acc, tok);
  std::optional<WindowEnd> pick;
  for (const Cuts& cut : {down, up}) {
    const WindowEnd e = ends.Split(cut);
    if (e.total < best->x_lo || e.total > best->x_hi) continue;
    const uint64_t off = e.total > want ? e.total - want : want - e.total;
    if (!pick || off < (pick->total > want ? pick->total - want : want - pick->total)) pick = e;
  }
  return pick;
}

// Closes steps [begin, end) of `out` as one window: lays them out again over
// the ranks when the config says so (window_balance.h; the step count may
// drop; `balanced`: that layout, already made by WindowEnds::RunOf for these
// very steps), then sets their window fields and weights.
void CloseWindow(const WindowConfig& config, std::vector<GlobalStep>& out, size_t begin, bool is_short,
                 WindowState& windows, uint64_t target,
                 std::optional<std::vector<GlobalStep>> balanced = std::nullopt) {
  if (config.balance && target != 0 && begin < out.size()) {
    std::vector<GlobalStep> window;
    if (balanced) {
      window = std::move(*balanced);
    } else {
      window.assign(std::make_move_iterator(out.begin() + static_cast<std::ptrdiff_t>(begin)),
                    std::make_move_iterator(out.end()));
      BalanceWindow(*config.balance, window);
    }
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
  // Before the steps move out of the plan: its samples' spread.
  const uint64_t tol = PlanSpreadTolerance(plan, config.tokens_per_step, config.spread);
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
    // With micro-step-aware ends (tol > 0): the round's windows so far minus
    // their targets; the next window's goal makes up for it (window.h).
    int64_t drift = 0;
    const int64_t band = static_cast<int64_t>(tol);
    // The round's loss tokens not yet in a closed window: the windows it has
    // left are about round_left / target.
    uint64_t round_left = 0;
    if (tol > 0) {
      for (const GlobalStep& q : queue) round_left += GlobalLoss(q);
    }
    uint64_t acc = 0;
    size_t acc_samples = 0;
    while (!queue.empty()) {
      // With micro-step-aware ends the drift is made up over the windows the
      // round has left, not by the next one alone (window.h).
      const int64_t shift = tol > 0 ? std::clamp(-drift, -band, band) /
                                          static_cast<int64_t>(std::max<uint64_t>(1, round_left / target))
                                    : carry;
      const uint64_t goal = static_cast<uint64_t>(static_cast<int64_t>(target) + shift);
      GlobalStep g = std::move(queue.front());
      queue.pop_front();
      const uint64_t tok = GlobalLoss(g);
      if (acc + tok < goal) {
        acc_samples += SampleCount(g);
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
      const WindowEnds ends(config, out, open, g, acc, tok);
      std::vector<WindowEnd> candidates;
      if (acc > 0) candidates.push_back(ends.Before());
      candidates.push_back(ends.After());
      if (acc + tok > goal) {
        const auto [cut_down, cut_up] = BracketCuts(g, goal - acc, tok);
        for (const Cuts& cut : {cut_down, cut_up}) {
          const WindowEnd e = ends.Split(cut);
          if (e.choice == WindowEnd::kSplit) candidates.push_back(e);
        }
      }
      const WindowEnd* under = nullptr;  // L: the largest total <= goal
      const WindowEnd* over = nullptr;   // H: the smallest total >= goal
      for (const WindowEnd& c : candidates) {
        if (c.total <= goal && (!under || c.total > under->total)) under = &c;
        if (c.total >= goal && (!over || c.total < over->total)) over = &c;
      }
      const WindowEnd* pick = over;  // kAfter always reaches the goal: `over` exists
      carry = 0;
      // Micro-step-aware ends (window.h): a pair further out, within tol of
      // the target, that runs in less time; of it the end nearer the goal.
      std::optional<std::pair<WindowEnd, WindowEnd>> aware;
      if (tol > 0 && under && under->total + tol >= target && over->total <= target + tol &&
          (acc_samples + SampleCount(g)) * world <= kSpreadMaxSampleRanks) {
        aware = ends.FewerMicroSteps(*under, *over, goal, target - tol, target + tol);
      }
      if (aware) {
        const auto& [low, high] = *aware;
        pick = goal - low.total <= high.total - goal ? &low : &high;
        // The round's drift after an end: the other end of the pair when the
        // nearer one would leave it past the band and the other less far.
        auto drift_after = [&](const WindowEnd& e) {
          return std::abs(drift + static_cast<int64_t>(e.total) - static_cast<int64_t>(target));
        };
        const WindowEnd* other = pick == &low ? &high : &low;
        if (drift_after(*pick) > band && drift_after(*other) < drift_after(*pick)) pick = other;
        // An end inside a step gives way to the step's start or end (the
        // nearer the goal) when that lies within tol of the target, keeps the
        // drift within the band and runs no more micro-steps: the next window
        // then starts on a whole planner step (window.h).
        if (pick->choice == WindowEnd::kSplit) {
          const size_t m = ends.RunOf(*pick).micro_steps;
          const WindowEnd* boundary = nullptr;
          auto off = [goal](const WindowEnd& e) { return e.total > goal ? e.total - goal : goal - e.total; };
          for (const WindowEnd& c : candidates) {
            if (c.choice == WindowEnd::kSplit || c.total + tol < target || c.total > target + tol ||
                drift_after(c) > band || (boundary && off(c) >= off(*boundary)) ||
                !ends.RunsWithin(c, m, false)) {
              continue;
            }
            boundary = &c;
          }
          if (boundary) pick = boundary;
        }
      } else if (under && (over->total > limit || under->total == goal)) {
        pick = under;
        carry = std::min(static_cast<int64_t>(goal - under->total), max_carry);
      } else if (under && over->total > under->total) {
        const double p_over = static_cast<double>(goal - under->total) / static_cast<double>(over->total - under->total);
        pick = SharedUniform(g, acc, goal) < p_over ? over : under;
      }
      // Back onto the planner's steps (window.h): an end inside a step, when
      // no step boundary could take its place, gives way to the end from which
      // the fewest windows, each within tol of the target, reach a step
      // boundary.
      WindowEnd realigned;
      if (tol > 0 && pick->choice == WindowEnd::kSplit && under && under->total + tol >= target &&
          over->total <= target + tol && (acc_samples + SampleCount(g)) * world <= kSpreadMaxSampleRanks) {
        if (std::optional<WindowEnd> r = Realign(ends, g, queue, acc, tok, target, tol, drift, round_left)) {
          realigned = std::move(*r);
          pick = &realigned;
        }
      }
      const uint64_t pick_total = pick->total;
      std::optional<std::vector<GlobalStep>> balanced = ends.Take(*pick);
      switch (pick->choice) {
        case WindowEnd::kBefore:
          CloseWindow(config, out, open, false, windows, target, std::move(balanced));
          queue.push_front(std::move(g));
          break;
        case WindowEnd::kSplit: {
          auto [first, second] = SplitAt(g, pick->cut, config.cost_model);
          out.push_back(std::move(first));
          CloseWindow(config, out, open, false, windows, target, std::move(balanced));
          queue.push_front(std::move(second));
          break;
        }
        case WindowEnd::kAfter:
          out.push_back(std::move(g));
          CloseWindow(config, out, open, false, windows, target, std::move(balanced));
          break;
      }
      drift += static_cast<int64_t>(pick_total) - static_cast<int64_t>(target);
      round_left -= std::min(round_left, pick_total);
      open = out.size();
      acc = 0;
      acc_samples = 0;
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
