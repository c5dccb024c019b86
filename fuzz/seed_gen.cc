// Writes the seed corpora under fuzz/corpus/<target>/: valid messages built
// with the real encoders (so the fuzzers start past the parsers' front doors)
// plus a few near-misses. Run by `fuzz/build.sh --seeds`; the output is
// committed, so this only needs rerunning when a format changes.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "proto/odb.pb.h"
#include "src/align/hello.h"
#include "src/align/meta_codec.h"
#include "src/align/planner.h"
#include "src/wire/tensor_codec.h"

namespace {

namespace fs = std::filesystem;
using odb::fuzz::EncodeFrames;

void Write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::string Header(const odb::wire::ProducerMessage& m) {
  std::string out;
  m.SerializeToString(&out);
  return out;
}

odb::wire::ProducerMessage Base() {
  odb::wire::ProducerMessage m;
  m.set_version(odb::wire::PROTOCOL_VERSION_CURRENT);
  return m;
}

void DecoderSeeds(const fs::path& dir) {
  auto hello = Base();
  hello.mutable_hello()->set_producer_id("p0");
  hello.mutable_hello()->set_rank(0);
  Write(dir, "hello", EncodeFrames({Header(hello)}));
  auto start = Base();
  start.mutable_start_epoch()->set_producer_id("p0");
  start.mutable_start_epoch()->set_epoch(1);
  Write(dir, "start_epoch", EncodeFrames({Header(start)}));
  auto end = Base();
  end.mutable_end_stream()->set_producer_id("p0");
  end.mutable_end_stream()->set_samples_sent(3);
  Write(dir, "end_stream", EncodeFrames({Header(end)}));

  // A text sample: input_ids int64 [5], labels int64 [5], attention as bool [5].
  auto sample = Base();
  auto* h = sample.mutable_sample();
  h->set_producer_id("p0");
  h->set_sample_id(42);
  h->set_tokens(5);
  odb::wire::EncodeTensorDesc("input_ids", odb::DType::kInt64, {5}, 1, h->add_tensors());
  odb::wire::EncodeTensorDesc("labels", odb::DType::kInt64, {5}, 2, h->add_tensors());
  odb::wire::EncodeTensorDesc("keep", odb::DType::kBool, {5}, 3, h->add_tensors());
  Write(dir, "sample_text",
        EncodeFrames({Header(sample), std::string(40, '\1'), std::string(40, '\2'), std::string(5, '\1')}));

  // A multimodal sample: pixel_values float16 [2, 3, 4], vision patches.
  auto mm = Base();
  auto* m = mm.mutable_sample();
  m->set_producer_id("p1");
  m->set_sample_id(7);
  m->set_tokens(3);
  m->set_vision_patches(2);
  m->set_epoch(2);
  odb::wire::EncodeTensorDesc("input_ids", odb::DType::kInt32, {3}, 2, m->add_tensors());
  odb::wire::EncodeTensorDesc("pixel_values", odb::DType::kFloat16, {2, 3, 4}, 1, m->add_tensors());
  Write(dir, "sample_multimodal", EncodeFrames({Header(mm), std::string(48, '\3'), std::string(12, '\4')}));

  // Near misses: a shape that does not match its frame, a wrong version,
  // a scalar length field, a sample with no tensors.
  Write(dir, "sample_short_frame", EncodeFrames({Header(sample), std::string(39, '\1'),
                                                 std::string(40, '\2'), std::string(5, '\1')}));
  auto old = sample;
  old.set_version(0);
  Write(dir, "version_mismatch", EncodeFrames({Header(old)}));
  auto scalar = Base();
  scalar.mutable_sample()->set_producer_id("p0");
  scalar.mutable_sample()->set_tokens(1);
  odb::wire::EncodeTensorDesc("input_ids", odb::DType::kInt64, {}, 1, scalar.mutable_sample()->add_tensors());
  Write(dir, "scalar_length_field", EncodeFrames({Header(scalar), std::string(8, '\0')}));
  auto bare = Base();
  bare.mutable_sample()->set_producer_id("p0");
  bare.mutable_sample()->set_tokens(9);
  Write(dir, "sample_no_tensors", EncodeFrames({Header(bare)}));
}

odb::align::RankRoundMessage Round(int rank, int samples, bool flags) {
  odb::align::RankRoundMessage msg;
  msg.epoch = 3;
  msg.round = 17;
  msg.rank = rank;
  msg.data.free_slots = 8;
  msg.data.stream_finished = flags;
  msg.data.wait_expired = flags;
  msg.data.stream_started = true;
  msg.data.wait_rounds = flags ? 2 : 0;
  for (int i = 0; i < samples; ++i) {
    odb::SampleMeta m;
    m.id = 1000 + static_cast<uint64_t>(i * 7 % 13) * 3;
    m.owner_rank = rank;
    m.lengths.tokens = 1 + static_cast<uint32_t>(i * 37 % 2000);
    m.lengths.vision_patches = i % 3 == 0 ? 256 : 0;
    m.lengths.audio_frames = i % 5 == 0 ? 100 : 0;
    m.payload_bytes = 8ull * m.lengths.tokens + 1;
    msg.data.pending.push_back(m);
  }
  return msg;
}

void MetaCodecSeeds(const fs::path& dir) {
  Write(dir, "empty_round", odb::align::EncodeRankRound(Round(0, 0, false)));
  Write(dir, "one_sample", odb::align::EncodeRankRound(Round(1, 1, true)));
  Write(dir, "thirteen_samples", odb::align::EncodeRankRound(Round(5, 13, false)));
  std::string bad = odb::align::EncodeRankRound(Round(2, 2, false));
  bad.back() = 1;  // version 1: the formats before proto/peer.proto
  Write(dir, "old_version", bad);
}

void HelloSeeds(const fs::path& dir) {
  odb::align::PlannerConfig config;
  odb::align::LocalPlanner planner(config);
  for (int world : {1, 2, 4}) {
    const odb::align::HelloFields fields = odb::align::AlignmentHelloFields(planner, world);
    std::vector<std::string> hellos;
    for (int r = 0; r < world; ++r) hellos.push_back(odb::align::EncodeHello(r, world, fields));
    Write(dir, "world" + std::to_string(world), EncodeFrames(hellos));
  }
  // Rank 1 disagrees on one field.
  odb::align::HelloFields a = odb::align::AlignmentHelloFields(planner, 2);
  odb::align::HelloFields b = a;
  b[4].second = "999";
  Write(dir, "mismatch", EncodeFrames({odb::align::EncodeHello(0, 2, a), odb::align::EncodeHello(1, 2, b)}));
  Write(dir, "small_fields", EncodeFrames({odb::align::EncodeHello(0, 1, {{"k", "v"}})}));
}

std::string Daemon(const odb::wire::DaemonMessage& m) {
  std::string out;
  m.SerializeToString(&out);
  return out;
}

void DeliverySeeds(const fs::path& dir, const fs::path& regressions) {
  odb::wire::DaemonMessage step;
  step.set_version(odb::wire::PROTOCOL_VERSION_CURRENT);
  auto* st = step.mutable_step();
  st->set_epoch(1);
  st->set_step_index(4);
  st->set_loss_weight(1.0);
  st->set_real_tokens(7);
  st->set_padded_tokens(8);
  for (uint64_t id : {11, 12}) st->add_sample_ids(id);
  for (uint32_t len : {3, 4}) st->add_lengths(len);
  for (int32_t r : {0, 1}) st->add_owner_ranks(r);
  odb::wire::EncodeTensorDesc("input_ids", odb::DType::kInt64, {2, 4}, 1, st->add_tensors());
  odb::wire::EncodeTensorDesc("attention_mask", odb::DType::kInt64, {2, 4}, 2, st->add_tensors());
  odb::wire::EncodeTensorDesc("pixel_values", odb::DType::kBFloat16, {3, 2}, 3, st->add_tensors());
  auto* rej = st->add_rejections();
  rej->set_code(odb::wire::ZERO_LENGTH);
  rej->set_sample_id(9);
  rej->set_has_sample_id(true);
  rej->set_message("sample 9: token length is 0");
  Write(dir, "step", EncodeFrames({Daemon(step), std::string(64, '\1'), std::string(64, '\0'),
                                   std::string(12, '\2')}));
  auto phases = step;
  auto* ph = phases.mutable_step();
  ph->add_enc_sample_ids(11);
  ph->add_enc_owner_ranks(0);
  ph->add_enc_dest_rank(1);
  ph->add_enc_dest_index(0);
  ph->add_llm_src_rank(0);
  ph->add_llm_src_rank(1);
  ph->set_samples_may_move(true);
  Write(dir, "step_phase_plans", EncodeFrames({Daemon(phases), std::string(64, '\1'),
                                               std::string(64, '\0'), std::string(12, '\2')}));
  odb::wire::DaemonMessage idle;
  idle.set_version(odb::wire::PROTOCOL_VERSION_CURRENT);
  idle.mutable_step()->set_idle(true);
  Write(dir, "step_idle", EncodeFrames({Daemon(idle)}));
  odb::wire::DaemonMessage end;
  end.set_version(odb::wire::PROTOCOL_VERSION_CURRENT);
  end.mutable_epoch_end()->set_epoch(1);
  end.mutable_epoch_end()->set_received(10);
  end.mutable_epoch_end()->add_not_emitted_ids(3);
  *end.mutable_epoch_end()->add_rejections() = *rej;
  Write(dir, "epoch_end", EncodeFrames({Daemon(end)}));
  odb::wire::DaemonMessage fatal;
  fatal.set_version(odb::wire::PROTOCOL_VERSION_CURRENT);
  fatal.mutable_fatal()->set_message("peer 2 died");
  fatal.mutable_fatal()->set_rank(2);
  Write(dir, "fatal", EncodeFrames({Daemon(fatal)}));
  Write(dir, "short_frame", EncodeFrames({Daemon(step), std::string(63, '\1'), std::string(64, '\0'),
                                          std::string(12, '\2')}));

  // Accepted today: 2 sample_ids but 1 length and 3 owner ranks. Consumers
  // index these arrays in parallel (odb_synth reads lengths[i] for every
  // sample id); see docs/fuzzing.md, finding 1. Fails with ODB_FUZZ_STRICT=1.
  auto skew = step;
  skew.mutable_step()->mutable_lengths()->RemoveLast();
  skew.mutable_step()->add_owner_ranks(5);
  Write(regressions, "parallel_arrays_differ_in_length",
        EncodeFrames({Daemon(skew), std::string(64, '\1'), std::string(64, '\0'), std::string(12, '\2')}));
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path root = argc > 1 ? argv[1] : "fuzz/corpus";
  DecoderSeeds(root / "decoder");
  MetaCodecSeeds(root / "meta_codec");
  HelloSeeds(root / "hello");
  DeliverySeeds(root / "delivery_decoder", root.parent_path() / "regressions" / "delivery_decoder");
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
