#include "client/cpp/src/delivery_decoder.h"

#include "proto/odb.pb.h"
#include "src/wire/tensor_codec.h"

namespace odb::client {
namespace {

Rejection FromWire(const wire::Rejection& r) {
  Rejection out;
  out.code = wire::ErrorCode_Name(r.code());
  out.has_sample_id = r.has_sample_id();
  out.sample_id = r.sample_id();
  out.producer_id = r.producer_id();
  out.message = r.message();
  return out;
}

// The tensors of a step whose bytes are in a block of the step arena.
absl::StatusOr<Delivery> DecodeArenaStep(Delivery d, const wire::Step& st,
                                         std::shared_ptr<std::vector<zmq::message_t>> frames,
                                         const std::string& where, const BlockResolver& resolve_block) {
  if (frames->size() != 1) {
    return absl::DataLossError(where + ": a step in the step arena carries " + std::to_string(frames->size() - 1) +
                               " tensor frame(s) as well");
  }
  if (!resolve_block) {
    return absl::DataLossError(where + ": the step is in a step arena this client has not mapped");
  }
  const wire::StepArenaBlock& b = st.arena();
  auto descs = wire::DecodeArenaTensorDescs(st.tensors(), b.offset(), b.length());
  if (!descs.ok()) return absl::DataLossError(where + ": " + std::string(descs.status().message()));
  absl::StatusOr<ResolvedBlock> block = resolve_block(b.generation(), b.offset(), b.length());
  if (!block.ok()) return absl::DataLossError(where + ": " + std::string(block.status().message()));
  d.tensors.reserve(descs->size());
  for (wire::DecodedTensorDesc& desc : *descs) {
    TensorView v;
    v.name = std::move(desc.name);
    v.dtype = static_cast<DType>(desc.dtype);
    v.shape = std::move(desc.shape);
    v.data = block->data + (desc.offset - b.offset());  // inside the block: checked above
    v.size_bytes = desc.size_bytes;
    d.tensors.push_back(std::move(v));
  }
  // The header frame and the block live as long as any tensor view.
  d.frames = std::make_shared<std::pair<std::shared_ptr<std::vector<zmq::message_t>>, std::shared_ptr<void>>>(
      std::move(frames), std::move(block->holder));
  return d;
}

}  // namespace

const TensorView* Delivery::Find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<Delivery> DecodeDelivery(std::shared_ptr<std::vector<zmq::message_t>> frames,
                                        const std::string& endpoint_for_errors,
                                        const BlockResolver& resolve_block) {
  if (frames == nullptr || frames->empty()) {
    return absl::DataLossError("empty message from the daemon at " + endpoint_for_errors);
  }
  wire::DaemonMessage message;
  const zmq::message_t& head = frames->front();
  if (!message.ParseFromArray(head.data(), static_cast<int>(head.size()))) {
    return absl::DataLossError("unreadable message from the daemon at " + endpoint_for_errors);
  }
  if (message.version() != wire::PROTOCOL_VERSION_CURRENT) {
    return absl::FailedPreconditionError(
        "daemon at " + endpoint_for_errors + " speaks protocol version " +
        std::to_string(message.version()) + ", this client speaks " +
        std::to_string(wire::PROTOCOL_VERSION_CURRENT) + "; upgrade both together");
  }
  Delivery d;
  if (message.has_fatal()) {
    return absl::AbortedError("odbd rank " + std::to_string(message.fatal().rank()) + " failed (" +
                              wire::ErrorCode_Name(message.fatal().code()) +
                              "): " + message.fatal().message());
  }
  if (message.has_epoch_end()) {
    const wire::EpochSummary& s = message.epoch_end();
    d.kind = Delivery::Kind::kEpochEnd;
    d.summary.epoch = s.epoch();
    d.summary.received = s.received();
    d.summary.emitted = s.emitted();
    d.summary.rejected = s.rejected();
    d.summary.steps = s.steps();
    d.summary.idle_steps = s.idle_steps();
    d.summary.real_tokens = s.real_tokens();
    d.summary.padded_tokens = s.padded_tokens();
    d.summary.rejections_are_errors = s.rejections_are_errors();
    for (const auto& r : s.rejections()) d.summary.rejections.push_back(FromWire(r));
    d.summary.not_emitted_ids.assign(s.not_emitted_ids().begin(), s.not_emitted_ids().end());
    return d;
  }
  if (message.has_session_ack()) {
    d.kind = Delivery::Kind::kSessionAck;
    if (message.session_ack().has_settings()) {
      const wire::JobSettings& s = message.session_ack().settings();
      JobSettings& out = d.settings.emplace();
      out.tokens_per_step = s.tokens_per_step();
      out.packed = s.packed();
      out.trainer_data_plane = s.trainer_data_plane();
      out.length_field = s.length_field();
      if (s.has_ignore_index()) out.ignore_index = s.ignore_index();
    }
    return d;
  }
  if (!message.has_step()) {
    return absl::DataLossError("message from the daemon carries neither a step nor an epoch end");
  }
  const wire::Step& st = message.step();
  d.kind = Delivery::Kind::kStep;
#define ODB_GET_STEP_FIELD(type, name, dflt, doc) d.step.name = st.name();
  ODB_STEP_FIELDS(ODB_GET_STEP_FIELD)
#undef ODB_GET_STEP_FIELD
  d.step.epoch = st.epoch();
  for (const auto& r : st.rejections()) d.step.rejections.push_back(FromWire(r));
#define ODB_GET_STEP_JOB_FIELD(type, name, dflt, doc) d.step.name = st.name();
  ODB_STEP_JOB_FIELDS(ODB_GET_STEP_JOB_FIELD)
#undef ODB_GET_STEP_JOB_FIELD
  // The lists, from the one list of step fields. Consumers index them in
  // parallel: they must agree in length (a refusal names every list's size).
  const int n = st.sample_ids_size();
  bool agree = true;
  std::string sizes;
  auto list_size = [&](const char* name, int size, bool ok) {
    agree = agree && ok;
    sizes += (sizes.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(size);
  };
#define ODB_GET_SAMPLE_FIELD(type, name, value, always, doc) \
  d.step.name.assign(st.name().begin(), st.name().end());    \
  list_size(#name, st.name##_size(), st.name##_size() == n || (!(always) && st.name##_size() == 0));
  // An optional entry: unknown where absent, and everywhere when a daemon
  // older than the field sends neither list.
#define ODB_GET_OPTIONAL_SAMPLE_FIELD(type, name, present, value, doc)                     \
  list_size(#name, st.name##_size(), st.name##_size() == n || st.name##_size() == 0);      \
  list_size(#present, st.present##_size(), st.present##_size() == st.name##_size());       \
  d.step.name.reserve(n);                                                                  \
  for (int i = 0; i < n; ++i) {                                                            \
    const bool known = st.name##_size() == n && st.present##_size() == n && st.present(i); \
    d.step.name.push_back(known ? std::optional<type>(st.name(i)) : std::nullopt);         \
  }
  ODB_STEP_SAMPLE_FIELDS(ODB_GET_SAMPLE_FIELD, ODB_GET_OPTIONAL_SAMPLE_FIELD)
#undef ODB_GET_OPTIONAL_SAMPLE_FIELD
#undef ODB_GET_SAMPLE_FIELD
  // Each phase's encoder-order lists are as long as its first; its LLM-order
  // list is empty or as long as sample_ids.
  for (const bool vision : {true, false}) {
    int encoded = -1;
#define ODB_GET_ROUTE_FIELD(type, vision_name, audio_name, llm_order, value, doc)                        \
  {                                                                                                      \
    const auto& wire_list = vision ? st.vision_name() : st.audio_name();                                 \
    (vision ? d.step.vision_name : d.step.audio_name).assign(wire_list.begin(), wire_list.end());        \
    if (!(llm_order) && encoded < 0) encoded = wire_list.size();                                         \
    list_size(vision ? #vision_name : #audio_name, wire_list.size(),                                     \
              (llm_order) ? (wire_list.empty() || wire_list.size() == n) : wire_list.size() == encoded); \
  }
    ODB_STEP_ROUTE_FIELDS(ODB_GET_ROUTE_FIELD)
#undef ODB_GET_ROUTE_FIELD
  }
  if (!agree) {
    return absl::DataLossError("step " + std::to_string(st.step_index()) + " from the daemon at " +
                               endpoint_for_errors + ": per-sample lists disagree in length (" + sizes + ")");
  }

  const std::string where = "step " + std::to_string(st.step_index()) + " of epoch " +
                            std::to_string(st.epoch()) + " from the daemon at " + endpoint_for_errors;
  if (st.has_arena()) return DecodeArenaStep(std::move(d), st, std::move(frames), where, resolve_block);
  std::vector<size_t> frame_sizes;
  frame_sizes.reserve(frames->size() - 1);
  for (size_t f = 1; f < frames->size(); ++f) frame_sizes.push_back((*frames)[f].size());
  auto descs = wire::DecodeTensorDescs(st.tensors(), frame_sizes);
  if (!descs.ok()) return absl::DataLossError(where + ": " + std::string(descs.status().message()));
  d.tensors.reserve(descs->size());
  for (wire::DecodedTensorDesc& desc : *descs) {
    const zmq::message_t& f = (*frames)[desc.frame];
    TensorView v;
    v.name = std::move(desc.name);
    v.dtype = static_cast<DType>(desc.dtype);  // same codes as the wire
    v.shape = std::move(desc.shape);
    v.data = static_cast<const uint8_t*>(f.data());
    v.size_bytes = f.size();
    d.tensors.push_back(std::move(v));
  }
  d.frames = std::move(frames);
  return d;
}

}  // namespace odb::client
