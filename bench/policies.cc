#include "bench/policies.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <memory>
#include <numeric>
#include <queue>
#include <random>
#include <span>

#include "absl/status/status.h"
#include "src/align/planner.h"
#include "src/align/window_partitioned.h"
#include "src/balance/global_planner.h"
#include "src/grouping/grouper.h"

namespace odb::bench {

namespace {

using Batch = std::vector<SampleLengths>;

RankStep StepOf(std::span<const SampleLengths> members, grouping::CostModel cost_model) {
  RankStep s;
  if (members.empty()) return s;
  s.idle = false;
  s.samples = static_cast<uint32_t>(members.size());
  for (const SampleLengths& m : members) {
    s.real_tokens += m.tokens;
    s.sum_len_sq += static_cast<double>(m.tokens) * m.tokens;
  }
  s.padded_tokens = grouping::PaddedTokens(cost_model, members);
  return s;
}

// W consecutive batches per step.
Schedule FromBatches(const std::vector<Batch>& batches, int world, grouping::CostModel cost_model,
                     uint64_t fixed_row_tokens = 0) {
  Schedule schedule;
  for (size_t i = 0; i < batches.size(); i += world) {
    std::vector<RankStep> step(world);
    for (int r = 0; r < world && i + r < batches.size(); ++r) {
      step[r] = StepOf(batches[i + r], cost_model);
      if (fixed_row_tokens > 0) step[r].padded_tokens = fixed_row_tokens;
    }
    schedule.push_back(std::move(step));
  }
  return schedule;
}

std::vector<Batch> Chunks(const std::vector<SampleLengths>& samples, size_t size) {
  std::vector<Batch> batches;
  for (size_t i = 0; i < samples.size(); i += size) {
    batches.emplace_back(samples.begin() + i, samples.begin() + std::min(samples.size(), i + size));
  }
  return batches;
}

bool ByTokens(const SampleLengths& a, const SampleLengths& b) { return a.tokens < b.tokens; }

// Length order, so the W batches of a step are alike (best case for balance).
void SortLongestFirst(std::vector<Batch>& batches) {
  std::stable_sort(batches.begin(), batches.end(), [](const Batch& a, const Batch& b) {
    return std::max_element(a.begin(), a.end(), ByTokens)->tokens >
           std::max_element(b.begin(), b.end(), ByTokens)->tokens;
  });
}

std::vector<Batch> BatchesOf(const std::vector<SampleLengths>& samples, std::vector<grouping::Group> groups) {
  std::vector<Batch> batches;
  batches.reserve(groups.size());
  for (const grouping::Group& g : groups) {
    Batch b;
    for (size_t i : g.members) b.push_back(samples[i]);
    batches.push_back(std::move(b));
  }
  SortLongestFirst(batches);
  return batches;
}

// Hugging Face's group_by_length (trainer_pt_utils.get_length_grouped_indices):
// random order, megabatches of 50 x batch size, each sorted longest first,
// then cut into batches.
std::vector<Batch> LengthGrouped(const std::vector<SampleLengths>& arrival, uint32_t batch_size) {
  const size_t mega = 50 * static_cast<size_t>(batch_size);
  std::vector<Batch> batches;
  for (size_t i = 0; i < arrival.size(); i += mega) {
    std::vector<SampleLengths> m(arrival.begin() + i, arrival.begin() + std::min(arrival.size(), i + mega));
    std::stable_sort(m.begin(), m.end(),
                     [](const SampleLengths& a, const SampleLengths& b) { return a.tokens > b.tokens; });
    for (Batch& b : Chunks(m, batch_size)) batches.push_back(std::move(b));
  }
  return batches;
}

// First-fit packing, in arrival order, into rows of L_max tokens.
std::vector<Batch> FirstFitRows(const std::vector<SampleLengths>& arrival, uint64_t row_tokens) {
  std::vector<Batch> rows;
  std::vector<uint64_t> used;
  for (const SampleLengths& s : arrival) {
    size_t r = 0;
    while (r < rows.size() && used[r] + s.tokens > row_tokens) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      used.push_back(0);
    }
    rows[r].push_back(s);
    used[r] += s.tokens;
  }
  return rows;
}

std::vector<std::vector<SampleLengths>> Shares(const std::vector<SampleLengths>& arrival, int world) {
  std::vector<std::vector<SampleLengths>> shares(world);
  for (size_t i = 0; i < arrival.size(); ++i) shares[i % world].push_back(arrival[i]);
  return shares;
}

uint64_t TokensOf(const Batch& b) {
  uint64_t t = 0;
  for (const SampleLengths& s : b) t += s.tokens;
  return t;
}

// Schedule rows from per-rank lists of batches run side by side: step j
// gives rank r its j-th batch (IDLE when it has none).
Schedule SideBySide(const std::vector<std::vector<Batch>>& per_rank, grouping::CostModel cost_model) {
  size_t steps = 0;
  for (const auto& b : per_rank) steps = std::max(steps, b.size());
  Schedule schedule(steps, std::vector<RankStep>(per_rank.size()));
  for (size_t r = 0; r < per_rank.size(); ++r) {
    for (size_t j = 0; j < per_rank[r].size(); ++j) schedule[j][r] = StepOf(per_rank[r][j], cost_model);
  }
  return schedule;
}

// lhotse's DynamicBucketingSampler with sync_buckets (examples/peers.py has
// the Python twin the real training runs): bucket upper bounds holding about
// equal total tokens each; every rank's share in its own buckets, in arrival
// order; each step the ranks draw the same bucket from one seeded stream among
// the buckets non-empty on every rank, and each rank takes the bucket's
// samples in order while the padded batch fits the budget. When no bucket is
// non-empty on every rank, each rank batches what it has left, longest first.
Schedule RunBucketing(const std::vector<SampleLengths>& arrival, const SimConfig& cfg, int buckets) {
  const int world = cfg.world;
  std::vector<uint32_t> lens;
  for (const SampleLengths& s : arrival) lens.push_back(s.tokens);
  std::sort(lens.begin(), lens.end());
  const double total = std::accumulate(lens.begin(), lens.end(), 0.0);
  std::vector<uint32_t> bounds;
  double acc = 0.0;
  for (uint32_t x : lens) {
    acc += x;
    if (acc >= total / buckets * (bounds.size() + 1) && static_cast<int>(bounds.size()) < buckets - 1) {
      bounds.push_back(x);
    }
  }
  if (!lens.empty()) bounds.push_back(lens.back());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  const auto shares = Shares(arrival, world);
  std::vector<std::vector<std::deque<SampleLengths>>> queues(
      world, std::vector<std::deque<SampleLengths>>(bounds.size()));
  for (int r = 0; r < world; ++r) {
    for (const SampleLengths& s : shares[r]) {
      const size_t b = std::lower_bound(bounds.begin(), bounds.end(), s.tokens) - bounds.begin();
      queues[r][std::min(b, bounds.size() - 1)].push_back(s);
    }
  }
  auto take = [&](std::deque<SampleLengths>& q) {
    Batch batch;
    uint32_t longest = 0;
    while (!q.empty()) {
      const uint32_t l = std::max(longest, q.front().tokens);
      if (!batch.empty() && (batch.size() + 1) * static_cast<uint64_t>(l) > cfg.budget.max_tokens) break;
      longest = l;
      batch.push_back(q.front());
      q.pop_front();
    }
    return batch;
  };
  std::mt19937_64 rng(cfg.seed * 0x9E3779B97F4A7C15ull + 0xB0C7);
  std::vector<std::vector<Batch>> per_rank(world);
  Schedule schedule;
  while (true) {
    std::vector<size_t> ready;
    for (size_t b = 0; b < bounds.size(); ++b) {
      bool all = true;
      for (int r = 0; r < world && all; ++r) all = !queues[r][b].empty();
      if (all) ready.push_back(b);
    }
    if (ready.empty()) break;
    const size_t b = ready[rng() % ready.size()];
    std::vector<RankStep> step(world);
    for (int r = 0; r < world; ++r) step[r] = StepOf(take(queues[r][b]), cfg.budget.model);
    schedule.push_back(std::move(step));
  }
  std::vector<std::vector<Batch>> tails(world);
  for (int r = 0; r < world; ++r) {
    std::vector<SampleLengths> left;
    for (auto& q : queues[r]) left.insert(left.end(), q.begin(), q.end());
    std::stable_sort(left.begin(), left.end(),
                     [](const SampleLengths& a, const SampleLengths& b) { return a.tokens > b.tokens; });
    std::deque<SampleLengths> rest(left.begin(), left.end());
    while (!rest.empty()) tails[r].push_back(take(rest));
  }
  for (auto& step : SideBySide(tails, cfg.budget.model)) schedule.push_back(std::move(step));
  return schedule;
}

// Karmarkar and Karp's largest differencing method, k-way (Korf, "Multi-way
// number partitioning", 2009), as verl's seqlen_balancing describes it: every
// item starts as a partial solution of k subsets (itself in one, the others
// empty; with equal_size the items, sorted, start k at a time, one per
// subset); the two partial solutions with the largest spread (largest minus
// smallest subset sum) are merged, the first's largest subset with the
// second's smallest, and so on, until one is left. Returns k lists of indices.
std::vector<std::vector<size_t>> KarmarkarKarp(const std::vector<double>& values, size_t k, bool equal_size) {
  struct Partial {
    std::vector<std::vector<size_t>> sets;
    std::vector<double> sums;
    double spread() const { return sums.front() - sums.back(); }
    void Sort() {
      std::vector<size_t> order(sets.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sums[a] > sums[b]; });
      Partial p;
      for (size_t i : order) {
        p.sets.push_back(std::move(sets[i]));
        p.sums.push_back(sums[i]);
      }
      *this = std::move(p);
    }
  };
  std::vector<size_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values[a] < values[b]; });
  const size_t start = equal_size ? k : 1;
  std::vector<Partial> partials;
  for (size_t i = 0; i < order.size(); i += start) {
    Partial p;
    p.sets.assign(k, {});
    p.sums.assign(k, 0.0);
    for (size_t j = 0; j < start && i + j < order.size(); ++j) {
      p.sets[j].push_back(order[i + j]);
      p.sums[j] = values[order[i + j]];
    }
    p.Sort();
    partials.push_back(std::move(p));
  }
  auto less = [&](size_t a, size_t b) { return partials[a].spread() < partials[b].spread(); };
  std::priority_queue<size_t, std::vector<size_t>, decltype(less)> heap(less);
  for (size_t i = 0; i < partials.size(); ++i) heap.push(i);
  if (heap.empty()) return std::vector<std::vector<size_t>>(k);
  while (heap.size() > 1) {
    Partial& a = partials[heap.top()];
    heap.pop();
    Partial& b = partials[heap.top()];
    heap.pop();
    Partial merged;
    for (size_t j = 0; j < k; ++j) {
      std::vector<size_t> set = std::move(a.sets[j]);
      set.insert(set.end(), b.sets[k - 1 - j].begin(), b.sets[k - 1 - j].end());
      merged.sets.push_back(std::move(set));
      merged.sums.push_back(a.sums[j] + b.sums[k - 1 - j]);
    }
    merged.Sort();
    partials.push_back(std::move(merged));
    heap.push(partials.size() - 1);
  }
  return partials[heap.top()].sets;
}

