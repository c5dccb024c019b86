#include "odb/producer.h"

#include <sys/stat.h>

#include <cerrno>
#include <map>
#include <zmq.hpp>

#include "proto/odb.pb.h"

namespace odb::client {

size_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kBool:
      return 1;
    case DType::kInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

struct Producer::Impl {
  ProducerOptions options;
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::push};
  std::map<uint32_t, uint64_t> sent;

  absl::Status SendParts(std::vector<zmq::message_t>& parts) {
    try {
      for (size_t i = 0; i < parts.size(); ++i) {
        auto flags = i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
        zmq::send_result_t sent;
        while (true) {  // EINTR (a signal, e.g. SIGCHLD in a trainer) is not an error: retry
          try {
            sent = socket.send(parts[i], flags);
            break;
          } catch (const zmq::error_t& e) {
            if (e.num() != EINTR) throw;
          }
        }
        if (!sent) {
          return absl::DeadlineExceededError(
              "producer '" + options.producer_id + "': the daemon at " + options.endpoint +
              " did not accept a message within " + std::to_string(options.send_timeout_ms) +
              " ms (is odbd running there, and is its trainer consuming steps?)");
        }
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError("producer '" + options.producer_id + "': send to " +
                                    options.endpoint + " failed: " + e.what());
    }
    return absl::OkStatus();
  }

  absl::Status SendControl(const wire::ProducerMessage& message) {
    std::vector<zmq::message_t> parts;
    std::string bytes = message.SerializeAsString();
    parts.emplace_back(bytes.data(), bytes.size());
    return SendParts(parts);
  }

  wire::ProducerMessage NewMessage() const {
    wire::ProducerMessage m;
    m.set_version(wire::PROTOCOL_VERSION_CURRENT);
    return m;
  }
};

Producer::Producer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Producer::~Producer() = default;

absl::StatusOr<std::unique_ptr<Producer>> Producer::Connect(const ProducerOptions& options) {
  if (options.producer_id.empty()) return absl::InvalidArgumentError("producer_id must not be empty");
  if (options.endpoint.rfind("ipc://", 0) == 0) {
    struct stat st;
    const std::string path = options.endpoint.substr(6);
    if (stat(path.c_str(), &st) != 0) {
      return absl::UnavailableError("no odbd listens at " + options.endpoint + " (socket file '" + path +
                                    "' does not exist); start the daemon first or fix the endpoint");
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  try {
    impl->socket.set(zmq::sockopt::linger, 30000);  // deliver what was sent before close
    impl->socket.set(zmq::sockopt::sndhwm, options.send_hwm);
    impl->socket.set(zmq::sockopt::sndtimeo, options.send_timeout_ms);
    impl->socket.connect(options.endpoint);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError("cannot connect to '" + options.endpoint + "': " + e.what());
  }
  wire::ProducerMessage hello = impl->NewMessage();
  hello.mutable_hello()->set_producer_id(options.producer_id);
  hello.mutable_hello()->set_rank(options.rank);
  if (absl::Status s = impl->SendControl(hello); !s.ok()) return s;
  return std::unique_ptr<Producer>(new Producer(std::move(impl)));
}

absl::Status Producer::StartEpoch(uint32_t epoch) {
  wire::ProducerMessage m = impl_->NewMessage();
  m.mutable_start_epoch()->set_producer_id(impl_->options.producer_id);
  m.mutable_start_epoch()->set_epoch(epoch);
  return impl_->SendControl(m);
}

absl::Status Producer::Send(uint64_t sample_id, uint32_t epoch, const Lengths& lengths,
                            const std::vector<TensorInput>& tensors) {
  wire::ProducerMessage m = impl_->NewMessage();
  wire::SampleHeader* h = m.mutable_sample();
  h->set_producer_id(impl_->options.producer_id);
  h->set_sample_id(sample_id);
  h->set_epoch(epoch);
  h->set_tokens(lengths.tokens);
  h->set_vision_patches(lengths.vision_patches);
  h->set_audio_frames(lengths.audio_frames);
  std::vector<zmq::message_t> parts;
  parts.reserve(tensors.size() + 1);
  parts.emplace_back();  // header, filled below
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInput& t = tensors[i];
    wire::TensorDesc* d = h->add_tensors();
    d->set_name(t.name);
    d->set_dtype(static_cast<wire::DType>(t.dtype));
    for (int64_t dim : t.shape) d->add_shape(dim);
    d->set_frame(static_cast<uint32_t>(i + 1));
    parts.emplace_back(t.data, t.size_bytes);
  }
  std::string header = m.SerializeAsString();
  parts[0] = zmq::message_t(header.data(), header.size());
  if (absl::Status s = impl_->SendParts(parts); !s.ok()) return s;
  ++impl_->sent[epoch];
  return absl::OkStatus();
}

absl::Status Producer::EndStream(uint32_t epoch) {
  wire::ProducerMessage m = impl_->NewMessage();
  m.mutable_end_stream()->set_producer_id(impl_->options.producer_id);
  m.mutable_end_stream()->set_epoch(epoch);
  m.mutable_end_stream()->set_samples_sent(impl_->sent[epoch]);
  return impl_->SendControl(m);
}

absl::Status Producer::SendRawFrames(const std::vector<std::string>& frames) {
  std::vector<zmq::message_t> parts;
  for (const auto& f : frames) parts.emplace_back(f.data(), f.size());
  return impl_->SendParts(parts);
}

uint64_t Producer::sent(uint32_t epoch) const {
  auto it = impl_->sent.find(epoch);
  return it == impl_->sent.end() ? 0 : it->second;
}

}  // namespace odb::client
