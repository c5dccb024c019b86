// Simulated cost of GlobalPlanner vs LocalPlanner vs an offline oracle, balance,
// bytes moved vs locality, and planner time at W = 64 x 1024.
//   bazel run -c opt //src/balance:balance_bench
// The planner's time alone (wall and thread CPU per round, three workloads):
//   bazel run -c opt //src/balance:balance_bench -- --planner-time
// The whole-job rounds of bench/real_rounds.py, in process (the planner's
// thread CPU per round at W = 2 / 16 / 32, one-rank nodes):
//   bazel run -c opt //src/balance:balance_bench -- --real-rounds 2,16,32
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/balance/global_planner.h"
#include "src/grouping/budget.h"
#include "src/grouping/grouper.h"
#include "src/grouping/synthetic_lengths.h"

namespace odb::balance {
namespace {

constexpr int kWorld = 8;
constexpr size_t kWindow = 256;
constexpr size_t kPerRank = 2048;  // samples per rank in the trace

struct SimResult {
  double total = 0;     // sum over steps of max_r StepTime
  double sum_mean = 0;  // sum over steps of mean_r StepTime
  uint64_t steps = 0;
  BytesMoved moved;
};

double Cost(const align::PlannerConfig& cfg, const std::vector<SampleLengths>& lens) {
  return grouping::StepTime(cfg.step_model, cfg.budget.model, lens);
}

std::vector<std::vector<SampleMeta>> Trace(grouping::LengthDistribution dist, uint64_t seed) {
  std::vector<std::vector<SampleMeta>> per_rank(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    const auto lens = grouping::SyntheticWindow(dist, kPerRank, 4096, seed * 1000 + r);
    for (size_t i = 0; i < lens.size(); ++i) {
      SampleMeta m;
      m.id = i;
      m.owner_rank = r;
      m.lengths = lens[i];
      m.payload_bytes = 4ull * lens[i].tokens;  // int32 token ids
      per_rank[r].push_back(m);
    }
  }
  return per_rank;
}

// Streams every rank's trace in chunks of kWindow per round; the trainer
// consumes everything between rounds.
SimResult Simulate(const align::Planner& planner, const std::vector<std::vector<SampleMeta>>& trace,
                   uint32_t lws) {
  SimResult out;
  const align::PlannerConfig& cfg = planner.config();
  std::vector<std::vector<SampleMeta>> pending(kWorld);
  std::vector<size_t> next(kWorld, 0);
  for (uint64_t round = 0; round < 100000; ++round) {
    align::RoundState st;
    st.round = round;
    st.ranks.resize(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      const size_t take = std::min(kWindow, trace[r].size() - next[r]);
      pending[r].insert(pending[r].end(), trace[r].begin() + next[r], trace[r].begin() + next[r] + take);
      next[r] += take;
      st.ranks[r].pending = pending[r];
      st.ranks[r].free_slots = 64;
      st.ranks[r].stream_finished = next[r] == trace[r].size();
    }
    const align::RoundPlan plan = planner.Plan(st);
    for (uint32_t k = 0; k < plan.num_steps; ++k) {
      double mx = 0, sum = 0;
      for (const auto& rp : plan.ranks) {
        std::vector<SampleLengths> lens;
        for (const auto& m : rp.steps[k].samples) lens.push_back(m.lengths);
        const double c = Cost(cfg, lens);
        mx = std::max(mx, c);
        sum += c;
      }
      out.total += mx;
      out.sum_mean += sum / kWorld;
    }
    out.steps += plan.num_steps;
    out.moved += ComputeBytesMoved(plan, lws);
    for (int r = 0; r < kWorld; ++r) {
      std::vector<SampleMeta> kept;
      for (const auto& key : plan.ranks[r].keep_pending) {
        for (const auto& m : pending[r]) {
          if (m.id == key.id) {
            kept.push_back(m);
            break;
          }
        }
      }
      pending[r] = std::move(kept);
    }
    if (plan.epoch_finished) break;
  }
  return out;
}

// Offline oracle: FormGroups over the whole trace (full knowledge of all
// lengths), groups sorted by cost and dealt W per step.
double Oracle(const align::PlannerConfig& cfg, const std::vector<std::vector<SampleMeta>>& trace) {
  std::vector<SampleLengths> all;
  for (const auto& r : trace) {
    for (const auto& m : r) all.push_back(m.lengths);
  }
  std::vector<double> costs;
  for (const auto& g : grouping::FormGroups(all, cfg.budget, cfg.step_model)) {
    std::vector<SampleLengths> lens;
    for (size_t i : g.members) lens.push_back(all[i]);
    costs.push_back(Cost(cfg, lens));
  }
  std::sort(costs.begin(), costs.end(), std::greater<>());
  double total = 0;
  for (size_t i = 0; i < costs.size(); i += kWorld) total += costs[i];
  return total;
}

void CostTable() {
  std::printf("== simulated cost, W=%d, window=%zu/rank, %zu samples/rank, budget 4096, lws=4 ==\n", kWorld, kWindow,
              kPerRank);
  std::printf("%-10s %-7s %-14s %12s %9s %9s %13s %13s\n", "dist", "model", "planner", "cost", "/oracle",
              "max/mean", "moved B/smp", "inter B/smp");
  for (auto dist : {grouping::LengthDistribution::kUniform, grouping::LengthDistribution::kLogNormal,
                    grouping::LengthDistribution::kBimodal}) {
    const auto trace = Trace(dist, 7);
    for (auto model : {grouping::CostModel::kPadded, grouping::CostModel::kPacked}) {
      align::PlannerConfig base;
      base.budget.model = model;
      base.window = kWindow;
      base.max_wait_rounds = 0;
      const double oracle = Oracle(base, trace);
      for (double locality : {1.0, 0.5, 0.0}) {
        GlobalPlannerConfig g;
        g.base = base;
        g.local_world_size = 4;
        g.locality = locality;
        GlobalPlanner planner(g);
        const SimResult s = Simulate(planner, trace, g.local_world_size);
        const double n = static_cast<double>(s.moved.samples());
        std::printf("%-10s %-7s %-14s %12.0f %9.4f %9.4f %13.1f %13.1f\n", grouping::DistributionName(dist),
                    model == grouping::CostModel::kPadded ? "padded" : "packed",
                    locality >= 1.0 ? "local(l=1)" : locality > 0 ? "global l=0.5" : "global l=0", s.total,
                    s.total / oracle, s.total / s.sum_mean, s.moved.moved_bytes() / n,
                    s.moved.inter_node_bytes / n);
      }
    }
  }
}

void LocalitySweep() {
  std::printf("\n== bytes moved per sample vs locality (lognormal, padded, W=8, lws=4) ==\n");
  std::printf("%-9s %12s %12s %12s %9s\n", "locality", "moved B/smp", "intra B/smp", "inter B/smp", "max/mean");
  const auto trace = Trace(grouping::LengthDistribution::kLogNormal, 11);
  for (double locality : {0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0}) {
    GlobalPlannerConfig g;
    g.base.window = kWindow;
    g.base.max_wait_rounds = 0;
    g.local_world_size = 4;
    g.locality = locality;
    const SimResult s = Simulate(GlobalPlanner(g), trace, 4);
    const double n = static_cast<double>(s.moved.samples());
    std::printf("%-9.2f %12.1f %12.1f %12.1f %9.4f\n", locality, s.moved.moved_bytes() / n,
                s.moved.intra_node_bytes / n, s.moved.inter_node_bytes / n, s.total / s.sum_mean);
  }
}

double ThreadCpuUs();

void PlannerTime() {
  std::printf("\n== planner time, W=64 x 1024 pending/rank, window 1024, free 8 ==\n");
  struct Case {
    grouping::CostModel model;
    bool image_text;
  };
  for (const Case c : {Case{grouping::CostModel::kPadded, false}, Case{grouping::CostModel::kPacked, false},
                       Case{grouping::CostModel::kPacked, true}}) {
    const grouping::CostModel model = c.model;
    const int world = 64;
    align::RoundState st;
    st.ranks.resize(world);
    for (int r = 0; r < world; ++r) {
      const auto lens = grouping::SyntheticWindow(
          c.image_text ? grouping::LengthDistribution::kImageText : grouping::LengthDistribution::kLogNormal,
          1024, 4096, 99 + r);
      for (size_t i = 0; i < lens.size(); ++i) {
        SampleMeta m;
        m.id = i;
        m.owner_rank = r;
        m.lengths = lens[i];
        m.payload_bytes = 4ull * lens[i].tokens;
        st.ranks[r].pending.push_back(m);
      }
      st.ranks[r].free_slots = 8;
    }
    GlobalPlannerConfig g;
    g.base.budget.model = model;
    g.base.window = 1024;
    g.base.max_wait_rounds = 0;
    g.local_world_size = 8;
    GlobalPlanner planner(g);
    std::vector<double> ms, cpu_ms;
    uint32_t steps = 0;
    for (int i = 0; i < 15; ++i) {
      const double c0 = ThreadCpuUs();
      const auto t0 = std::chrono::steady_clock::now();
      const align::RoundPlan plan = planner.Plan(st);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      cpu_ms.push_back(1e-3 * (ThreadCpuUs() - c0));
      steps = plan.num_steps;
    }
    std::sort(ms.begin(), ms.end());
    std::sort(cpu_ms.begin(), cpu_ms.end());
    std::vector<SampleLengths> all;
    for (const auto& rr : st.ranks) {
      for (const auto& m : rr.pending) all.push_back(m.lengths);
    }
    const double c0 = ThreadCpuUs();
    const auto groups = grouping::FormGroups(all, g.base.budget, g.base.step_model);
    const double fg = 1e-3 * (ThreadCpuUs() - c0);
    std::printf(
        "%-7s %-10s p50 %.2f ms, min %.2f ms, thread CPU p50 %.2f ms "
        "(T=%u; of which FormGroups(65536) %.2f ms CPU, %zu groups)\n",
        model == grouping::CostModel::kPadded ? "padded" : "packed",
        c.image_text ? "image_text" : "lognormal", ms[ms.size() / 2], ms[0], cpu_ms[cpu_ms.size() / 2], steps,
        fg, groups.size());
  }
}

double ThreadCpuUs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e6 * static_cast<double>(ts.tv_sec) + 1e-3 * static_cast<double>(ts.tv_nsec);
}

// The rounds one daemon of bench/real_rounds.py plans (its defaults: 80
// samples per rank from `odb_synth produce --max-len 32 --min-len 1`, i.e.
// lognormal lengths of median 4 clamped to [1, 32], int64 token ids; window 4,
// max_tokens 128, queue_steps 64 (min_free_slots 32, full rounds),
// local_world_size 1, the global planner unpartitioned). Every stream has
// finished (the producers send everything at once) and the trainer drains
// the queue between rounds. Prints the planner's thread CPU per planning
// round (median, mean) and the plans' inter-node bytes.
void RealRounds(int world, uint32_t lws, int reps, uint32_t per_rank, uint32_t window) {
  std::vector<std::vector<SampleMeta>> pending(world);
  for (int r = 0; r < world; ++r) {
    std::mt19937_64 rng(r);
    std::lognormal_distribution<double> lognormal(std::log(32.0 / 8.0), 0.9);
    for (uint64_t i = 0; i < per_rank; ++i) {
      SampleMeta m;
      m.id = static_cast<uint64_t>(r) * 1000000 + i;
      m.owner_rank = r;
      m.lengths.tokens = static_cast<uint32_t>(std::clamp<double>(lognormal(rng), 1, 32));
      m.payload_bytes = 8ull * m.lengths.tokens;
      pending[r].push_back(m);
    }
  }
  GlobalPlannerConfig g;
  g.base.budget.max_tokens = 128;
  g.base.window = window;
  g.base.min_free_slots = 32;
  g.base.full_rounds = true;
  g.local_world_size = lws;
  GlobalPlanner planner(g);
  std::vector<double> cpu;
  uint64_t steps = 0, inter = 0, moved = 0, digest = 0xcbf29ce484222325ull;
  for (uint64_t round = 0; round < 100000; ++round) {
    align::RoundState st;
    st.round = round;
    st.ranks.resize(world);
    for (int r = 0; r < world; ++r) {
      st.ranks[r].pending = pending[r];
      st.ranks[r].free_slots = 64;
      st.ranks[r].stream_finished = true;
    }
    double best = 1e300;
    align::RoundPlan plan;
    for (int i = 0; i < reps; ++i) {
      const double t0 = ThreadCpuUs();
      plan = planner.Plan(st);
      best = std::min(best, ThreadCpuUs() - t0);
    }
    if (plan.epoch_finished) break;
    if (plan.num_steps > 0) cpu.push_back(best);
    steps += plan.num_steps;
    for (const auto& rp : plan.ranks) {  // FNV-1a over every step's sample ids, rank by rank
      for (const auto& step : rp.steps) {
        for (const auto& m : step.samples) digest = (digest ^ m.id) * 0x100000001b3ull;
        digest = (digest ^ 0xff) * 0x100000001b3ull;
      }
    }
    const BytesMoved b = ComputeBytesMoved(plan, lws);
    inter += b.inter_node_bytes;
    moved += b.moved_bytes();
    for (int r = 0; r < world; ++r) {
      std::vector<SampleMeta> kept;
      for (const auto& key : plan.ranks[r].keep_pending) {
        for (const auto& m : pending[r]) {
          if (m.id == key.id) kept.push_back(m);
        }
      }
      pending[r] = std::move(kept);
    }
  }
  std::vector<double> sorted = cpu;
  std::sort(sorted.begin(), sorted.end());
  double sum = 0;
  for (double c : cpu) sum += c;
  std::printf(
      "W=%-3d lws=%u: %zu planning rounds, %lu steps; planner CPU per round p50 %.0f us, mean %.0f us, "
      "max %.0f us; inter-node bytes %lu, moved bytes %lu; plans %016lx\n",
      world, lws, cpu.size(), static_cast<unsigned long>(steps),
      sorted.empty() ? 0.0 : sorted[sorted.size() / 2],
      cpu.empty() ? 0.0 : sum / static_cast<double>(cpu.size()), sorted.empty() ? 0.0 : sorted.back(),
      static_cast<unsigned long>(inter), static_cast<unsigned long>(moved),
      static_cast<unsigned long>(digest));
}

}  // namespace
}  // namespace odb::balance

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--real-rounds") == 0) {
    // Optional: repetitions per round (the least CPU counts), local_world_size, samples per rank, window.
    const int reps = argc >= 4 ? std::atoi(argv[3]) : 5;
    const auto lws = static_cast<uint32_t>(argc >= 5 ? std::atoi(argv[4]) : 1);
    const auto per_rank = static_cast<uint32_t>(argc >= 6 ? std::atoi(argv[5]) : 80);
    const auto window = static_cast<uint32_t>(argc >= 7 ? std::atoi(argv[6]) : 4);
    // Positional (no flags): a flag or a word here read as 0 and ran nothing sensible.
    for (int i = 3; i < std::min(argc, 7); ++i) {
      if (std::atoi(argv[i]) < 1) {
        std::fprintf(stderr,
                     "balance_bench: --real-rounds W[,W...] [reps] [local_world_size] [samples_per_rank] "
                     "[window]: '%s' is not a whole number >= 1\n",
                     argv[i]);
        return 2;
      }
    }
    for (const char* p = argv[2]; *p != 0;) {
      char* end = nullptr;
      const long w = std::strtol(p, &end, 10);
      odb::balance::RealRounds(static_cast<int>(w), lws, reps, per_rank, window);
      p = *end == ',' ? end + 1 : end;
    }
    return 0;
  }
  if (argc >= 2 && std::strcmp(argv[1], "--planner-time") == 0) {
    odb::balance::PlannerTime();  // the planner's time alone
    return 0;
  }
  odb::balance::CostTable();
  odb::balance::LocalitySweep();
  odb::balance::PlannerTime();
  return 0;
}
