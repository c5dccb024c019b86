// real_rounds_gloo: the baseline for bench/real_rounds.py. One process is one
// rank (started W times, each in its own network namespace, as the odbd
// daemons of the same run are): a raw fixed-size gloo::allgather on a
// dedicated context, TCP transport, FileStore rendezvous on a shared
// directory; and, as a second variant, the two collectives odb's peer group
// runs for one all-gather (src/align/gloo_peer_group.cc: an all-gather of the
// int64 sizes, then gloo::allgatherv), on the same context and bytes, so that
// a gap between a round and the raw all-gather can be placed; and, as a third
// variant ("bruck"), a raw logarithmic all-gather of the same bytes (Bruck's
// algorithm on Gloo's point-to-point unbound buffers: ceil(log2 W) rounds of
// one send and one receive, the algorithm the peer group runs from 3 ranks
// up), the fastest raw all-gather this harness has.
// Prints one JSON line per message size and variant with this rank's
// per-iteration times, so the harness compares the daemons' alignment round
// with the collective alone over the same links, netem included.
//
//   real_rounds_gloo gather --rank R --world W --store DIR --hostname ADDR
//       --bytes 1024,65536 [--iters 30] [--warmup 5]
//       [--block P --summary-bytes S --totals-bytes N]
//     with --block, also the raw form of a partitioned round (the daemon's
//     alignment.partition_ranks, src/align/aligner.cc PartitionedRound): per
//     iteration a world-wide all-gather of S bytes per rank, an all-gather of
//     the first --bytes size within this rank's block of P consecutive ranks
//     (its own Gloo context, as PeerGroup::Split makes one), and a world-wide
//     all-gather of N bytes per rank; one line, variant "partitioned", with
//     the sequence's time and each collective's (Gloo's rings), and one,
//     variant "partitioned_bruck", with the same sequence of Bruck
//     all-gathers.
//   real_rounds_gloo codec --samples N --max-tokens T
//     prints the bytes one rank's round message (src/align/meta_codec) has
//     with N pending samples of up to T tokens: the size the daemons gather.
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "src/align/meta_codec.h"

namespace {

using Clock = std::chrono::steady_clock;

const char* Arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  if (fallback == nullptr) {
    std::fprintf(stderr, "real_rounds_gloo: %s is required\n", name);
    std::exit(2);
  }
  return fallback;
}

std::vector<size_t> Sizes(const std::string& list) {
  std::vector<size_t> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    const long long v = std::atoll(list.substr(start, end - start).c_str());
    if (v <= 0) {
      std::fprintf(stderr, "real_rounds_gloo: --bytes wants positive sizes, got \"%s\"\n", list.c_str());
      std::exit(2);
    }
    out.push_back(static_cast<size_t>(v));
    start = end + 1;
  }
  return out;
}

int Codec(int argc, char** argv) {
  const int samples = std::atoi(Arg(argc, argv, "--samples", nullptr));
  const int max_tokens = std::atoi(Arg(argc, argv, "--max-tokens", nullptr));
  if (samples < 0 || max_tokens < 1) {
    std::fprintf(stderr, "real_rounds_gloo codec: --samples >= 0 and --max-tokens >= 1\n");
    return 2;
  }
  // Ids and lengths as odb_synth's producers make them (consecutive ids from
  // rank * 1e6, lengths up to max_tokens): the encoding is varint, so the
  // size depends on the values' magnitudes, not only on the count.
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int> len(1, max_tokens);
  odb::align::RankRoundMessage msg;
  msg.epoch = 1;
  msg.round = 1000;
  msg.rank = 31;
  msg.data.free_slots = 8;
  for (int i = 0; i < samples; ++i) {
    odb::SampleMeta m;
    m.id = 31'000'000ull + static_cast<uint64_t>(i);
    m.owner_rank = 31;
    m.lengths.tokens = static_cast<uint32_t>(len(rng));
    m.payload_bytes = 4ull * m.lengths.tokens + 64;
    msg.data.pending.push_back(m);
  }
  std::printf("{\"samples\": %d, \"max_tokens\": %d, \"bytes\": %zu}\n", samples, max_tokens,
              odb::align::EncodeRankRound(msg).size());
  return 0;
}

