#include "src/emit/step_builder.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <map>

#include "src/shm/arena_reader.h"

namespace odb::emit {
namespace {

const SteadyClock kSteady;

class VectorFrame : public FrameHolder {
 public:
  explicit VectorFrame(std::vector<uint8_t> bytes) : bytes(std::move(bytes)) {}
  std::vector<uint8_t> bytes;
};

// `n` tokens, each `value` (by default the id).
Sample Tokens(uint64_t id, uint32_t n, int64_t value = -1) {
  std::vector<int64_t> values(n, value < 0 ? static_cast<int64_t>(id) : value);
  std::vector<uint8_t> raw(n * sizeof(int64_t));
  std::memcpy(raw.data(), values.data(), raw.size());
  auto frame = std::make_shared<VectorFrame>(std::move(raw));
  Sample s;
  s.meta.id = id;
  s.meta.lengths.tokens = n;
  s.meta.payload_bytes = frame->bytes.size();
  s.producer_id.assign(1, 'p');
  s.tensors.push_back({"input_ids", DType::kInt64, {n}, frame->bytes.data(), frame->bytes.size()});
  s.frames.push_back(frame);
  return s;
}

StepPlan PlanOf(std::vector<uint64_t> ids, uint64_t tokens) {
  StepPlan plan;
  plan.sample_ids = ids;
  plan.sample_owners.assign(ids.size(), 0);
  plan.real_tokens = tokens;
  plan.global_real_tokens = 2 * tokens;  // another rank holds as many tokens
  plan.loss_weight = 1.0;                // W = 2: half of it here
  return plan;
}

TEST_CASE("a step is built from buffered samples and counted in the epoch's totals") {
  StepBuilderOptions options;
  options.rank = 0;
  DaemonState state(1 << 20, 100, 1);
  DaemonMetrics metrics;
  REQUIRE(!state.buffer.Add(Tokens(1, 3)));
  REQUIRE(!state.buffer.Add(Tokens(2, 5)));
  StepBuilder builder(options, state, metrics, nullptr);
  auto parts = builder.Build(0, PlanOf({1, 2}, 8), [] { return false; });
  REQUIRE(parts.ok());
  wire::DaemonMessage m;
  REQUIRE_FALSE(parts->in_arena);
  REQUIRE(m.ParseFromArray(parts->parts[0].data(), static_cast<int>(parts->parts[0].size())));
  REQUIRE(m.step().sample_ids_size() == 2);
  REQUIRE(m.step().loss_weight() == 1.0);
  REQUIRE(state.epoch_totals[0].emitted() == 2);
}

// The trainer keys a resume by (owner rank, seq): which copy of a repeated
// dataset index a step took. A sample sent without seq says so (has_seq
// false), never a made-up position.
TEST_CASE("each sample's seq goes into the step header in sample order; a sample without seq is marked") {
  StepBuilderOptions options;
  options.rank = 0;
  DaemonState state(1 << 20, 100, 1);
  DaemonMetrics metrics;
  Sample with_seq = Tokens(1, 3);
  with_seq.seq = 41;
  REQUIRE(!state.buffer.Add(std::move(with_seq)));
  REQUIRE(!state.buffer.Add(Tokens(2, 5)));  // no seq
  Sample late = Tokens(3, 2);
  late.seq = 0;
  REQUIRE(!state.buffer.Add(std::move(late)));
  StepBuilder builder(options, state, metrics, nullptr);
  auto parts = builder.Build(0, PlanOf({3, 1, 2}, 10), [] { return false; });
  REQUIRE(parts.ok());
  wire::DaemonMessage m;
  REQUIRE(m.ParseFromArray(parts->parts[0].data(), static_cast<int>(parts->parts[0].size())));
  const wire::Step& st = m.step();
  REQUIRE(st.sample_ids_size() == 3);
  CHECK(st.sample_ids(0) == 3);
  REQUIRE(st.seqs_size() == 3);
  REQUIRE(st.has_seq_size() == 3);
  CHECK(st.seqs(0) == 0);
  CHECK(st.has_seq(0));
  CHECK(st.seqs(1) == 41);
  CHECK(st.has_seq(1));
  CHECK_FALSE(st.has_seq(2));
  CHECK(st.seqs(2) == 0);
}

TEST_CASE("a step that cannot be collated stops the job instead of breaking the weights") {
  // Before, the rank emitted the step as IDLE with weight 0 while the other
  // ranks' weights counted its tokens: Σ_r w_r fell below W, silently.
  StepBuilderOptions options;
  options.rank = 0;
  options.collate.max_batch_tensor_bytes = 16;  // a resource limit the step exceeds
  DaemonState state(1 << 20, 100, 1);
  DaemonMetrics metrics;
  REQUIRE(!state.buffer.Add(Tokens(1, 3)));
  REQUIRE(!state.buffer.Add(Tokens(2, 5)));
  StepBuilder builder(options, state, metrics, nullptr);
  auto parts = builder.Build(0, PlanOf({1, 2}, 8), [] { return false; });
  REQUIRE(parts.status().code() == absl::StatusCode::kAborted);
  REQUIRE(std::string(parts.status().message()).find("samples 1, 2") != std::string::npos);
  REQUIRE(std::string(parts.status().message()).find("sum to W") != std::string::npos);
  REQUIRE(state.epoch_totals[0].steps() == 0);  // no IDLE step stands in for it
}

wire::Step Header(const zmq::message_t& head) {
  wire::DaemonMessage m;
  REQUIRE(m.ParseFromArray(head.data(), static_cast<int>(head.size())));
  return m.step();
}

TEST_CASE("with a step arena the step is collated straight into one block: the same tensors as frames") {
  StepBuilderOptions options;
  options.rank = 0;
  DaemonState state(1 << 20, 100, 1);
  DaemonMetrics metrics;
  REQUIRE(!state.buffer.Add(Tokens(1, 7)));
  REQUIRE(!state.buffer.Add(Tokens(2, 14)));
  StepBuilder builder(options, state, metrics, nullptr);
  auto frames = builder.Build(0, PlanOf({1, 2}, 21), [] { return false; });
  REQUIRE(frames.ok());
  REQUIRE_FALSE(frames->in_arena);
  auto arena = StepArena::Create(1 << 20, kSteady);
  REQUIRE(arena.ok());
  auto reader = shm::ArenaReader::AttachFd((*arena)->fd(), {.expected_generation = (*arena)->generation()});
  REQUIRE(reader.ok());
  // Two samples with the same tokens, built into the arena this time.
  REQUIRE(!state.buffer.Add(Tokens(3, 7, 1)));
  REQUIRE(!state.buffer.Add(Tokens(4, 14, 2)));
  auto placed = builder.Build(0, PlanOf({3, 4}, 21), [] { return false; }, arena->get());
  REQUIRE(placed.ok());
  REQUIRE(placed->in_arena);
  REQUIRE(placed->parts.size() == 1);  // the header alone
  CHECK(metrics.step_arena_steps.load() == 1);
  const wire::Step want = Header(frames->parts[0]);
  const wire::Step got = Header(placed->parts[0]);
  REQUIRE(got.has_arena());
  CHECK(got.arena().generation() == (*arena)->generation());
  REQUIRE(got.tensors_size() == want.tensors_size());
  REQUIRE(got.tensors_size() == 2);  // input_ids, attention_mask
  auto block = (*reader)->View(got.arena().offset(), got.arena().length());
  REQUIRE(block.ok());
  for (int i = 0; i < got.tensors_size(); ++i) {
    const wire::TensorDesc& d = got.tensors(i);
    CHECK(d.name() == want.tensors(i).name());
    CHECK(std::vector<int64_t>(d.shape().begin(), d.shape().end()) ==
          std::vector<int64_t>(want.tensors(i).shape().begin(), want.tensors(i).shape().end()));
    CHECK(d.frame() == 0);
    CHECK(d.offset() % 64 == 0);
    REQUIRE(d.offset() >= got.arena().offset());
    REQUIRE(d.offset() + d.length() <= got.arena().offset() + got.arena().length());
    const zmq::message_t& frame = frames->parts[static_cast<size_t>(want.tensors(i).frame())];
    REQUIRE(d.length() == frame.size());
    CHECK(std::memcmp(block->data() + (d.offset() - got.arena().offset()), frame.data(), frame.size()) == 0);
  }
}

TEST_CASE("a step larger than the step arena goes as frames; a full arena stops the job naming the cause") {
  StepBuilderOptions options;
  options.rank = 0;
  options.step_arena_wait_ms = 200;
  DaemonState state(1 << 24, 100, 1);
  DaemonMetrics metrics;
  REQUIRE(!state.buffer.Add(Tokens(1, 20000)));  // 160 KB of tokens + 160 KB of mask
  REQUIRE(!state.buffer.Add(Tokens(2, 5000)));
  REQUIRE(!state.buffer.Add(Tokens(3, 5000)));
  StepBuilder builder(options, state, metrics, nullptr);
  auto arena = StepArena::Create(128 << 10, kSteady);
  REQUIRE(arena.ok());
  auto reader = shm::ArenaReader::AttachFd((*arena)->fd(), {});
  REQUIRE(reader.ok());
  auto big = builder.Build(0, PlanOf({1}, 20000), [] { return false; }, arena->get());
  REQUIRE(big.ok());
  CHECK_FALSE(big->in_arena);
  CHECK(big->parts.size() == 3);  // header, input_ids, attention_mask
  CHECK(metrics.step_arena_frame_fallbacks.load() == 1);
  auto first = builder.Build(0, PlanOf({2}, 5000), [] { return false; }, arena->get());
  REQUIRE(first.ok());
  REQUIRE(first->in_arena);  // 80 KB: the trainer holds it
  auto second = builder.Build(0, PlanOf({3}, 5000), [] { return false; }, arena->get());
  REQUIRE(second.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(second.status().message()).find("shm.step_arena_bytes") != std::string::npos);
}

// A sample with input_ids (`n` tokens) and two encoder inputs, "pixels" and
// "audio", of `m` elements each (all int64, values the id).
Sample Multimodal(uint64_t id, uint32_t n, uint32_t m) {
  Sample s = Tokens(id, n);
  for (const char* name : {"pixels", "audio"}) {
    std::vector<int64_t> values(m, static_cast<int64_t>(id));
    std::vector<uint8_t> raw(m * sizeof(int64_t));
    std::memcpy(raw.data(), values.data(), raw.size());
    auto frame = std::make_shared<VectorFrame>(std::move(raw));
    s.tensors.push_back({name, DType::kInt64, {m}, frame->bytes.data(), frame->bytes.size()});
    s.frames.push_back(frame);
  }
  return s;
}

template <typename T, typename R>
std::vector<T> ToVector(const R& repeated) {
  return std::vector<T>(repeated.begin(), repeated.end());
}

TEST_CASE("with per-phase plans each phase's route goes into its own header fields, its samples into its batch") {
  StepBuilderOptions options;
  options.rank = 0;
  options.phase_plans = true;
  options.encoder_fields = {"pixels"};
  options.audio_fields = {"audio"};
  DaemonState state(1 << 20, 100, 1);
  DaemonMetrics metrics;
  REQUIRE(!state.buffer.Add(Multimodal(1, 3, 4)));
  REQUIRE(!state.buffer.Add(Multimodal(2, 5, 2)));
  REQUIRE(!state.buffer.Add(Multimodal(3, 2, 6)));  // encoded here, trained on rank 1
  StepPlan plan = PlanOf({1, 2}, 8);
  PhaseRoute vision{{3, 1}, {0, 0}, {1, 0}, {0, 0}, {0, 1}};
  PhaseRoute audio{{2}, {0}, {0}, {1}, {1, 0}};
  plan.phase(EncoderPhase::kVision) = vision;
  plan.phase(EncoderPhase::kAudio) = audio;
  StepBuilder builder(options, state, metrics, nullptr);
  auto built = builder.Build(0, plan, [] { return false; });
  REQUIRE(built.ok());
  const wire::Step step = Header(built->parts[0]);
  CHECK(ToVector<uint64_t>(step.enc_sample_ids()) == vision.ids);
  CHECK(ToVector<int32_t>(step.enc_owner_ranks()) == vision.owners);
  CHECK(ToVector<int32_t>(step.enc_dest_rank()) == vision.dest_rank);
  CHECK(ToVector<uint32_t>(step.enc_dest_index()) == vision.dest_index);
  CHECK(ToVector<int32_t>(step.llm_src_rank()) == vision.src_rank);
  CHECK(ToVector<uint64_t>(step.audio_sample_ids()) == audio.ids);
  CHECK(ToVector<int32_t>(step.audio_owner_ranks()) == audio.owners);
  CHECK(ToVector<int32_t>(step.audio_dest_rank()) == audio.dest_rank);
  CHECK(ToVector<uint32_t>(step.audio_dest_index()) == audio.dest_index);
  CHECK(ToVector<int32_t>(step.llm_audio_src_rank()) == audio.src_rank);
  // The LLM batch without the encoder fields; each encoder batch holds its
  // phase's samples in route order (rows padded to the longest).
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const wire::TensorDesc& d : step.tensors()) shapes[d.name()] = ToVector<int64_t>(d.shape());
  CHECK(shapes.count("input_ids") == 1);
  CHECK(shapes.count("pixels") == 0);
  CHECK(shapes.count("audio") == 0);
  CHECK(shapes["enc.pixels"] == std::vector<int64_t>{2, 6});
  CHECK(shapes["audio.audio"] == std::vector<int64_t>{1, 2});
  CHECK(shapes.count("enc.audio") == 0);
  CHECK(shapes.count("audio.pixels") == 0);
}

}  // namespace
}  // namespace odb::emit
