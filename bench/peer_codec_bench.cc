// Bytes and CPU of the per-round peer messages (issue 34 item 5) as odbd
// sends them (align::EncodeRankRound / DecodeRankRound, the round summary and
// the token totals), on the round rank 0 of a partitioned job handles at W
// ranks with blocks of B (the real-daemon and scale benchmarks' setting:
// window 512, chat_longtail lengths, 16 free slots, T = 70 steps): it encodes
// its own messages and decodes B block messages and W summaries.
//
//   bazel run -c opt //bench:peer_codec_bench -- --world 2560 --block 256 --reps 21
//
// Thread CPU time, median over --reps repetitions. Prints one JSON object
// (the same keys at every commit, so two builds compare: docs/protocol.md,
// "Peer messages", has the figures of the formats before proto/peer.proto).
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/trace.h"
#include "src/align/aligner.h"
#include "src/align/meta_codec.h"

namespace odb::bench {
namespace {

double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int Run(int argc, char** argv) {
  int world = 2560, block = 256, reps = 15, steps = 70;
  uint32_t window = 512;
  std::string preset = "chat_longtail";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--world") {
      world = std::atoi(v);
    } else if (a == "--block") {
      block = std::atoi(v);
    } else if (a == "--reps") {
      reps = std::atoi(v);
    } else if (a == "--window") {
      window = static_cast<uint32_t>(std::atoi(v));
    } else if (a == "--steps") {
      steps = std::atoi(v);
    } else if (a == "--preset") {
      preset = v;
    } else {
      std::fprintf(stderr, "peer_codec_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  // The block's round messages: rank r's window of its own trace.
  std::vector<align::RankRoundMessage> msgs(block);
  for (int r = 0; r < block; ++r) {
    auto t = GenerateTrace(preset, window, 4096, 1000003ull * static_cast<uint64_t>(r) + 1);
    if (!t.ok()) {
      std::fprintf(stderr, "peer_codec_bench: %s\n", t.status().ToString().c_str());
      return 2;
    }
    msgs[r].epoch = 1;
    msgs[r].round = 4321;
    msgs[r].rank = r;
    msgs[r].data.free_slots = 16;
    for (uint32_t i = 0; i < window; ++i) {
      SampleMeta m;
      m.id = 7 * static_cast<uint64_t>(i) + static_cast<uint64_t>(r) * 1000000;
      m.owner_rank = r;
      m.lengths = t->samples[i];
      m.payload_bytes = 4ull * m.lengths.tokens;
      m.loss_tokens = i % 2 == 0 ? kEveryTokenBearsLoss : m.lengths.tokens / 2;  // half prompt-masked
      msgs[r].data.pending.push_back(m);
    }
  }
  std::vector<align::RankSummary> sums(world);
  for (int r = 0; r < world; ++r) {
    sums[r].pending = window;
    sums[r].free_slots = 16;
    sums[r].group_bound = 37.0 + r % 5;
  }
  std::vector<uint64_t> loss(steps), real(steps);
  for (int k = 0; k < steps; ++k) {
    loss[k] = 900 + 13 * k;
    real[k] = 3000 + 17 * k;
  }
  std::vector<double> c_enc, c_dec, c_senc, c_sdec;
  size_t c_bytes = 0, c_sbytes = 0;
  for (int rep = 0; rep < reps; ++rep) {
    // The block's round messages, then every rank's summary.
    std::vector<std::string> wire(block);
    double t0 = ThreadCpuMs();
    for (int r = 0; r < block; ++r) wire[r] = align::EncodeRankRound(msgs[r]);
    c_enc.push_back(ThreadCpuMs() - t0);
    c_bytes = 0;
    for (const std::string& w : wire) c_bytes += w.size();
    t0 = ThreadCpuMs();
    for (int r = 0; r < block; ++r) {
      if (!align::DecodeRankRound(wire[r]).ok()) return 3;
    }
    c_dec.push_back(ThreadCpuMs() - t0);
    std::vector<std::string> swire(world);
    t0 = ThreadCpuMs();
    for (int r = 0; r < world; ++r) swire[r] = align::EncodeRoundSummary(1, 4321, r, sums[r]);
    c_senc.push_back(ThreadCpuMs() - t0);
    c_sbytes = 0;
    for (const std::string& w : swire) c_sbytes += w.size();
    t0 = ThreadCpuMs();
    for (int r = 0; r < world; ++r) {
      uint32_t e = 0;
      uint64_t n = 0;
      int32_t from = 0;
      if (!align::DecodeRoundSummary(swire[r], e, n, from).ok()) return 3;
    }
    c_sdec.push_back(ThreadCpuMs() - t0);
  }
  const size_t c_tot = align::EncodeRankTotals(1, 4321, 0, loss, real).size();
  // What rank 0 receives in one round: B - 1 block messages, W - 1 summaries and totals.
  const auto recv = [&](size_t msg_total, size_t sum_total, size_t tot) {
    return static_cast<double>(msg_total) * (block - 1) / block +
           static_cast<double>(sum_total) * (world - 1) / world + static_cast<double>(tot) * (world - 1);
  };
  std::printf(
      "{\"world\": %d, \"block\": %d, \"window\": %u, \"steps\": %d, \"reps\": %d, \"preset\": \"%s\",\n"
      " \"codec\": {\"round_msg_bytes\": %.1f, \"summary_bytes\": %.1f, \"totals_bytes\": %zu, "
      "\"recv_bytes_per_round\": %.0f, \"block_encode_ms\": %.3f, \"block_decode_ms\": %.3f, "
      "\"summaries_encode_ms\": %.3f, \"summaries_decode_ms\": %.3f}}\n",
      world, block, window, steps, reps, preset.c_str(), static_cast<double>(c_bytes) / block,
      static_cast<double>(c_sbytes) / world, c_tot, recv(c_bytes, c_sbytes, c_tot), Median(c_enc),
      Median(c_dec), Median(c_senc), Median(c_sdec));
  return 0;
}

}  // namespace
}  // namespace odb::bench

int main(int argc, char** argv) { return odb::bench::Run(argc, argv); }
