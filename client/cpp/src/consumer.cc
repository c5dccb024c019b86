#include "odb/consumer.h"

#include <cerrno>
#include <zmq.hpp>

#include "proto/odb.pb.h"

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

}  // namespace

const TensorView* Delivery::Find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

struct Consumer::Impl {
  ConsumerOptions options;
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::dealer};
  bool owe_credit = false;

  absl::Status SendTrainer(const wire::TrainerMessage& m) {
    std::string bytes = m.SerializeAsString();
    try {
      if (!socket.send(zmq::buffer(bytes), zmq::send_flags::dontwait)) {
        return absl::UnavailableError("cannot reach the daemon at " + options.endpoint +
                                      " (send queue full)");
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError("send to daemon at " + options.endpoint + " failed: " + e.what());
    }
    return absl::OkStatus();
  }
};

Consumer::Consumer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Consumer::~Consumer() = default;

absl::StatusOr<std::unique_ptr<Consumer>> Consumer::Connect(const ConsumerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  try {
    impl->socket.set(zmq::sockopt::linger, 0);
    impl->socket.set(zmq::sockopt::rcvtimeo, options.receive_timeout_ms);
    impl->socket.set(zmq::sockopt::sndhwm, 1000);
    impl->socket.connect(options.endpoint);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError("cannot connect to '" + options.endpoint + "': " + e.what());
  }
  return std::unique_ptr<Consumer>(new Consumer(std::move(impl)));
}

absl::Status Consumer::StartEpoch(uint32_t epoch, uint32_t expected_producers) {
  wire::TrainerMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  m.mutable_start_epoch()->set_epoch(epoch);
  m.mutable_start_epoch()->set_expected_producers(expected_producers);
  return impl_->SendTrainer(m);
}

absl::StatusOr<Delivery> Consumer::Next() {
  if (impl_->owe_credit) {
    wire::TrainerMessage credit;
    credit.set_version(wire::PROTOCOL_VERSION_CURRENT);
    credit.mutable_credit()->set_steps(1);
    if (absl::Status s = impl_->SendTrainer(credit); !s.ok()) return s;
    impl_->owe_credit = false;
  }
  auto frames = std::make_shared<std::vector<zmq::message_t>>();
  try {
    do {
      zmq::message_t part;
      // A signal (e.g. the SIGCHLD PyTorch's DataLoader gets when a worker
      // exits) interrupts recv with EINTR: that is not an error, retry.
      zmq::recv_result_t got;
      while (true) {
        try {
          got = impl_->socket.recv(part);
          break;
        } catch (const zmq::error_t& e) {
          if (e.num() != EINTR) throw;
        }
      }
      if (!got) {
        return absl::DeadlineExceededError(
            "no step from the daemon at " + impl_->options.endpoint + " within " +
            std::to_string(impl_->options.receive_timeout_ms) +
            " ms: is odbd running, and are its producers sending?");
      }
      frames->push_back(std::move(part));
    } while (frames->back().more());
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError("receive from daemon at " + impl_->options.endpoint +
                                  " failed: " + e.what());
  }
  wire::DaemonMessage message;
  const zmq::message_t& head = frames->front();
  if (!message.ParseFromArray(head.data(), static_cast<int>(head.size()))) {
    return absl::DataLossError("unreadable message from the daemon at " + impl_->options.endpoint);
  }
  if (message.version() != wire::PROTOCOL_VERSION_CURRENT) {
    return absl::FailedPreconditionError(
        "daemon at " + impl_->options.endpoint + " speaks protocol version " +
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
  if (!message.has_step()) {
    return absl::DataLossError("message from the daemon carries neither a step nor an epoch end");
  }
  const wire::Step& st = message.step();
  d.kind = Delivery::Kind::kStep;
  d.step.epoch = st.epoch();
  d.step.step_index = st.step_index();
  d.step.idle = st.idle();
  d.step.sample_ids.assign(st.sample_ids().begin(), st.sample_ids().end());
  d.step.lengths.assign(st.lengths().begin(), st.lengths().end());
  d.step.owner_ranks.assign(st.owner_ranks().begin(), st.owner_ranks().end());
  d.step.real_tokens = st.real_tokens();
  d.step.padded_tokens = st.padded_tokens();
  d.step.global_real_tokens = st.global_real_tokens();
  d.step.loss_weight = st.loss_weight();
  d.step.over_budget = st.over_budget();
  d.step.samples_may_move = st.samples_may_move();
  d.step.rejections_are_errors = st.rejections_are_errors();
  for (const auto& r : st.rejections()) d.step.rejections.push_back(FromWire(r));
  d.step.enc_sample_ids.assign(st.enc_sample_ids().begin(), st.enc_sample_ids().end());
  d.step.enc_owner_ranks.assign(st.enc_owner_ranks().begin(), st.enc_owner_ranks().end());
  d.step.enc_dest_rank.assign(st.enc_dest_rank().begin(), st.enc_dest_rank().end());
  d.step.enc_dest_index.assign(st.enc_dest_index().begin(), st.enc_dest_index().end());
  d.step.llm_src_rank.assign(st.llm_src_rank().begin(), st.llm_src_rank().end());
  for (const auto& desc : st.tensors()) {
    if (desc.frame() < 1 || desc.frame() >= frames->size()) {
      return absl::DataLossError("step " + std::to_string(st.step_index()) + ": tensor '" +
                                 desc.name() + "' points at a missing frame");
    }
    const zmq::message_t& f = (*frames)[desc.frame()];
    TensorView v;
    v.name = desc.name();
    v.dtype = static_cast<DType>(desc.dtype());
    v.shape.assign(desc.shape().begin(), desc.shape().end());
    v.data = static_cast<const uint8_t*>(f.data());
    v.size_bytes = f.size();
    d.tensors.push_back(std::move(v));
  }
  d.frames = frames;
  impl_->owe_credit = true;
  return d;
}

}  // namespace odb::client