// Bruck's all-gather of `bytes` per rank from `in` into `out` (rank order):
// in round k (d = 2^k < W) a rank sends the min(d, W - d) blocks it holds to
// rank - d and receives as many from rank + d; every receive is posted first,
// each send waits for the receive it forwards. Raw: no size header, no slot.
void BruckGather(const std::shared_ptr<gloo::Context>& ctx, const char* in, size_t bytes, char* out, uint32_t tag) {
  const int n = ctx->size;
  const int me = ctx->rank;
  std::vector<char> held(bytes * static_cast<size_t>(n));
  std::memcpy(held.data(), in, bytes);
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends, recvs;
  std::vector<int> dist;
  for (int d = 1; d < n; d *= 2) dist.push_back(d);
  const auto slot = [&](size_t k) { return gloo::Slot::build(0x4d, tag) + static_cast<uint8_t>(k); };
  for (size_t k = 0; k < dist.size(); ++k) {
    const int d = dist[k];
    const size_t count = static_cast<size_t>(std::min(d, n - d));
    recvs.push_back(ctx->createUnboundBuffer(held.data() + bytes * static_cast<size_t>(d), bytes * count));
    recvs.back()->recv((me + d) % n, slot(k));
  }
  for (size_t k = 0; k < dist.size(); ++k) {
    const int d = dist[k];
    if (k > 0) recvs[k - 1]->waitRecv();
    const size_t count = static_cast<size_t>(std::min(d, n - d));
    sends.push_back(ctx->createUnboundBuffer(held.data(), bytes * count));
    sends.back()->send((me - d + n) % n, slot(k));
  }
  if (!recvs.empty()) recvs.back()->waitRecv();
  for (auto& s : sends) s->waitSend();
  for (int i = 0; i < n; ++i) {
    std::memcpy(out + bytes * static_cast<size_t>((me + i) % n), held.data() + bytes * static_cast<size_t>(i), bytes);
  }
}

// The same bytes per rank from every rank of `ctx` (Gloo's ring, or Bruck's
// all-gather with `log`), checked: block r of the output must hold rank r's byte.
// One fixed-size all-gather of `in` into `out`: Bruck's (log) or Gloo's ring.
void FixedGather(const std::shared_ptr<gloo::Context>& ctx, std::vector<char>& in, std::vector<char>& out,
                 bool log, uint32_t& tag) {
  if (log) {
    BruckGather(ctx, in.data(), in.size(), out.data(), tag++);
  } else {
    gloo::AllgatherOptions opts(ctx);
    opts.setInput(in.data(), in.size());
    opts.setOutput(out.data(), out.size());
    opts.setTag(tag++);
    gloo::allgather(opts);
  }
}

bool TimedGather(const std::shared_ptr<gloo::Context>& ctx, size_t bytes, uint32_t& tag, double& took_us,
                 bool log = false) {
  const int size = ctx->size;
  std::vector<char> in(bytes, static_cast<char>(ctx->rank)), out(bytes * static_cast<size_t>(size));
  const auto t0 = Clock::now();
  FixedGather(ctx, in, out, log, tag);
  took_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  for (int r = 0; r < size; ++r) {
    if (out[static_cast<size_t>(r) * bytes] != static_cast<char>(r)) return false;
  }
  return true;
}

