// The daemon's partitioned round measured through the real Aligner (issue 22):
// rank 0 runs align::Aligner with the partitioned balance::GlobalPlanner over
// a FakeWorld of W in-process ranks, exactly as odbd does over Gloo (summary
// all-gather, block all-gather on a Split group, every rank's token totals). The
// other W - 1 ranks play the protocol with the same wire messages but do not
// plan (on this 2-core machine W real planners would cost W x rank 0's CPU):
// rank 0's block-mates send their real metadata in the block all-gather;
// every rank sends its real summary; the other ranks send token totals of
// the round's T steps (placeholders of a step's magnitude: they only scale
// rank 0's weights, and their size as varints is what counts).
// Every rank tops its pending list up to the window before each round (a
// producer at least as fast as the trainer); what rank 0's block plans
// leaves its block's lists. Setting as bench/scale_bench.cc: window 512,
// queue 32 (16 free slots, full rounds), padded L_max 4096, a = 512, b = 1,
// local_world_size 8, locality 0.
//
//   bazel run -c opt //bench:scale_aligner_bench -- --world 2560 --partition-ranks 256 --rounds 4
//
// With --window-tokens N (optimizer.tokens_per_step, accumulation windows
// under partitioned planning: src/align/window_partitioned.h) every rank
// also sends its window-end offers: rank 0 from its real steps, the others
// from synthetic steps of the placeholders' size (samples of 300 tokens),
// each tracking the window state as every daemon does, and their ends take
// the tolerance of optimizer.window_spread (--window-spread S, default the
// daemon's 1; 0: the fixed nominal ends) from the world-wide counts, as the
// daemons do. The JSON then adds
// the closed windows' mean and largest size over the target, counted on rank
// 0's steps, and the micro-steps per round (windows split steps).
//
// Prints one JSON object: rank 0's thread CPU per round of Aligner::RunRound
// (encode, decode, gates, PlanBlock, weights) and per planned step, the bytes
// its collectives delivered to it per round and per planned step
// (Aligner::last_round_received_bytes, cross-checked with FakeWorld's count).
#include <time.h>

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench/policies.h"
#include "bench/trace.h"
#include "src/align/aligner.h"
#include "src/align/fake_peer_group.h"
#include "src/align/meta_codec.h"
#include "src/align/window_partitioned.h"
#include "src/balance/global_planner.h"

namespace odb::bench {
namespace {

double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

struct Options {
  int world = 256;
  int rounds = 4;
  uint32_t window = 512;
  uint32_t queue = 32;
  uint32_t lws = 8;
  uint32_t partition_ranks = 256;
  std::string preset = "chat_longtail";
  uint64_t seed = 1;
  uint64_t window_tokens = 0;  // optimizer.tokens_per_step; 0: no windows
  double window_spread = align::PlannerConfig{}.window_spread;  // optimizer.window_spread
};

// A non-planning rank's steps for the window-end offers: each step's
// placeholder real tokens as samples of 300 tokens, every token bearing loss.
std::vector<align::PlannedStep> SyntheticSteps(const std::vector<uint64_t>& real) {
  std::vector<align::PlannedStep> steps(real.size());
  for (size_t k = 0; k < real.size(); ++k) {
    for (uint64_t left = real[k]; left > 0;) {
      SampleMeta m;
      m.lengths.tokens = static_cast<uint32_t>(std::min<uint64_t>(left, 300));
      left -= m.lengths.tokens;
      steps[k].samples.push_back(m);
    }
    steps[k].idle = steps[k].samples.empty();
  }
  return steps;
}

// One rank's endless stream (the same per rank at every W, as scale_bench).
class RankStream {
 public:
  RankStream(const Options& o, int rank) : o_(&o), rank_(rank) {}
  SampleMeta Next() {
    if (pos_ == chunk_.size()) {
      auto t = GenerateTrace(o_->preset, o_->window, 4096,
                             align::MixSeed(align::MixSeed(o_->seed, static_cast<uint64_t>(rank_)), chunks_++));
      if (!t.ok()) {
        std::fprintf(stderr, "scale_aligner_bench: %s\n", t.status().ToString().c_str());
        std::exit(2);
      }
      chunk_ = std::move(t->samples);
      pos_ = 0;
    }
    SampleMeta m;
    m.id = next_id_++;
    m.owner_rank = rank_;
    m.lengths = chunk_[pos_++];
    m.payload_bytes = 4ull * m.lengths.tokens;
    return m;
  }