// verl's seqlen_balancing (examples/peers.py, kk_balanced, has the Python twin
// the real training runs): global batches of `per_rank` x W samples in arrival
// order; each split over the ranks into equal-size parts by Karmarkar-Karp on
// the workload estimate s + s^2 x c / b (verl: 24576 s + s^2 for a 7B model,
// i.e. the linear layers' cost per token over the attention's per token pair;
// here the step model's own ratio, tokens alone when c = 0); then every rank's
// part into the same number of packed rows (the maximum over the ranks), the
// fewest under L_max tokens, by Karmarkar-Karp on tokens. Rows are variable
// length (no padding: flash-attention varlen).
Schedule RunKkBalanced(const std::vector<SampleLengths>& arrival, const SimConfig& cfg, uint32_t per_rank) {
  const int world = cfg.world;
  const double quad = cfg.model.b > 0 ? cfg.model.c / cfg.model.b : 0.0;
  const uint64_t cap = cfg.budget.max_tokens;
  const size_t global = static_cast<size_t>(per_rank) * world;
  Schedule schedule;
  for (size_t i = 0; i < arrival.size(); i += global) {
    const Batch group(arrival.begin() + i, arrival.begin() + std::min(arrival.size(), i + global));
    std::vector<double> work;
    for (const SampleLengths& s : group) work.push_back(s.tokens + quad * s.tokens * s.tokens);
    const auto parts = KarmarkarKarp(work, world, group.size() % world == 0);
    std::vector<Batch> shares;
    size_t rows = 1;
    for (const auto& part : parts) {
      Batch share;
      for (size_t j : part) share.push_back(group[j]);
      rows = std::max<size_t>(rows, (TokensOf(share) + cap - 1) / cap);
      shares.push_back(std::move(share));
    }
    std::vector<std::vector<Batch>> per(world);
    for (;; ++rows) {
      bool fits = true;
      for (int r = 0; r < world; ++r) {
        per[r].clear();
        std::vector<double> tokens;
        for (const SampleLengths& s : shares[r]) tokens.push_back(s.tokens);
        for (const auto& part : KarmarkarKarp(tokens, std::min(rows, shares[r].size()), false)) {
          if (part.empty()) continue;
          Batch row;
          for (size_t j : part) row.push_back(shares[r][j]);
          fits &= row.size() == 1 || TokensOf(row) <= cap;
          per[r].push_back(std::move(row));
        }
      }
      if (fits) break;
    }
    for (auto& step : SideBySide(per, grouping::CostModel::kPacked)) schedule.push_back(std::move(step));
  }
  return schedule;
}

