#include "src/ingest/ingest_channel.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "src/common/fd_budget.h"
#include "src/common/zmq_transfer.h"
#include "src/grouping/budget.h"
#include "src/wire/tensor_codec.h"

namespace odb::ingest {
namespace {

constexpr size_t kBurst = 256;                 // messages per OnReadable (the trainer is never starved)
constexpr size_t kMaxConnections = 4096;       // producer connections tracked at once
constexpr uint64_t kMaxHeaderBytes = 1 << 20;  // a header frame larger than this is refused by ZeroMQ
// Samples are held for at most this many epochs past the trainer's (or,
// before the trainer asks for one, past the lowest one that producers send):
// a later epoch is refused, since each held epoch costs bookkeeping.
constexpr uint32_t kEpochHorizon = 4;
// Payload bytes lent per sample of credit at least (or the producer's largest
// sample so far), up to its byte window.
constexpr uint64_t kBytesPerLentSample = 64 << 10;

// What an arena sample is charged: its tensors' lengths as sent, plus the
// bookkeeping per tensor (the formula of frames), saturating: the header is
// not validated yet.
uint64_t ArenaPayloadBytes(const wire::SampleHeader& header) {
  uint64_t total = 0;
  for (const wire::TensorDesc& t : header.tensors()) {
    if (__builtin_add_overflow(total, t.length(), &total) ||
        __builtin_add_overflow(total, wire::kBookkeepingBytesPerTensor, &total)) {
      return UINT64_MAX;
    }
  }
  return total;
}

// Producer connections tracked at once: no more than the descriptors allow.
size_t MaxProducerConnections() {
  return static_cast<size_t>(std::min<uint64_t>(kMaxConnections, MaxConnectionsByDescriptors()));
}

// The lowest epoch the trainer is training or has asked for; nullopt before
// it asks (and between its epochs). Requires DaemonState::mu.
std::optional<uint32_t> TrainerEpoch(const DaemonState& state) {
  std::optional<uint32_t> epoch = state.current_epoch;
  for (uint32_t e : state.requested_epochs) {
    if (!epoch || e < *epoch) epoch = e;
  }
  return epoch;
}

wire::IngestReply NewReply() {
  wire::IngestReply r;
  r.set_version(wire::PROTOCOL_VERSION_CURRENT);
  return r;
}

}  // namespace

IngestChannel::IngestChannel(zmq::context_t& context, IngestOptions options, DaemonState& state,
                             DaemonMetrics& metrics, const Clock& clock)
    : context_(context), options_(std::move(options)), state_(state), metrics_(metrics), clock_(clock) {
  decode_options_.length_field = options_.collate.length_field;
  // A sample may take at most half the buffer: once the buffer drains it
  // always fits, and ahead-of-epoch producers (half the buffer) never block it.
  max_sample_bytes_ = std::max<uint64_t>(1, options_.buffer_max_bytes / 2);
  window_samples_ = std::clamp<uint64_t>(options_.buffer_max_samples / 4, 1, 1024);
  last_message_ = clock_.Now();
}

absl::Status IngestChannel::Bind() {
  for (const auto& endpoint : options_.endpoints) {
    try {
      EnsureIpcDirectory(endpoint);
      zmq::socket_t socket(context_, zmq::socket_type::router);
      socket.set(zmq::sockopt::linger, 0);
      socket.set(zmq::sockopt::rcvhwm, options_.hwm);
      socket.set(zmq::sockopt::sndhwm, 10000);
      socket.set(zmq::sockopt::router_mandatory, true);
      // A frame larger than any admissible sample (or header) is a protocol
      // violation: ZeroMQ drops that connection instead of allocating it.
      socket.set(zmq::sockopt::maxmsgsize,
                 static_cast<int64_t>(std::max<uint64_t>(max_sample_bytes_, kMaxHeaderBytes)));
      socket.bind(endpoint);
      bound_.push_back(socket.get(zmq::sockopt::last_endpoint));
      sockets_.push_back(std::move(socket));
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError("cannot bind the ingest endpoint " + endpoint + " (" + e.what() +
                                    "); is another odbd using it?");
    }
  }
  return absl::OkStatus();
}

bool IngestChannel::ChargeCredit(Conn& conn, bool is_sample, uint64_t bytes) {
  if (!is_sample) return true;
  if (conn.credit_samples <= 0 || conn.credit_bytes < static_cast<int64_t>(bytes)) return false;
  conn.credit_samples -= 1;
  conn.credit_bytes -= static_cast<int64_t>(bytes);
  conn.window.OnSampleUsed();
  conn.last_sample = clock_.Now();
  conn.largest_sample = std::max(conn.largest_sample, bytes);
  outstanding_samples_ -= 1;
  outstanding_bytes_ -= static_cast<int64_t>(bytes);
  return true;
}

void IngestChannel::OnReadable(size_t i) {
  struct Received {
    Conn* conn;
    IngestEvent event;
    uint64_t bytes;
  };
  std::vector<Received> burst;
  for (size_t n = 0; n < kBurst; ++n) {
    Transfer t = TryRecvMultipart(sockets_[i], parts_);
    if (t.code == TransferCode::kAgain) break;
    if (t.code == TransferCode::kInterrupted) continue;
    if (!t.ok()) {
      spdlog::warn("ingest socket {}: receive failed ({}); continuing", bound_[i], t.error);
      break;
    }
    if (parts_.size() < 2) continue;  // a routing frame with no message: nothing to account
    ConnKey key{i, parts_[0].to_string()};
    auto it = conns_.find(key);
    if (it == conns_.end()) {
      if (conns_.size() >= MaxProducerConnections()) {
        std::lock_guard<std::mutex> lock(state_.mu);
        wire::Rejection r =
            MakeReject(wire::TOO_LARGE, "more than " + std::to_string(MaxProducerConnections()) +
                                            " producer connections; message of a new one refused")
                .rejection;
        Reject(std::move(r), std::nullopt, false);
        continue;
      }
      Conn fresh;
      fresh.socket = i;
      fresh.routing_id = key.second;
      fresh.last_sample = clock_.Now();
      it = conns_.emplace(key, std::move(fresh)).first;
    }
    Conn& conn = it->second;
    conn.last_heard = clock_.Now();
    // A sample whose tensors are in the producer's arena is one frame too:
    // its header is parsed once, here.
    std::optional<wire::ProducerMessage> arena_sample;
    if (parts_.size() == 2) {
      // A control message; a credit request is the channel's own business.
      wire::ProducerMessage control;
      if (control.ParseFromArray(parts_[1].data(), static_cast<int>(parts_[1].size()))) {
        if (control.has_credit_request()) {
          const wire::CreditRequest& request = control.credit_request();
          if (request.bytes() > 0) conn.wanted_bytes = std::min<uint64_t>(request.bytes(), max_sample_bytes_);
          if (request.has_seq()) {
            conn.wanted_seq = request.seq();
            conn.wanted_seq_epoch = request.epoch();
          }
          continue;
        }
        if (control.has_sample() && control.sample().has_arena()) arena_sample = std::move(control);
      }
    }
    std::vector<zmq::message_t> body;
    body.reserve(parts_.size() - 1);
    uint64_t payload = 0;
    for (size_t p = 1; p < parts_.size(); ++p) {
      if (p >= 2) payload += parts_[p].size() + wire::kBookkeepingBytesPerTensor;
      body.push_back(std::move(parts_[p]));
    }
    // Arena samples are charged like frames (their bytes count against
    // buffer.max_bytes although they live in the producer's arena).
    if (arena_sample) payload = ArenaPayloadBytes(arena_sample->sample());
    const bool is_sample = body.size() > 1 || arena_sample.has_value();
    const ArenaContext arena_context{arenas_, conn.producer_id};
    auto decode = [&]() -> IngestEvent {
      if (arena_sample) {
        return DecodeParsedProducerMessage(*arena_sample, std::move(body), decode_options_, arena_context);
      }
      return DecodeProducerMessage(std::move(body), decode_options_, arena_context);
    };
    IngestEvent event;
    if (is_sample && payload > max_sample_bytes_) {
      // An arena sample is decoded all the same: that takes its block, and
      // dropping the decoded sample hands the block back to the producer.
      // Its header (the first frame, small) names it: the rejection carries
      // its id and it counts in its producer's stream, so the producer's
      // honest end_stream total still matches.
      wire::ProducerMessage header;
      if (arena_sample) {
        header = *arena_sample;
      } else if (!header.ParseFromArray(body[0].data(), static_cast<int>(body[0].size()))) {
        header.Clear();
      }
      IngestEvent dropped;
      if (arena_sample) dropped = decode();
      const bool named = header.has_sample();
      const uint64_t id = header.sample().sample_id();
      RejectEvent reject = MakeReject(
          wire::TOO_LARGE,
          (named ? "sample " + std::to_string(id) : std::string("a sample")) + " of " + std::to_string(payload) +
              " payload bytes from producer '" + conn.producer_id +
              "' exceeds the largest admissible sample (" + std::to_string(max_sample_bytes_) +
              " bytes = half of buffer.max_bytes); raise buffer.max_bytes",
          conn.producer_id, named ? &id : nullptr);
      if (named && !conn.producer_id.empty() && header.sample().producer_id() == conn.producer_id) {
        reject.epoch = header.sample().epoch();
        reject.has_epoch = true;
        if (header.sample().has_seq()) reject.seq = header.sample().seq();
      }
      event = std::move(reject);
      ChargeCredit(conn, true, std::min<uint64_t>(payload, std::max<int64_t>(conn.credit_bytes, 0)));
    } else if (!ChargeCredit(conn, is_sample, payload)) {
      // Decoded anyway, so the report names the sample and it counts against
      // its producer's stream (end_stream totals still match).
      event = decode();
      RejectEvent reject;
      if (auto* s = std::get_if<SampleEvent>(&event)) {
        const uint64_t id = s->sample.meta.id;
        reject =
            conn.producer_id.empty()
                ? MakeReject(wire::UNKNOWN_PRODUCER,
                             "sample " + std::to_string(id) + " from producer '" + s->sample.producer_id +
                                 "' arrived on a connection that never sent hello; call "
                                 "Producer::Connect before sending",
                             s->sample.producer_id, &id)
                : MakeReject(wire::CREDIT_EXCEEDED,
                             "sample " + std::to_string(id) + " (" + std::to_string(payload) +
                                 " bytes) from producer '" + conn.producer_id +
                                 "' was sent without credit (held " + std::to_string(conn.credit_samples) +
                                 " samples / " + std::to_string(conn.credit_bytes) +
                                 " bytes); producers must wait for the daemon's credit (the odb "
                                 "clients do)",
                             conn.producer_id, &id);
        reject.epoch = s->sample.epoch;
        reject.has_epoch = true;
        reject.seq = s->sample.seq;
        event = std::move(reject);
      } else if (std::get_if<RejectEvent>(&event) == nullptr) {
        event = MakeReject(wire::MALFORMED_HEADER, "a multi-frame message that is not a sample",
                           conn.producer_id);
      }
    } else {
      event = decode();
    }
    // The connection's producer is known from its hello on, in message order:
    // a sample right behind its hello in the same burst is decoded as that
    // producer's (its arena blocks are checked against it). Admit() still
    // refuses a second hello under another id.
    if (const auto* hello = std::get_if<HelloEvent>(&event); hello != nullptr && conn.producer_id.empty()) {
      conn.producer_id = hello->producer_id;
    }
    burst.push_back({&conn, std::move(event), payload});
  }
  if (burst.empty()) return;
  last_message_ = clock_.Now();
  std::vector<std::pair<Conn*, wire::IngestReply>> replies;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    for (Received& r : burst) Admit(*r.conn, std::move(r.event), r.bytes, replies);
  }
  burst.clear();  // what was not admitted is freed outside the lock
  state_.cv.notify_all();
  std::vector<ConnKey> gone;
  for (auto& [conn, reply] : replies) {
    if (!Reply(*conn, reply)) gone.push_back({conn->socket, conn->routing_id});
  }
  for (const ConnKey& key : gone) Forget(key);
  GrantCredits();
}