 private:
  const Options* o_;
  int rank_;
  uint64_t chunks_ = 0, next_id_ = 0;
  std::vector<SampleLengths> chunk_;
  size_t pos_ = 0;
};

int Run(const Options& o) {
  const int world = o.world;
  StepModel sim;
  align::PlannerConfig pc;
  pc.budget.model = grouping::CostModel::kPadded;
  pc.budget.max_tokens = 4096;
  pc.step_model = sim.PlannerModel();
  pc.mode = align::EpochMode::kJoin;
  pc.window = o.window;
  pc.min_free_slots = std::max<uint32_t>(1, o.queue / 2);  // as the daemon (PlannerConfigFrom)
  pc.full_rounds = true;
  pc.tokens_per_step = o.window_tokens;
  pc.window_spread = o.window_spread;
  balance::GlobalPlannerConfig g;
  g.base = pc;
  g.local_world_size = o.lws;
  g.partition_ranks = o.partition_ranks;
  const balance::GlobalPlanner frame_planner(g);
  const int block = static_cast<int>(frame_planner.BlockRanks(static_cast<size_t>(world)));
  if (block >= world) {
    std::fprintf(stderr, "scale_aligner_bench: one block (partition_ranks %u, W %d): nothing partitioned\n",
                 o.partition_ranks, world);
    return 2;
  }

  align::FakeWorld fake(world, std::chrono::minutes(30));
  std::vector<RankStream> streams;
  streams.reserve(world);
  for (int r = 0; r < world; ++r) streams.emplace_back(o, r);
  // Pending lists of rank 0's block (they change); the other ranks keep a
  // full window and send the same summary every round.
  std::vector<std::vector<SampleMeta>> pending(block);
  std::vector<align::RankSummary> far(world);
  for (int r = block; r < world; ++r) {
    align::RankRound rr;
    for (uint32_t i = 0; i < o.window; ++i) rr.pending.push_back(streams[r].Next());
    rr.free_slots = o.queue;
    far[r] = align::SummaryOf(rr, frame_planner.GroupBound(rr));
  }
  align::Aligner aligner(fake.Rank(0), std::make_unique<balance::GlobalPlanner>(g));
  if (!aligner.StartEpoch(0).ok()) return 2;

  std::vector<double> cpu_ms, steps, recv;
  std::vector<double> planned(static_cast<size_t>(o.rounds), 0.0);  // T per round (before window splits)
  std::vector<double> windows;  // closed windows / target (rank 0's steps)
  // The non-planning ranks' window cut and state (--window-tokens), kept by
  // the last rank for all of them (see there).
  std::optional<align::PartitionedWindows> shared_cut;
  align::WindowState shared_windows;
  std::barrier far_sync(world - 1);
  std::barrier sync(world);
  std::vector<std::thread> threads;
  std::atomic<bool> failed{false};
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      align::PeerGroup* peers = fake.Rank(r);
      std::unique_ptr<align::PeerGroup> block_peers;
      for (int round = 0; round < o.rounds; ++round) {
        if (r < block) {
          while (pending[r].size() < o.window) pending[r].push_back(streams[r].Next());
        }
        sync.arrive_and_wait();  // lists ready
        if (r == 0) {
          align::RoundInput in;
          in.pending = pending[0];
          in.free_slots = o.queue;
          const double t0 = ThreadCpuMs();
          auto res = aligner.RunRound(in);
          const double t1 = ThreadCpuMs();
          if (!res.ok()) {
            std::fprintf(stderr, "scale_aligner_bench: rank 0: %s\n", res.status().ToString().c_str());
            failed = true;
            std::exit(1);
          }
          cpu_ms.push_back(t1 - t0);
          steps.push_back(static_cast<double>(res->steps.size()));
          for (const align::PlannedStep& st : res->steps) {
            if (st.closes_window && !st.window_short && o.window_tokens > 0) {
              windows.push_back(static_cast<double>(st.window_loss_tokens) /
                                static_cast<double>(o.window_tokens));
            }
          }
          recv.push_back(static_cast<double>(aligner.last_round_received_bytes()));
        } else {
          // A rank that plays the protocol without planning.
          const bool mine = r < block;
          align::RankRoundMessage msg;
          msg.round = static_cast<uint64_t>(round);
          msg.rank = r;
          if (mine) {
            msg.data.pending = pending[r];
            msg.data.free_slots = o.queue;
          }
          const align::RankSummary summary =
              mine ? align::SummaryOf(msg.data, frame_planner.GroupBound(msg.data)) : far[r];
          if (!block_peers) block_peers = std::move(*peers->Split(r / block));
          auto gathered = peers->AllGather(align::EncodeRoundSummary(0, msg.round, r, summary));
          if (!gathered.ok()) std::exit(1);
          align::BlockRoundState bs;
          bs.begin = r / block * block;
          bs.round = msg.round;
          bs.summaries.resize(world);
          for (int q = 0; q < world; ++q) {
            uint32_t e = 0;
            uint64_t n = 0;
            int32_t from = 0;
            auto s = align::DecodeRoundSummary((*gathered)[q], e, n, from);
            if (!s.ok()) std::exit(1);
            bs.summaries[q] = *s;
          }
          uint32_t min_free = 0;
          if (align::ApplyRoundGates(pc, bs.summaries, min_free)) continue;
          if (mine) {
            auto b = block_peers->AllGather(align::EncodeRankRound(msg));
            if (!b.ok()) std::exit(1);
          }
          const align::RoundPlan frame = frame_planner.PlanBlock(bs);  // no block ranks: T only
          const uint32_t t = frame.num_steps;
          if (t > 0) {
            // Placeholders of a real step's magnitude (a few thousand tokens
            // of an L_max 4096 budget): the totals are varints, so their
            // values size them.
            std::vector<uint64_t> loss(t), real(t);
            for (uint32_t k = 0; k < t; ++k) {
              real[k] = 3000 + (static_cast<uint64_t>(r) * 31 + k * 17) % 1000;
              // With windows, every token bears loss (as rank 0's samples):
              // the offers cut these placeholders.
              loss[k] = o.window_tokens > 0 ? real[k] : real[k] / 2;
            }
            // The steps the placeholders stand for (samples of 300 tokens),
            // before the windowed entry below joins `real`.
            const std::vector<align::PlannedStep> synthetic = SyntheticSteps(real);
            if (o.window_tokens > 0) {
              // With windows, the count of samples in the rank's steps and,
              // with window_spread, the sum of their squared loss tokens, as
              // Aligner::PartitionedRound sends.
              uint64_t n = 0;
              for (const align::PlannedStep& st : synthetic) n += st.samples.size();
              loss.push_back(n);
              real.push_back(pc.window_spread > 0.0 ? align::SquaredLossTokens(synthetic) : 0);
            }
            auto tot = peers->AllGather(align::EncodeRankTotals(0, msg.round, r, loss, real));
            if (!tot.ok()) std::exit(1);
            if (r == world - 1) planned[static_cast<size_t>(round)] = t;
            if (o.window_tokens > 0) {
              // The window ends, as Aligner::PartitionedWindowRound plays
              // them. Every daemon decodes every rank's totals and offers; here
              // the last rank does it once for all the non-planning ranks
              // (W threads each decoding W messages would cost W^2 of this
              // machine's CPU) and shares the cut and the window state.
              if (r == world - 1) {
                std::vector<uint64_t> loss_total(t, 0), real_total(t, 0);
                uint64_t samples = 0, loss_sum = 0, loss_sq = 0;
                for (const std::string& g : *tot) {
                  auto d = align::DecodeRankTotals(g);
                  if (!d.ok()) std::exit(1);
                  for (uint32_t k = 0; k < t; ++k) {
                    loss_total[k] += d->loss[k];
                    real_total[k] += d->real[k];
                    loss_sum += d->loss[k];
                  }
                  samples += d->loss[t];
                  loss_sq = align::SaturatingAdd(loss_sq, d->real[t]);
                }
                // The tol the daemons take (Aligner::PartitionedWindowRound).
                const uint64_t tol =
                    align::SpreadTolerance(samples, loss_sum, loss_sq, o.window_tokens, pc.window_spread);
                shared_cut.emplace(o.window_tokens, loss_total, real_total, static_cast<size_t>(world), tol);
              }
              far_sync.arrive_and_wait();
              const align::PartitionedWindows& cut = *shared_cut;
              std::vector<std::vector<align::CutOffer>> offers(static_cast<size_t>(world));
              if (cut.inside_ends() > 0) {
                std::vector<uint64_t> a, b;
                for (const align::CutOffer& c : cut.Offers(synthetic)) {
                  a.insert(a.end(), {c.loss, c.next_loss});
                  b.insert(b.end(), {c.real, c.next_real});
                }
                // The merge bits (window_partitioned.h, "Merged parts"): a
                // placeholder rank has no block plan to judge; it says 1 for
                // every candidate (rank 0's block decides; the widest
                // varints, so the bytes are not undercounted).
                align::AppendMergeBits(std::vector<uint8_t>(cut.merge_candidates(), 1), a, b);
                auto ends = peers->AllGather(align::EncodeRankTotals(0, msg.round, r, a, b));
                if (!ends.ok()) std::exit(1);
                if (r == world - 1) {
                  for (int q = 0; q < world; ++q) {
                    auto d = align::DecodeRankTotals((*ends)[q]);
                    if (!d.ok()) std::exit(1);
                    offers[q].resize(cut.inside_ends());
                    for (size_t i = 0; i < cut.inside_ends(); ++i) {
                      offers[q][i] = align::CutOffer{d->loss[2 * i], d->real[2 * i], d->loss[2 * i + 1],
                                                     d->real[2 * i + 1]};
                    }
                  }
                }
              }
              if (r == world - 1) {
                std::vector<std::vector<uint8_t>> fits;
                if (cut.inside_ends() > 0)
                  fits.assign(static_cast<size_t>(world), std::vector<uint8_t>(cut.merge_candidates(), 1));
                if (!shared_cut->Decide(offers, fits).ok()) std::exit(1);
                bool inputs_open = false;
                for (const align::RankSummary& q : bs.summaries) {
                  inputs_open =
                      inputs_open || (!q.stream_finished && !q.input_blocked && q.pending < pc.window);
                }
                align::RoundPlan none;  // no block here: the window state only
                none.ranks.resize(static_cast<size_t>(world));
                std::vector<uint64_t> global_real;
                shared_cut->Apply(none, 0, 0, pc.budget.model, shared_windows, inputs_open, false,
                                  global_real);
              }
            }
          }
        }
        sync.arrive_and_wait();  // round done: rank 0's block plan is final
        if (r < block && r != 0) {
          // What rank 0's block planned (emitted, or kept pending but past
          // the window) leaves or stays: keep what the plan kept.
          const align::RoundPlan& plan = aligner.last_plan();
          std::set<uint64_t> keep;
          for (const align::SampleKey& k : plan.ranks[r].keep_pending) keep.insert(k.id);
          if (plan.num_steps > 0) std::erase_if(pending[r], [&](const SampleMeta& m) { return !keep.count(m.id); });
        } else if (r == 0) {
          const align::RoundPlan& plan = aligner.last_plan();
          std::set<uint64_t> keep;
          for (const align::SampleKey& k : plan.ranks[0].keep_pending) keep.insert(k.id);
          if (plan.num_steps > 0) std::erase_if(pending[0], [&](const SampleMeta& m) { return !keep.count(m.id); });
        }
        sync.arrive_and_wait();  // lists updated
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failed) return 1;
  double cpu = 0, st = 0, by = 0, t = 0;
  for (size_t i = 0; i < cpu_ms.size(); ++i) {
    cpu += cpu_ms[i];
    st += steps[i];
    by += recv[i];
    t += planned[i];
  }
  const double rounds = static_cast<double>(cpu_ms.size());
  // Per planned step: the planner's T (with windows, a round emits more
  // micro-steps than that: steps split at window ends).
  std::printf(
      "{\"world\": %d, \"partition_ranks\": %u, \"block_ranks\": %d, \"rounds\": %d, \"window\": %u, "
      "\"steps_per_round\": %.2f, \"aligner_cpu_ms_per_round\": %.2f, \"aligner_cpu_ms_per_step\": %.3f, "
      "\"recv_bytes_per_round\": %.0f, \"recv_bytes_per_step\": %.0f, \"fake_world_recv_bytes\": %llu",
      world, o.partition_ranks, block, o.rounds, o.window, t / rounds, cpu / rounds, t > 0 ? cpu / t : 0.0,
      by / rounds, t > 0 ? by / t : 0.0, static_cast<unsigned long long>(fake.ReceivedBytes(0)));
  if (o.window_tokens > 0) {
    double sum = 0, worst = 0;
    for (double w : windows) {
      sum += w;
      worst = std::max(worst, w);
    }
    std::printf(
        ", \"window_tokens\": %llu, \"micro_steps_per_round\": %.2f, \"windows\": %zu, "
        "\"mean_window_over_target\": %.5f, \"max_window_over_target\": %.5f",
        static_cast<unsigned long long>(o.window_tokens), st / rounds, windows.size(),
        windows.empty() ? 0.0 : sum / static_cast<double>(windows.size()), worst);
  }
  std::printf("}\n");
  return 0;
}

}  // namespace
}  // namespace odb::bench

int main(int argc, char** argv) {
  odb::bench::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "scale_aligner_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--world") {
      o.world = std::atoi(value().c_str());
    } else if (a == "--rounds") {
      o.rounds = std::atoi(value().c_str());
    } else if (a == "--partition-ranks") {
      o.partition_ranks = static_cast<uint32_t>(std::atoi(value().c_str()));
    } else if (a == "--window") {
      o.window = static_cast<uint32_t>(std::atoi(value().c_str()));
    } else if (a == "--lws") {
      o.lws = static_cast<uint32_t>(std::atoi(value().c_str()));
    } else if (a == "--window-tokens") {
      o.window_tokens = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--window-spread") {
      o.window_spread = std::strtod(value().c_str(), nullptr);
    } else {
      std::fprintf(
          stderr,
          "usage: scale_aligner_bench [--world W] [--rounds N] [--partition-ranks P] [--window N] [--lws N]"
          " [--window-tokens N] [--window-spread S]\n");
      return 2;
    }
  }
  if (o.world < 2 || o.rounds < 1) {
    std::fprintf(stderr, "scale_aligner_bench: --world >= 2 and --rounds >= 1\n");
    return 2;
  }
  return odb::bench::Run(o);
}