// The reference ODB 0.1.x algorithm (DESIGN.md, "Reference facts"): per rank,
// the reference grouping rule on a window of `window` buffered samples; then
// T = max(1, min(max_A G_r, min_{N_r>0} N_r)) (free slots are unbounded
// here); a rank with G_r > T keeps its T largest groups and returns the rest
// to its buffer; a rank with G_r < T splits its longest-sample multi-sample
// group one sample at a time into singletons; same-seed shuffle of group
// order on every rank; ranks without groups run IDLE steps.
Schedule RunReference(const std::vector<SampleLengths>& arrival, const SimConfig& cfg, uint32_t window) {
  const int world = cfg.world;
  const auto shares = Shares(arrival, world);
  std::vector<size_t> next(world, 0);
  std::vector<std::vector<SampleLengths>> pending(world);
  Schedule schedule;
  for (uint64_t round = 0;; ++round) {
    bool anything = false;
    for (int r = 0; r < world; ++r) {
      while (pending[r].size() < window && next[r] < shares[r].size())
        pending[r].push_back(shares[r][next[r]++]);
      anything |= !pending[r].empty();
    }
    if (!anything) break;
    std::vector<std::vector<std::vector<size_t>>> groups(world);
    size_t max_groups = 0, min_n = std::numeric_limits<size_t>::max();
    for (int r = 0; r < world; ++r) {
      if (pending[r].empty()) continue;
      for (grouping::Group& g : grouping::ReferenceOdbGroups(pending[r], cfg.budget)) {
        groups[r].push_back(std::move(g.members));
      }
      max_groups = std::max(max_groups, groups[r].size());
      min_n = std::min(min_n, pending[r].size());
    }
    const size_t t = std::max<size_t>(1, std::min(max_groups, min_n));
    std::vector<std::vector<RankStep>> steps(t, std::vector<RankStep>(world));
    for (int r = 0; r < world; ++r) {
      auto& gs = groups[r];
      const auto& win = pending[r];
      auto longest = [&](const std::vector<size_t>& g) {
        uint32_t m = 0;
        for (size_t i : g) m = std::max(m, win[i].tokens);
        return m;
      };
      if (gs.empty()) continue;  // IDLE for the whole round
      if (gs.size() > t) {
        std::stable_sort(gs.begin(), gs.end(),
                         [](const auto& a, const auto& b) { return a.size() > b.size(); });
        gs.resize(t);
      }
      while (gs.size() < t) {
        size_t pick = gs.size();
        for (size_t i = 0; i < gs.size(); ++i) {
          if (gs[i].size() >= 2 && (pick == gs.size() || longest(gs[i]) > longest(gs[pick]))) pick = i;
        }
        if (pick == gs.size()) break;  // cannot happen: T <= N_r
        auto& g = gs[pick];
        auto it = std::max_element(g.begin(), g.end(),
                                   [&](size_t a, size_t b) { return win[a].tokens < win[b].tokens; });
        const size_t lone = *it;
        g.erase(it);
        gs.push_back({lone});
      }
      std::stable_sort(gs.begin(), gs.end(),
                       [&](const auto& a, const auto& b) { return longest(a) > longest(b); });
      std::vector<grouping::Group> order;
      for (auto& g : gs) order.push_back(grouping::Group{g, false});
      grouping::ShuffleGroups(order, align::MixSeed(cfg.seed, round));  // same seed on every rank
      std::vector<bool> used(win.size(), false);
      for (size_t k = 0; k < order.size(); ++k) {
        Batch b;
        for (size_t i : order[k].members) {
          b.push_back(win[i]);
          used[i] = true;
        }
        steps[k][r] = StepOf(b, cfg.budget.model);
      }
      std::vector<SampleLengths> rest;
      for (size_t i = 0; i < win.size(); ++i) {
        if (!used[i]) rest.push_back(win[i]);
      }
      pending[r] = std::move(rest);
    }
    for (auto& s : steps) schedule.push_back(std::move(s));
  }
  return schedule;
}

