#include "odb/producer.h"

#include <sys/stat.h>

#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <zmq.hpp>

#include "proto/odb.pb.h"
#include "src/wire/tensor_codec.h"

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
  zmq::socket_t socket{context, zmq::socket_type::dealer};
  std::map<uint32_t, uint64_t> sent;
  // Flow control (see IngestReply in proto/odb.proto): what the daemon granted
  // and this producer has not used yet.
  int64_t credit_samples = 0;
  int64_t credit_bytes = 0;
  uint64_t max_sample_bytes = 0;  // 0 until the daemon's first credit
  uint64_t requested_bytes = 0;
  // alignment.deterministic (the daemon sends seq limits): epoch -> samples
  // with seq below it may be sent.
  std::atomic<bool> cancelled{false};
  bool seq_gated = false;
  std::map<uint32_t, uint64_t> seq_limits;
  std::map<uint32_t, wire::IngestReply> stream_replies;  // epoch -> ack or rejection
  std::vector<wire::Rejection> rejections;

  std::string Who() const { return "producer '" + options.producer_id + "'"; }

  absl::Status CheckCancelled() const {
    if (!cancelled.load()) return absl::OkStatus();
    return absl::CancelledError(Who() + ": cancelled (its loader is shutting down)");
  }

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
              Who() + ": the daemon at " + options.endpoint + " did not accept a message within " +
              std::to_string(options.send_timeout_ms) + " ms (is odbd running there?)");
        }
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(Who() + ": send to " + options.endpoint + " failed: " + e.what());
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

  // Reads the daemon's replies, waiting up to `timeout_ms` for the first one.
  // Returns false on timeout.
  absl::StatusOr<bool> Pump(int timeout_ms) {
    try {
      zmq::pollitem_t item{static_cast<void*>(socket), 0, ZMQ_POLLIN, 0};
      int ready = 0;
      while (true) {
        try {
          ready = zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
          break;
        } catch (const zmq::error_t& e) {
          if (e.num() != EINTR) throw;
        }
      }
      if (ready == 0) return false;
      zmq::message_t frame;
      while (socket.recv(frame, zmq::recv_flags::dontwait)) {
        wire::IngestReply reply;
        if (!reply.ParseFromArray(frame.data(), static_cast<int>(frame.size())) ||
            reply.version() != wire::PROTOCOL_VERSION_CURRENT) {
          return absl::FailedPreconditionError(Who() + ": unreadable reply from the daemon at " +
                                               options.endpoint + " (protocol version mismatch?)");
        }
        if (reply.has_credit()) {
          credit_samples += reply.credit().samples();
          credit_bytes += static_cast<int64_t>(reply.credit().bytes());
          if (reply.credit().max_sample_bytes() > 0) max_sample_bytes = reply.credit().max_sample_bytes();
          if (reply.credit().has_seq_limit()) {
            seq_gated = true;
            uint64_t& limit = seq_limits[reply.credit().seq_epoch()];
            limit = std::max(limit, reply.credit().seq_limit());
          }
        } else if (reply.has_stream_ack()) {
          stream_replies[reply.stream_ack().epoch()] = reply;
        } else if (reply.has_rejection()) {
          rejections.push_back(reply.rejection());
          stream_replies[UINT32_MAX] = reply;
        }
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(Who() + ": receive from " + options.endpoint + " failed: " + e.what());
    }
    return true;
  }

  // Blocks until the daemon has granted room for one sample of `bytes`.
  absl::Status WaitForCredit(uint64_t bytes, uint64_t sample_id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.send_timeout_ms);
    while (credit_samples <= 0 || credit_bytes < static_cast<int64_t>(bytes)) {
      if (absl::Status s = CheckCancelled(); !s.ok()) return s;
      if (max_sample_bytes > 0 && bytes > max_sample_bytes) {
        return absl::InvalidArgumentError(
            Who() + ": sample " + std::to_string(sample_id) + " has " + std::to_string(bytes) +
            " payload bytes, more than the daemon accepts for one sample (" + std::to_string(max_sample_bytes) +
            " = half of its buffer.max_bytes); raise buffer.max_bytes or split the sample");
      }
      if (max_sample_bytes > 0 && credit_bytes < static_cast<int64_t>(bytes) && requested_bytes < bytes) {
        wire::ProducerMessage request = NewMessage();
        request.mutable_credit_request()->set_bytes(bytes);
        if (absl::Status s = SendControl(request); !s.ok()) return s;
        requested_bytes = bytes;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        return absl::DeadlineExceededError(
            Who() + ": the daemon at " + options.endpoint + " granted no room for sample " +
            std::to_string(sample_id) + " within " + std::to_string(options.send_timeout_ms) +
            " ms (is odbd running there, and is its trainer consuming steps?)");
      }
      auto got = Pump(static_cast<int>(std::min<int64_t>(left.count(), 100)));
      if (!got.ok()) return got.status();
    }
    requested_bytes = 0;
    return absl::OkStatus();
  }

  // alignment.deterministic: blocks until the daemon lets samples of `epoch`
  // with this seq in (its in-order frontier moved close enough).
  absl::Status WaitForSeq(uint32_t epoch, uint64_t seq, uint64_t sample_id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.send_timeout_ms);
    bool asked = false;
    while (seq_gated && seq_limits[epoch] <= seq) {
      if (absl::Status s = CheckCancelled(); !s.ok()) return s;
      if (!asked) {
        wire::ProducerMessage request = NewMessage();
        request.mutable_credit_request()->set_seq(seq);
        request.mutable_credit_request()->set_epoch(epoch);
        if (absl::Status s = SendControl(request); !s.ok()) return s;
        asked = true;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        return absl::DeadlineExceededError(
            Who() + ": sample " + std::to_string(sample_id) + " (seq " + std::to_string(seq) +
            ") waited " + std::to_string(options.send_timeout_ms) + " ms for the daemon at " + options.endpoint +
            " to receive the samples before it in order (alignment.deterministic; limit " +
            std::to_string(seq_limits[epoch]) + "): is the producer of the earlier samples alive?");
      }
      auto got = Pump(static_cast<int>(std::min<int64_t>(left.count(), 100)));
      if (!got.ok()) return got.status();
    }
    return absl::OkStatus();
  }

  absl::Status SendSample(std::vector<zmq::message_t>& parts, uint64_t sample_id, uint32_t epoch,
                          std::optional<uint64_t> seq) {
    if (seq && parts.size() > 1) {
      // The first credit says whether the daemon limits seqs: wait for it.
      if (max_sample_bytes == 0) {
        if (absl::Status s = WaitForCredit(0, sample_id); !s.ok()) return s;
      }
      if (absl::Status s = WaitForSeq(epoch, *seq, sample_id); !s.ok()) return s;
    }
    uint64_t bytes = 0;
    // The daemon charges each tensor's bookkeeping too (the same constant).
    for (size_t i = 1; i < parts.size(); ++i) bytes += parts[i].size() + wire::kBookkeepingBytesPerTensor;
    if (parts.size() > 1) {
      if (absl::Status s = WaitForCredit(bytes, sample_id); !s.ok()) return s;
      credit_samples -= 1;
      credit_bytes -= static_cast<int64_t>(bytes);
    }
    return SendParts(parts);
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
    impl->socket.set(zmq::sockopt::rcvhwm, 0);  // credits and acks are small and must not be dropped
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
                            const std::vector<TensorInput>& tensors, std::optional<uint64_t> seq) {
  if (absl::Status s = impl_->CheckCancelled(); !s.ok()) return s;
  wire::ProducerMessage m = impl_->NewMessage();
  wire::SampleHeader* h = m.mutable_sample();
  h->set_producer_id(impl_->options.producer_id);
  h->set_sample_id(sample_id);
  h->set_epoch(epoch);
  h->set_tokens(lengths.tokens);
  h->set_vision_patches(lengths.vision_patches);
  h->set_audio_frames(lengths.audio_frames);
  if (seq) h->set_seq(*seq);
  std::vector<zmq::message_t> parts;
  parts.reserve(tensors.size() + 1);
  parts.emplace_back();  // header, filled below
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInput& t = tensors[i];
    wire::EncodeTensorDesc(t.name, static_cast<odb::DType>(t.dtype), t.shape, static_cast<uint32_t>(i + 1),
                           h->add_tensors());
    parts.emplace_back(t.data, t.size_bytes);
  }
  std::string header = m.SerializeAsString();
  parts[0] = zmq::message_t(header.data(), header.size());
  if (absl::Status s = impl_->SendSample(parts, sample_id, epoch, seq); !s.ok()) return s;
  ++impl_->sent[epoch];
  return absl::OkStatus();
}

