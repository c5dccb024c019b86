// Scaling benchmark of one alignment round (issue 22): the daemon's global
// planner (balance::GlobalPlanner) and metadata codec (align::EncodeRankRound /
// DecodeRankRound) on synthetic windows of W simulated ranks, measured on ONE
// rank (every rank runs the same pure function on the same all-gathered bytes).
//
//   bazel run -c opt //bench:scale_bench -- --world 256 --rounds 6
//
// Setting (the production defaults of configs/odbd.yaml): grouping.window 512
// per rank, emit.queue_steps 32 (a round waits until half the queue is free,
// so it sees 16 free slots), padded budget L_max 4096, step model a = 512,
// b = 1 (grouping.step_time's defaults), planner global with locality 0 and
// local_world_size 8. Each rank streams its own trace (preset, seed derived
// from the rank only, so rank r's samples are the same at every W) and its
// pending list is topped up to the window before each round (a producer at
// least as fast as the trainer); emitted samples leave it.
//
// Prints one JSON object (bench/scale.py collects one per W, each from a
// fresh process so that VmHWM is that W's peak):
//   plan_cpu_ms: thread CPU time of GlobalPlanner::Plan per round (CPU, not
//     wall: the machine may be shared);
//   decode_cpu_ms: thread CPU time to decode the W messages of a round;
//   sent_bytes: this rank's encoded message per round; recv_bytes: the other
//     W - 1 messages (what an all-gather delivers to each rank);
//   bound_fraction: the simulator's metric (bench/batching_sim): the padded
//     lower bound of the emitted samples (bench/bound.h) over the simulated
//     time (sum over steps of the slowest rank's cost);
//   vmhwm_kb: peak resident memory of this process;
//   moved_bytes_per_sample, inter_node_bytes_per_sample: payload bytes the
//     plans move between ranks / nodes (balance::ComputeBytesMoved), per
//     emitted sample. --exact-max-world M sets
//     GlobalPlannerConfig::exact_assignment_max_world (exact Hungarian
//     permutation up to M ranks) to compare the two assignments.
//   --partition-ranks P sets GlobalPlannerConfig::partition_ranks; then
//   block_plan_cpu_ms is GlobalPlanner::PlanBlockOf(state, 0) (what rank 0
//   plans when every rank plans only its block; plan_cpu_ms stays the whole
//   Plan, whose steps are simulated), block_decode_cpu_ms_per_round the
//   decode of rank 0's block's messages, and block_recv_bytes_per_step what
//   rank 0 would receive: its block's messages plus kSummaryBytes per rank
//   outside it. Without partitioning they equal the whole-round figures.
//   --window-tokens T (optimizer.tokens_per_step: loss tokens, or Ns / Nm as
//   batching_sim takes them; 0 = off) cuts every round's plan into
//   accumulation windows with the daemon's align::ApplyWindows, as the Aligner
//   does (bench/policies.h ApplyRoundWindows; the open window's samples stay
//   pending for the next round). Then window_cpu_ms_per_round is its thread
//   CPU time, bound_fraction is over the micro-steps it leaves (time model (a):
//   every micro-step synchronised), bound_fraction_window over the per-window
//   time (b: the slowest rank's sum over each window, DDP no_sync), and
//   windows, mean_window_over_target, max_window_over_target, idle_share
//   (IDLE rank-steps over all rank-steps) describe them (balance over the
//   window as the Aligner runs it; --no-window-balance: the cut alone); of_window_bound and
//   of_window_bound_window are the fractions (a) and (b) of the window bounds
//   (bench/bound.h WindowedBounds: what no schedule with as many windows beats). docs/benchmarks.md,
//   "Accumulation windows in the simulator". With --partition-ranks,
//   --partitioned-windows cuts and balances the windows as a partitioned
//   daemon does (bench/policies.h ApplyRoundPartitionedWindows:
//   align::PartitionedWindows from the world-wide step totals, then
//   align::BalanceBlockWindows per block) instead of over the whole plan
//   (whole-job windows); the JSON says which ("partitioned_windows").
//   --window-parts prints to stderr, for the planned steps and for the
//   micro-steps the windows leave, where time model (a) goes (PartStats
//   below; docs/benchmarks.md, "Partitioned windows in the simulator");
//   --window-parts-steps adds a line per micro-step.
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bench/bound.h"
#include "bench/policies.h"
#include "bench/trace.h"
#include "src/align/meta_codec.h"
#include "src/align/planner.h"
#include "src/align/window_balance.h"
#include "src/balance/global_planner.h"
#include "src/grouping/budget.h"