// odb itself: W ranks driven through the daemon's planner (align::LocalPlanner,
// or balance::GlobalPlanner for `alignment.planner: global`) exactly as the
// daemon drives it (src/daemon/daemon.cc RunOneRound + align::Aligner): each
// rank's pending list in arrival order, topped up to the window before each
// round (a producer at least as fast as the trainer), free slots from
// emit.queue_steps (all of them every round, or paced: see PolicySpec),
// stream_finished once a rank's share has fully arrived, the consecutive
// waiting-round counter the Aligner keeps; Join mode. The planner is given
// the model's linear part (StepModel::PlannerModel), as a user would set
// grouping.step_time. With SimConfig::window_tokens each round's plan goes
// through the daemon's accumulation windows (ApplyRoundWindows) before its
// steps are taken, and the samples of a window held open stay pending.
absl::StatusOr<Schedule> RunOdb(const std::vector<SampleLengths>& arrival, const SimConfig& cfg,
                                const PolicySpec& spec, StepMembers* members) {
  const int world = cfg.world;
  const uint32_t window = spec.window ? spec.window : cfg.window;
  align::PlannerConfig pc;
  pc.budget = cfg.budget;
  if (spec.packed)
    pc.budget.model = grouping::CostModel::kPacked;  // collate.packed + grouping.cost_model: packed
  pc.step_model = cfg.model.PlannerModel();
  pc.mode = align::EpochMode::kJoin;
  pc.seed = cfg.seed;
  pc.window = window;
  pc.deterministic = spec.deterministic;
  pc.full_rounds = spec.full_rounds;
  pc.mix_lengths = spec.mix_groups;
  pc.mix_steps = spec.mix_steps;
  pc.window_spread = cfg.window_spread;
  std::unique_ptr<align::Planner> planner;
  if (spec.global) {
    balance::GlobalPlannerConfig g;
    g.base = pc;
    g.locality = 0.0;
    g.partition_ranks = cfg.partition_ranks;
    planner = std::make_unique<balance::GlobalPlanner>(g);
  } else {
    planner = std::make_unique<align::LocalPlanner>(pc);
  }
  // Partitioned windows need the partitioned planner: the local planner has no blocks.
  const bool partitioned = cfg.partitioned_windows && cfg.window_tokens > 0;
  if (partitioned && (!spec.global || cfg.partition_ranks == 0)) {
    return absl::InvalidArgumentError("partitioned windows need the global planner with partition_ranks");
  }
  const uint32_t queue = spec.queue_steps == 0 ? (1u << 20) : spec.queue_steps;
  uint32_t free_slots = queue;
  std::vector<std::vector<SampleMeta>> shares(world);
  for (size_t i = 0; i < arrival.size(); ++i) {
    const int r = static_cast<int>(i % world);
    SampleMeta m;
    m.id = i;
    m.owner_rank = r;
    m.lengths = arrival[i];
    shares[r].push_back(m);
  }
  std::vector<size_t> next(world, 0);
  std::vector<std::vector<SampleMeta>> pending(world);
  uint32_t wait_rounds = 0;
  uint64_t first_step = 0, idle_rounds = 0;
  align::WindowState windows;
  Schedule schedule;
  for (uint64_t round = 0;; ++round) {
    align::RoundState state;
    state.epoch = 0;
    state.round = round;
    state.first_step = first_step;
    state.ranks.resize(world);
    for (int r = 0; r < world; ++r) {
      // Deterministic mode plans from the first window+1 samples and calls a
      // stream finished once the window holds its whole remainder (Aligner).
      const size_t fill = spec.deterministic ? window + 1 : window;
      while (pending[r].size() < fill && next[r] < shares[r].size())
        pending[r].push_back(shares[r][next[r]++]);
      align::RankRound& rr = state.ranks[r];
      rr.pending = pending[r];
      rr.free_slots = free_slots;
      rr.stream_finished =
          next[r] == shares[r].size() && (!spec.deterministic || pending[r].size() <= window);
      rr.wait_rounds = wait_rounds;
    }
    align::RoundPlan plan = planner->Plan(state);
    const uint32_t planned = plan.num_steps;
    if (absl::Status s = partitioned ? ApplyRoundPartitionedWindows(cfg.window_tokens, *planner,
                                                                    cfg.window_balance, state, plan, windows)
                                     : ApplyRoundWindows(cfg.window_tokens, *planner, cfg.window_balance,
                                                         state, plan, windows);
        !s.ok()) {
      return s;
    }
    AppendRoundSteps(plan, world, &schedule);
    for (uint32_t k = 0; members != nullptr && k < plan.num_steps; ++k) {
      std::vector<std::vector<SampleLengths>>& step = members->emplace_back(world);
      for (int r = 0; r < world; ++r) {
        for (const SampleMeta& m : plan.ranks[r].steps[k].samples) step[r].push_back(m.lengths);
      }
    }
    first_step += plan.num_steps;
    if (plan.epoch_finished) break;
    if (spec.paced > 0 && spec.queue_steps != 0) {
      // The round queued num_steps. The next round fires as soon as `paced`
      // slots are free (Daemon::RoundDue: one); until then the trainer takes
      // steps off the queue, one at a time.
      const uint32_t fire_at = queue - std::min(queue, spec.paced);  // queued steps at which a round fires
      uint32_t queued = std::min({queue, queue - free_slots + plan.num_steps, fire_at});
      // A round that planned steps but queued none (its accumulation window
      // held open for more samples) left the queue as it was: the trainer
      // takes one more step off it before the next round, which sees one
      // more slot (else every later round would plan the same open window).
      if (planned > 0 && plan.num_steps == 0 && queued > 0) --queued;
      free_slots = queue - queued;
    }
    KeepPending(plan, &pending);
    wait_rounds = plan.waiting ? wait_rounds + 1 : 0;
    idle_rounds = plan.num_steps == 0 ? idle_rounds + 1 : 0;
    if (idle_rounds > 1000) {
      return absl::InternalError("odb simulation made no progress for 1000 rounds: " + plan.reason);
    }
  }
  return schedule;
}

}  // namespace

