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
  d.step.sample_ids.assign(st.sample_ids().begin(), st.sample_ids().end());
  d.step.lengths.assign(st.lengths().begin(), st.lengths().end());
  d.step.owner_ranks.assign(st.owner_ranks().begin(), st.owner_ranks().end());
  if (st.seqs_size() == st.sample_ids_size() && st.has_seq_size() == st.sample_ids_size()) {
    d.step.seqs.reserve(st.seqs_size());
    for (int i = 0; i < st.seqs_size(); ++i) {
      d.step.seqs.push_back(st.has_seq(i) ? std::optional<uint64_t>(st.seqs(i)) : std::nullopt);
    }
  } else {
    // A daemon older than the fields sends neither list: every seq unknown.
    d.step.seqs.assign(st.sample_ids_size(), std::nullopt);
  }
  d.step.samples_may_move = st.samples_may_move();
  d.step.deterministic = st.deterministic();
  d.step.rejections_are_errors = st.rejections_are_errors();
  for (const auto& r : st.rejections()) d.step.rejections.push_back(FromWire(r));
  d.step.enc_sample_ids.assign(st.enc_sample_ids().begin(), st.enc_sample_ids().end());
  d.step.enc_owner_ranks.assign(st.enc_owner_ranks().begin(), st.enc_owner_ranks().end());
  d.step.enc_dest_rank.assign(st.enc_dest_rank().begin(), st.enc_dest_rank().end());
  d.step.enc_dest_index.assign(st.enc_dest_index().begin(), st.enc_dest_index().end());
  d.step.llm_src_rank.assign(st.llm_src_rank().begin(), st.llm_src_rank().end());
  d.step.audio_sample_ids.assign(st.audio_sample_ids().begin(), st.audio_sample_ids().end());
  d.step.audio_owner_ranks.assign(st.audio_owner_ranks().begin(), st.audio_owner_ranks().end());
  d.step.audio_dest_rank.assign(st.audio_dest_rank().begin(), st.audio_dest_rank().end());
  d.step.audio_dest_index.assign(st.audio_dest_index().begin(), st.audio_dest_index().end());
  d.step.llm_audio_src_rank.assign(st.llm_audio_src_rank().begin(), st.llm_audio_src_rank().end());
  // Consumers index these lists in parallel: they must agree in length.
  const int n = st.sample_ids_size(), e = st.enc_sample_ids_size(), a = st.audio_sample_ids_size();
  if (st.lengths_size() != n || st.owner_ranks_size() != n || (st.seqs_size() != 0 && st.seqs_size() != n) ||
      st.has_seq_size() != st.seqs_size() || (st.llm_src_rank_size() != 0 && st.llm_src_rank_size() != n) ||
      st.enc_owner_ranks_size() != e || st.enc_dest_rank_size() != e || st.enc_dest_index_size() != e ||
      (st.llm_audio_src_rank_size() != 0 && st.llm_audio_src_rank_size() != n) ||
      st.audio_owner_ranks_size() != a || st.audio_dest_rank_size() != a || st.audio_dest_index_size() != a) {
    return absl::DataLossError(
        "step " + std::to_string(st.step_index()) + " from the daemon at " + endpoint_for_errors +
        ": per-sample lists disagree in length (sample_ids " + std::to_string(n) + ", lengths " +
        std::to_string(st.lengths_size()) + ", owner_ranks " + std::to_string(st.owner_ranks_size()) +
        ", seqs " + std::to_string(st.seqs_size()) + ", has_seq " + std::to_string(st.has_seq_size()) +
        ", llm_src_rank " + std::to_string(st.llm_src_rank_size()) + ", enc_sample_ids " + std::to_string(e) +
        ", enc_owner_ranks " + std::to_string(st.enc_owner_ranks_size()) + ", enc_dest_rank " +
        std::to_string(st.enc_dest_rank_size()) + ", enc_dest_index " +
        std::to_string(st.enc_dest_index_size()) + ", llm_audio_src_rank " +
        std::to_string(st.llm_audio_src_rank_size()) + ", audio_sample_ids " + std::to_string(a) +
        ", audio_owner_ranks " + std::to_string(st.audio_owner_ranks_size()) + ", audio_dest_rank " +
        std::to_string(st.audio_dest_rank_size()) + ", audio_dest_index " +
        std::to_string(st.audio_dest_index_size()) + ")");
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
