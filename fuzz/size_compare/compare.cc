// Bytes per alignment round: the hand-written meta codec vs protobuf
// (array-of-structs and packed struct-of-arrays), and the hello.
// (the codec column: proto/peer.proto's RankRound, what odbd sends since 2026-12-05)
//   protoc --cpp_out=/tmp/sc fuzz/size_compare/round_meta.proto
//   protoc --proto_path=proto --cpp_out=/tmp/sc/proto proto/peer.proto
//   g++ -std=c++20 -O1 -I. -I/tmp/sc fuzz/size_compare/compare.cc /tmp/sc/round_meta.pb.cc /tmp/sc/proto/peer.pb.cc \
//     src/align/meta_codec.cc src/align/peer_wire.cc src/align/hello.cc src/align/planner.cc src/align/planned_groups.cc src/align/window.cc src/grouping/budget.cc \
//     src/grouping/grouper.cc -lprotobuf <absl libs of third_party/BUILD> -o /tmp/sc/compare
#include <cmath>
#include <cstdio>
#include <random>

#include "round_meta.pb.h"  // generated into -I/tmp/sc
#include "src/align/hello.h"
#include "src/align/meta_codec.h"

int main() {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> len(6.0, 1.0);  // median ~400 tokens
  std::printf("pending/rank | codec B/rank | proto AoS | proto SoA | (per round, W ranks: x W)\n");
  for (int pending : {0, 16, 256, 1024}) {
    odb::align::RankRoundMessage msg;
    msg.epoch = 3;
    msg.round = 1234;
    msg.rank = 5;
    msg.data.free_slots = 32;
    msg.data.stream_started = true;
    odb::sizecmp::RankRoundAos aos;
    odb::sizecmp::RankRoundSoa soa;
    aos.set_epoch(3); aos.set_round(1234); aos.set_rank(5); aos.set_free_slots(32); aos.set_flags(4);
    soa.set_epoch(3); soa.set_round(1234); soa.set_rank(5); soa.set_free_slots(32); soa.set_flags(4);
    uint64_t id = 5'000'000, prev = 0;
    for (int i = 0; i < pending; ++i) {
      id += 1 + rng() % 8;  // ids of one rank: increasing with small gaps
      odb::SampleMeta m;
      m.id = id;
      m.owner_rank = 5;
      m.lengths.tokens = static_cast<uint32_t>(std::min(8192.0, 1.0 + len(rng)));
      m.lengths.vision_patches = i % 4 == 0 ? 576 : 0;  // a quarter multimodal
      m.payload_bytes = 8ull * m.lengths.tokens * 2 + (m.lengths.vision_patches ? 576 * 1176 : 0);
      msg.data.pending.push_back(m);
      auto* s = aos.add_pending();
      s->set_id_delta(static_cast<int64_t>(id - prev));
      s->set_tokens(m.lengths.tokens);
      s->set_vision_patches(m.lengths.vision_patches);
      s->set_payload_bytes(m.payload_bytes);
      soa.add_id_delta(static_cast<int64_t>(id - prev));
      soa.add_tokens(m.lengths.tokens);
      soa.add_vision_patches(m.lengths.vision_patches);
      soa.add_audio_frames(0);
      soa.add_payload_bytes(m.payload_bytes);
      prev = id;
    }
    const size_t codec = odb::align::EncodeRankRound(msg).size();
    std::printf("%12d | %12zu | %9zu | %9zu\n", pending, codec, aos.ByteSizeLong(), soa.ByteSizeLong());
  }
  odb::align::PlannerConfig config;
  odb::align::LocalPlanner planner(config);
  const auto fields = odb::align::AlignmentHelloFields(planner, 8);
  odb::sizecmp::HelloProto hp;
  hp.set_version(1); hp.set_rank(5); hp.set_world(8); hp.set_fingerprint(odb::align::HelloFingerprint(fields));
  for (const auto& [k, v] : fields) {
    auto* f = hp.add_fields();
    f->set_name(k);
    f->set_value(v);
  }
  std::printf("hello (%zu fields): custom %zu B, protobuf %zu B (once per job)\n", fields.size(),
              odb::align::EncodeHello(5, 8, fields).size(), hp.ByteSizeLong());
  return 0;
}