absl::Status ApplyRoundWindows(uint64_t tokens_per_step, const align::Planner& planner, bool balance,
                               const align::RoundState& state, align::RoundPlan& plan,
                               align::WindowState& windows) {
  if (tokens_per_step == 0) return absl::OkStatus();
  if (windows.next_window == 0) {
    if (absl::Status s = align::CheckWindowTarget(tokens_per_step, plan); !s.ok()) return s;
  }
  const align::PlannerConfig& pc = planner.config();
  align::WindowConfig config;
  config.tokens_per_step = tokens_per_step;
  config.cost_model = pc.budget.model;
  config.spread = pc.window_spread;
  if (balance && planner.MovesSamples())
    config.balance = align::WindowBalanceConfig{pc.budget, pc.step_model};
  align::ApplyWindows(config, plan, windows, align::InputsOpen(state, pc.window));
  return absl::OkStatus();
}

absl::Status ApplyRoundPartitionedWindows(uint64_t tokens_per_step, const align::Planner& planner,
                                          bool balance, const align::RoundState& state,
                                          align::RoundPlan& plan, align::WindowState& windows) {
  const size_t world = plan.ranks.size();
  const uint32_t t = plan.num_steps;
  // A block of the whole job is no partitioned round: the Aligner plans it
  // as one pool and cuts whole-job windows.
  if (world < 2 || planner.BlockRanks(world) >= world) {
    return ApplyRoundWindows(tokens_per_step, planner, balance, state, plan, windows);
  }
  if (tokens_per_step == 0 || t == 0) return absl::OkStatus();
  // The totals all-gather: every step's loss and real tokens over all ranks,
  // the samples the round planned and (with window_spread) the sum of the
  // squares of their loss tokens, each rank's added as the Aligner adds them.
  const align::PlannerConfig& pc = planner.config();
  std::vector<uint64_t> loss(t, 0), real(t, 0);
  uint64_t planned = 0, loss_sum = 0, planned_sq = 0;
  for (const align::RankPlan& rp : plan.ranks) {
    for (uint32_t k = 0; k < t; ++k) {
      const align::PlannedStep& s = rp.steps[k];
      for (const SampleMeta& m : s.samples) loss[k] += align::LossTokensOf(m);
      real[k] += s.real_tokens;
      planned += s.samples.size();
    }
    if (pc.window_spread > 0.0)
      planned_sq = align::SaturatingAdd(planned_sq, align::SquaredLossTokens(rp.steps));
  }
  for (uint64_t l : loss) loss_sum += l;
  if (windows.next_window == 0) {
    if (absl::Status s = align::CheckWindowTargetCounts(tokens_per_step, planned, loss_sum, world); !s.ok())
      return s;
  }
  const uint64_t tol =
      align::SpreadTolerance(planned, loss_sum, planned_sq, tokens_per_step, pc.window_spread);
  align::PartitionedWindows cut(tokens_per_step, loss, real, world, tol);
  // The offers all-gather (only in rounds with an end inside a step).
  // With the offers, every rank's merge bits (window_partitioned.h, "Merged
  // parts").
  std::vector<std::vector<align::CutOffer>> offers(world);
  std::vector<std::vector<uint8_t>> fits;
  const size_t block = std::max<size_t>(1, planner.BlockRanks(world));
  cut.EnableMerges(align::WindowBalanceConfig{pc.budget, pc.step_model}, planner.MovesSamples());
  if (cut.inside_ends() > 0) {
    fits.resize(world);
    for (size_t b = 0; b < world; b += block) {
      const int end = static_cast<int>(std::min(world, b + block));
      const std::vector<uint8_t> bits = cut.MergeFits(plan, static_cast<int>(b), end);
      for (size_t r = b; r < static_cast<size_t>(end); ++r) {
        offers[r] = cut.Offers(plan.ranks[r].steps);
        fits[r] = bits;
      }
    }
  }
  if (absl::Status s = cut.Decide(offers, fits); !s.ok()) return s;
  // Whether the round planned every sample the epoch has left (the Aligner's
  // count over the round summaries).
  bool all_finished = true;
  uint64_t pending = 0;
  for (const align::RankRound& rr : state.ranks) {
    all_finished = all_finished && rr.stream_finished;
    pending += rr.pending.size();
  }
  // Each block cuts its own ranks (a merged micro-step is laid out over its
  // block), from the same window state; every block ends in the same one.
  std::vector<uint64_t> global_real;
  const align::WindowState before = windows;
  for (size_t b = 0; b < world; b += block) {
    align::WindowState ws = before;
    cut.Apply(plan, static_cast<int>(b), static_cast<int>(std::min(world, b + block)), pc.budget.model, ws,
              align::InputsOpen(state, pc.window), all_finished && planned == pending, global_real);
    if (b == 0) windows = ws;
  }
  if (balance && planner.MovesSamples()) {
    for (size_t b = 0; b < world; b += block) {
      align::BalanceBlockWindows(align::WindowBalanceConfig{pc.budget, pc.step_model}, plan,
                                 static_cast<int>(b), static_cast<int>(std::min(world, b + block)));
    }
  }
  return absl::OkStatus();
}

