#include "src/emit/step_builder.h"

#include <catch2/catch.hpp>
#include <cstring>

namespace odb::emit {
namespace {

class VectorFrame : public FrameHolder {
 public:
  explicit VectorFrame(std::vector<uint8_t> bytes) : bytes(std::move(bytes)) {}
  std::vector<uint8_t> bytes;
};

Sample Tokens(uint64_t id, uint32_t n) {
  std::vector<int64_t> values(n, static_cast<int64_t>(id));
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
  DaemonConfig config;
  config.rank = 0;
  DaemonState state(1 << 20, 100, 1);
  DaemonMetrics metrics;
  REQUIRE(!state.buffer.Add(Tokens(1, 3)));
  REQUIRE(!state.buffer.Add(Tokens(2, 5)));
  StepBuilder builder(config, state, metrics, nullptr);
  auto parts = builder.Build(0, PlanOf({1, 2}, 8), [] { return false; });
  REQUIRE(parts.ok());
  wire::DaemonMessage m;
  REQUIRE(m.ParseFromArray((*parts)[0].data(), static_cast<int>((*parts)[0].size())));
  REQUIRE(m.step().sample_ids_size() == 2);
  REQUIRE(m.step().loss_weight() == 1.0);
  REQUIRE(state.epoch_totals[0].emitted() == 2);
}

TEST_CASE("a step that cannot be collated stops the job instead of breaking the weights") {
  // Before, the rank emitted the step as IDLE with weight 0 while the other
  // ranks' weights counted its tokens: Σ_r w_r fell below W, silently.
  DaemonConfig config;
  config.rank = 0;
  config.collate.max_batch_tensor_bytes = 16;  // a resource limit the step exceeds
  DaemonState state(1 << 20, 100, 1);
  DaemonMetrics metrics;
  REQUIRE(!state.buffer.Add(Tokens(1, 3)));
  REQUIRE(!state.buffer.Add(Tokens(2, 5)));
  StepBuilder builder(config, state, metrics, nullptr);
  auto parts = builder.Build(0, PlanOf({1, 2}, 8), [] { return false; });
  REQUIRE(parts.status().code() == absl::StatusCode::kAborted);
  REQUIRE(std::string(parts.status().message()).find("samples 1, 2") != std::string::npos);
  REQUIRE(std::string(parts.status().message()).find("sum to W") != std::string::npos);
  REQUIRE(state.epoch_totals[0].steps() == 0);  // no IDLE step stands in for it
}

}  // namespace
}  // namespace odb::emit
