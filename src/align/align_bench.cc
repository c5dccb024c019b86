// Alignment round latency on loopback, next to raw Gloo all-gathers of the
// same size in the same run, and the steps/s the aligner sustains.
//   bazel run -c opt //src/align:align_bench -- [rounds]
#include <gloo/allgather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "src/align/aligner.h"
#include "src/align/gloo_peer_group.h"
#include "src/align/meta_codec.h"
#include "src/align/planner.h"

namespace odb::align {
namespace {

using Clock = std::chrono::steady_clock;

struct RankStats {
  std::vector<double> round_us;
  std::vector<double> gather_us;
  std::vector<double> raw_us;
  uint64_t steps = 0;
  double seconds = 0;
  size_t msg_bytes = 0;
  std::string error;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

void RunRank(int rank, int world, const std::string& dir, int rounds, RankStats& st) {
  PlannerConfig cfg;
  cfg.max_wait_rounds = 0;
  cfg.window = 256;
  GlooPeerGroupOptions o;
  o.rank = rank;
  o.world_size = world;
  o.job_id = "bench" + std::to_string(world);
  o.file_store_dir = dir;
  o.hostname = "127.0.0.1";
  LocalPlanner probe(cfg);
  o.hello = AlignmentHelloFields(probe, world);
  auto g = GlooPeerGroup::Connect(o);
  if (!g.ok()) {
    st.error = g.status().ToString();
    return;
  }
  Aligner aligner(g->get(), std::make_unique<LocalPlanner>(cfg));
  (void)aligner.StartEpoch(0);
  uint64_t next_id = 0;
  uint64_t lcg = 12345 + rank;
  std::vector<SampleMeta> pending;
  auto refill = [&] {
    while (pending.size() < 256) {
      lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
      SampleMeta m;
      m.id = next_id++;
      m.owner_rank = rank;
      m.lengths.tokens = static_cast<uint32_t>(16 + (lcg >> 33) % 2000);
      m.payload_bytes = m.lengths.tokens * 4;
      pending.push_back(m);
    }
  };
  refill();
  {
    RankRoundMessage msg{0, 0, rank, RankRound{pending, 64, false, 0, false}};
    // Every rank must use the same size for the fixed-size raw all-gather.
    auto all = (*g)->AllGather(EncodeRankRound(msg));
    if (!all.ok()) {
      st.error = all.status().ToString();
      return;
    }
    for (const std::string& b : *all) st.msg_bytes = std::max(st.msg_bytes, b.size());
  }
  const auto t0 = Clock::now();
  for (int i = 0; i < rounds; ++i) {
    const auto a = Clock::now();
    auto res = aligner.RunRound(RoundInput{0, pending, 64, false});
    st.round_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
    if (!res.ok()) {
      st.error = res.status().ToString();
      return;
    }
    st.steps += res->steps.size();
    std::vector<SampleMeta> kept;
    size_t k = 0;
    for (const SampleMeta& m : pending) {
      if (k < res->keep_pending.size() && res->keep_pending[k].id == m.id) {
        kept.push_back(m);
        ++k;
      }
    }
    pending = std::move(kept);
    refill();
  }
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // The same bytes through the peer group alone (sizes + allgatherv).
  const std::string same(st.msg_bytes, 'x');
  for (int i = 0; i < rounds; ++i) {
    const auto a = Clock::now();
    if (!(*g)->AllGather(same).ok()) return;
    st.gather_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
  }
  // Raw Gloo: one fixed-size gloo::allgather of the same size on its own context.
  gloo::rendezvous::FileStore fs(dir);
  std::filesystem::create_directories(std::filesystem::path(dir) / ("raw" + std::to_string(world)));
  gloo::rendezvous::PrefixStore ps("raw" + std::to_string(world), fs);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
  ctx->connectFullMesh(ps, dev);
  std::vector<char> in(st.msg_bytes, 'y'), out(st.msg_bytes * world);
  for (int i = 0; i < rounds; ++i) {
    const auto a = Clock::now();
    gloo::AllgatherOptions opts(ctx);
    opts.setInput(in.data(), in.size());
    opts.setOutput(out.data(), out.size());
    opts.setTag(7);
    gloo::allgather(opts);
    st.raw_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
  }
}

}  // namespace
}  // namespace odb::align

int main(int argc, char** argv) {
  using namespace odb::align;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 300;
  std::printf("align_bench: %d rounds per W, 256 pending samples per rank (window 256), padded budget 4096, "
              "loopback TCP, ranks as threads in one process (%u hw threads)\n",
              rounds, std::thread::hardware_concurrency());
  std::printf("%3s %8s | %12s %12s | %14s %14s | %13s %10s\n", "W", "msg B", "round p50 us", "round p99 us",
              "pg gather p50", "raw gloo p50", "steps/s/rank", "rounds/s");
  for (int world : {2, 4, 8}) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "odb_align_bench_XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return 1;
    std::vector<RankStats> stats(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) threads.emplace_back(RunRank, r, world, tmpl, rounds, std::ref(stats[r]));
    for (auto& t : threads) t.join();
    std::filesystem::remove_all(tmpl);
    for (const auto& s : stats) {
      if (!s.error.empty()) {
        std::printf("W=%d error: %s\n", world, s.error.c_str());
        return 1;
      }
    }
    const RankStats& s = stats[0];
    std::printf("%3d %8zu | %12.0f %12.0f | %14.0f %14.0f | %13.0f %10.0f\n", world, s.msg_bytes,
                Percentile(s.round_us, 0.5), Percentile(s.round_us, 0.99), Percentile(s.gather_us, 0.5),
                Percentile(s.raw_us, 0.5), s.steps / s.seconds, rounds / s.seconds);
  }
  return 0;
}