uint64_t WindowTarget::Tokens(const std::vector<SampleLengths>& samples, int world,
                              uint64_t max_tokens) const {
  if (off()) return 0;
  double tokens = value;
  if (unit == Unit::kSamples) {
    double total = 0;
    for (const SampleLengths& s : samples) total += s.tokens;
    tokens = value * (samples.empty() ? 0.0 : total / static_cast<double>(samples.size()));
  } else if (unit == Unit::kMicroSteps) {
    tokens = value * world * static_cast<double>(max_tokens);
  }
  return std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(tokens)));
}

std::string WindowTarget::Spelling() const {
  if (off()) return "0";
  char buf[64];
  if (unit == Unit::kTokens) {
    std::snprintf(buf, sizeof buf, "%.0f", value);
  } else {
    std::snprintf(buf, sizeof buf, "%g%s", value, unit == Unit::kSamples ? "s" : "m");
  }
  return buf;
}

absl::StatusOr<WindowTarget> ParseWindowTarget(const std::string& text) {
  WindowTarget t;
  std::string number = text;
  if (!number.empty() && (number.back() == 's' || number.back() == 'm')) {
    t.unit = number.back() == 's' ? WindowTarget::Unit::kSamples : WindowTarget::Unit::kMicroSteps;
    number.pop_back();
  }
  char* end = nullptr;
  t.value = number.empty() ? -1.0 : std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !(t.value >= 0.0) ||
      !std::isfinite(t.value) || (t.unit == WindowTarget::Unit::kTokens && t.value != std::floor(t.value))) {
    return absl::InvalidArgumentError(
        "window target '" + text +
        "': want loss tokens (65536), samples (16s) or global micro-steps (1m); "
        "0 = off");
  }
  return t;
}

uint32_t FixedBatchSize(const std::vector<SampleLengths>& samples, const grouping::Budget& budget) {
  uint32_t longest = 1;
  for (const SampleLengths& s : samples) longest = std::max(longest, s.tokens);
  return static_cast<uint32_t>(std::max<uint64_t>(1, budget.max_tokens / longest));
}

uint32_t P99BatchSize(const std::vector<SampleLengths>& samples, const grouping::Budget& budget) {
  if (samples.empty()) return 1;
  std::vector<uint32_t> lens;
  lens.reserve(samples.size());
  for (const SampleLengths& s : samples) lens.push_back(s.tokens);
  std::sort(lens.begin(), lens.end());
  // The same percentile as MeasureTrace (bench/trace.cc).
  const uint32_t p99 =
      std::max<uint32_t>(1, lens[std::min(lens.size() - 1, static_cast<size_t>(0.99 * lens.size()))]);
  return static_cast<uint32_t>(std::max<uint64_t>(1, budget.max_tokens / p99));
}

std::string PolicySpec::Name(const SimConfig& config) const {
  if (base == "reference_odb") return base + ":w" + std::to_string(window ? window : config.window);
  if (base != "odb") return base;
  return std::string("odb:") + (global ? "global" : "local") + ":q" +
         (queue_steps == 0 ? std::string("inf") : std::to_string(queue_steps)) + ":w" +
         std::to_string(window ? window : config.window) +
         (paced == 0   ? ""
          : paced == 1 ? ":paced"
                       : ":paced" + std::to_string(paced)) +
         (deterministic ? ":det" : "") + (full_rounds ? ":full" : "") + (packed ? ":packed" : "") +
         (mix_groups ? ":mix" : "") + (mix_steps ? ":mixsteps" : "");
}