std::optional<std::string> IngestChannel::EpochRefusal(uint32_t epoch) const {
  const std::string e = "epoch " + std::to_string(epoch);
  // A closed epoch is the tracker's to judge (already ended, or late for a
  // Non-Join closure).
  if (state_.tracker.IsClosed(epoch)) return std::nullopt;
  if (const std::optional<uint32_t> trainer = TrainerEpoch(state_)) {
    // The trainer decides where the job is, also on a fresh daemon after a
    // resume: its epoch, not epoch 0, is where the held epochs start.
    if (epoch < *trainer) {
      return e + " is before epoch " + std::to_string(*trainer) +
             ", the one the trainer trains now; it will not be trained: send the trainer's epoch";
    }
    if (epoch - *trainer > kEpochHorizon) {
      return e + " is more than " + std::to_string(kEpochHorizon) + " epochs after epoch " +
             std::to_string(*trainer) + ", the one the trainer trains now; send epochs in order";
    }
    return std::nullopt;
  }
  const uint32_t first_open = state_.tracker.FirstOpenEpoch();
  if (epoch < first_open) {
    return e + " is before epoch " + std::to_string(first_open) +
           ", the first one this daemon has not closed; it will not be trained";
  }
  // Before the trainer asks (the producers of a resumed job may start first,
  // at any epoch): at most kEpochHorizon + 1 neighbouring epochs are held.
  if (const auto range = state_.tracker.OpenEpochRange()) {
    const uint32_t lo = std::min(range->first, epoch), hi = std::max(range->second, epoch);
    if (hi - lo > kEpochHorizon) {
      return e + " is more than " + std::to_string(kEpochHorizon) + " epochs away from epoch " +
             std::to_string(epoch == lo ? range->second : range->first) +
             ", which producers already send (the trainer has not asked for an epoch yet); send epochs in order";
    }
  }
  return std::nullopt;
}

