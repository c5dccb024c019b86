#include "src/ingest/decoder.h"

#include <memory>

#include <google/protobuf/arena.h>

#include "src/common/dtype.h"

namespace odb::ingest {

RejectEvent MakeReject(wire::ErrorCode code, const std::string& message,
                       const std::string& producer_id, const uint64_t* sample_id) {
  RejectEvent e;
  e.rejection.set_code(code);
  e.rejection.set_message(message);
  e.rejection.set_producer_id(producer_id);
  if (sample_id != nullptr) {
    e.rejection.set_sample_id(*sample_id);
    e.rejection.set_has_sample_id(true);
  }
  return e;
}

namespace {

IngestEvent DecodeSample(const wire::SampleHeader& h, std::vector<zmq::message_t>&& parts) {
  const uint64_t id = h.sample_id();
  auto reject = [&](wire::ErrorCode code, const std::string& why) -> IngestEvent {
    RejectEvent e = MakeReject(code, "sample " + std::to_string(id) + " from producer '" +
                                         h.producer_id() + "': " + why,
                               h.producer_id(), &id);
    e.epoch = h.epoch();
    e.has_epoch = true;
    return e;
  };
  if (h.tokens() == 0) {
    return reject(wire::ZERO_LENGTH,
                  "token length is 0; every sample needs at least one token (filter empty samples "
                  "in preprocessing)");
  }
  const size_t payload_frames = parts.size() - 1;
  if (static_cast<size_t>(h.tensors_size()) != payload_frames) {
    return reject(wire::FRAME_COUNT_MISMATCH,
                  "header lists " + std::to_string(h.tensors_size()) + " tensors but the message has " +
                      std::to_string(payload_frames) + " payload frames");
  }
  // Frame indices are 1..payload_frames; a message has few frames, but any
  // count is handled (bit i of used_frames, or a vector beyond 64).
  uint64_t used_frames = 0;
  std::vector<bool> used_beyond_64;
  auto frame_seen = [&](uint32_t frame) -> bool {
    if (frame < 64) {
      const bool seen = (used_frames >> frame) & 1;
      used_frames |= uint64_t{1} << frame;
      return seen;
    }
    if (used_beyond_64.empty()) used_beyond_64.assign(parts.size(), false);
    const bool seen = used_beyond_64[frame];
    used_beyond_64[frame] = true;
    return seen;
  };
  Sample sample;
  sample.tensors.reserve(h.tensors_size());
  sample.meta.id = id;
  sample.meta.lengths = {h.tokens(), h.vision_patches(), h.audio_frames()};
  sample.epoch = h.epoch();
  sample.producer_id = h.producer_id();
  for (const auto& desc : h.tensors()) {
    auto field = [&] { return "tensor '" + desc.name() + "'"; };  // for errors only
    if (desc.name().empty()) return reject(wire::MALFORMED_HEADER, "a tensor has an empty name");
    if (sample.FindTensor(desc.name()) != nullptr) {
      return reject(wire::MALFORMED_HEADER, field() + " appears twice");
    }
    if (!IsValidDType(static_cast<uint32_t>(desc.dtype()))) {
      return reject(wire::UNKNOWN_DTYPE, field() + " has unknown dtype code " +
                                             std::to_string(static_cast<int>(desc.dtype())));
    }
    if (desc.frame() < 1 || desc.frame() >= parts.size()) {
      return reject(wire::FRAME_COUNT_MISMATCH,
                    field() + " points at frame " + std::to_string(desc.frame()) +
                        " but frames 1.." + std::to_string(payload_frames) + " exist");
    }
    if (frame_seen(desc.frame())) {
      return reject(wire::FRAME_COUNT_MISMATCH,
                    field() + " reuses frame " + std::to_string(desc.frame()));
    }
    TensorView view;
    view.name = desc.name();
    view.dtype = static_cast<DType>(desc.dtype());
    view.shape.reserve(desc.shape_size());
    int64_t numel = 1;
    for (int64_t d : desc.shape()) {
      if (d < 0 || d > (int64_t{1} << 40)) {
        return reject(wire::SHAPE_SIZE_MISMATCH, field() + " has invalid dimension " + std::to_string(d));
      }
      numel *= d;
      view.shape.push_back(d);
    }
    const size_t expected = static_cast<size_t>(numel) * DTypeSize(view.dtype);
    const size_t actual = parts[desc.frame()].size();
    if (expected != actual) {
      std::string shape;
      for (int64_t d : view.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
      return reject(wire::SHAPE_SIZE_MISMATCH,
                    field() + " declares shape [" + shape + "] of " + std::string(DTypeName(view.dtype)) +
                        " = " + std::to_string(expected) + " bytes, but its frame has " +
                        std::to_string(actual) + " bytes");
    }
    sample.tensors.push_back(std::move(view));
  }
  // Move the payload frames in (one holder for all of them, sized exactly:
  // it lives as long as the sample is buffered); the views point into them
  // from now on. Holder index i is frame i + 1.
  std::vector<zmq::message_t> payload;
  payload.reserve(payload_frames);
  for (size_t f = 1; f < parts.size(); ++f) payload.push_back(std::move(parts[f]));
  auto holder = std::make_shared<ZmqFrames>(std::move(payload));
  for (size_t t = 0; t < sample.tensors.size(); ++t) {
    const uint32_t frame = h.tensors(static_cast<int>(t)).frame();
    sample.tensors[t].data = holder->data(frame - 1);
    sample.tensors[t].size_bytes = holder->size(frame - 1);
    sample.meta.payload_bytes += holder->size(frame - 1);
  }
  sample.frames.push_back(std::move(holder));
  return SampleEvent{std::move(sample)};
}

}  // namespace

IngestEvent DecodeProducerMessage(std::vector<zmq::message_t>&& parts) {
  if (parts.empty()) return MakeReject(wire::MALFORMED_HEADER, "empty message");
  // The header lives on a stack-backed arena: no heap allocation or per-field
  // destruction per message (they were a quarter of the daemon's ingest cost).
  alignas(16) char block[2048];
  google::protobuf::ArenaOptions arena_options;
  arena_options.initial_block = block;
  arena_options.initial_block_size = sizeof(block);
  google::protobuf::Arena arena(arena_options);
  wire::ProducerMessage& msg = *google::protobuf::Arena::CreateMessage<wire::ProducerMessage>(&arena);
  if (!msg.ParseFromArray(parts[0].data(), static_cast<int>(parts[0].size()))) {
    return MakeReject(wire::MALFORMED_HEADER,
                      "first frame (" + std::to_string(parts[0].size()) +
                          " bytes) is not a ProducerMessage header");
  }
  if (msg.version() != wire::PROTOCOL_VERSION_CURRENT) {
    std::string producer;
    uint64_t sample_id = 0;
    const uint64_t* id = nullptr;
    if (msg.has_sample()) {
      producer = msg.sample().producer_id();
      sample_id = msg.sample().sample_id();
      id = &sample_id;
    }
    return MakeReject(wire::VERSION_MISMATCH,
                      "producer speaks protocol version " + std::to_string(msg.version()) +
                          ", this daemon speaks " + std::to_string(wire::PROTOCOL_VERSION_CURRENT) +
                          "; upgrade the client and the daemon together",
                      producer, id);
  }
  switch (msg.kind_case()) {
    case wire::ProducerMessage::kHello:
      if (msg.hello().producer_id().empty()) {
        return MakeReject(wire::MALFORMED_HEADER, "hello without a producer_id");
      }
      return HelloEvent{msg.hello().producer_id(), msg.hello().rank()};
    case wire::ProducerMessage::kStartEpoch:
      return StartEpochEvent{msg.start_epoch().producer_id(), msg.start_epoch().epoch()};
    case wire::ProducerMessage::kEndStream:
      if (parts.size() != 1) {
        return MakeReject(wire::FRAME_COUNT_MISMATCH, "end_stream message carries extra frames",
                          msg.end_stream().producer_id());
      }
      return EndStreamEvent{msg.end_stream().producer_id(), msg.end_stream().epoch(),
                            msg.end_stream().samples_sent()};
    case wire::ProducerMessage::kSample:
      return DecodeSample(msg.sample(), std::move(parts));
    default:
      return MakeReject(wire::MALFORMED_HEADER, "header has no message kind");
  }
}

}  // namespace odb::ingest
