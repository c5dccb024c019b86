#include "bench/policies.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>
#include <span>

#include "absl/status/status.h"
#include "src/align/planner.h"
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

std::vector<Batch> BatchesOf(const std::vector<SampleLengths>& samples, std::vector<grouping::Group> groups) {
  std::vector<Batch> batches;
  batches.reserve(groups.size());
  for (const grouping::Group& g : groups) {
    Batch b;
    for (size_t i : g.members) b.push_back(samples[i]);
    batches.push_back(std::move(b));
  }
  // Length order, so the W batches of a step are alike (best case for balance).
  std::stable_sort(batches.begin(), batches.end(), [](const Batch& a, const Batch& b) {
    return std::max_element(a.begin(), a.end(), ByTokens)->tokens >
           std::max_element(b.begin(), b.end(), ByTokens)->tokens;
  });
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
    std::stable_sort(m.begin(), m.end(), [](const SampleLengths& a, const SampleLengths& b) {
      return a.tokens > b.tokens;
    });
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

// The reference ODB 0.1.x algorithm (DESIGN.md, "Reference facts"): per rank,
// the reference grouping rule on a window of `window` buffered samples; then
// T = max(1, min(max_A G_r, min_{N_r>0} N_r)) (free slots are unbounded
// here); a rank with G_r > T keeps its T largest groups and returns the rest
// to its buffer; a rank with G_r < T splits its longest-sample multi-sample
// group one sample at a time into singletons; same-seed shuffle of group
// order on every rank; ranks without groups run IDLE steps.
Schedule RunReference(const std::vector<SampleLengths>& arrival, const SimConfig& cfg) {
  const int world = cfg.world;
  const auto shares = Shares(arrival, world);
  std::vector<size_t> next(world, 0);
  std::vector<std::vector<SampleLengths>> pending(world);
  Schedule schedule;
  for (uint64_t round = 0;; ++round) {
    bool anything = false;
    for (int r = 0; r < world; ++r) {
      while (pending[r].size() < cfg.window && next[r] < shares[r].size()) pending[r].push_back(shares[r][next[r]++]);
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
        std::stable_sort(gs.begin(), gs.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
        gs.resize(t);
      }
      while (gs.size() < t) {
        size_t pick = gs.size();
        for (size_t i = 0; i < gs.size(); ++i) {
          if (gs[i].size() >= 2 && (pick == gs.size() || longest(gs[i]) > longest(gs[pick]))) pick = i;
        }
        if (pick == gs.size()) break;  // cannot happen: T <= N_r
        auto& g = gs[pick];
        auto it = std::max_element(g.begin(), g.end(), [&](size_t a, size_t b) { return win[a].tokens < win[b].tokens; });
        const size_t lone = *it;
        g.erase(it);
        gs.push_back({lone});
      }
      std::stable_sort(gs.begin(), gs.end(), [&](const auto& a, const auto& b) { return longest(a) > longest(b); });
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
// round (a producer at least as fast as the trainer), `free_slots` credits,
// stream_finished once a rank's share has fully arrived, the consecutive
// waiting-round counter the Aligner keeps; Join mode.
absl::StatusOr<Schedule> RunOdb(const std::vector<SampleLengths>& arrival, const SimConfig& cfg,
                                bool global = false) {
  const int world = cfg.world;
  align::PlannerConfig pc;
  pc.budget = cfg.budget;
  pc.step_model = cfg.model;
  pc.mode = align::EpochMode::kJoin;
  pc.seed = cfg.seed;
  pc.window = cfg.window;
  std::unique_ptr<align::Planner> planner;
  if (global) {
    balance::GlobalPlannerConfig g;
    g.base = pc;
    g.locality = 0.0;
    planner = std::make_unique<balance::GlobalPlanner>(g);
  } else {
    planner = std::make_unique<align::LocalPlanner>(pc);
  }
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
  Schedule schedule;
  for (uint64_t round = 0;; ++round) {
    align::RoundState state;
    state.epoch = 0;
    state.round = round;
    state.first_step = first_step;
    state.ranks.resize(world);
    for (int r = 0; r < world; ++r) {
      while (pending[r].size() < cfg.window && next[r] < shares[r].size()) pending[r].push_back(shares[r][next[r]++]);
      align::RankRound& rr = state.ranks[r];
      rr.pending = pending[r];
      rr.free_slots = cfg.free_slots;
      rr.stream_finished = next[r] == shares[r].size();
      rr.wait_rounds = wait_rounds;
    }
    align::RoundPlan plan = planner->Plan(state);
    for (uint32_t k = 0; k < plan.num_steps; ++k) {
      std::vector<RankStep> step(world);
      for (int r = 0; r < world; ++r) {
        const align::PlannedStep& ps = plan.ranks[r].steps[k];
        if (ps.idle) continue;
        RankStep& s = step[r];
        s.idle = false;
        s.samples = static_cast<uint32_t>(ps.samples.size());
        s.real_tokens = ps.real_tokens;
        s.padded_tokens = ps.padded_tokens;
        for (const SampleMeta& m : ps.samples) s.sum_len_sq += static_cast<double>(m.lengths.tokens) * m.lengths.tokens;
      }
      schedule.push_back(std::move(step));
    }
    first_step += plan.num_steps;
    if (plan.epoch_finished) break;
    // The daemon's buffer keeps arrival order; emitted samples leave it.
    for (int r = 0; r < world; ++r) {
      const auto& keep = plan.ranks[r].keep_pending;
      std::vector<SampleMeta> rest;
      std::vector<align::SampleKey> sorted_keep(keep.begin(), keep.end());
      std::sort(sorted_keep.begin(), sorted_keep.end());
      for (const SampleMeta& m : pending[r]) {
        if (std::binary_search(sorted_keep.begin(), sorted_keep.end(), align::KeyOf(m))) rest.push_back(m);
      }
      pending[r] = std::move(rest);
    }
    wait_rounds = plan.waiting ? wait_rounds + 1 : 0;
    idle_rounds = plan.num_steps == 0 ? idle_rounds + 1 : 0;
    if (idle_rounds > 1000) {
      return absl::InternalError("odb simulation made no progress for 1000 rounds: " + plan.reason);
    }
  }
  return schedule;
}

}  // namespace

uint32_t FixedBatchSize(const std::vector<SampleLengths>& samples, const grouping::Budget& budget) {
  uint32_t longest = 1;
  for (const SampleLengths& s : samples) longest = std::max(longest, s.tokens);
  return static_cast<uint32_t>(std::max<uint64_t>(1, budget.max_tokens / longest));
}

std::vector<std::string> PolicyNames() {
  return {"standard", "sorted",     "length_grouped", "packing", "reference_odb",
          "odb",      "odb_queue32", "odb_global",   "oracle",  "oracle_dp"};
}

absl::StatusOr<Schedule> RunPolicy(const std::string& policy, const std::vector<SampleLengths>& arrival,
                                   const SimConfig& cfg) {
  const grouping::CostModel cm = cfg.budget.model;
  const uint32_t b = FixedBatchSize(arrival, cfg.budget);
  if (policy == "standard") return FromBatches(Chunks(arrival, b), cfg.world, cm);
  if (policy == "sorted") {
    std::vector<SampleLengths> sorted = arrival;
    std::stable_sort(sorted.begin(), sorted.end(), ByTokens);
    return FromBatches(Chunks(sorted, b), cfg.world, cm);
  }
  if (policy == "length_grouped") return FromBatches(LengthGrouped(arrival, b), cfg.world, cm);
  if (policy == "packing") {
    return FromBatches(FirstFitRows(arrival, cfg.budget.max_tokens), cfg.world, grouping::CostModel::kPacked,
                       cfg.budget.max_tokens);
  }
  if (policy == "oracle") {
    return FromBatches(BatchesOf(arrival, grouping::GreedyFewestSteps(arrival, cfg.budget)), cfg.world, cm);
  }
  if (policy == "oracle_dp") {
    return FromBatches(BatchesOf(arrival, grouping::FormGroups(arrival, cfg.budget, cfg.model)), cfg.world, cm);
  }
  if (policy == "reference_odb") return RunReference(arrival, cfg);
  if (policy == "odb") return RunOdb(arrival, cfg);
  if (policy == "odb_global") return RunOdb(arrival, cfg, /*global=*/true);
  if (policy == "odb_queue32") {
    SimConfig c = cfg;
    c.free_slots = 32;  // the daemon's default emit.queue_steps
    return RunOdb(arrival, c);
  }
  return absl::InvalidArgumentError("unknown policy '" + policy + "'");
}

double RankCost(const grouping::StepTimeModel& model, const RankStep& step) {
  if (step.idle) return model.per_step;
  return model.per_step + model.per_padded_token * static_cast<double>(step.padded_tokens) +
         model.per_len_sq * step.sum_len_sq;
}

Metrics Evaluate(const Schedule& schedule, const grouping::StepTimeModel& model) {
  Metrics m;
  m.steps = schedule.size();
  m.step_costs.reserve(schedule.size());
  for (const auto& step : schedule) {
    double worst = 0.0, sum = 0.0;
    for (const RankStep& s : step) {
      const double c = RankCost(model, s);
      worst = std::max(worst, c);
      sum += c;
      m.idle_rank_steps += s.idle;
      m.samples += s.samples;
      m.real_tokens += s.real_tokens;
      if (!s.idle) m.padded_tokens += s.padded_tokens;
    }
    m.time += worst;
    m.mean_rank_time += step.empty() ? 0.0 : sum / step.size();
    m.step_costs.push_back(worst);
  }
  return m;
}

}  // namespace odb::bench