void IngestChannel::RefuseOutsideEpochs(const std::string& producer_id, uint32_t epoch, uint64_t id,
                                        const std::string& why) {
  // Counted as sent in the producer's stream (its end_stream then agrees),
  // and filed under the trainer's epoch when there is one: its summary says
  // why its samples did not come.
  state_.tracker.NoteRefused(producer_id, epoch);
  const std::optional<uint32_t> trainer = TrainerEpoch(state_);
  const auto range = state_.tracker.OpenEpochRange();
  const uint32_t filed = trainer ? *trainer : range ? range->first : state_.tracker.FirstOpenEpoch();
  Reject(MakeReject(wire::WRONG_EPOCH,
                    "sample " + std::to_string(id) + " from producer '" + producer_id + "' refused: " + why,
                    producer_id, &id)
             .rejection,
         filed, true);
}

void IngestChannel::Reject(wire::Rejection rejection, std::optional<uint32_t> epoch, bool is_sample) {
  RejectionLog::Truncate(rejection);
  const uint32_t e = epoch.value_or(state_.current_epoch.value_or(0));
  // A flood of bad input must not flood the log either: the first ones are
  // logged, the rest counted (all of them are in the summary's count).
  constexpr uint64_t kLoggedPerEpoch = 100;
  const uint64_t seen = state_.rejections.Count(e);
  if (seen < kLoggedPerEpoch) {
    spdlog::warn("rejected input: {} ({})", rejection.message(), wire::ErrorCode_Name(rejection.code()));
  } else if (seen == kLoggedPerEpoch) {
    spdlog::warn("epoch {}: more than {} rejections; further ones are counted, not logged", e,
                 kLoggedPerEpoch);
  }
  if (is_sample) {
    metrics_.samples_rejected.fetch_add(1);
    metrics_.samples_received.fetch_add(1);
  }
  if (is_sample) ++state_.epoch_received[e];
  state_.rejections.Record(std::move(rejection), e);
}

