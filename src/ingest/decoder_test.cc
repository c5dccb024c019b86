#include "src/ingest/decoder.h"

#include <catch2/catch.hpp>

namespace odb::ingest {
namespace {

zmq::message_t Header(const wire::ProducerMessage& m) {
  std::string bytes = m.SerializeAsString();
  return zmq::message_t(bytes.data(), bytes.size());
}

wire::ProducerMessage SampleMessage(uint64_t id, uint32_t tokens) {
  wire::ProducerMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  auto* s = m.mutable_sample();
  s->set_producer_id("p0");
  s->set_sample_id(id);
  s->set_epoch(3);
  s->set_tokens(tokens);
  auto* t = s->add_tensors();
  t->set_name("input_ids");
  t->set_dtype(wire::INT64);
  t->add_shape(tokens);
  t->set_frame(1);
  return m;
}

std::vector<zmq::message_t> Parts(const wire::ProducerMessage& m, std::vector<size_t> frame_sizes) {
  std::vector<zmq::message_t> parts;
  parts.push_back(Header(m));
  for (size_t size : frame_sizes) {
    zmq::message_t f(size);
    for (size_t i = 0; i < size; ++i) static_cast<uint8_t*>(f.data())[i] = static_cast<uint8_t>(i * 7);
    parts.push_back(std::move(f));
  }
  return parts;
}

wire::Rejection Rejected(const IngestEvent& e) {
  REQUIRE(std::holds_alternative<RejectEvent>(e));
  return std::get<RejectEvent>(e).rejection;
}

TEST_CASE("a valid sample decodes without copying its frame") {
  auto parts = Parts(SampleMessage(42, 5), {40});
  const void* frame_data = parts[1].data();
  IngestEvent e = DecodeProducerMessage(std::move(parts));
  REQUIRE(std::holds_alternative<SampleEvent>(e));
  const Sample& s = std::get<SampleEvent>(e).sample;
  CHECK(s.meta.id == 42);
  CHECK(s.epoch == 3);
  CHECK(s.meta.lengths.tokens == 5);
  CHECK(s.meta.payload_bytes == 40);
  REQUIRE(s.tensors.size() == 1);
  CHECK(s.tensors[0].data == frame_data);  // same bytes, no copy
  CHECK(s.tensors[0].shape == std::vector<int64_t>{5});
  CHECK(s.tensors[0].data[3] == 21);
}

TEST_CASE("a header with daemon_key (the payload exchange's) keys the sample by it, keeping its id") {
  wire::ProducerMessage m = SampleMessage(42, 5);
  m.mutable_sample()->set_daemon_key(0xabcdef0123ULL);
  DecodeOptions peer;
  peer.accept_daemon_key = true;
  IngestEvent e = DecodeProducerMessage(Parts(m, {40}), peer);
  REQUIRE(std::holds_alternative<SampleEvent>(e));
  const Sample& s = std::get<SampleEvent>(e).sample;
  CHECK(s.meta.id == 0xabcdef0123ULL);
  CHECK(s.user_id == std::optional<uint64_t>(42));
  CHECK(s.UserId() == 42);
  // Without it, the id is the key and there is no separate user id.
  IngestEvent plain = DecodeProducerMessage(Parts(SampleMessage(42, 5), {40}));
  CHECK_FALSE(std::get<SampleEvent>(plain).sample.user_id.has_value());
  CHECK(std::get<SampleEvent>(plain).sample.UserId() == 42);
}

// Anywhere but the payload exchange (a producer, frames or arena), a header
// with daemon_key is refused at decode, naming its sample_id: nothing after
// the decoder (credit, seq, logs, stream counts) takes the key for its id.
TEST_CASE("a header with daemon_key from anyone but a peer daemon is refused naming its sample id") {
  wire::ProducerMessage m = SampleMessage(42, 5);
  m.mutable_sample()->set_daemon_key(77);
  m.mutable_sample()->set_seq(3);
  IngestEvent e = DecodeProducerMessage(Parts(m, {40}));
  REQUIRE(std::holds_alternative<RejectEvent>(e));
  const RejectEvent& r = std::get<RejectEvent>(e);
  CHECK(r.rejection.code() == wire::MALFORMED_HEADER);
  CHECK(r.rejection.sample_id() == 42);
  CHECK_THAT(r.rejection.message(), Catch::Contains("sample 42") && Catch::Contains("daemon_key (77)"));
  CHECK(r.seq == std::optional<uint64_t>(3));  // its place is known, as for any rejected sample
  CHECK(r.has_epoch);
}

TEST_CASE("bad input gets a specific error naming the sample") {
  SECTION("not a header") {
    std::vector<zmq::message_t> parts;
    parts.emplace_back("\xff\xff\xff garbage", 12);
    const auto r = Rejected(DecodeProducerMessage(std::move(parts)));
    CHECK(r.code() == wire::MALFORMED_HEADER);
    CHECK_THAT(r.message(), Catch::Contains("not a ProducerMessage"));
  }
  SECTION("version mismatch") {
    auto m = SampleMessage(7, 5);
    m.set_version(99);
    const auto r = Rejected(DecodeProducerMessage(Parts(m, {40})));
    CHECK(r.code() == wire::VERSION_MISMATCH);
    CHECK(r.sample_id() == 7);
    CHECK_THAT(r.message(), Catch::Contains("version 99"));
  }
  SECTION("length 0") {
    auto m = SampleMessage(8, 0);
    const auto r = Rejected(DecodeProducerMessage(Parts(m, {0})));
    CHECK(r.code() == wire::ZERO_LENGTH);
    CHECK(r.sample_id() == 8);
  }
  SECTION("unknown dtype") {
    auto m = SampleMessage(9, 5);
    m.mutable_sample()->mutable_tensors(0)->set_dtype(static_cast<wire::DType>(77));
    const auto r = Rejected(DecodeProducerMessage(Parts(m, {40})));
    CHECK(r.code() == wire::UNKNOWN_DTYPE);
    CHECK_THAT(r.message(), Catch::Contains("input_ids") && Catch::Contains("77"));
  }
  SECTION("frame missing") {
    const auto r = Rejected(DecodeProducerMessage(Parts(SampleMessage(10, 5), {})));
    CHECK(r.code() == wire::FRAME_COUNT_MISMATCH);
    CHECK(r.sample_id() == 10);
  }
  SECTION("extra frame") {
    const auto r = Rejected(DecodeProducerMessage(Parts(SampleMessage(11, 5), {40, 8})));
    CHECK(r.code() == wire::FRAME_COUNT_MISMATCH);
  }
  SECTION("shape and size disagree") {
    const auto r = Rejected(DecodeProducerMessage(Parts(SampleMessage(12, 5), {41})));
    CHECK(r.code() == wire::SHAPE_SIZE_MISMATCH);
    CHECK_THAT(r.message(), Catch::Contains("40 bytes") && Catch::Contains("41 bytes"));
  }
  SECTION("frame index out of range") {
    auto m = SampleMessage(13, 5);
    m.mutable_sample()->mutable_tensors(0)->set_frame(4);
    const auto r = Rejected(DecodeProducerMessage(Parts(m, {40})));
    CHECK(r.code() == wire::FRAME_COUNT_MISMATCH);
  }
}

TEST_CASE("a huge zero-size length field is refused: its rows disagree with tokens") {
  // Regression (bug a): input_ids [2^40, 0] with an empty frame passed, and
  // the attention mask built from its 2^40 rows took the daemon down.
  auto m = SampleMessage(20, 5);
  auto* t = m.mutable_sample()->mutable_tensors(0);
  t->set_shape(0, int64_t{1} << 40);
  t->add_shape(0);
  const auto r = Rejected(DecodeProducerMessage(Parts(m, {0})));
  CHECK(r.code() == wire::TOKENS_MISMATCH);
  CHECK(r.sample_id() == 20);
  CHECK_THAT(r.message(), Catch::Contains("1099511627776") && Catch::Contains("5"));
}

TEST_CASE("a shape whose element count wraps to 0 is refused") {
  // Regression (bug b): [2^40, 2^40] wrapped to 0 elements and matched a
  // 0-byte frame.
  auto m = SampleMessage(21, 5);
  auto* t = m.mutable_sample()->add_tensors();
  t->set_name("pixels");
  t->set_dtype(wire::UINT8);
  t->add_shape(int64_t{1} << 40);
  t->add_shape(int64_t{1} << 40);
  t->set_frame(2);
  const auto r = Rejected(DecodeProducerMessage(Parts(m, {40, 0})));
  CHECK(r.code() == wire::SHAPE_SIZE_MISMATCH);
  CHECK(r.sample_id() == 21);
  CHECK_THAT(r.message(), Catch::Contains("pixels") && Catch::Contains("overflows"));
}

TEST_CASE("the header's tokens must equal the length field's rows") {
  // Regression (bug c): tokens 1 for 2^17 rows made a 1 MiB sample pad every
  // sample of its step to 2^17 rows.
  const uint32_t rows = 1u << 17;
  auto m = SampleMessage(22, rows);
  m.mutable_sample()->set_tokens(1);
  const auto r = Rejected(DecodeProducerMessage(Parts(m, {size_t{rows} * 8})));
  CHECK(r.code() == wire::TOKENS_MISMATCH);
  CHECK(r.sample_id() == 22);
  CHECK(r.producer_id() == "p0");
  CHECK_THAT(r.message(), Catch::Contains("sample 22") && Catch::Contains("tokens 1") &&
                              Catch::Contains("131072 rows") && Catch::Contains("input_ids"));
}

TEST_CASE("a scalar length field is refused") {
  auto m = SampleMessage(23, 1);
  m.mutable_sample()->mutable_tensors(0)->clear_shape();
  const auto r = Rejected(DecodeProducerMessage(Parts(m, {8})));
  CHECK(r.code() == wire::TOKENS_MISMATCH);
  CHECK_THAT(r.message(), Catch::Contains("scalar"));
}

TEST_CASE("tokens are checked against the configured length field only") {
  auto m = SampleMessage(24, 5);
  m.mutable_sample()->set_tokens(3);
  DecodeOptions options;
  options.length_field = "labels";  // the sample does not carry it: nothing to compare
  CHECK(std::holds_alternative<SampleEvent>(DecodeProducerMessage(Parts(m, {40}), options)));
  options.length_field = "input_ids";
  CHECK(Rejected(DecodeProducerMessage(Parts(m, {40}), options)).code() == wire::TOKENS_MISMATCH);
}

TEST_CASE("tensor descriptions are validated by the codec") {
  SECTION("a tensor name over the limit") {
    auto m = SampleMessage(25, 5);
    m.mutable_sample()->mutable_tensors(0)->set_name(std::string(1000, 'x'));
    const auto r = Rejected(DecodeProducerMessage(Parts(m, {40})));
    CHECK(r.code() == wire::TOO_LARGE);
    CHECK(r.sample_id() == 25);
  }
  SECTION("a duplicate name") {
    auto m = SampleMessage(26, 5);
    *m.mutable_sample()->add_tensors() = m.sample().tensors(0);
    m.mutable_sample()->mutable_tensors(1)->set_frame(2);
    const auto r = Rejected(DecodeProducerMessage(Parts(m, {40, 40})));
    CHECK(r.code() == wire::MALFORMED_HEADER);
    CHECK_THAT(r.message(), Catch::Contains("sample 26") && Catch::Contains("appears twice"));
  }
  SECTION("a reused frame") {
    auto m = SampleMessage(27, 5);
    auto* t = m.mutable_sample()->add_tensors();
    *t = m.sample().tensors(0);
    t->set_name("labels");
    const auto r = Rejected(DecodeProducerMessage(Parts(m, {40, 40})));
    CHECK(r.code() == wire::FRAME_COUNT_MISMATCH);
  }
}

TEST_CASE("producer ids over the limit are TOO_LARGE in every message kind") {
  const std::string long_id(300, 'p');
  DecodeOptions options;
  auto check = [&](const wire::ProducerMessage& m, size_t frames) {
    std::vector<size_t> sizes(frames, 40);
    const auto r = Rejected(DecodeProducerMessage(Parts(m, sizes), options));
    CHECK(r.code() == wire::TOO_LARGE);
    CHECK_THAT(r.message(), Catch::Contains("300 bytes") && Catch::Contains("256"));
    CHECK(r.message().size() < 300);  // the id is not echoed in full
    CHECK(r.producer_id().empty());
  };
  wire::ProducerMessage hello;
  hello.set_version(wire::PROTOCOL_VERSION_CURRENT);
  hello.mutable_hello()->set_producer_id(long_id);
  check(hello, 0);
  wire::ProducerMessage start;
  start.set_version(wire::PROTOCOL_VERSION_CURRENT);
  start.mutable_start_epoch()->set_producer_id(long_id);
  check(start, 0);
  wire::ProducerMessage end;
  end.set_version(wire::PROTOCOL_VERSION_CURRENT);
  end.mutable_end_stream()->set_producer_id(long_id);
  check(end, 0);
  auto sample = SampleMessage(28, 5);
  sample.mutable_sample()->set_producer_id(long_id);
  check(sample, 1);

  options.max_producer_id_bytes = 300;  // at the limit: accepted
  CHECK(std::holds_alternative<HelloEvent>(DecodeProducerMessage(Parts(hello, {}), options)));
}

TEST_CASE("control messages decode") {
  wire::ProducerMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  m.mutable_hello()->set_producer_id("w1");
  m.mutable_hello()->set_rank(2);
  std::vector<zmq::message_t> parts;
  parts.push_back(Header(m));
  IngestEvent e = DecodeProducerMessage(std::move(parts));
  REQUIRE(std::holds_alternative<HelloEvent>(e));
  CHECK(std::get<HelloEvent>(e).rank == 2);

  wire::ProducerMessage end;
  end.set_version(wire::PROTOCOL_VERSION_CURRENT);
  end.mutable_end_stream()->set_producer_id("w1");
  end.mutable_end_stream()->set_samples_sent(17);
  std::vector<zmq::message_t> parts2;
  parts2.push_back(Header(end));
  IngestEvent e2 = DecodeProducerMessage(std::move(parts2));
  REQUIRE(std::holds_alternative<EndStreamEvent>(e2));
  CHECK(std::get<EndStreamEvent>(e2).samples_sent == 17);
}

// A stand-in for the daemon's ArenaRegistry: one arena of producer "p0" whose
// data region is a vector; counts what is held and returned.
class FakeArenas : public ArenaBlockSource {
 public:
  static constexpr uint64_t kId = 9;
  static constexpr uint64_t kBase = 4096;  // the data region's first offset
  std::vector<uint8_t> bytes = std::vector<uint8_t>(1 << 16);
  int held = 0;
  int returned = 0;