namespace odb::bench {
namespace {

double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

long VmHwmKb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

struct Options {
  int world = 8;
  int rounds = 6;
  uint32_t window = 512;
  uint32_t queue = 32;
  uint32_t lws = 8;
  std::string preset = "chat_longtail";
  uint64_t seed = 1;
  uint32_t exact_max_world = balance::GlobalPlannerConfig{}.exact_assignment_max_world;
  uint32_t partition_ranks = 0;
  std::string dump_plan;  // --dump-plan FILE: the last round's steps as JSON
  std::string window_tokens = "0";  // --window-tokens: accumulation windows (WindowTarget spelling)
  bool window_balance = true;       // --no-window-balance: the window cut alone
  double window_spread = align::PlannerConfig{}.window_spread;  // --window-spread: optimizer.window_spread
  bool partitioned_windows = false;  // --partitioned-windows: as a partitioned daemon cuts them
  bool window_parts = false;         // --window-parts: where the windowed micro-steps' time goes (stderr)
  bool window_parts_steps = false;   // --window-parts-steps: the same per micro-step of the windows
};

// --window-parts: per micro-step after the windows (and of the planned steps
// before them), summed over the run: the slowest rank's cost (time model a),
// the mean rank's, IDLE ranks, and two per-block lower bounds on what a
// re-layout of the micro-step's samples within each block could reach: the
// costliest single sample, and the block's even share (per_step +
// per_padded_token x real tokens / ranks); and a re-layout of each block's
// samples of the micro-step onto its ranks, ignoring the budget (padded: the
// length-sorted list in contiguous runs, one per rank, the largest run's
// padded tokens least; packed: LPT). forced_idle_rank_steps: the IDLE ranks
// no layout within a block avoids (a block's micro-step with fewer samples
// than ranks).
struct PartStats {
  bool per_step = false;  // --window-parts-steps: a line per micro-step too
  uint64_t micro_steps = 0, idle = 0, rank_steps = 0, forced_idle = 0;
  double max_cost = 0, mean_cost = 0, lb_single = 0, lb_even = 0, lb = 0, lpt = 0;
  void Add(const align::WindowBalanceConfig& c, const align::RoundPlan& plan, size_t block) {
    const size_t world = plan.ranks.size();
    for (uint32_t k = 0; k < plan.num_steps; ++k) {
      ++micro_steps;
      double mx = 0, sum = 0, single = 0, even = 0, lpt_max = 0;
      for (size_t b = 0; b < world; b += block) {
        const size_t e = std::min(world, b + block);
        std::vector<SampleMeta> all;
        uint64_t real = 0;
        for (size_t r = b; r < e; ++r) {
          const align::PlannedStep& s = plan.ranks[r].steps[k];
          const double cost = align::MicroStepCost(c, s);
          mx = std::max(mx, cost);
          sum += cost;
          ++rank_steps;
          if (s.samples.empty()) ++idle;
          for (const SampleMeta& m : s.samples) {
            all.push_back(m);
            real += m.lengths.tokens;
            align::PlannedStep one;
            one.samples.push_back(m);
            single = std::max(single, align::MicroStepCost(c, one));
          }
        }
        forced_idle += all.size() < e - b ? e - b - all.size() : 0;  // fewer samples than ranks
        even =
            std::max(even, c.step_model.per_step + c.step_model.per_padded_token * static_cast<double>(real) /
                                                       static_cast<double>(e - b));
        // LPT: longest first onto the least loaded rank (estimated by its
        // padded or packed tokens) that holds it within the budget.
        std::sort(all.begin(), all.end(), [](const SampleMeta& x, const SampleMeta& y) {
          return x.lengths.tokens > y.lengths.tokens;
        });
        std::vector<align::PlannedStep> ranks(e - b);
        const bool padded = c.budget.model == grouping::CostModel::kPadded;
        if (padded && !all.empty()) {
          // Padded: contiguous runs of the length-sorted list, the least
          // largest n x longest that needs no more runs than ranks (binary
          // search; the greedy run cut is optimal for a given cap).
          auto runs = [&](uint64_t cap, std::vector<align::PlannedStep>* out) {
            size_t used = 0, i = 0;
            while (i < all.size()) {
              const uint64_t l = all[i].lengths.tokens;
              size_t n = 1;
              while (i + n < all.size() && (n + 1) * l <= cap) ++n;
              if (out && used < out->size())
                (*out)[used].samples.assign(all.begin() + static_cast<std::ptrdiff_t>(i),
                                            all.begin() + static_cast<std::ptrdiff_t>(i + n));
              ++used;
              i += n;
            }
            return used;
          };
          uint64_t lo = all.front().lengths.tokens, hi = std::max<uint64_t>(lo, all.size() * lo);
          while (lo < hi) {
            const uint64_t mid = lo + (hi - lo) / 2;
            if (runs(mid, nullptr) <= ranks.size())
              hi = mid;
            else
              lo = mid + 1;
          }
          runs(lo, &ranks);
        } else {
          std::vector<uint64_t> total(e - b, 0);
          for (const SampleMeta& m : all) {  // packed: LPT
            size_t best = 0;
            for (size_t r = 1; r < ranks.size(); ++r)
              if (total[r] < total[best]) best = r;
            ranks[best].samples.push_back(m);
            total[best] += m.lengths.tokens;
          }
        }
        for (const align::PlannedStep& s : ranks) lpt_max = std::max(lpt_max, align::MicroStepCost(c, s));
      }
      if (per_step)
        std::fprintf(stderr,
                     "k %u window %llu closes %d: max %.0f mean %.0f single %.0f even %.0f runs %.0f\n", k,
                     static_cast<unsigned long long>(plan.ranks[0].steps[k].window),
                     plan.ranks[0].steps[k].closes_window ? 1 : 0, mx, sum / static_cast<double>(world),
                     single, even, lpt_max);
      max_cost += mx;
      mean_cost += sum / static_cast<double>(world);
      lb_single += single;
      lb_even += even;
      lb += std::max(single, even);
      lpt += lpt_max;
    }
  }
  void Print(const char* what) const {
    std::fprintf(
        stderr,
        "{\"window_parts\": \"%s\", \"micro_steps\": %llu, \"idle_rank_steps\": %llu, \"idle_share\": %.4f, "
        "\"forced_idle_rank_steps\": %llu, \"sum_max_cost\": %.0f, \"sum_mean_cost\": %.0f, "
        "\"sum_single_bound\": %.0f, "
        "\"sum_even_bound\": %.0f, \"sum_block_bound\": %.0f, \"sum_block_lpt\": %.0f}\n",
        what, static_cast<unsigned long long>(micro_steps), static_cast<unsigned long long>(idle),
        rank_steps ? static_cast<double>(idle) / static_cast<double>(rank_steps) : 0.0,
        static_cast<unsigned long long>(forced_idle), max_cost, mean_cost, lb_single, lb_even, lb, lpt);
  }
};

// Bytes of one rank's summary in a partitioned round: what the round gates
// and the T rule read of a rank outside the reader's block (pending count,
// free slots, wait rounds and flags, the group lower bound as a double), as
// fixed-width fields. The benchmark counts these payload bytes; the daemon's
// summary (proto/peer.proto RoundSummary, varints with its lockstep header)
// is about 26 B (bench/peer_codec_bench), and bench/scale_aligner_bench.cc
// measures the daemon's real round.
constexpr uint64_t kSummaryBytes = 8 + 4 + 4 + 1 + 8;

// One rank's endless stream: chunks of `window` samples, chunk c generated
// with seed (seed, rank, c), so the stream does not depend on W or on how
// fast the rank consumes it.
class RankStream {
 public:
  RankStream(const Options& o, int rank) : o_(o), rank_(rank) {}
  SampleMeta Next() {
    if (pos_ == chunk_.size()) {
      auto t =
          GenerateTrace(o_.preset, o_.window, 4096,
                        align::MixSeed(align::MixSeed(o_.seed, static_cast<uint64_t>(rank_)), chunks_++));
      if (!t.ok()) {
        std::fprintf(stderr, "scale_bench: %s\n", t.status().ToString().c_str());
        std::exit(2);
      }
      chunk_ = std::move(t->samples);
      pos_ = 0;
    }
    SampleMeta m;
    m.id = next_id_++;
    m.owner_rank = rank_;
    m.lengths = chunk_[pos_++];
    m.payload_bytes = 4ull * m.lengths.tokens;  // int32 token ids
    return m;
  }