void IngestChannel::Admit(Conn& conn, IngestEvent&& event, uint64_t charged_bytes,
                          std::vector<std::pair<Conn*, wire::IngestReply>>& replies) {
  if (auto* hello = std::get_if<HelloEvent>(&event)) {
    if (!conn.producer_id.empty() && conn.producer_id != hello->producer_id) {
      Reject(MakeReject(wire::MALFORMED_HEADER,
                        "a connection that said hello as '" + conn.producer_id + "' said hello again as '" +
                            hello->producer_id + "'; one producer id per connection",
                        conn.producer_id)
                 .rejection,
             std::nullopt, false);
      return;
    }
    conn.producer_id = hello->producer_id;
    state_.tracker.OnHello(hello->producer_id);
    spdlog::debug("producer '{}' connected (rank {})", hello->producer_id, hello->rank);
    if (hello->rank >= 0 && hello->rank != options_.rank) {
      spdlog::warn("producer '{}' says it feeds rank {} but this is rank {}", hello->producer_id, hello->rank,
                   options_.rank);
    }
  } else if (std::get_if<StartEpochEvent>(&event)) {
    // Producers announce epochs for logging only; the trainer decides the order.
  } else if (auto* end = std::get_if<EndStreamEvent>(&event)) {
    std::optional<wire::Rejection> r;
    if (std::optional<std::string> why = EpochRefusal(end->epoch)) {
      // Not a count mismatch: the stream's epoch is not one the daemon holds,
      // and that is what the producer is told.
      const uint64_t refused = state_.tracker.Refused(end->producer_id, end->epoch);
      r = MakeReject(wire::WRONG_EPOCH,
                     "end_stream of producer '" + end->producer_id + "' refused: " + *why +
                         (refused > 0 ? " (" + std::to_string(refused) + " of its " +
                                            std::to_string(end->samples_sent) +
                                            " samples of that epoch were refused for this reason)"
                                      : std::string()),
                     end->producer_id)
              .rejection;
    } else {
      r = state_.tracker.OnEndStream(end->producer_id, end->epoch, end->samples_sent);
    }
    wire::IngestReply reply = NewReply();
    if (r) {
      *reply.mutable_rejection() = *r;
      Reject(std::move(*r), end->epoch, false);
    } else {
      reply.mutable_stream_ack()->set_epoch(end->epoch);
      reply.mutable_stream_ack()->set_samples_received(end->samples_sent);
    }
    // The stream is over: its unused credit returns to the buffer (the client
    // drops its own when the acknowledgement arrives; it waits for it).
    outstanding_bytes_ -= std::max<int64_t>(conn.credit_bytes, 0);
    outstanding_samples_ -= std::max<int64_t>(conn.credit_samples, 0);
    conn.credit_bytes = 0;
    conn.credit_samples = 0;
    conn.ahead = end->epoch >= state_.current_epoch.value_or(state_.tracker.FirstOpenEpoch());
    replies.emplace_back(&conn, std::move(reply));
    spdlog::debug("producer '{}' ended epoch {} after {} samples", end->producer_id, end->epoch,
                  end->samples_sent);
  } else if (auto* reject = std::get_if<RejectEvent>(&event)) {
    std::optional<uint32_t> epoch;
    if (reject->has_epoch) epoch = reject->epoch;
    const bool is_sample = reject->rejection.has_sample_id() || charged_bytes > 0;
    if (reject->rejection.has_sample_id() && reject->has_epoch) {
      // Count it against the producer's stream so end_stream totals still match
      // (without opening bookkeeping for an epoch the daemon does not hold).
      if (EpochRefusal(reject->epoch)) {
        state_.tracker.NoteRefused(reject->rejection.producer_id(), reject->epoch);
      } else {
        state_.tracker.OnSample(reject->rejection.producer_id(), reject->epoch, reject->rejection.sample_id());
        // Its place in the order is taken: a deterministic rank does not wait for it.
        if (options_.deterministic && reject->seq && !state_.tracker.IsClosed(reject->epoch)) {
          state_.buffer.NoteSeq(reject->epoch, *reject->seq);
        }
      }
    }
    Reject(std::move(reject->rejection), epoch, is_sample);
  } else if (auto* s = std::get_if<SampleEvent>(&event)) {
    Sample& sample = s->sample;
    const uint32_t epoch = sample.epoch;
    if (sample.producer_id != conn.producer_id) {
      const uint64_t id = sample.meta.id;
      Reject(MakeReject(wire::UNKNOWN_PRODUCER,
                        "sample " + std::to_string(id) + " names producer '" + sample.producer_id +
                            "' but its connection said hello as '" + conn.producer_id +
                            "'; send hello first and keep one producer id per connection",
                        sample.producer_id, &id)
                 .rejection,
             epoch, true);
      return;
    }
    const uint32_t first_open = state_.tracker.FirstOpenEpoch();
    if (std::optional<std::string> why = EpochRefusal(epoch)) {
      RefuseOutsideEpochs(sample.producer_id, epoch, sample.meta.id, *why);
      return;
    }
    if (options_.deterministic && !state_.tracker.IsClosed(epoch)) {
      const uint64_t id = sample.meta.id;
      if (!sample.seq) {
        state_.tracker.OnSample(sample.producer_id, epoch, id);
        Reject(MakeReject(wire::MALFORMED_HEADER,
                          "sample " + std::to_string(id) + " from producer '" + sample.producer_id +
                              "' has no seq; alignment.deterministic needs every sample's position in "
                              "its rank's list (Producer.send(..., seq=i); OdbDataLoader sends it)",
                          sample.producer_id, &id)
                   .rejection,
               epoch, true);
        return;
      }
      if (!state_.buffer.NoteSeq(epoch, *sample.seq)) {
        state_.tracker.OnSample(sample.producer_id, epoch, id);
        Reject(MakeReject(wire::DUPLICATE_ID,
                          "sample " + std::to_string(id) + " from producer '" + sample.producer_id + "' has seq " +
                              std::to_string(*sample.seq) + ", which another sample of epoch " +
                              std::to_string(epoch) + " already had; seq must be unique per rank and epoch",
                          sample.producer_id, &id)
                   .rejection,
               epoch, true);
        return;
      }
    } else if (!options_.deterministic) {
      sample.seq.reset();  // ignored: planning goes by arrival
    }
    if (auto r = state_.tracker.OnSample(sample.producer_id, epoch, sample.meta.id)) {
      Reject(std::move(*r), epoch, true);
      return;
    }
    auto schema = schemas_.find(epoch);
    if (schema == schemas_.end()) {
      const uint32_t oldest = TrainerEpoch(state_).value_or(first_open);
      std::erase_if(schemas_, [&](const auto& entry) { return entry.first < oldest; });
      collate::CollateOptions options = options_.collate;
      // Per-phase plans batch the encoder fields apart (never packed).
      if (options_.phase_plans) options.packed = false;
      schema = schemas_.emplace(epoch, std::make_unique<EpochSchema>(std::move(options))).first;
    }
    if (auto r = schema->second->Check(sample)) {
      if (r->code() == wire::CONFIG_MISMATCH) {
        spdlog::error("the config does not fit the data: {} (every such sample is rejected)", r->message());
      }
      Reject(std::move(*r), epoch, true);
      return;
    }
    // Ahead: a later epoch than the one being planned (or, before the
    // trainer starts one, than the first open epoch).
    conn.ahead = epoch > state_.current_epoch.value_or(first_open);
    sample.meta.owner_rank = options_.rank;
    if (options_.reject_over_budget && !grouping::FitsAlone(options_.budget, sample.meta.lengths)) {
      const uint64_t id = sample.meta.id;
      Reject(MakeReject(wire::OVER_BUDGET,
                        "sample " + std::to_string(id) +
                            " (tokens=" + std::to_string(sample.meta.lengths.tokens) +
                            ", vision=" + std::to_string(sample.meta.lengths.vision_patches) +
                            ", audio=" + std::to_string(sample.meta.lengths.audio_frames) +
                            ") fits no budget (" + grouping::DescribeBudget(options_.budget) +
                            "); raise the budget or set grouping.over_budget: isolate",
                        sample.producer_id, &id)
                 .rejection,
             epoch, true);
      return;
    }
    if (auto r = state_.buffer.Add(std::move(sample))) {
      Reject(std::move(*r), epoch, true);
      return;
    }
    ++state_.epoch_received[epoch];
    metrics_.samples_received.fetch_add(1);
  }
}

