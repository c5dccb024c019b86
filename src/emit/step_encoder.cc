#include "src/emit/step_encoder.h"

#include <memory>

namespace odb::emit {
namespace {

zmq::message_t Serialize(const wire::DaemonMessage& message) {
  std::string bytes = message.SerializeAsString();
  return zmq::message_t(bytes.data(), bytes.size());
}

}  // namespace

std::vector<zmq::message_t> EncodeStep(wire::Step step, std::vector<collate::BatchTensor>&& tensors) {
  step.clear_tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    wire::TensorDesc* desc = step.add_tensors();
    desc->set_name(tensors[i].name);
    desc->set_dtype(static_cast<wire::DType>(tensors[i].dtype));
    for (int64_t d : tensors[i].shape) desc->add_shape(d);
    desc->set_frame(static_cast<uint32_t>(i + 1));
  }
  wire::DaemonMessage message;
  message.set_version(wire::PROTOCOL_VERSION_CURRENT);
  *message.mutable_step() = std::move(step);

  std::vector<zmq::message_t> parts;
  parts.reserve(tensors.size() + 1);
  parts.push_back(Serialize(message));
  for (auto& tensor : tensors) {
    // Zero copy: ZeroMQ frees the vector when the frame has been sent.
    auto* owned = new std::vector<uint8_t>(std::move(tensor.bytes));
    parts.emplace_back(owned->data(), owned->size(),
                       [](void*, void* hint) { delete static_cast<std::vector<uint8_t>*>(hint); },
                       owned);
  }
  return parts;
}

std::vector<zmq::message_t> EncodeControl(const wire::DaemonMessage& message) {
  std::vector<zmq::message_t> parts;
  parts.push_back(Serialize(message));
  return parts;
}

}  // namespace odb::emit