 private:
  const Options& o_;
  int rank_;
  uint64_t chunks_ = 0, next_id_ = 0;
  std::vector<SampleLengths> chunk_;
  size_t pos_ = 0;
};

std::string Json(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%s%.4f", i ? ", " : "", v[i]);
    s += buf;
  }
  return s + "]";
}

// The round's steps for bench/exchange_optimum.py: per step its cost (the
// slowest rank's grouping::StepTime) and every sample with the rank that
// runs it, its owner, tokens and payload bytes.
bool DumpPlan(const std::string& path, const align::PlannerConfig& pc, uint32_t lws, const align::RoundPlan& plan) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "scale_bench: cannot write %s\n", path.c_str());
    return false;
  }
  std::fprintf(f,
               "{\"world\": %zu, \"local_world_size\": %u, \"max_tokens\": %llu, \"padded\": %s, "
               "\"per_step\": %.17g, \"per_padded_token\": %.17g, \"per_len_sq\": %.17g, \"steps\": [",
               plan.ranks.size(), lws, static_cast<unsigned long long>(pc.budget.max_tokens),
               pc.budget.model == grouping::CostModel::kPadded ? "true" : "false", pc.step_model.per_step,
               pc.step_model.per_padded_token, pc.step_model.per_len_sq);
  for (uint32_t k = 0; k < plan.num_steps; ++k) {
    double cost = 0;
    for (const align::RankPlan& rp : plan.ranks) {
      std::vector<SampleLengths> lens;
      for (const SampleMeta& m : rp.steps[k].samples) lens.push_back(m.lengths);
      cost = std::max(cost, grouping::StepTime(pc.step_model, pc.budget.model, lens));
    }
    std::fprintf(f, "%s{\"cost\": %.17g, \"samples\": [", k ? ", " : "", cost);
    bool first = true;
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      for (const SampleMeta& m : plan.ranks[r].steps[k].samples) {
        std::fprintf(f, "%s[%zu, %d, %u, %llu]", first ? "" : ", ", r, m.owner_rank, m.lengths.tokens,
                     static_cast<unsigned long long>(m.payload_bytes));
        first = false;
      }
    }
    std::fprintf(f, "]}");
  }
  std::fprintf(f, "]}\n");
  return std::fclose(f) == 0;
}