bool IngestChannel::Reply(Conn& conn, const wire::IngestReply& reply) {
  std::vector<zmq::message_t> parts;
  const std::string bytes = reply.SerializeAsString();
  parts.emplace_back(bytes.data(), bytes.size());
  Transfer t = TrySendTo(sockets_[conn.socket], conn.routing_id, parts);
  if (t.code == TransferCode::kUnreachable) {
    // The producer is gone: its credit returns to the buffer.
    outstanding_bytes_ -= std::max<int64_t>(conn.credit_bytes, 0);
    outstanding_samples_ -= std::max<int64_t>(conn.credit_samples, 0);
    conn.credit_bytes = 0;
    conn.credit_samples = 0;
    return false;
  }
  if (!t.ok()) {
    spdlog::warn("reply to producer '{}' not sent ({})", conn.producer_id, TransferCodeName(t.code));
  }
  return true;
}

uint64_t IngestChannel::WindowBytes() const {
  // Room shared among the producers that said hello; a producer whose next
  // sample is larger asks for it (CreditRequest) and gets it when room allows.
  size_t producers = 0;
  for (const auto& [key, conn] : conns_) producers += conn.producer_id.empty() ? 0 : 1;
  const uint64_t share = options_.buffer_max_bytes / (2 * std::max<size_t>(producers, 1));
  return std::clamp<uint64_t>(share, std::min<uint64_t>(64 << 10, max_sample_bytes_), max_sample_bytes_);
}

