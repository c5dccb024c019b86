#include "src/emit/step_encoder.h"

#include <memory>

#include "src/wire/tensor_codec.h"

namespace odb::emit {
namespace {

zmq::message_t Serialize(const wire::DaemonMessage& message) {
  std::string bytes = message.SerializeAsString();
  return zmq::message_t(bytes.data(), bytes.size());
}

// A tensor buffer owned by ZeroMQ until its free callback runs (on ZeroMQ's
// I/O thread, possibly after the daemon's own objects are gone: the pool is
// shared, not borrowed).
struct OwnedBuffer {
  std::vector<uint8_t> bytes;
  std::shared_ptr<BufferPool> pool;
};

void FreeOwnedBuffer(void*, void* hint) {
  auto* owned = static_cast<OwnedBuffer*>(hint);
  if (owned->pool != nullptr) owned->pool->Release(std::move(owned->bytes));
  delete owned;
}

}  // namespace

std::vector<zmq::message_t> EncodeStep(wire::Step step, std::vector<collate::BatchTensor>&& tensors,
                                       std::shared_ptr<BufferPool> buffers) {
  step.clear_tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    wire::EncodeTensorDesc(tensors[i].name, tensors[i].dtype, tensors[i].shape,
                           static_cast<uint32_t>(i + 1), step.add_tensors());
  }
  wire::DaemonMessage message;
  message.set_version(wire::PROTOCOL_VERSION_CURRENT);
  *message.mutable_step() = std::move(step);

  std::vector<zmq::message_t> parts;
  parts.reserve(tensors.size() + 1);
  parts.push_back(Serialize(message));
  for (auto& tensor : tensors) {
    // Zero copy: ZeroMQ releases the buffer when the frame has been sent.
    auto* owned = new OwnedBuffer{std::move(tensor.bytes), buffers};
    parts.emplace_back(owned->bytes.data(), owned->bytes.size(), &FreeOwnedBuffer, owned);
  }
  return parts;
}

std::vector<zmq::message_t> EncodeArenaStep(wire::Step step, const std::vector<collate::BatchTensorLayout>& tensors,
                                            const ArenaPlacement& where) {
  step.clear_tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    wire::TensorDesc* d = step.add_tensors();
    wire::EncodeTensorDesc(tensors[i].name, tensors[i].dtype, tensors[i].shape, /*frame=*/0, d);
    d->set_offset(where.tensor_offsets[i]);
    d->set_length(tensors[i].size_bytes);
  }
  step.mutable_arena()->set_generation(where.generation);
  step.mutable_arena()->set_offset(where.block_offset);
  step.mutable_arena()->set_length(where.block_length);
  wire::DaemonMessage message;
  message.set_version(wire::PROTOCOL_VERSION_CURRENT);
  *message.mutable_step() = std::move(step);
  std::vector<zmq::message_t> parts;
  parts.push_back(Serialize(message));
  return parts;
}

std::vector<zmq::message_t> EncodeControl(const wire::DaemonMessage& message) {
  std::vector<zmq::message_t> parts;
  parts.push_back(Serialize(message));
  return parts;
}

}  // namespace odb::emit
