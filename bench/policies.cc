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
// grouping.step_time.
absl::StatusOr<Schedule> RunOdb(const std::vector<SampleLengths>& arrival, const SimConfig& cfg,
                                const PolicySpec& spec) {
  const int world = cfg.world;
  const uint32_t window = spec.window ? spec.window : cfg.window;
  align::PlannerConfig pc;
  pc.budget = cfg.budget;
  pc.step_model = cfg.model.PlannerModel();
  pc.mode = align::EpochMode::kJoin;
  pc.seed = cfg.seed;
  pc.window = window;
  pc.deterministic = spec.deterministic;
  pc.full_rounds = spec.full_rounds;
  std::unique_ptr<align::Planner> planner;
  if (spec.global) {
    balance::GlobalPlannerConfig g;
    g.base = pc;
    g.locality = 0.0;
    planner = std::make_unique<balance::GlobalPlanner>(g);
  } else {
    planner = std::make_unique<align::LocalPlanner>(pc);
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
    AppendRoundSteps(plan, world, &schedule);
    first_step += plan.num_steps;
    if (plan.epoch_finished) break;
    if (spec.paced > 0 && spec.queue_steps != 0) {
      // The round queued num_steps. The next round fires as soon as `paced`
      // slots are free (Daemon::RoundDue: one); until then the trainer takes
      // steps off the queue, one at a time.
      const uint32_t queued = std::min(queue, queue - free_slots + plan.num_steps);
      const uint32_t fire_at = queue - std::min(queue, spec.paced);  // queued steps at which a round fires
      free_slots = queue - std::min(queued, fire_at);
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
         (deterministic ? ":det" : "") + (full_rounds ? ":full" : "");
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
  static const char* kPlain[] = {"standard", "standard_p99",  "sorted",    "length_grouped",
                                 "packing",  "sorted_greedy", "offline_dp"};
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
          "sorted_greedy",
          "offline_dp"};
}

absl::StatusOr<Schedule> RunPolicy(const std::string& policy, const std::vector<SampleLengths>& arrival,
                                   const SimConfig& cfg) {
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
  if (base == "reference_odb") return RunReference(arrival, cfg, spec->window ? spec->window : cfg.window);
  return RunOdb(arrival, cfg, *spec);
}

double RankCost(const StepModel& model, const RankStep& step) {
  if (step.idle) return model.a;
  return model.Step(static_cast<double>(step.padded_tokens), step.sum_len_sq);
}

Metrics Evaluate(const Schedule& schedule, const StepModel& model, uint64_t max_tokens) {
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
      if (!s.idle && max_tokens != 0 && s.padded_tokens > max_tokens) ++m.over_budget_rank_steps;
    }
    m.time += worst;
    m.mean_rank_time += step.empty() ? 0.0 : sum / step.size();
    m.step_costs.push_back(worst);
  }
  return m;
}

void AppendRoundSteps(const align::RoundPlan& plan, int world, Schedule* schedule,
                      std::vector<SampleLengths>* emitted) {
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