void IngestChannel::GrantCredits() {
  int64_t free_bytes, free_samples, ahead_room;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    free_bytes = static_cast<int64_t>(state_.buffer.RoomBytes()) - outstanding_bytes_;
    free_samples = static_cast<int64_t>(state_.buffer.RoomSamples()) - outstanding_samples_;
    const uint32_t base = state_.current_epoch.value_or(state_.tracker.FirstOpenEpoch());
    const uint64_t outside = state_.buffer.BytesOutsideEpoch(base);
    ahead_room = static_cast<int64_t>(options_.buffer_max_bytes / 2) - static_cast<int64_t>(outside);
  }
  for (const auto& [key, conn] : conns_) {
    if (conn.ahead) ahead_room -= std::max<int64_t>(conn.credit_bytes, 0);
  }
  const uint64_t window = WindowBytes();
  const auto now = clock_.Now();
  // Samples are lent to producers that send (CreditWindow): a producer that
  // said hello and sends nothing is lent one, and all of them together at
  // most half the buffer, so idle producers cannot keep it from busy ones.
  size_t producers = 0;
  for (const auto& [key, conn] : conns_) producers += conn.producer_id.empty() ? 0 : 1;
  const int64_t share = CreditWindow::Share(options_.buffer_max_samples, producers, window_samples_);
  // alignment.deterministic: a producer may send seq < frontier + window of
  // its epoch (ProducerCredit.seq_limit). A producer whose next sample is at
  // the limit asked for more (wanted_seq); it gets it once the frontier moved.
  std::map<uint32_t, uint64_t> seq_limits;
  uint32_t base_epoch = 0;
  if (options_.deterministic) {
    std::lock_guard<std::mutex> lock(state_.mu);
    base_epoch = state_.current_epoch.value_or(state_.tracker.FirstOpenEpoch());
    seq_limits[base_epoch] = state_.buffer.Frontier(base_epoch) + options_.window;
    for (const auto& [key, conn] : conns_) {
      if (conn.wanted_seq)
        seq_limits[conn.wanted_seq_epoch] = state_.buffer.Frontier(conn.wanted_seq_epoch) + options_.window;
    }
  }
  auto set_limit = [&](wire::ProducerCredit& credit, uint32_t epoch) {
    credit.set_seq_limit(seq_limits[epoch]);
    credit.set_seq_epoch(epoch);
  };
  // Producers that went away without ending their stream hold credit; an
  // empty grant to each connection quiet for a second finds them (ROUTER
  // answers EHOSTUNREACH) so their credit returns to the buffer.
  const bool probe = now - last_probe_ > std::chrono::seconds(1);
  if (probe) last_probe_ = now;
  std::vector<ConnKey> gone;
  for (auto& [key, conn] : conns_) {
    if (conn.producer_id.empty()) {
      // Never said hello, holds no credit: forgotten once quiet.
      if (probe && now - conn.last_heard > std::chrono::seconds(1)) gone.push_back(key);
      continue;
    }
    if (conn.wanted_seq && seq_limits[conn.wanted_seq_epoch] > *conn.wanted_seq) {
      wire::IngestReply raise = NewReply();
      set_limit(*raise.mutable_credit(), conn.wanted_seq_epoch);
      conn.wanted_seq.reset();
      if (!Reply(conn, raise)) {
        gone.push_back(key);
        continue;
      }
    }
    // Every quiet connection is probed, also one that waits for room: a
    // producer that died while the buffer was full holds no credit, and
    // unless it is found gone its silence is taken for the daemon's own
    // back-pressure (CheckSilence) and the stall never gets a name.
    if (probe && now - conn.last_heard > std::chrono::seconds(1)) {
      wire::IngestReply ping = NewReply();
      ping.mutable_credit();
      if (!Reply(conn, ping)) {
        gone.push_back(key);
        continue;
      }
    }
    // One that could send and did not for a second is lent one sample again
    // (its top-ups stop; what it holds returns as it sends or leaves).
    if (MaySend(conn) && now - conn.last_sample > std::chrono::seconds(1)) conn.window.Quiet();
    // Bytes follow the samples lent: a producer lent one sample is lent
    // room for about one (a larger one asks, CreditRequest), so idle
    // producers pin no more bytes than samples.
    const int64_t lend = conn.window.Samples(share);
    const uint64_t per_sample = std::max<uint64_t>(kBytesPerLentSample, conn.largest_sample);
    const uint64_t lent_bytes =
        std::min<uint64_t>(window, static_cast<uint64_t>(lend) * std::min<uint64_t>(per_sample, window));
    const int64_t target = static_cast<int64_t>(std::max<uint64_t>(lent_bytes, conn.wanted_bytes));
    const int64_t need_bytes = target - conn.credit_bytes;
    const int64_t need_samples = lend - conn.credit_samples;
    // Top up once half the window is spent (or the producer asked for more,
    // or holds none): one credit message per half window, not one per burst,
    // which for small samples was one message per sample each way.
    const bool low = 2 * need_bytes >= target || 2 * need_samples >= lend ||
                     conn.credit_samples <= 0 || conn.credit_bytes <= 0 || conn.wanted_bytes > 0;
    if (!low || (need_bytes <= 0 && need_samples <= 0)) continue;
    // Bytes are topped up only when they run low too: a producer that needs
    // samples but still holds bytes is not charged a byte grant (an ahead
    // producer's held bytes would otherwise block its sample top-ups).
    const bool bytes_low = 2 * need_bytes >= target || conn.credit_bytes <= 0 || conn.wanted_bytes > 0;
    const int64_t grant_bytes = bytes_low ? std::max<int64_t>(need_bytes, 0) : 0;
    const int64_t grant_samples = std::max<int64_t>(need_samples, 0);
    if (grant_bytes > free_bytes || grant_samples > free_samples) continue;  // wait for room
    if (conn.ahead && grant_bytes > 0 && grant_bytes > ahead_room) continue;
    wire::IngestReply reply = NewReply();
    reply.mutable_credit()->set_bytes(static_cast<uint64_t>(grant_bytes));
    reply.mutable_credit()->set_samples(static_cast<uint32_t>(grant_samples));
    reply.mutable_credit()->set_max_sample_bytes(max_sample_bytes_);
    if (options_.deterministic) set_limit(*reply.mutable_credit(), base_epoch);
    conn.credit_bytes += grant_bytes;
    conn.credit_samples += grant_samples;
    outstanding_bytes_ += grant_bytes;
    outstanding_samples_ += grant_samples;
    free_bytes -= grant_bytes;
    free_samples -= grant_samples;
    if (conn.ahead) ahead_room -= grant_bytes;
    if (conn.credit_bytes >= static_cast<int64_t>(conn.wanted_bytes)) conn.wanted_bytes = 0;
    if (!Reply(conn, reply)) gone.push_back(key);
  }
  for (const ConnKey& key : gone) Forget(key);
}