int Run(const Options& o, const WindowTarget& window_target) {
  const int world = o.world;
  StepModel sim;  // a = 512, b = 1: the simulator model whose linear part the planner is given
  align::PlannerConfig pc;
  pc.budget.model = grouping::CostModel::kPadded;
  pc.budget.max_tokens = 4096;
  pc.step_model = sim.PlannerModel();
  pc.mode = align::EpochMode::kJoin;
  pc.window = o.window;
  pc.max_wait_rounds = 0;
  pc.window_spread = o.window_spread;
  balance::GlobalPlannerConfig g;
  g.base = pc;
  g.locality = 0.0;
  g.local_world_size = o.lws;
  g.exact_assignment_max_world = o.exact_max_world;
  g.partition_ranks = o.partition_ranks;
  const balance::GlobalPlanner planner(g);
  const align::WindowBalanceConfig balance_config{pc.budget, pc.step_model};
  // Ranks of rank 0's block (all W without partitioning).
  const int block = o.partition_ranks == 0 ? world
                                           : std::min<int>(world, static_cast<int>((o.partition_ranks + o.lws - 1) /
                                                                                   o.lws * o.lws));

  std::vector<RankStream> streams;
  streams.reserve(world);
  for (int r = 0; r < world; ++r) streams.emplace_back(o, r);
  std::vector<std::vector<SampleMeta>> pending(world);
  std::vector<double> plan_ms, decode_ms, steps_per_round, block_plan_ms, block_decode_ms;
  PartStats parts_before, parts_after;
  parts_after.per_step = o.window_parts_steps;
  double block_recv_sum = 0;
  double sent_sum = 0, recv_sum = 0, sent_max = 0, recv_max = 0;
  Schedule schedule;
  std::vector<SampleLengths> emitted;
  uint64_t first_step = 0;
  balance::BytesMoved moved;
  align::WindowState windows;
  uint64_t window_tokens = 0;  // the target in loss tokens, resolved on the first round's samples
  double window_ms = 0;
  // A round sees half the queue free (Daemon::RoundDue). A round whose steps
  // all went back (its accumulation window held open) queued nothing: the
  // trainer takes one more step off the queue before the next, which sees one
  // more slot (the simulator's odb policies do the same).
  uint32_t free_slots = o.queue / 2;
  for (int round = 0; round < o.rounds; ++round) {
    for (int r = 0; r < world; ++r) {
      while (pending[r].size() < o.window) pending[r].push_back(streams[r].Next());
    }
    // What the all-gather carries: every rank's encoded round message.
    std::vector<std::string> wire(world);
    uint64_t total_bytes = 0;
    for (int r = 0; r < world; ++r) {
      align::RankRoundMessage msg;
      msg.round = static_cast<uint64_t>(round);
      msg.rank = r;
      msg.data.pending = pending[r];
      msg.data.free_slots = free_slots;
      msg.data.stream_finished = false;
      wire[r] = align::EncodeRankRound(msg);
      total_bytes += wire[r].size();
    }
    for (int r = 0; r < world; ++r) {
      const double sent = static_cast<double>(wire[r].size());
      const double recv = static_cast<double>(total_bytes - wire[r].size());
      sent_sum += sent;
      recv_sum += recv;
      sent_max = std::max(sent_max, sent);
      recv_max = std::max(recv_max, recv);
    }
    // Rank 0 in a partitioned round: its block's messages and the other
    // blocks' summaries.
    {
      uint64_t block_bytes = 0;
      for (int r = 1; r < block; ++r) block_bytes += wire[r].size();
      block_recv_sum += static_cast<double>(block_bytes + kSummaryBytes * static_cast<uint64_t>(world - block));
    }
    // Rank 0's side of the round: decode all W messages into the state...
    align::RoundState state;
    state.epoch = 0;
    state.round = static_cast<uint64_t>(round);
    state.first_step = first_step;
    state.ranks.resize(world);
    double d0 = ThreadCpuMs();
    for (int r = 0; r < world; ++r) {
      if (r == block) {
        block_decode_ms.push_back(ThreadCpuMs() - d0);
        d0 -= block_decode_ms.back();  // keep timing the whole decode
      }
      auto msg = align::DecodeRankRound(wire[r]);
      if (!msg.ok()) {
        std::fprintf(stderr, "scale_bench: decode of rank %d: %s\n", r, msg.status().ToString().c_str());
        return 2;
      }
      state.ranks[r] = std::move(msg->data);
    }
    decode_ms.push_back(ThreadCpuMs() - d0);
    if (block == world) block_decode_ms.push_back(decode_ms.back());
    wire.clear();
    wire.shrink_to_fit();
    // ...then plan.
    const double p0 = ThreadCpuMs();
    align::RoundPlan plan = planner.Plan(state);
    plan_ms.push_back(ThreadCpuMs() - p0);
    if (block < world) {
      const double b0 = ThreadCpuMs();
      const align::RoundPlan mine = planner.PlanBlockOf(state, 0);
      block_plan_ms.push_back(ThreadCpuMs() - b0);
      if (mine.num_steps != plan.num_steps) {
        std::fprintf(stderr, "scale_bench: PlanBlockOf plans %u steps, Plan %u\n", mine.num_steps, plan.num_steps);
        return 2;
      }
    } else {
      block_plan_ms.push_back(plan_ms.back());
    }
    steps_per_round.push_back(plan.num_steps);
    if (o.window_parts) parts_before.Add(balance_config, plan, static_cast<size_t>(block));
    if (!window_target.off()) {
      if (window_tokens == 0) {
        std::vector<SampleLengths> first;
        for (const align::RankRound& rr : state.ranks) {
          for (const SampleMeta& m : rr.pending) first.push_back(m.lengths);
        }
        window_tokens = window_target.Tokens(first, world, pc.budget.max_tokens);
      }
      const double w0 = ThreadCpuMs();
      const absl::Status s =
          o.partitioned_windows
              ? ApplyRoundPartitionedWindows(window_tokens, planner, o.window_balance, state, plan, windows)
              : ApplyRoundWindows(window_tokens, planner, o.window_balance, state, plan, windows);
      window_ms += ThreadCpuMs() - w0;
      if (!s.ok()) {
        std::fprintf(stderr, "scale_bench: %s\n", s.ToString().c_str());
        return 2;
      }
    }
    if (o.window_parts) parts_after.Add(balance_config, plan, static_cast<size_t>(block));
    if (plan.ranks.size() != static_cast<size_t>(world)) {
      std::fprintf(stderr, "scale_bench: plan has %zu ranks, want %d\n", plan.ranks.size(), world);
      return 2;
    }
    if (!o.dump_plan.empty() && round + 1 == o.rounds && !DumpPlan(o.dump_plan, pc, o.lws, plan)) return 2;
    free_slots =
        steps_per_round.back() > 0 && plan.num_steps == 0 ? std::min(o.queue, free_slots + 1) : o.queue / 2;
    AppendRoundSteps(plan, world, &schedule, &emitted);
    first_step += plan.num_steps;
    moved += balance::ComputeBytesMoved(plan, o.lws);
    KeepPending(plan, &pending);
  }
  if (o.window_parts) {
    parts_before.Print("planned steps");
    parts_after.Print("micro-steps");
  }
  const long hwm = VmHwmKb();
  const Metrics metrics = Evaluate(schedule, sim, pc.budget.max_tokens, window_tokens);
  const Bounds bounds = LowerBounds(emitted, pc.budget, sim, world);
  const WindowBounds window_bounds = WindowedBounds(bounds, sim, metrics.windows, /*padded=*/true);
  double plan_total = 0, steps_total = 0, block_total = 0, block_decode_total = 0;
  for (size_t i = 0; i < plan_ms.size(); ++i) {
    plan_total += plan_ms[i];
    block_total += block_plan_ms[i];
    block_decode_total += block_decode_ms[i];
    steps_total += steps_per_round[i];
  }
  const double n_rounds = static_cast<double>(o.rounds);
  const double n_rank_rounds = n_rounds * world;
  std::printf(
      "{\"world\": %d, \"rounds\": %d, \"window\": %u, \"free_slots\": %u, \"local_world_size\": %u, "
      "\"preset\": \"%s\", \"plan_cpu_ms\": %s, \"decode_cpu_ms\": %s, \"steps\": %s, "
      "\"plan_cpu_ms_per_round\": %.4f, \"plan_cpu_ms_per_step\": %.4f, "
      "\"sent_bytes_per_round\": %.1f, \"recv_bytes_per_round\": %.1f, "
      "\"sent_bytes_per_round_max\": %.0f, \"recv_bytes_per_round_max\": %.0f, "
      "\"recv_bytes_per_step\": %.1f, \"emitted_samples\": %zu, \"sim_time\": %.1f, "
      "\"padded_bound\": %.1f, \"bound_fraction\": %.5f, \"max_over_mean\": %.5f, "
      "\"idle_rank_steps\": %llu, \"over_budget_rank_steps\": %llu, \"vmhwm_kb\": %ld, "
      "\"exact_assignment_max_world\": %u, \"moved_bytes_per_sample\": %.1f, "
      "\"inter_node_bytes_per_sample\": %.1f, \"partition_ranks\": %u, \"block_ranks\": %d, "
      "\"block_plan_cpu_ms\": %s, \"block_plan_cpu_ms_per_step\": %.4f, \"block_decode_cpu_ms_per_round\": "
      "%.4f, "
      "\"block_recv_bytes_per_step\": %.1f, \"window_target\": \"%s\", \"window_tokens\": %llu, "
      "\"window_cpu_ms_per_round\": %.4f, \"micro_steps\": %llu, \"sim_window_time\": %.1f, "
      "\"bound_fraction_window\": %.5f, \"idle_share\": %.5f, \"windows\": %llu, \"short_windows\": %llu, "
      "\"mean_window_over_target\": %.5f, \"max_window_over_target\": %.5f, \"of_window_bound\": %.5f, "
      "\"of_window_bound_window\": %.5f, \"partitioned_windows\": %s}\n",
      world, o.rounds, o.window, o.queue / 2, o.lws, o.preset.c_str(), Json(plan_ms).c_str(),
      Json(decode_ms).c_str(), Json(steps_per_round).c_str(), plan_total / n_rounds,
      steps_total > 0 ? plan_total / steps_total : 0.0, sent_sum / n_rank_rounds, recv_sum / n_rank_rounds,
      sent_max, recv_max, steps_total > 0 ? recv_sum / n_rank_rounds * n_rounds / steps_total : 0.0,
      emitted.size(), metrics.time, bounds.padded, metrics.time > 0 ? bounds.padded / metrics.time : 0.0,
      metrics.max_over_mean(), static_cast<unsigned long long>(metrics.idle_rank_steps),
      static_cast<unsigned long long>(metrics.over_budget_rank_steps), hwm, o.exact_max_world,
      moved.samples() ? static_cast<double>(moved.moved_bytes()) / static_cast<double>(moved.samples()) : 0.0,
      moved.samples() ? static_cast<double>(moved.inter_node_bytes) / static_cast<double>(moved.samples())
                      : 0.0,
      o.partition_ranks, block, Json(block_plan_ms).c_str(),
      steps_total > 0 ? block_total / steps_total : 0.0, block_decode_total / n_rounds,
      steps_total > 0 ? block_recv_sum / steps_total : 0.0, window_target.Spelling().c_str(),
      static_cast<unsigned long long>(window_tokens), window_ms / n_rounds,
      static_cast<unsigned long long>(metrics.steps), metrics.window_time,
      metrics.window_time > 0 ? bounds.padded / metrics.window_time : 0.0, metrics.idle_share(),
      static_cast<unsigned long long>(metrics.windows),
      static_cast<unsigned long long>(metrics.short_windows), metrics.mean_window_over_target,
      metrics.max_window_over_target, metrics.time > 0 ? window_bounds.synchronous / metrics.time : 0.0,
      metrics.window_time > 0 ? window_bounds.per_window / metrics.window_time : 0.0,
      o.partitioned_windows ? "true" : "false");
  return 0;
}

}  // namespace
}  // namespace odb::bench