absl::StatusOr<PolicySpec> ParsePolicy(const std::string& text) {
  PolicySpec spec;
  std::vector<std::string> parts;
  size_t from = 0;
  while (true) {
    const size_t colon = text.find(':', from);
    parts.push_back(text.substr(from, colon == std::string::npos ? std::string::npos : colon - from));
    if (colon == std::string::npos) break;
    from = colon + 1;
  }
  spec.base = parts[0];
  static const char* kPlain[] = {"standard",      "standard_p99", "sorted",    "length_grouped", "packing",
                                 "sorted_greedy", "offline_dp",   "bucketing", "kk_balanced"};
  const bool plain = std::find(std::begin(kPlain), std::end(kPlain), spec.base) != std::end(kPlain);
  if (!plain && spec.base != "odb" && spec.base != "reference_odb") {
    return absl::InvalidArgumentError("unknown policy '" + text + "'");
  }
  auto number = [](const std::string& digits, uint32_t& out) {
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    out = static_cast<uint32_t>(std::stoul(digits));
    return out > 0;
  };
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& opt = parts[i];
    bool ok = false;
    if (!plain && opt.size() > 1 && opt[0] == 'w') ok = number(opt.substr(1), spec.window);
    if (spec.base == "odb") {
      if (opt == "local" || opt == "global") {
        spec.global = opt == "global";
        ok = true;
      } else if (opt == "qinf") {
        spec.queue_steps = 0;
        ok = true;
      } else if (opt == "det") {
        spec.deterministic = true;
        ok = true;
      } else if (opt == "full") {
        spec.full_rounds = true;
        ok = true;
      } else if (opt == "packed") {
        spec.packed = true;
        ok = true;
      } else if (opt == "mix") {
        spec.mix_groups = true;
        ok = true;
      } else if (opt == "mixsteps") {
        spec.mix_steps = true;
        ok = true;
      } else if (opt == "paced") {
        spec.paced = 1;
        ok = true;
      } else if (opt.rfind("paced", 0) == 0) {
        ok = number(opt.substr(5), spec.paced);
      } else if (opt.size() > 1 && opt[0] == 'q') {
        ok = number(opt.substr(1), spec.queue_steps);
      }
    }
    if (!ok) return absl::InvalidArgumentError("policy '" + text + "': bad option '" + opt + "'");
  }
  return spec;
}

bool IsPackedPolicy(const std::string& name) {
  if (name == "packing" || name == "kk_balanced") return true;
  const absl::StatusOr<PolicySpec> spec = ParsePolicy(name);
  return spec.ok() && spec->packed;
}

bool TakesWindows(const std::string& policy) { return policy == "odb" || policy.rfind("odb:", 0) == 0; }

std::vector<std::string> PolicyNames(uint32_t window) {
  const std::string w = ":w" + std::to_string(window);
  return {"standard",
          "standard_p99",
          "sorted",
          "length_grouped",
          "packing",
          "reference_odb:w16",
          "reference_odb" + w,
          "odb:local:q32" + w + ":paced",
          "odb:local:q32" + w,
          "odb:local:qinf" + w,
          "odb:global:q32" + w + ":paced",
          "odb:global:q32" + w,
          "odb:global:qinf" + w,
          "odb:global:q32" + w + ":paced16:full",
          "odb:global:q32" + w + ":paced16:full:packed",
          "bucketing",
          "kk_balanced",
          "sorted_greedy",
          "offline_dp"};
}

absl::StatusOr<Schedule> RunPolicy(const std::string& policy, const std::vector<SampleLengths>& arrival,
                                   const SimConfig& cfg, StepMembers* members) {
  absl::StatusOr<PolicySpec> spec = ParsePolicy(policy);
  if (!spec.ok()) return spec.status();
  const std::string& base = spec->base;
  const grouping::CostModel cm = cfg.budget.model;
  const uint32_t b = FixedBatchSize(arrival, cfg.budget);
  if (base == "standard") return FromBatches(Chunks(arrival, b), cfg.world, cm);
  if (base == "standard_p99")
    return FromBatches(Chunks(arrival, P99BatchSize(arrival, cfg.budget)), cfg.world, cm);
  if (base == "sorted") {
    std::vector<SampleLengths> sorted = arrival;
    std::stable_sort(sorted.begin(), sorted.end(), ByTokens);
    return FromBatches(Chunks(sorted, b), cfg.world, cm);
  }
  if (base == "length_grouped") return FromBatches(LengthGrouped(arrival, b), cfg.world, cm);
  if (base == "packing") {
    return FromBatches(FirstFitRows(arrival, cfg.budget.max_tokens), cfg.world, grouping::CostModel::kPacked,
                       cfg.budget.max_tokens);
  }
  if (base == "sorted_greedy") {
    return FromBatches(BatchesOf(arrival, grouping::GreedyFewestSteps(arrival, cfg.budget)), cfg.world, cm);
  }
  if (base == "offline_dp") {
    std::vector<Batch> batches = OptimalPaddedGroups(arrival, cfg.budget, cfg.model);
    SortLongestFirst(batches);
    return FromBatches(batches, cfg.world, cm);
  }
  if (base == "bucketing") return RunBucketing(arrival, cfg, 30);
  if (base == "kk_balanced") return RunKkBalanced(arrival, cfg, cfg.window);
  if (base == "reference_odb") return RunReference(arrival, cfg, spec->window ? spec->window : cfg.window);
  return RunOdb(arrival, cfg, *spec, members);
}

double RankCost(const StepModel& model, const RankStep& step) {
  if (step.idle) return model.a;
  return model.Step(static_cast<double>(step.padded_tokens), step.sum_len_sq);
}