void IngestChannel::Forget(const ConnKey& key) {
  auto it = conns_.find(key);
  if (it == conns_.end()) return;
  const std::string& producer = it->second.producer_id;
  if (!producer.empty()) {
    // Worth a line when it leaves a stream open: the epoch waits for it (a
    // producer may reconnect, so this is not an error until
    // emit.producer_timeout_ms says so).
    std::lock_guard<std::mutex> lock(state_.mu);
    if (state_.current_epoch) {
      const uint32_t epoch = *state_.current_epoch;
      const auto active = state_.tracker.ActiveProducers(epoch);
      if (std::find(active.begin(), active.end(), producer) != active.end()) {
        spdlog::warn(
            "producer '{}' left without ending its stream for epoch {}; the epoch waits for it "
            "(emit.producer_timeout_ms {} ms)",
            producer, epoch, options_.producer_timeout_ms);
      }
    }
  }
  conns_.erase(it);
}

bool IngestChannel::MaySend(const Conn& conn) {
  // Credit for a sample, and not waiting for more: a producer that asked for
  // bytes (its next sample is larger) or for a higher seq limit is held back
  // by the daemon.
  return conn.credit_samples > 0 && conn.credit_bytes > 0 &&
         (conn.wanted_bytes == 0 || conn.credit_bytes >= static_cast<int64_t>(conn.wanted_bytes)) &&
         !conn.wanted_seq;
}

