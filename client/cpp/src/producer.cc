#include "odb/producer.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <zmq.hpp>

#include "client/cpp/src/fork_guard.h"
#include "proto/odb.pb.h"
#include "src/common/dtype.h"
#include "src/common/stream_copy.h"
#include "src/shm/arena_writer.h"
#include "src/shm/fd_passing.h"
#include "src/shm/unique_fd.h"
#include "src/wire/tensor_codec.h"

namespace odb::client {
namespace {

// Longest single wait of a blocking ZeroMQ send: Cancel is checked between two.
constexpr int kSendSliceMs = 100;

// The daemon's arena registration socket next to an ipc:// ingest socket
// (docs/protocol.md; the daemon's ingest::ArenaSocketPath).
std::string ArenaSocketPath(const std::string& ingest_socket_path) { return ingest_socket_path + ".arena"; }

uint64_t RoundUp64(uint64_t n) { return (n + 63) / 64 * 64; }

// Registers `writer`'s memfd with the daemon listening on `socket_path`: the
// arena id its samples name, or why not.
absl::StatusOr<uint64_t> RegisterArena(const std::string& socket_path, const std::string& producer_id,
                                       shm::ArenaWriter& writer, int timeout_ms) {
  absl::StatusOr<shm::UniqueFd> sock = shm::ConnectSeqpacket(socket_path, timeout_ms);
  if (absl::IsUnavailable(sock.status())) {
    return absl::UnavailableError("no arena registration socket answers at " + socket_path + " (" +
                                  std::string(sock.status().message()) +
                                  "; shm.producer_arenas off, or an older odbd)");
  }
  if (!sock.ok()) return sock.status();
  absl::StatusOr<shm::PeerCredentials> peer = shm::GetPeerCredentials(sock->get());
  if (!peer.ok()) return peer.status();
  if (peer->uid != ::getuid()) {
    return absl::PermissionDeniedError("the daemon behind " + socket_path + " runs as uid " +
                                       std::to_string(peer->uid) + ", this producer as uid " +
                                       std::to_string(::getuid()) + ": arenas are shared only within one user");
  }
  wire::ArenaRegister request;
  request.set_version(wire::PROTOCOL_VERSION_CURRENT);
  request.set_producer_id(producer_id);
  request.set_generation(writer.arena().generation());
  request.set_capacity_bytes(writer.capacity_bytes());
  if (absl::Status s = shm::SendFd(sock->get(), writer.arena().fd(), request.SerializeAsString()); !s.ok()) return s;
  char buffer[4096];
  const ssize_t n = ::recv(sock->get(), buffer, sizeof(buffer), 0);
  if (n <= 0) {
    return absl::UnavailableError("the daemon did not answer the arena registration on " + socket_path + " (" +
                                  (n == 0 ? std::string("it closed the connection") : std::strerror(errno)) + ")");
  }
  wire::ArenaRegistered answer;
  if (!answer.ParseFromArray(buffer, static_cast<int>(n))) {
    return absl::FailedPreconditionError("unreadable arena registration answer from " + socket_path);
  }
  if (answer.arena_id() == 0) {
    return absl::FailedPreconditionError("the daemon refused the arena: " + answer.error());
  }
  return answer.arena_id();
}

}  // namespace

absl::StatusOr<DataPlane> ParseDataPlane(std::string_view name) {
  if (name == "auto") return DataPlane::kAuto;
  if (name == "shm") return DataPlane::kShm;
  if (name == "zmq") return DataPlane::kZmq;
  return absl::InvalidArgumentError("data_plane '" + std::string(name.substr(0, 64)) +
                                    "' is not one of auto, shm, zmq");
}

const char* DataPlaneName(DataPlane plane) {
  switch (plane) {
    case DataPlane::kAuto:
      return "auto";
    case DataPlane::kShm:
      return "shm";
    case DataPlane::kZmq:
      return "zmq";
  }
  return "?";
}

// One element-type table: the public enum carries the wire codes, which are
// src/common/dtype.h's (sizes, names) and proto/odb.proto's.
#define ODB_SAME_DTYPE_CODE(client_name, common_name, wire_name)                                     \
  static_assert(                                                                                     \
      static_cast<uint32_t>(DType::client_name) == static_cast<uint32_t>(odb::DType::common_name) && \
          static_cast<uint32_t>(DType::client_name) == static_cast<uint32_t>(wire::wire_name),       \
      "odb::client::DType::" #client_name " differs from the wire's code")
ODB_SAME_DTYPE_CODE(kUInt8, kUInt8, UINT8);
ODB_SAME_DTYPE_CODE(kInt8, kInt8, INT8);
ODB_SAME_DTYPE_CODE(kInt16, kInt16, INT16);
ODB_SAME_DTYPE_CODE(kInt32, kInt32, INT32);
ODB_SAME_DTYPE_CODE(kInt64, kInt64, INT64);
ODB_SAME_DTYPE_CODE(kFloat16, kFloat16, FLOAT16);
ODB_SAME_DTYPE_CODE(kBFloat16, kBFloat16, BFLOAT16);
ODB_SAME_DTYPE_CODE(kFloat32, kFloat32, FLOAT32);
ODB_SAME_DTYPE_CODE(kFloat64, kFloat64, FLOAT64);
ODB_SAME_DTYPE_CODE(kBool, kBool, BOOL);
#undef ODB_SAME_DTYPE_CODE

size_t DTypeBytes(DType dtype) {
  const auto code = static_cast<uint32_t>(dtype);
  return odb::IsValidDType(code) ? odb::DTypeSize(static_cast<odb::DType>(code)) : 0;
}

struct Producer::Impl {
  ProducerOptions options;
  ForkGuard owner;  // see fork_guard.h
  // The shared-memory arena (null: frames only). Declared before the context:
  // destroyed after it, i.e. after ZeroMQ has handed every sent message to the
  // kernel (linger), so the daemon sees the arena closed only after them.
  std::unique_ptr<shm::ArenaWriter> arena;
  uint64_t arena_id = 0;
  std::string arena_note;  // why there is no arena
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
    if (absl::Status s = owner.Check(Who()); !s.ok()) return s;
    if (!cancelled.load()) return absl::OkStatus();
    return absl::CancelledError(Who() + ": cancelled (its loader is shutting down)");
  }

  absl::Status SendParts(std::vector<zmq::message_t>& parts) {
    try {
      for (size_t i = 0; i < parts.size(); ++i) {
        auto flags = i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
        zmq::send_result_t sent;
        // The socket's send timeout is a slice (kSendSliceMs): between slices
        // Cancel is seen, so a loader leaving its epoch (its daemon died, say)
        // never waits out send_timeout_ms for a send nobody will take.
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(options.send_timeout_ms, 0));
        while (true) {
          try {
            sent = socket.send(parts[i], flags);
          } catch (const zmq::error_t& e) {
            if (e.num() != EINTR) throw;  // EINTR (a signal, e.g. SIGCHLD in a trainer): retry
            continue;
          }
          if (sent) break;
          if (absl::Status s = CheckCancelled(); !s.ok()) return s;
          if (options.send_timeout_ms >= 0 && std::chrono::steady_clock::now() >= deadline) {
            return absl::DeadlineExceededError(
                Who() + ": the daemon at " + options.endpoint + " did not accept a message within " +
                std::to_string(options.send_timeout_ms) + " ms (is odbd running there?)");
          }
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
        } else if (reply.has_stream_ack() || reply.has_rejection()) {
          // The daemon answers an end_stream (ack, or a rejection) after taking
          // back the stream's unused credit; credit it grants afterwards (it
          // may arrive in this same read) is new and kept.
          credit_samples = 0;
          credit_bytes = 0;
          if (reply.has_stream_ack()) {
            stream_replies[reply.stream_ack().epoch()] = reply;
          } else {
            rejections.push_back(reply.rejection());
            stream_replies[UINT32_MAX] = reply;
          }
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

  // Waits until the daemon lets a sample of `bytes` (payload plus bookkeeping)
  // in: its seq under the limit (alignment.deterministic) and enough credit.
  absl::Status AwaitRoom(uint64_t bytes, uint64_t sample_id, uint32_t epoch, std::optional<uint64_t> seq) {
    if (seq) {
      // The first credit says whether the daemon limits seqs: wait for it.
      if (max_sample_bytes == 0) {
        if (absl::Status s = WaitForCredit(0, sample_id); !s.ok()) return s;
      }
      if (absl::Status s = WaitForSeq(epoch, *seq, sample_id); !s.ok()) return s;
    }
    return WaitForCredit(bytes, sample_id);
  }

  void Debit(uint64_t bytes) {
    credit_samples -= 1;
    credit_bytes -= static_cast<int64_t>(bytes);
  }

  absl::Status SendSample(std::vector<zmq::message_t>& parts, uint64_t sample_id, uint32_t epoch,
                          std::optional<uint64_t> seq) {
    uint64_t bytes = 0;
    // The daemon charges each tensor's bookkeeping too (the same constant).
    for (size_t i = 1; i < parts.size(); ++i) bytes += parts[i].size() + wire::kBookkeepingBytesPerTensor;
    if (parts.size() > 1) {
      if (absl::Status s = AwaitRoom(bytes, sample_id, epoch, seq); !s.ok()) return s;
      Debit(bytes);
    }
    return SendParts(parts);
  }

  // A block of `length` bytes of the arena; waits (back-pressure) while the
  // daemon holds the arena's blocks, up to send_timeout_ms.
  absl::StatusOr<shm::Block> AllocateBlock(uint64_t length, uint64_t sample_id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.send_timeout_ms);
    while (true) {
      if (absl::Status s = CheckCancelled(); !s.ok()) return s;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        const shm::ArenaWriter::Stats st = arena->stats();
        return absl::DeadlineExceededError(
            Who() + ": sample " + std::to_string(sample_id) + " waited " + std::to_string(options.send_timeout_ms) +
            " ms for " + std::to_string(length) + " bytes of its shared-memory arena (" +
            std::to_string(arena->capacity_bytes()) + " bytes, " + std::to_string(st.outstanding_blocks) +
            " blocks held by the daemon at " + options.endpoint + "): is its trainer consuming steps?");
      }
      // Slices of at most 100 ms, so that Cancel is seen.
      absl::StatusOr<shm::Block> block =
          arena->Allocate(length, absl::Milliseconds(std::min<int64_t>(left.count(), 100)));
      if (block.ok() || block.status().code() != absl::StatusCode::kDeadlineExceeded) {
        if (!block.ok()) {
          return absl::Status(block.status().code(), Who() + ": sample " + std::to_string(sample_id) + ": " +
                                                         std::string(block.status().message()));
        }
        return block;
      }
    }
  }

  // The shared-memory path: the tensors are copied into one block of the
  // arena (each at a 64-byte aligned offset), the header names the block and
  // each tensor's range, and only the header goes over ZeroMQ.
  absl::Status SendArenaSample(wire::ProducerMessage& m, const std::vector<TensorInput>& tensors,
                               uint64_t block_length, uint64_t sample_id, uint32_t epoch,
                               std::optional<uint64_t> seq) {
    uint64_t bytes = 0;
    for (const TensorInput& t : tensors) bytes += t.size_bytes + wire::kBookkeepingBytesPerTensor;
    if (absl::Status s = AwaitRoom(bytes, sample_id, epoch, seq); !s.ok()) return s;
    absl::StatusOr<shm::Block> block = AllocateBlock(block_length, sample_id);
    if (!block.ok()) return block.status();
    wire::SampleHeader* h = m.mutable_sample();
    uint64_t at = 0;
    for (const TensorInput& t : tensors) {
      StreamCopy(block->data + at, t.data, t.size_bytes);  // the daemon reads it, not this core
      wire::EncodeArenaTensorDesc(t.name, static_cast<odb::DType>(t.dtype), t.shape, block->offset + at,
                                  t.size_bytes, h->add_tensors());
      at += RoundUp64(t.size_bytes);
    }
    h->mutable_arena()->set_arena_id(arena_id);
    h->mutable_arena()->set_offset(block->offset);
    h->mutable_arena()->set_length(block->length);
    std::vector<zmq::message_t> parts;
    std::string header = m.SerializeAsString();
    parts.emplace_back(header.data(), header.size());
    if (absl::Status s = SendParts(parts); !s.ok()) {
      (void)arena->Free(*block);  // never reached the daemon
      return s;
    }
    Debit(bytes);
    return absl::OkStatus();
  }

  // Creates and registers the arena (options.data_plane kAuto or kShm, an
  // ipc:// endpoint).
  absl::Status SetUpArena() {
    if (options.endpoint.rfind("ipc://", 0) != 0) {
      return absl::InvalidArgumentError("the shared-memory data plane needs a local daemon (an ipc:// endpoint), not " +
                                        options.endpoint);
    }
    if (options.arena_bytes == 0) return absl::InvalidArgumentError("arena_bytes must be > 0");
    shm::ArenaOptions o;
    o.capacity_bytes = options.arena_bytes;
    // Pages are allocated as blocks are first written: the arena costs what
    // is in flight (bounded by the daemon's credit), not its capacity.
    o.reserve = false;
    o.memfd_name = "odb-arena:" + options.producer_id.substr(0, 200);
    // Blocks outstanding at once (one per sample the daemon holds): as many as
    // the daemon buffers by default (buffer.max_samples), so that small
    // samples are bounded by credit, not by the block count (a 2 MiB
    // completion queue, touched only as far as it is used).
    o.max_blocks = 65536;
    absl::StatusOr<std::unique_ptr<shm::ArenaWriter>> writer = shm::ArenaWriter::Create(o);
    if (!writer.ok()) return writer.status();
    absl::StatusOr<uint64_t> id = RegisterArena(ArenaSocketPath(options.endpoint.substr(6)), options.producer_id,
                                                **writer, std::min(options.send_timeout_ms, 10000));
    if (!id.ok()) return id.status();
    arena = std::move(*writer);
    arena_id = *id;
    return absl::OkStatus();
  }
};

Producer::Producer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Producer::~Producer() {
  // A forked copy must not touch the context (zmq_ctx_term would wait forever).
  if (impl_ && impl_->owner.forked()) (void)impl_.release();
  // A cancelled producer's unsent messages have no taker (its loader left the
  // epoch, often because the daemon died): closing must not linger for them.
  if (impl_ && impl_->cancelled.load()) {
    try {
      impl_->socket.set(zmq::sockopt::linger, 0);
    } catch (const zmq::error_t&) {
    }
  }
}

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
    impl->socket.set(zmq::sockopt::sndtimeo, options.send_timeout_ms < 0 ? kSendSliceMs
                                                                         : std::min(options.send_timeout_ms, kSendSliceMs));
    impl->socket.connect(options.endpoint);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError("cannot connect to '" + options.endpoint + "': " + e.what());
  }
  if (options.data_plane != DataPlane::kZmq) {
    if (absl::Status s = impl->SetUpArena(); !s.ok()) {
      if (options.data_plane == DataPlane::kShm) {
        return absl::Status(s.code(), "producer '" + options.producer_id +
                                          "': data_plane shm, but the shared-memory arena is not available: " +
                                          std::string(s.message()));
      }
      impl->arena_note = std::string(s.message());  // auto: frames
    }
  } else {
    impl->arena_note = "data_plane zmq";
  }
  wire::ProducerMessage hello = impl->NewMessage();
  hello.mutable_hello()->set_producer_id(options.producer_id);
  hello.mutable_hello()->set_rank(options.rank);
  if (absl::Status s = impl->SendControl(hello); !s.ok()) return s;
  return std::unique_ptr<Producer>(new Producer(std::move(impl)));
}