  absl::StatusOr<Acquired> Acquire(std::string_view producer_id, const wire::ArenaBlock& block) override {
    if (block.arena_id() != kId) return absl::NotFoundError("arena " + std::to_string(block.arena_id()) + " unknown");
    if (producer_id != "p0") return absl::PermissionDeniedError("not yours");
    if (block.offset() < kBase || block.offset() - kBase > bytes.size() ||
        block.length() > bytes.size() - (block.offset() - kBase)) {
      return absl::OutOfRangeError("outside the data region");
    }
    struct Holder : FrameHolder {
      FakeArenas* owner;
      explicit Holder(FakeArenas* o) : owner(o) {}
      ~Holder() override { ++owner->returned; }
    };
    ++held;
    return Acquired{bytes.data() + (block.offset() - kBase), std::make_shared<Holder>(this)};
  }
};

wire::ProducerMessage ArenaSample(uint64_t id, uint32_t tokens, uint64_t block_offset) {
  wire::ProducerMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  auto* s = m.mutable_sample();
  s->set_producer_id("p0");
  s->set_sample_id(id);
  s->set_epoch(3);
  s->set_tokens(tokens);
  wire::EncodeArenaTensorDesc("input_ids", odb::DType::kInt64, {tokens}, block_offset, 8 * tokens, s->add_tensors());
  s->mutable_arena()->set_arena_id(FakeArenas::kId);
  s->mutable_arena()->set_offset(block_offset);
  s->mutable_arena()->set_length(8 * tokens);
  return m;
}

std::vector<zmq::message_t> HeaderOnly(const wire::ProducerMessage& m) {
  std::vector<zmq::message_t> parts;
  parts.push_back(Header(m));
  return parts;
}

TEST_CASE("an arena sample's views point into the arena; the block is returned with the sample") {
  FakeArenas arenas;
  for (size_t i = 0; i < arenas.bytes.size(); ++i) arenas.bytes[i] = static_cast<uint8_t>(i * 13);
  const ArenaContext context{&arenas, "p0"};
  {
    IngestEvent e = DecodeProducerMessage(HeaderOnly(ArenaSample(42, 5, 4096 + 640)), {}, context);
    REQUIRE(std::holds_alternative<SampleEvent>(e));
    const Sample& s = std::get<SampleEvent>(e).sample;
    REQUIRE(s.tensors.size() == 1);
    CHECK(s.tensors[0].data == arenas.bytes.data() + 640);  // in place, no copy
    CHECK(s.tensors[0].size_bytes == 40);
    CHECK(s.meta.payload_bytes == 40);
    CHECK(arenas.held == 1);
    CHECK(arenas.returned == 0);
  }
  CHECK(arenas.returned == 1);  // the sample is gone
}

TEST_CASE("a rejected arena sample hands its block back; an unusable block is named") {
  FakeArenas arenas;
  const ArenaContext context{&arenas, "p0"};
  SECTION("rejected after the block was taken: returned") {
    auto m = ArenaSample(5, 5, 4096);
    m.mutable_sample()->mutable_arena()->set_length(64);
    m.mutable_sample()->mutable_tensors(0)->set_length(48);  // shape says 40
    const auto r = Rejected(DecodeProducerMessage(HeaderOnly(m), {}, context));
    CHECK(r.code() == wire::SHAPE_SIZE_MISMATCH);
    CHECK(r.sample_id() == 5);
    CHECK(arenas.held == 1);
    CHECK(arenas.returned == 1);
    auto zero = ArenaSample(6, 5, 4096);
    zero.mutable_sample()->set_tokens(0);
    CHECK(Rejected(DecodeProducerMessage(HeaderOnly(zero), {}, context)).code() == wire::ZERO_LENGTH);
    CHECK(arenas.returned == 2);
  }
  SECTION("a block the source refuses: INVALID_ARENA_BLOCK naming the sample and the reason") {
    auto m = ArenaSample(7, 5, 4096);
    m.mutable_sample()->mutable_arena()->set_arena_id(3);
    const auto r = Rejected(DecodeProducerMessage(HeaderOnly(m), {}, context));
    CHECK(r.code() == wire::INVALID_ARENA_BLOCK);
    CHECK(r.sample_id() == 7);
    CHECK_THAT(r.message(), Catch::Contains("sample 7 from producer 'p0'") && Catch::Contains("arena 3 unknown"));
    CHECK(arenas.held == 0);
  }
  SECTION("a tensor outside its block") {
    auto m = ArenaSample(8, 5, 4096);
    m.mutable_sample()->mutable_tensors(0)->set_offset(4096 + 64);
    const auto r = Rejected(DecodeProducerMessage(HeaderOnly(m), {}, context));
    CHECK(r.code() == wire::INVALID_ARENA_BLOCK);
    CHECK(arenas.returned == 1);
  }
  SECTION("no arenas here (a peer daemon's message), or frames as well") {
    const auto r = Rejected(DecodeProducerMessage(HeaderOnly(ArenaSample(9, 5, 4096))));
    CHECK(r.code() == wire::INVALID_ARENA_BLOCK);
    CHECK_THAT(r.message(), Catch::Contains("only from local producers"));
    auto parts = Parts(ArenaSample(10, 5, 4096), {40});
    CHECK(Rejected(DecodeProducerMessage(std::move(parts), {}, context)).code() == wire::FRAME_COUNT_MISMATCH);
    CHECK(arenas.held == 0);
  }
}

TEST_CASE("loss_tokens: carried when at most tokens, refused naming both counts when over") {
  {
    IngestEvent e = DecodeProducerMessage(Parts(SampleMessage(30, 5), {40}));
    REQUIRE(std::holds_alternative<SampleEvent>(e));
    CHECK(std::get<SampleEvent>(e).sample.meta.loss_tokens == kEveryTokenBearsLoss);  // absent: every token
  }
  for (uint32_t n : {0u, 3u, 5u}) {
    auto m = SampleMessage(31, 5);
    m.mutable_sample()->set_loss_tokens(n);
    IngestEvent e = DecodeProducerMessage(Parts(m, {40}));
    REQUIRE(std::holds_alternative<SampleEvent>(e));
    CHECK(std::get<SampleEvent>(e).sample.meta.loss_tokens == n);
  }
  auto m = SampleMessage(32, 5);
  m.mutable_sample()->set_loss_tokens(6);
  const auto r = Rejected(DecodeProducerMessage(Parts(m, {40})));
  CHECK(r.code() == wire::TOKENS_MISMATCH);
  CHECK(r.sample_id() == 32);
  CHECK_THAT(r.message(), Catch::Contains("loss_tokens 6") && Catch::Contains("tokens 5"));
}

}  // namespace
}  // namespace odb::ingest