Metrics Evaluate(const Schedule& schedule, const StepModel& model, uint64_t max_tokens,
                 uint64_t window_target) {
  Metrics m;
  m.steps = schedule.size();
  m.step_costs.reserve(schedule.size());
  std::vector<double> window_rank_cost;  // each rank's summed cost in the open window
  uint64_t window_tokens = 0, window_samples = 0, full_windows = 0, full_samples = 0;
  double over_sum = 0.0, len_sq_sum = 0.0;
  std::vector<double> full_tokens;  // each full window's loss tokens
  for (const auto& step : schedule) {
    double worst = 0.0, sum = 0.0;
    window_rank_cost.resize(step.size(), 0.0);
    for (size_t r = 0; r < step.size(); ++r) {
      const RankStep& s = step[r];
      const double c = RankCost(model, s);
      worst = std::max(worst, c);
      sum += c;
      window_rank_cost[r] += c;
      window_tokens += s.real_tokens;
      window_samples += s.samples;
      if (!s.idle) len_sq_sum += s.sum_len_sq;
      ++m.rank_steps;
      m.idle_rank_steps += s.idle;
      m.samples += s.samples;
      m.real_tokens += s.real_tokens;
      if (!s.idle) m.padded_tokens += s.padded_tokens;
      if (!s.idle && max_tokens != 0 && s.padded_tokens > max_tokens) ++m.over_budget_rank_steps;
    }
    m.time += worst;
    m.mean_rank_time += step.empty() ? 0.0 : sum / step.size();
    m.step_costs.push_back(worst);
    if (step.empty() || step[0].closes_window) {
      m.window_time += *std::max_element(window_rank_cost.begin(), window_rank_cost.end());
      ++m.windows;
      if (window_target > 0 && window_tokens * 10 < window_target * 9) ++m.windows_under_90;
      if (!step.empty() && step[0].window_short) {
        ++m.short_windows;
      } else if (window_target > 0) {
        const double over = static_cast<double>(window_tokens) / static_cast<double>(window_target);
        over_sum += over;
        m.max_window_over_target = std::max(m.max_window_over_target, over);
        ++full_windows;
        full_samples += window_samples;
        full_tokens.push_back(static_cast<double>(window_tokens));
      }
      std::fill(window_rank_cost.begin(), window_rank_cost.end(), 0.0);
      window_tokens = window_samples = 0;
    }
  }
  // A schedule that ends inside a window (none of the policies does) counts it as closed there.
  if (!schedule.empty() && !schedule.back().empty() && !schedule.back()[0].closes_window) {
    m.window_time += *std::max_element(window_rank_cost.begin(), window_rank_cost.end());
    ++m.windows;
    ++m.short_windows;
    if (window_target > 0 && window_tokens * 10 < window_target * 9) ++m.windows_under_90;
  }
  m.mean_window_over_target = full_windows ? over_sum / static_cast<double>(full_windows) : 0.0;
  if (full_tokens.size() >= 2 && m.samples > 0) {
    double mean = 0.0, var = 0.0;
    for (double t : full_tokens) mean += t;
    mean /= static_cast<double>(full_tokens.size());
    for (double t : full_tokens) var += (t - mean) * (t - mean);
    var /= static_cast<double>(full_tokens.size() - 1);
    const double n = static_cast<double>(m.samples);
    const double len_mean = static_cast<double>(m.real_tokens) / n;
    const double len_var = std::max(0.0, len_sq_sum / n - len_mean * len_mean);
    const double per_window = static_cast<double>(full_samples) / static_cast<double>(full_tokens.size());
    if (len_var > 0.0) m.window_sd_over_random = std::sqrt(var / (per_window * len_var));
  }
  return m;
}

void AppendRoundSteps(const align::RoundPlan& plan, int world, Schedule* schedule,
                      std::vector<SampleLengths>* emitted) {
  for (uint32_t k = 0; k < plan.num_steps; ++k) {
    std::vector<RankStep> step(world);
    for (int r = 0; r < world; ++r) {
      const align::PlannedStep& ps = plan.ranks[r].steps[k];
      RankStep& s = step[r];
      // Without ApplyWindows every planned step closes its own window (the fields' defaults).
      s.closes_window = ps.closes_window;
      s.window_short = ps.window_short;
      if (ps.idle) continue;
      s.idle = false;
      s.samples = static_cast<uint32_t>(ps.samples.size());
      s.real_tokens = ps.real_tokens;
      s.padded_tokens = ps.padded_tokens;
      for (const SampleMeta& m : ps.samples) {
        s.sum_len_sq += static_cast<double>(m.lengths.tokens) * m.lengths.tokens;
        if (emitted != nullptr) emitted->push_back(m.lengths);
      }
    }
    schedule->push_back(std::move(step));
  }
}

void KeepPending(const align::RoundPlan& plan, std::vector<std::vector<SampleMeta>>* pending) {
  for (size_t r = 0; r < pending->size(); ++r) {
    std::vector<align::SampleKey> keep(plan.ranks[r].keep_pending.begin(), plan.ranks[r].keep_pending.end());
    std::sort(keep.begin(), keep.end());
    std::vector<SampleMeta> rest;
    rest.reserve((*pending)[r].size());
    for (const SampleMeta& m : (*pending)[r]) {
      if (std::binary_search(keep.begin(), keep.end(), align::KeyOf(m))) rest.push_back(m);
    }
    (*pending)[r] = std::move(rest);
  }
}

}  // namespace odb::bench
