#include "src/ingest/decoder.h"

#include <memory>
#include <optional>

#include <google/protobuf/arena.h>


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

// A producer id over the limit is not echoed: its first bytes say whose it is.
std::string IdPrefix(const std::string& id) {
  constexpr size_t kShown = 32;
  return "'" + id.substr(0, kShown) + (id.size() > kShown ? "...'" : "'");
}

// Null when `producer_id` is within the limit, else the rejection (TOO_LARGE).
std::optional<RejectEvent> CheckProducerId(const std::string& producer_id,
                                           const DecodeOptions& options, const std::string& what) {
  if (producer_id.size() <= options.max_producer_id_bytes) return std::nullopt;
  return MakeReject(wire::TOO_LARGE,
                    what + ": producer_id " + IdPrefix(producer_id) + " has " +
                        std::to_string(producer_id.size()) + " bytes, over the limit of " +
                        std::to_string(options.max_producer_id_bytes) + "; use a shorter id");
}

IngestEvent DecodeSample(const wire::SampleHeader& h, std::vector<zmq::message_t>&& parts,
                         const DecodeOptions& options, const ArenaContext& arenas) {
  const uint64_t id = h.sample_id();
  // An arena block is taken first: from here on, any rejection drops
  // `block.holder`, which hands the block back to the producer.
  ArenaBlockSource::Acquired block;
  const bool in_arena = h.has_arena();
  if (in_arena) {
    auto reject_block = [&](wire::ErrorCode code, const std::string& why) -> IngestEvent {
      // The producer id is echoed only within the limit (it is refused below otherwise).
      const std::string producer =
          h.producer_id().size() <= options.max_producer_id_bytes ? h.producer_id() : h.producer_id().substr(0, 32) + "...";
      RejectEvent e = MakeReject(code, "sample " + std::to_string(id) + " from producer '" + producer + "': " + why,
                                 producer, &id);
      e.epoch = h.epoch();
      e.has_epoch = true;
      if (h.has_seq()) e.seq = h.seq();
      return e;
    };
    if (parts.size() != 1) {
      return reject_block(wire::FRAME_COUNT_MISMATCH,
                          "its tensors are in arena block (arena " + std::to_string(h.arena().arena_id()) +
                              ") but the message also carries " + std::to_string(parts.size() - 1) +
                              " payload frames; send one or the other");
    }
    if (arenas.source == nullptr) {
      return reject_block(wire::INVALID_ARENA_BLOCK,
                          "arena blocks are accepted only from local producers on the daemon's ingest "
                          "sockets; send the payload as frames");
    }
    absl::StatusOr<ArenaBlockSource::Acquired> acquired = arenas.source->Acquire(arenas.producer_id, h.arena());
    if (!acquired.ok()) return reject_block(wire::INVALID_ARENA_BLOCK, std::string(acquired.status().message()));
    block = std::move(*acquired);
  }
  if (auto too_large = CheckProducerId(h.producer_id(), options,
                                        "sample " + std::to_string(id))) {
    too_large->rejection.set_sample_id(id);
    too_large->rejection.set_has_sample_id(true);
    too_large->epoch = h.epoch();
    too_large->has_epoch = true;
    return *too_large;
  }
  auto reject = [&](wire::ErrorCode code, const std::string& why) -> IngestEvent {
    RejectEvent e = MakeReject(code, "sample " + std::to_string(id) + " from producer '" +
                                         h.producer_id() + "': " + why,
                               h.producer_id(), &id);
    e.epoch = h.epoch();
    e.has_epoch = true;
    if (h.has_seq()) e.seq = h.seq();
    return e;
  };
  if (h.has_daemon_key() && !options.accept_daemon_key) {
    return reject(wire::MALFORMED_HEADER, "sets daemon_key (" + std::to_string(h.daemon_key()) +
                                              "), a field only daemons send each other; leave it unset");
  }
  if (h.tokens() == 0) {
    return reject(wire::ZERO_LENGTH,
                  "token length is 0; every sample needs at least one token (filter empty samples "
                  "in preprocessing)");
  }
  const size_t payload_frames = parts.size() - 1;
  wire::ErrorCode code = wire::MALFORMED_HEADER;
  absl::StatusOr<std::vector<wire::DecodedTensorDesc>> descs;
  if (in_arena) {
    descs = wire::DecodeArenaTensorDescs(h.tensors(), h.arena().offset(), h.arena().length(),
                                         options.tensor_limits, &code);
  } else {
    std::vector<size_t> frame_sizes(payload_frames);
    for (size_t f = 0; f < payload_frames; ++f) frame_sizes[f] = parts[f + 1].size();
    descs = wire::DecodeTensorDescs(h.tensors(), frame_sizes, options.tensor_limits, &code);
  }
  if (!descs.ok()) return reject(code, std::string(descs.status().message()));

  Sample sample;
  sample.tensors.reserve(descs->size());
  sample.meta.id = id;
  sample.meta.lengths = {h.tokens(), h.vision_patches(), h.audio_frames()};
  sample.epoch = h.epoch();
  sample.producer_id = h.producer_id();
  if (h.has_seq()) sample.seq = h.seq();
  if (h.has_daemon_key()) {
    // Keyed apart by the owner rank's buffer (see Sample::user_id); only a
    // peer daemon's (DecodeOptions::accept_daemon_key).
    sample.user_id = id;
    sample.meta.id = h.daemon_key();
  }
  if (h.has_loss_tokens()) {
    if (h.loss_tokens() > h.tokens()) {
      return reject(wire::TOKENS_MISMATCH, "loss_tokens " + std::to_string(h.loss_tokens()) + " > tokens " +
                                               std::to_string(h.tokens()) +
                                               ": count the labels not equal to the ignore index");
    }
    sample.meta.loss_tokens = h.loss_tokens();
  }
  for (wire::DecodedTensorDesc& desc : *descs) {
    TensorView view;
    view.name = std::move(desc.name);
    view.dtype = desc.dtype;
    view.shape = std::move(desc.shape);
    sample.tensors.push_back(std::move(view));
  }
  // Budgets and padding are computed from `tokens`, the batch from the
  // length field's rows: they must agree, or a small sample could claim
  // 1 token and make its step pad every row to its real length.
  if (const TensorView* length = sample.FindTensor(options.length_field)) {
    if (length->shape.empty()) {
      return reject(wire::TOKENS_MISMATCH,
                    "length field '" + options.length_field +
                        "' is a scalar; its dim 0 must be the sample's token count");
    }
    if (length->shape[0] != static_cast<int64_t>(h.tokens())) {
      return reject(wire::TOKENS_MISMATCH,
                    "header says tokens " + std::to_string(h.tokens()) + " but length field '" +
                        options.length_field + "' has " + std::to_string(length->shape[0]) +
                        " rows (dim 0); they must be equal");
    }
  }
  if (in_arena) {
    // The views point into the mapped block; the holder returns it when the
    // sample is gone (collated, rejected later, or dropped with its epoch).
    for (size_t t = 0; t < sample.tensors.size(); ++t) {
      const wire::DecodedTensorDesc& desc = (*descs)[t];
      sample.tensors[t].data = block.data + (desc.offset - h.arena().offset());
      sample.tensors[t].size_bytes = desc.size_bytes;
      sample.meta.payload_bytes += desc.size_bytes;
    }
    sample.frames.push_back(std::move(block.holder));
    return SampleEvent{std::move(sample)};
  }
  // Move the payload frames in (one holder for all of them, sized exactly:
  // it lives as long as the sample is buffered); the views point into them
  // from now on. Holder index i is frame i + 1.
  std::vector<zmq::message_t> payload;
  payload.reserve(payload_frames);
  for (size_t f = 1; f < parts.size(); ++f) payload.push_back(std::move(parts[f]));
  auto holder = std::make_shared<ZmqFrames>(std::move(payload));
  for (size_t t = 0; t < sample.tensors.size(); ++t) {
    const uint32_t frame = (*descs)[t].frame;
    sample.tensors[t].data = holder->data(frame - 1);
    sample.tensors[t].size_bytes = holder->size(frame - 1);
    sample.meta.payload_bytes += holder->size(frame - 1);
  }
  sample.frames.push_back(std::move(holder));
  return SampleEvent{std::move(sample)};
}

}  // namespace