// Wall-clock now, in ns: comparable across the ranks' processes (the
// benchmark times each collective from the last rank's entry).
long long WallNs() {
  return static_cast<long long>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

// `, "entry_ns": [...], "exit_ns": [...]` for a JSON line.
std::string Stamps(const std::vector<long long>& entry_ns, const std::vector<long long>& exit_ns) {
  std::string stamps;
  for (const auto* v : {&entry_ns, &exit_ns}) {
    stamps += v == &entry_ns ? ", \"entry_ns\": [" : "], \"exit_ns\": [";
    for (size_t k = 0; k < v->size(); ++k) stamps += (k ? "," : "") + std::to_string((*v)[k]);
  }
  return stamps + "]";
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Partitioned(const std::shared_ptr<gloo::rendezvous::Context>& world_ctx,
                std::shared_ptr<gloo::transport::Device> dev, gloo::rendezvous::Store& fs, int rank,
                int world, int block, size_t summary, size_t msg, size_t totals, int iters, int warmup,
                uint32_t tag) {
  // Blocks of `block` consecutive ranks, the last one possibly shorter (as
  // the aligner cuts them).
  const int begin = rank / block * block;
  const int end = std::min(world, begin + block);
  gloo::rendezvous::PrefixStore ps("block" + std::to_string(begin), fs);
  auto block_ctx = std::make_shared<gloo::rendezvous::Context>(rank - begin, end - begin);
  block_ctx->setTimeout(std::chrono::seconds(120));
  block_ctx->connectFullMesh(ps, dev);
  uint32_t block_tag = 1;
  for (const bool log : {false, true}) {
  std::vector<double> total_us, summary_us, block_us, totals_us;
  std::vector<long long> entry_ns, exit_ns;  // of each timed sequence, as the daemons' round_trace has
  for (int i = 0; i < warmup + iters; ++i) {
    gloo::BarrierOptions b(world_ctx);
    b.setTag(tag++);
    gloo::barrier(b);
    const auto t0 = Clock::now();
    const long long entered = WallNs();
    double a = 0, m = 0, t = 0;
    bool ok = TimedGather(world_ctx, summary, tag, a, log);
    ok = ok && (end - begin < 2 || TimedGather(block_ctx, msg, block_tag, m, log));
    ok = ok && TimedGather(world_ctx, totals, tag, t, log);
    if (!ok) {
      std::fprintf(stderr, "rank %d: a partitioned all-gather delivered wrong bytes\n", rank);
      return 1;
    }
    const double took = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (i >= warmup) {
      total_us.push_back(took);
      summary_us.push_back(a);
      block_us.push_back(m);
      totals_us.push_back(t);
      entry_ns.push_back(entered);
      exit_ns.push_back(WallNs());
    }
  }
  std::printf(
      "{\"rank\": %d, \"world\": %d, \"bytes\": %zu, \"variant\": \"%s\", \"block\": %d, "
      "\"block_size\": %d, \"summary_bytes\": %zu, \"totals_bytes\": %zu, \"iters\": %d, "
      "\"p50_us\": %.1f, \"summary_p50_us\": %.1f, \"block_p50_us\": %.1f, \"totals_p50_us\": %.1f%s}\n",
      rank, world, msg, log ? "partitioned_bruck" : "partitioned", block, end - begin, summary, totals, iters,
      Median(total_us), Median(summary_us), Median(block_us), Median(totals_us),
      Stamps(entry_ns, exit_ns).c_str());
  std::fflush(stdout);
  }
  return 0;
}

int Gather(int argc, char** argv) {
  const int rank = std::atoi(Arg(argc, argv, "--rank", nullptr));
  const int world = std::atoi(Arg(argc, argv, "--world", nullptr));
  const std::string store = Arg(argc, argv, "--store", nullptr);
  const std::string host = Arg(argc, argv, "--hostname", nullptr);
  const std::vector<size_t> sizes = Sizes(Arg(argc, argv, "--bytes", nullptr));
  const int iters = std::atoi(Arg(argc, argv, "--iters", "30"));
  const int warmup = std::atoi(Arg(argc, argv, "--warmup", "5"));
  if (world < 2 || rank < 0 || rank >= world || iters < 1 || warmup < 0) {
    std::fprintf(stderr, "real_rounds_gloo gather: needs 0 <= rank < world, world >= 2, iters >= 1\n");
    return 2;
  }
  gloo::rendezvous::FileStore fs(store);
  gloo::rendezvous::PrefixStore ps("raw", fs);
  gloo::transport::tcp::attr attr;
  attr.hostname = host;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
  ctx->setTimeout(std::chrono::seconds(120));
  ctx->connectFullMesh(ps, dev);
  uint32_t tag = 1;
  for (size_t bytes : sizes) {
   for (const char* variant : {"allgather", "sizes+allgatherv", "bruck"}) {
    const bool two_step = std::strcmp(variant, "sizes+allgatherv") == 0;
    const bool log = std::strcmp(variant, "bruck") == 0;
    std::vector<char> in(bytes, static_cast<char>(rank)), out(bytes * static_cast<size_t>(world));
    std::vector<double> us;
    // Wall-clock entry and exit of every timed iteration, so that the
    // benchmark can time each from the last rank's entry, as it does the
    // daemons' rounds (their round_trace).
    std::vector<long long> entry_ns, exit_ns;
    for (int i = 0; i < warmup + iters; ++i) {
      // A barrier first, so that every rank starts the timed collective
      // together, as the daemons do (a round starts when all are ready).
      gloo::BarrierOptions b(ctx);
      b.setTag(tag++);
      gloo::barrier(b);
      const auto t0 = Clock::now();
      const long long entered = WallNs();
      if (two_step) {
        int64_t mine = static_cast<int64_t>(bytes);
        std::vector<int64_t> all(static_cast<size_t>(world));
        gloo::AllgatherOptions size_opts(ctx);
        size_opts.setInput(&mine, 1);
        size_opts.setOutput(all.data(), all.size());
        size_opts.setTag(tag++);
        gloo::allgather(size_opts);
        std::vector<size_t> counts(all.begin(), all.end());
        gloo::AllgathervOptions opts(ctx);
        opts.setInput(in.data(), in.size());
        opts.setOutput(out.data(), counts);
        opts.setTag(tag++);
        gloo::allgatherv(opts);
      } else {
        FixedGather(ctx, in, out, log, tag);
      }
      const double took = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (i >= warmup) {
        us.push_back(took);
        entry_ns.push_back(entered);
        exit_ns.push_back(WallNs());
      }
    }
    for (int r = 0; r < world; ++r) {  // the bytes arrived, not just the timing
      if (out[static_cast<size_t>(r) * bytes] != static_cast<char>(r)) {
        std::fprintf(stderr, "rank %d: block %d of the all-gather holds wrong bytes\n", rank, r);
        return 1;
      }
    }
    std::sort(us.begin(), us.end());
    double sum = 0;
    for (double v : us) sum += v;
    const std::string stamps = Stamps(entry_ns, exit_ns);
    std::printf("{\"rank\": %d, \"world\": %d, \"bytes\": %zu, \"variant\": \"%s\", \"iters\": %d, "
                "\"p50_us\": %.1f, \"mean_us\": %.1f, \"min_us\": %.1f%s}\n",
                rank, world, bytes, variant, iters, us[us.size() / 2],
                sum / static_cast<double>(us.size()), us.front(), stamps.c_str());
    std::fflush(stdout);
   }
  }
  const int block = std::atoi(Arg(argc, argv, "--block", "0"));
  if (block > 0) {
    const size_t summary = static_cast<size_t>(std::atoll(Arg(argc, argv, "--summary-bytes", nullptr)));
    const size_t totals = static_cast<size_t>(std::atoll(Arg(argc, argv, "--totals-bytes", nullptr)));
    if (summary < 1 || totals < 1) {
      std::fprintf(stderr, "real_rounds_gloo gather: --summary-bytes and --totals-bytes must be >= 1\n");
      return 2;
    }
    return Partitioned(ctx, dev, fs, rank, world, block, summary, sizes.front(), totals, iters, warmup, tag);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "gather") == 0) return Gather(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "codec") == 0) return Codec(argc, argv);
  std::fprintf(stderr, "usage: real_rounds_gloo gather|codec ... (see the file's comment)\n");
  return 2;
}