absl::Status Producer::StartEpoch(uint32_t epoch) {
  if (absl::Status s = impl_->CheckCancelled(); !s.ok()) return s;
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
  if (lengths.loss_tokens) h->set_loss_tokens(*lengths.loss_tokens);
  if (seq) h->set_seq(*seq);
  if (impl_->arena) {
    const ProducerOptions& o = impl_->options;
    uint64_t payload = 0, block_length = 0;
    for (const TensorInput& t : tensors) {
      payload += t.size_bytes;
      block_length += RoundUp64(t.size_bytes);
    }
    if (o.data_plane == DataPlane::kShm || payload >= o.shm_min_bytes) {
      if (block_length <= impl_->arena->capacity_bytes()) {
        if (absl::Status s = impl_->SendArenaSample(m, tensors, block_length, sample_id, epoch, seq); !s.ok()) {
          return s;
        }
        ++impl_->sent[epoch];
        return absl::OkStatus();
      }
      if (o.data_plane == DataPlane::kShm) {
        return absl::InvalidArgumentError(
            impl_->Who() + ": sample " + std::to_string(sample_id) + " has " + std::to_string(payload) +
            " payload bytes (a block of " + std::to_string(block_length) + " bytes), more than its shared-memory "
            "arena holds (" + std::to_string(impl_->arena->capacity_bytes()) +
            " bytes); raise arena_bytes, or use data_plane auto, which sends such samples over the socket");
      }
      // auto: a sample larger than the arena goes as frames.
    }
  }
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
  if (absl::Status s = impl_->CheckCancelled(); !s.ok()) return s;
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
  return absl::OkStatus();
}