IngestEvent DecodeProducerMessage(std::vector<zmq::message_t>&& parts, const DecodeOptions& options,
                                  const ArenaContext& arenas) {
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
  return DecodeParsedProducerMessage(msg, std::move(parts), options, arenas);
}

IngestEvent DecodeParsedProducerMessage(const wire::ProducerMessage& msg, std::vector<zmq::message_t>&& parts,
                                        const DecodeOptions& options, const ArenaContext& arenas) {
  if (parts.empty()) return MakeReject(wire::MALFORMED_HEADER, "empty message");
  if (msg.version() != wire::PROTOCOL_VERSION_CURRENT) {
    std::string producer;
    uint64_t sample_id = 0;
    const uint64_t* id = nullptr;
    if (msg.has_sample()) {
      // An over-long id is not echoed (it is refused anyway once versions match).
      if (msg.sample().producer_id().size() <= options.max_producer_id_bytes) {
        producer = msg.sample().producer_id();
      }
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
      if (auto too_large = CheckProducerId(msg.hello().producer_id(), options, "hello")) {
        return *too_large;
      }
      return HelloEvent{msg.hello().producer_id(), msg.hello().rank()};
    case wire::ProducerMessage::kStartEpoch:
      if (auto too_large = CheckProducerId(msg.start_epoch().producer_id(), options,
                                           "start_epoch")) {
        return *too_large;
      }
      return StartEpochEvent{msg.start_epoch().producer_id(), msg.start_epoch().epoch()};
    case wire::ProducerMessage::kEndStream:
      if (auto too_large = CheckProducerId(msg.end_stream().producer_id(), options,
                                           "end_stream")) {
        return *too_large;
      }
      if (parts.size() != 1) {
        return MakeReject(wire::FRAME_COUNT_MISMATCH, "end_stream message carries extra frames",
                          msg.end_stream().producer_id());
      }
      return EndStreamEvent{msg.end_stream().producer_id(), msg.end_stream().epoch(),
                            msg.end_stream().samples_sent()};
    case wire::ProducerMessage::kSample:
      return DecodeSample(msg.sample(), std::move(parts), options, arenas);
    default:
      return MakeReject(wire::MALFORMED_HEADER, "header has no message kind");
  }
}

}  // namespace odb::ingest