int main(int argc, char** argv) {
  odb::bench::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "scale_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--world") {
      o.world = std::atoi(value().c_str());
    } else if (a == "--rounds") {
      o.rounds = std::atoi(value().c_str());
    } else if (a == "--window") {
      o.window = static_cast<uint32_t>(std::atoi(value().c_str()));
    } else if (a == "--queue") {
      o.queue = static_cast<uint32_t>(std::atoi(value().c_str()));
    } else if (a == "--lws") {
      o.lws = static_cast<uint32_t>(std::atoi(value().c_str()));
    } else if (a == "--preset") {
      o.preset = value();
    } else if (a == "--exact-max-world") {
      o.exact_max_world = static_cast<uint32_t>(std::atoi(value().c_str()));
    } else if (a == "--partition-ranks") {
      o.partition_ranks = static_cast<uint32_t>(std::atoi(value().c_str()));
    } else if (a == "--dump-plan") {
      o.dump_plan = value();
    } else if (a == "--window-tokens") {
      o.window_tokens = value();
    } else if (a == "--no-window-balance") {
      o.window_balance = false;
    } else if (a == "--window-spread") {
      o.window_spread = std::strtod(value().c_str(), nullptr);
    } else if (a == "--partitioned-windows") {
      o.partitioned_windows = true;
    } else if (a == "--window-parts") {
      o.window_parts = true;
    } else if (a == "--window-parts-steps") {
      o.window_parts = o.window_parts_steps = true;
    } else if (a == "--seed") {
      o.seed = std::strtoull(value().c_str(), nullptr, 10);
    } else {
      std::fprintf(
          stderr,
          "usage: scale_bench [--world W] [--rounds R] [--window N] [--queue Q] [--lws L] "
          "[--preset NAME] [--seed S] [--exact-max-world M] [--partition-ranks P] [--dump-plan FILE] "
          "[--window-tokens T|Ns|Nm] [--no-window-balance] [--window-spread S] [--partitioned-windows] "
          "[--window-parts] [--window-parts-steps]\n");
      return 2;
    }
  }
  if (o.world < 1 || o.rounds < 1 || o.window < 1 || o.queue < 2 || !odb::bench::IsPreset(o.preset)) {
    std::fprintf(stderr,
                 "scale_bench: need world >= 1, rounds >= 1, window >= 1, queue >= 2, a known preset\n");
    return 2;
  }
  if (o.partitioned_windows && o.partition_ranks == 0) {
    std::fprintf(stderr, "scale_bench: --partitioned-windows needs --partition-ranks\n");
    return 2;
  }
  const auto target = odb::bench::ParseWindowTarget(o.window_tokens);
  if (!target.ok()) {
    std::fprintf(stderr, "scale_bench: --window-tokens: %s\n",
                 std::string(target.status().message()).c_str());
    return 2;
  }
  return odb::bench::Run(o, *target);
}