absl::Status Producer::SendRawFrames(const std::vector<std::string>& frames) {
  if (absl::Status s = impl_->CheckCancelled(); !s.ok()) return s;
  std::vector<zmq::message_t> parts;
  for (const auto& f : frames) parts.emplace_back(f.data(), f.size());
  return impl_->SendSample(parts, 0, 0, std::nullopt);
}

uint64_t Producer::sent(uint32_t epoch) const {
  auto it = impl_->sent.find(epoch);
  return it == impl_->sent.end() ? 0 : it->second;
}

DataPlane Producer::data_plane() const { return impl_->arena ? DataPlane::kShm : DataPlane::kZmq; }
uint64_t Producer::arena_id() const { return impl_->arena_id; }
const std::string& Producer::arena_note() const { return impl_->arena_note; }

std::optional<ArenaStats> Producer::arena_stats() const {
  if (!impl_->arena) return std::nullopt;
  impl_->arena->Reclaim();  // count what the daemon returned by now
  const shm::ArenaWriter::Stats s = impl_->arena->stats();
  ArenaStats out;
  out.capacity_bytes = impl_->arena->capacity_bytes();
  out.allocations = s.allocations;
  out.returns = s.returns;
  out.waits = s.waits;
  out.outstanding_blocks = s.outstanding_blocks;
  out.outstanding_bytes = s.outstanding_bytes;
  return out;
}

}  // namespace odb::client
