#include "client/cpp/src/delivery_decoder.h"

#include <catch2/catch.hpp>

#include "proto/odb.pb.h"
#include "src/wire/tensor_codec.h"

namespace odb::client {
namespace {

using Frames = std::shared_ptr<std::vector<zmq::message_t>>;

Frames Message(const wire::DaemonMessage& m, const std::vector<size_t>& frame_sizes) {
  auto frames = std::make_shared<std::vector<zmq::message_t>>();
  const std::string bytes = m.SerializeAsString();
  frames->emplace_back(bytes.data(), bytes.size());
  for (size_t size : frame_sizes) {
    zmq::message_t f(size);
    for (size_t i = 0; i < size; ++i) static_cast<uint8_t*>(f.data())[i] = static_cast<uint8_t>(i);
    frames->push_back(std::move(f));
  }
  return frames;
}

wire::DaemonMessage Step() {
  wire::DaemonMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  wire::Step* st = m.mutable_step();
  st->set_epoch(2);
  st->set_step_index(9);
  st->add_sample_ids(5);
  st->add_sample_ids(6);
  st->add_lengths(3);
  st->add_lengths(2);
  st->add_owner_ranks(0);
  st->add_owner_ranks(1);
  st->set_loss_weight(0.5);
  wire::Rejection* r = st->add_rejections();
  r->set_code(wire::TOKENS_MISMATCH);
  r->set_sample_id(7);
  r->set_has_sample_id(true);
  wire::EncodeTensorDesc("input_ids", odb::DType::kInt64, {2, 3}, 1, st->add_tensors());
  wire::EncodeTensorDesc("attention_mask", odb::DType::kInt64, {2, 3}, 2, st->add_tensors());
  return m;
}

TEST_CASE("a step decodes into views over its frames") {
  Frames frames = Message(Step(), {48, 48});
  const void* data = (*frames)[1].data();
  auto d = DecodeDelivery(frames, "ipc:///x");
  REQUIRE(d.ok());
  CHECK(d->kind == Delivery::Kind::kStep);
  CHECK(d->step.epoch == 2);
  CHECK(d->step.step_index == 9);
  CHECK(d->step.sample_ids == std::vector<uint64_t>{5, 6});
  CHECK(d->step.loss_weight == 0.5);
  REQUIRE(d->step.rejections.size() == 1);
  CHECK(d->step.rejections[0].code == "TOKENS_MISMATCH");
  CHECK(d->step.rejections[0].sample_id == 7);
  REQUIRE(d->tensors.size() == 2);
  CHECK(d->tensors[0].data == data);  // no copy
  CHECK(d->tensors[0].dtype == DType::kInt64);
  CHECK(d->tensors[0].shape == std::vector<int64_t>{2, 3});
  CHECK(d->tensors[0].size_bytes == 48);
  REQUIRE(d->Find("attention_mask") != nullptr);
  CHECK(d->Find("attention_mask")->data[5] == 5);
  CHECK(d->frames != nullptr);
}

TEST_CASE("a step tensor whose shape does not match its frame is refused") {
  // Regression: the shape was handed to the trainer as is; torch read
  // 48 bytes out of a 40-byte frame.
  auto d = DecodeDelivery(Message(Step(), {40, 48}), "ipc:///x");
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(d.status().message()),
             Catch::Contains("step 9") && Catch::Contains("ipc:///x") &&
                 Catch::Contains("'input_ids'") && Catch::Contains("48 bytes") &&
                 Catch::Contains("40 bytes"));
}

TEST_CASE("malformed step tensors are refused") {
  SECTION("an overflowing shape") {
    wire::DaemonMessage m = Step();
    m.mutable_step()->mutable_tensors(0)->set_shape(0, int64_t{1} << 40);
    m.mutable_step()->mutable_tensors(0)->set_shape(1, int64_t{1} << 40);
    auto d = DecodeDelivery(Message(m, {0, 48}), "e");
    CHECK(d.status().code() == absl::StatusCode::kDataLoss);
  }
  SECTION("a missing frame") {
    auto d = DecodeDelivery(Message(Step(), {48}), "e");
    CHECK(d.status().code() == absl::StatusCode::kDataLoss);
  }
  SECTION("a frame used twice") {
    wire::DaemonMessage m = Step();
    m.mutable_step()->mutable_tensors(1)->set_frame(1);
    auto d = DecodeDelivery(Message(m, {48, 48}), "e");
    CHECK(d.status().code() == absl::StatusCode::kDataLoss);
  }
  SECTION("an unknown dtype") {
    wire::DaemonMessage m = Step();
    m.mutable_step()->mutable_tensors(1)->set_dtype(static_cast<wire::DType>(40));
    auto d = DecodeDelivery(Message(m, {48, 48}), "e");
    CHECK(d.status().code() == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("a step whose per-sample lists disagree in length is refused (consumers index them in parallel)") {
  // Found by the delivery_decoder fuzzer (fuzz/regressions/delivery_decoder/).
  wire::DaemonMessage m = Step();
  m.mutable_step()->add_lengths(9);  // three lengths for two samples
  auto d = DecodeDelivery(Message(m, {48, 48}), "e");
  REQUIRE(d.status().code() == absl::StatusCode::kDataLoss);
  REQUIRE(std::string(d.status().message()).find("lengths 3") != std::string::npos);
  wire::DaemonMessage enc = Step();
  enc.mutable_step()->add_enc_sample_ids(5);  // an encoder sample without its route
  REQUIRE(DecodeDelivery(Message(enc, {48, 48}), "e").status().code() == absl::StatusCode::kDataLoss);
  // The audio phase's lists likewise.
  wire::DaemonMessage audio = Step();
  audio.mutable_step()->add_audio_sample_ids(5);  // an audio sample without its route
  auto a = DecodeDelivery(Message(audio, {48, 48}), "e");
  REQUIRE(a.status().code() == absl::StatusCode::kDataLoss);
  REQUIRE(std::string(a.status().message()).find("audio_sample_ids 1") != std::string::npos);
  wire::DaemonMessage src = Step();
  src.mutable_step()->add_llm_audio_src_rank(0);  // one source rank for two samples
  REQUIRE(DecodeDelivery(Message(src, {48, 48}), "e").status().code() == absl::StatusCode::kDataLoss);
  wire::DaemonMessage whole = Step();
  for (int j = 0; j < 2; ++j) whole.mutable_step()->add_llm_audio_src_rank(1);
  whole.mutable_step()->add_audio_sample_ids(7);
  whole.mutable_step()->add_audio_owner_ranks(0);
  whole.mutable_step()->add_audio_dest_rank(1);
  whole.mutable_step()->add_audio_dest_index(0);
  auto ok = DecodeDelivery(Message(whole, {48, 48}), "e");
  REQUIRE(ok.ok());
  CHECK(ok->step.audio_sample_ids == std::vector<uint64_t>{7});
  CHECK(ok->step.audio_dest_rank == std::vector<int32_t>{1});
  CHECK(ok->step.llm_audio_src_rank == std::vector<int32_t>{1, 1});
}

TEST_CASE("each sample's seq arrives in sample order, unknown where the sample had none") {
  wire::DaemonMessage m = Step();
  m.mutable_step()->add_seqs(17);
  m.mutable_step()->add_has_seq(true);
  m.mutable_step()->add_seqs(0);
  m.mutable_step()->add_has_seq(false);
  auto d = DecodeDelivery(Message(m, {48, 48}), "e");
  REQUIRE(d.ok());
  REQUIRE(d->step.seqs.size() == 2);
  CHECK(d->step.seqs[0] == std::optional<uint64_t>(17));
  CHECK_FALSE(d->step.seqs[1].has_value());
  // A daemon older than the field: as many unknown seqs as samples.
  auto old = DecodeDelivery(Message(Step(), {48, 48}), "e");
  REQUIRE(old.ok());
  CHECK(old->step.seqs == std::vector<std::optional<uint64_t>>(2));
  // One seq for two samples (or a mask of another length) is refused, naming the lists.
  wire::DaemonMessage short_seqs = Step();
  short_seqs.mutable_step()->add_seqs(1);
  short_seqs.mutable_step()->add_has_seq(true);
  auto s = DecodeDelivery(Message(short_seqs, {48, 48}), "e");
  REQUIRE(s.status().code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(s.status().message()).find("seqs 1, has_seq 1") != std::string::npos);
  wire::DaemonMessage no_mask = Step();
  for (int j = 0; j < 2; ++j) no_mask.mutable_step()->add_seqs(j);
  REQUIRE(DecodeDelivery(Message(no_mask, {48, 48}), "e").status().code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("control messages and protocol errors") {
  SECTION("epoch end") {
    wire::DaemonMessage m;
    m.set_version(wire::PROTOCOL_VERSION_CURRENT);
    m.mutable_epoch_end()->set_epoch(3);
    m.mutable_epoch_end()->set_emitted(10);
    m.mutable_epoch_end()->add_not_emitted_ids(4);
    auto d = DecodeDelivery(Message(m, {}), "e");
    REQUIRE(d.ok());
    CHECK(d->kind == Delivery::Kind::kEpochEnd);
    CHECK(d->summary.epoch == 3);
    CHECK(d->summary.emitted == 10);
    CHECK(d->summary.not_emitted_ids == std::vector<uint64_t>{4});
  }
  SECTION("fatal") {
    wire::DaemonMessage m;
    m.set_version(wire::PROTOCOL_VERSION_CURRENT);
    m.mutable_fatal()->set_rank(1);
    m.mutable_fatal()->set_code(wire::CONFIG_MISMATCH);
    m.mutable_fatal()->set_message("collate.length_field: ...");
    auto d = DecodeDelivery(Message(m, {}), "e");
    CHECK(d.status().code() == absl::StatusCode::kAborted);
    CHECK_THAT(std::string(d.status().message()),
               Catch::Contains("rank 1") && Catch::Contains("CONFIG_MISMATCH"));
  }
  SECTION("version") {
    wire::DaemonMessage m = Step();
    m.set_version(7);
    auto d = DecodeDelivery(Message(m, {48, 48}), "tcp://h:1");
    CHECK(d.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(d.status().message()), Catch::Contains("tcp://h:1"));
  }
  SECTION("garbage and empty") {
    auto frames = std::make_shared<std::vector<zmq::message_t>>();
    CHECK(DecodeDelivery(frames, "e").status().code() == absl::StatusCode::kDataLoss);
    frames->emplace_back("\xff\xff\xff", 3);
    CHECK(DecodeDelivery(frames, "e").status().code() == absl::StatusCode::kDataLoss);
  }
  SECTION("neither step nor epoch end") {
    wire::DaemonMessage m;
    m.set_version(wire::PROTOCOL_VERSION_CURRENT);
    CHECK(DecodeDelivery(Message(m, {}), "e").status().code() == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("a session acknowledgement carries the job settings; one from an older daemon has none") {
  wire::DaemonMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  m.mutable_session_ack();
  auto old = DecodeDelivery(Message(m, {}), "e");
  REQUIRE(old.ok());
  CHECK(old->kind == Delivery::Kind::kSessionAck);
  CHECK_FALSE(old->settings.has_value());
  wire::JobSettings* s = m.mutable_session_ack()->mutable_settings();
  s->set_tokens_per_step(4096);
  s->set_packed(true);
  s->set_trainer_data_plane("shm");
  s->set_length_field("input_ids");
  auto without_labels = DecodeDelivery(Message(m, {}), "e");
  REQUIRE(without_labels.ok());
  REQUIRE(without_labels->settings.has_value());
  CHECK(without_labels->settings->tokens_per_step == 4096);
  CHECK(without_labels->settings->packed);
  CHECK(without_labels->settings->trainer_data_plane == "shm");
  CHECK(without_labels->settings->length_field == "input_ids");
  CHECK_FALSE(without_labels->settings->ignore_index.has_value());
  s->set_ignore_index(-100);
  auto with_labels = DecodeDelivery(Message(m, {}), "e");
  REQUIRE(with_labels.ok());
  CHECK(with_labels->settings->ignore_index == std::optional<int64_t>(-100));
}

}  // namespace
}  // namespace odb::client
