#include "src/emit/step_encoder.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

namespace odb::emit {
namespace {

collate::BatchTensor Tensor(const std::string& name, DType dtype, std::vector<int64_t> shape, size_t bytes,
                            uint8_t fill) {
  return collate::BatchTensor{name, dtype, std::move(shape), std::vector<uint8_t>(bytes, fill)};
}

wire::DaemonMessage Header(const zmq::message_t& frame) {
  wire::DaemonMessage m;
  REQUIRE(m.ParseFromArray(frame.data(), static_cast<int>(frame.size())));
  return m;
}

TEST_CASE("a step is its header then one frame per tensor, the header naming each frame") {
  wire::Step step;
  step.set_step_index(7);
  step.add_sample_ids(41);
  std::vector<collate::BatchTensor> tensors;
  tensors.push_back(Tensor("input_ids", DType::kInt64, {2, 3}, 48, 0xAB));
  tensors.push_back(Tensor("attention_mask", DType::kInt64, {2, 3}, 48, 0x01));
  std::vector<zmq::message_t> parts = EncodeStep(step, std::move(tensors));
  REQUIRE(parts.size() == 3);
  wire::DaemonMessage m = Header(parts[0]);
  CHECK(m.version() == wire::PROTOCOL_VERSION_CURRENT);
  REQUIRE(m.has_step());
  CHECK(m.step().step_index() == 7);
  CHECK(m.step().sample_ids(0) == 41);
  REQUIRE(m.step().tensors_size() == 2);
  CHECK(m.step().tensors(0).name() == "input_ids");
  CHECK(m.step().tensors(0).frame() == 1);
  CHECK(m.step().tensors(1).name() == "attention_mask");
  CHECK(m.step().tensors(1).frame() == 2);
  CHECK(m.step().tensors(1).shape_size() == 2);
  REQUIRE(parts[1].size() == 48);
  CHECK(static_cast<const uint8_t*>(parts[1].data())[47] == 0xAB);
  CHECK(static_cast<const uint8_t*>(parts[2].data())[0] == 0x01);
}

TEST_CASE("a step's buffers go back to the pool once ZeroMQ releases its frames") {
  auto pool =
      std::make_shared<BufferPool>(/*min_bytes=*/1, /*max_free_buffers=*/8, /*max_free_bytes=*/1 << 20);
  std::vector<collate::BatchTensor> tensors;
  tensors.push_back(Tensor("a", DType::kInt32, {4}, 16, 1));
  tensors.push_back(Tensor("b", DType::kInt32, {2}, 8, 2));
  {
    std::vector<zmq::message_t> parts = EncodeStep(wire::Step(), std::move(tensors), pool);
    CHECK(pool->free_buffers() == 0);  // ZeroMQ holds them
  }
  CHECK(pool->free_buffers() == 2);
}

TEST_CASE("an arena step is the header alone, naming the block and each tensor's place in it") {
  std::vector<collate::BatchTensorLayout> layout(2);
  layout[0].name = "input_ids";
  layout[0].dtype = DType::kInt64;
  layout[0].shape = {1, 4};
  layout[0].size_bytes = 32;
  layout[1].name = "labels";
  layout[1].dtype = DType::kInt64;
  layout[1].shape = {1, 4};
  layout[1].size_bytes = 32;
  ArenaPlacement where{
      .generation = 3, .block_offset = 4096, .block_length = 128, .tensor_offsets = {4096, 4160}};
  std::vector<zmq::message_t> parts = EncodeArenaStep(wire::Step(), layout, where);
  REQUIRE(parts.size() == 1);
  wire::DaemonMessage m = Header(parts[0]);
  REQUIRE(m.step().tensors_size() == 2);
  CHECK(m.step().tensors(0).frame() == 0);
  CHECK(m.step().tensors(1).offset() == 4160);
  CHECK(m.step().tensors(1).length() == 32);
  CHECK(m.step().arena().generation() == 3);
  CHECK(m.step().arena().offset() == 4096);
  CHECK(m.step().arena().length() == 128);
}

TEST_CASE("a control message is one frame") {
  wire::DaemonMessage summary;
  summary.set_version(wire::PROTOCOL_VERSION_CURRENT);
  summary.mutable_epoch_end()->set_emitted(5);
  std::vector<zmq::message_t> parts = EncodeControl(summary);
  REQUIRE(parts.size() == 1);
  CHECK(Header(parts[0]).epoch_end().emitted() == 5);
}

}  // namespace
}  // namespace odb::emit