void IngestChannel::NoteEpochRequested() { last_message_ = clock_.Now(); }

std::optional<std::string> IngestChannel::CheckStall() {
  if (!options_.deterministic) return std::nullopt;
  const auto now = clock_.Now();
  std::lock_guard<std::mutex> lock(state_.mu);
  bool stalled = state_.current_epoch.has_value();
  uint32_t epoch = 0;
  size_t in_order = 0;
  if (stalled) {
    epoch = *state_.current_epoch;
    size_t connected = 0;
    for (const auto& [key, conn] : conns_) connected += conn.producer_id.empty() ? 0 : 1;
    const size_t known =
        std::max(connected, state_.tracker.ActiveProducers(epoch).size() + state_.tracker.EndedCount(epoch));
    in_order = state_.buffer.PendingInOrder(epoch, static_cast<size_t>(options_.window) + 1, false).size();
    // Waiting for samples in order, every expected producer is there, and
    // none of them may send: each is out of credit (the buffer has no room
    // for it) or holds its next sample back at the seq limit.
    stalled = !state_.tracker.StreamFinished(epoch, state_.expected_producers) &&
              in_order <= options_.window && known >= state_.expected_producers && !conns_.empty();
    for (const auto& [key, conn] : conns_) {
      if (!stalled) break;
      if (!conn.producer_id.empty() && MaySend(conn)) stalled = false;
    }
  }
  if (!stalled) {
    stall_since_.reset();
    return std::nullopt;
  }
  if (!stall_since_) stall_since_ = now;
  if (now - *stall_since_ < std::chrono::seconds(2)) return std::nullopt;
  return "alignment.deterministic: rank " + std::to_string(options_.rank) + " waits for epoch " +
         std::to_string(epoch) + "'s sample seq " + std::to_string(state_.buffer.Frontier(epoch)) +
         " (it has " + std::to_string(in_order) + " samples in order and needs " +
         std::to_string(options_.window + 1) + ") but no producer can send it: the buffer holds " +
         std::to_string(state_.buffer.count()) + " samples / " + std::to_string(state_.buffer.bytes()) +
         " bytes of its limits (buffer.max_samples " + std::to_string(options_.buffer_max_samples) +
         ", buffer.max_bytes " + std::to_string(options_.buffer_max_bytes) +
         "). Raise buffer.max_bytes or lower grouping.window (a rank buffers up to two windows of samples "
         "in order), or check that the producer of that seq is alive";
}

std::optional<std::string> IngestChannel::CheckSilence() {
  if (options_.producer_timeout_ms == 0) return std::nullopt;
  const auto now = clock_.Now();
  std::lock_guard<std::mutex> lock(state_.mu);
  if (!state_.current_epoch) {
    last_message_ = now;
    return std::nullopt;
  }
  const uint32_t epoch = *state_.current_epoch;
  if (state_.tracker.StreamFinished(epoch, state_.expected_producers)) return std::nullopt;
  // Silence is the producers' only while some producer may send: with every
  // credit used up, the daemon itself is holding them back.
  bool someone_may_send = conns_.empty();
  for (const auto& [key, conn] : conns_) {
    if (!conn.producer_id.empty() && MaySend(conn)) someone_may_send = true;
  }
  if (!someone_may_send) {
    last_message_ = now;
    return std::nullopt;
  }
  if (now - last_message_ <= std::chrono::milliseconds(options_.producer_timeout_ms)) return std::nullopt;
  const auto active = state_.tracker.ActiveProducers(epoch);
  const size_t ended = state_.tracker.EndedCount(epoch);
  std::string open;
  for (const auto& p : active) open += (open.empty() ? "" : ", ") + p;
  const size_t expected = state_.expected_producers;
  const size_t silent = expected > ended + active.size() ? expected - ended - active.size() : 0;
  // Input refused for this epoch (e.g. samples of an epoch the trainer does
  // not train) is often why its streams never complete.
  const uint64_t refused = state_.rejections.Count(epoch);
  const std::string rejected =
      refused == 0 ? std::string()
                   : "; " + std::to_string(refused) +
                         " input(s) were rejected during this epoch (the rejections and the daemon's log say why)";
  return "no message from any producer for " + std::to_string(options_.producer_timeout_ms) +
         " ms while epoch " + std::to_string(epoch) + "'s input is incomplete: " + std::to_string(ended) +
         " of " + std::to_string(expected) + " expected producer(s) ended their stream; " +
         (open.empty() ? std::string("no stream is open")
                       : "open streams (samples sent, no end_stream): " + open) +
         "; " + std::to_string(silent) + " expected producer(s) sent nothing of epoch " +
         std::to_string(epoch) + " yet" + rejected +
         ". A data worker probably died or hangs (emit.producer_timeout_ms)";
}

}  // namespace odb::ingest