void Producer::Cancel() { impl_->cancelled.store(true); }

absl::Status Producer::EndStream(uint32_t epoch) {
  wire::ProducerMessage m = impl_->NewMessage();
  m.mutable_end_stream()->set_producer_id(impl_->options.producer_id);
  m.mutable_end_stream()->set_epoch(epoch);
  m.mutable_end_stream()->set_samples_sent(impl_->sent[epoch]);
  if (absl::Status s = impl_->SendControl(m); !s.ok()) return s;
  // Wait until the daemon has read the whole stream: after this returns the
  // producer may close (or exit) without losing anything it sent.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(impl_->options.send_timeout_ms);
  while (true) {
    if (absl::Status s = impl_->CheckCancelled(); !s.ok()) return s;
    auto it = impl_->stream_replies.find(epoch);
    if (it != impl_->stream_replies.end()) {
      impl_->stream_replies.erase(it);
      break;
    }
    auto rejected = impl_->stream_replies.find(UINT32_MAX);
    if (rejected != impl_->stream_replies.end()) {
      const wire::Rejection r = rejected->second.rejection();
      impl_->stream_replies.erase(rejected);
      if (r.code() == wire::COUNT_MISMATCH || r.code() == wire::WRONG_EPOCH ||
          r.message().find("end_stream") != std::string::npos) {
        return absl::DataLossError(impl_->Who() + ": the daemon refused the end of epoch " +
                                   std::to_string(epoch) + " (" + wire::ErrorCode_Name(r.code()) + "): " +
                                   r.message());
      }
      continue;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return absl::DeadlineExceededError(impl_->Who() + ": the daemon at " + impl_->options.endpoint +
                                         " did not acknowledge the end of epoch " + std::to_string(epoch) +
                                         " within " + std::to_string(impl_->options.send_timeout_ms) + " ms");
    }
    auto got = impl_->Pump(static_cast<int>(std::min<int64_t>(left.count(), 100)));
    if (!got.ok()) return got.status();
  }
  // The daemon returned this stream's unused credit to its buffer.
  impl_->credit_samples = 0;
  impl_->credit_bytes = 0;
  return absl::OkStatus();
}

absl::Status Producer::SendRawFrames(const std::vector<std::string>& frames) {
  std::vector<zmq::message_t> parts;
  for (const auto& f : frames) parts.emplace_back(f.data(), f.size());
  return impl_->SendSample(parts, 0, 0, std::nullopt);
}

uint64_t Producer::sent(uint32_t epoch) const {
  auto it = impl_->sent.find(epoch);
  return it == impl_->sent.end() ? 0 : it->second;
}

}  // namespace odb::client
