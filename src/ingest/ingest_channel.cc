#include "src/ingest/ingest_channel.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "src/common/fd_budget.h"
#include "src/common/zmq_transfer.h"
#include "src/wire/tensor_codec.h"

namespace odb::ingest {
namespace {

constexpr size_t kBurst = 256;                 // messages per OnReadable (the trainer is never starved)
constexpr size_t kMaxConnections = 4096;       // producer connections tracked at once
constexpr uint64_t kMaxHeaderBytes = 1 << 20;  // a header frame larger than this is refused by ZeroMQ

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
// it asks (and between its epochs).
std::optional<uint32_t> TrainerEpoch(const DaemonState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
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
    : context_(context),
      options_(std::move(options)),
      state_(state),
      metrics_(metrics),
      clock_(clock),
      ledger_(options_.buffer_max_bytes, options_.buffer_max_samples),
      admission_(AdmissionOptions{options_.rank, options_.deterministic, options_.reject_over_budget,
                                  options_.budget}),
      liveness_(clock, options_.producer_timeout_ms) {
  decode_options_.length_field = options_.collate.length_field;
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
                 static_cast<int64_t>(std::max<uint64_t>(ledger_.max_sample_bytes(), kMaxHeaderBytes)));
      socket.bind(endpoint);
      bound_.push_back(socket.get(zmq::sockopt::last_endpoint));
      sockets_.push_back(std::move(socket));
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError("cannot bind the ingest endpoint " + endpoint + " (" + e.what() +
                                    "); is another odbd using it?");
    }
    if (const std::string why = RestrictIpcSocket(bound_.back()); !why.empty()) {
      return absl::PermissionDeniedError("the ingest endpoint " + endpoint + ": " + why);
    }
  }
  return absl::OkStatus();
}

IngestChannel::Conn* IngestChannel::ConnFor(size_t i, const std::string& routing_id) {
  ConnKey key{i, routing_id};
  auto it = conns_.find(key);
  if (it != conns_.end()) return &it->second;
  if (conns_.size() >= MaxProducerConnections()) {
    MutexLock lock(state_.mu);
    Reject(MakeReject(wire::TOO_LARGE, "more than " + std::to_string(MaxProducerConnections()) +
                                           " producer connections; message of a new one refused")
               .rejection,
           std::nullopt, false);
    return nullptr;
  }
  Conn fresh;
  fresh.socket = i;
  fresh.routing_id = routing_id;
  fresh.credit.last_sample = clock_.Now();
  return &conns_.emplace(std::move(key), std::move(fresh)).first->second;
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
    Conn* conn = ConnFor(i, parts_[0].to_string());
    if (conn == nullptr) continue;
    conn->last_heard = clock_.Now();
    // A sample whose tensors are in the producer's arena is one frame too:
    // its header is parsed once, here.
    std::optional<wire::ProducerMessage> arena_sample;
    if (parts_.size() == 2) {
      // A control message; a credit request is the ledger's own business.
      wire::ProducerMessage control;
      if (control.ParseFromArray(parts_[1].data(), static_cast<int>(parts_[1].size()))) {
        if (control.has_credit_request()) {
          ledger_.NoteRequest(conn->credit, control.credit_request());
          continue;
        }
        if (control.has_sample() && control.sample().has_arena()) arena_sample = std::move(control);
      }
    }
    std::vector<zmq::message_t> body;
    body.reserve(parts_.size() - 1);
    for (size_t p = 1; p < parts_.size(); ++p) body.push_back(std::move(parts_[p]));
    uint64_t charged = 0;
    IngestEvent event = Receive(*conn, std::move(body), std::move(arena_sample), charged);
    // The connection's producer is known from its hello on, in message order:
    // a sample right behind its hello in the same burst is decoded as that
    // producer's (its arena blocks are checked against it). Admit() still
    // refuses a second hello under another id.
    if (const auto* hello = std::get_if<HelloEvent>(&event); hello != nullptr && conn->producer_id.empty()) {
      conn->producer_id = hello->producer_id;
    }
    burst.push_back({conn, std::move(event), charged});
  }
  if (burst.empty()) return;
  liveness_.NoteHeard();
  std::vector<std::pair<Conn*, wire::IngestReply>> replies;
  {
    MutexLock lock(state_.mu);
    for (Received& r : burst) Admit(*r.conn, std::move(r.event), r.bytes, replies);
  }
  burst.clear();  // what was not admitted is freed outside the lock
  state_.cv.NotifyAll();
  std::vector<ConnKey> gone;
  for (auto& [conn, reply] : replies) {
    if (!Reply(*conn, reply)) gone.push_back({conn->socket, conn->routing_id});
  }
  for (const ConnKey& key : gone) Forget(key);
  GrantCredits();
}

IngestEvent IngestChannel::Receive(Conn& conn, std::vector<zmq::message_t>&& body,
                                   std::optional<wire::ProducerMessage>&& arena_sample, uint64_t& charged) {
  uint64_t payload = 0;
  for (size_t p = 1; p < body.size(); ++p) payload += body[p].size() + wire::kBookkeepingBytesPerTensor;
  // Arena samples are charged like frames (their bytes count against
  // buffer.max_bytes although they live in the producer's arena).
  if (arena_sample) payload = ArenaPayloadBytes(arena_sample->sample());
  charged = payload;
  const bool is_sample = body.size() > 1 || arena_sample.has_value();
  const ArenaContext arena_context{arenas_, conn.producer_id};
  auto decode = [&]() -> IngestEvent {
    if (arena_sample) {
      return DecodeParsedProducerMessage(*arena_sample, std::move(body), decode_options_, arena_context);
    }
    return DecodeProducerMessage(std::move(body), decode_options_, arena_context);
  };
  const uint64_t max_sample_bytes = ledger_.max_sample_bytes();
  if (!is_sample) return decode();
  if (payload > max_sample_bytes) {
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
    RejectEvent reject =
        MakeReject(wire::TOO_LARGE,
                   (named ? "sample " + std::to_string(id) : std::string("a sample")) + " of " +
                       std::to_string(payload) + " payload bytes from producer '" + conn.producer_id +
                       "' exceeds the largest admissible sample (" + std::to_string(max_sample_bytes) +
                       " bytes = half of buffer.max_bytes); raise buffer.max_bytes",
                   conn.producer_id, named ? &id : nullptr);
    if (named && !conn.producer_id.empty() && header.sample().producer_id() == conn.producer_id) {
      reject.epoch = header.sample().epoch();
      reject.has_epoch = true;
      if (header.sample().has_seq()) reject.seq = header.sample().seq();
    }
    // What credit it had is used up (as much as it held).
    ledger_.Charge(conn.credit, std::min<uint64_t>(payload, std::max<int64_t>(conn.credit.bytes, 0)),
                   clock_.Now());
    return reject;
  }
  if (ledger_.Charge(conn.credit, payload, clock_.Now())) return decode();
  // Decoded anyway, so the report names the sample and it counts against
  // its producer's stream (end_stream totals still match).
  IngestEvent event = decode();
  if (auto* s = std::get_if<SampleEvent>(&event)) {
    const uint64_t id = s->sample.meta.id;
    RejectEvent reject =
        conn.producer_id.empty()
            ? MakeReject(wire::UNKNOWN_PRODUCER,
                         "sample " + std::to_string(id) + " from producer '" + s->sample.producer_id +
                             "' arrived on a connection that never sent hello; call "
                             "Producer::Connect before sending",
                         s->sample.producer_id, &id)
            : MakeReject(wire::CREDIT_EXCEEDED,
                         "sample " + std::to_string(id) + " (" + std::to_string(payload) +
                             " bytes) from producer '" + conn.producer_id +
                             "' was sent without credit (held " + std::to_string(conn.credit.samples) +
                             " samples / " + std::to_string(conn.credit.bytes) +
                             " bytes); producers must wait for the daemon's credit (the odb clients do)",
                         conn.producer_id, &id);
    reject.epoch = s->sample.epoch;
    reject.has_epoch = true;
    reject.seq = s->sample.seq;
    return reject;
  }
  if (std::get_if<RejectEvent>(&event) == nullptr) {
    return MakeReject(wire::MALFORMED_HEADER, "a multi-frame message that is not a sample", conn.producer_id);
  }
  return event;
}

uint64_t IngestChannel::SeqLimit(uint32_t epoch) const {
  // What GrantCredits grants: every limit a producer was told is at most
  // this (the frontier only moves up), so an honest producer never hits it.
  const uint64_t frontier = state_.buffer.Frontier(epoch);
  return frontier > UINT64_MAX - options_.window ? UINT64_MAX : frontier + options_.window;
}

EpochView IngestChannel::ViewOf(uint32_t epoch) const {
  EpochView view;
  view.closed = state_.tracker.IsClosed(epoch);
  view.trainer = TrainerEpoch(state_);
  view.first_open = state_.tracker.FirstOpenEpoch();
  view.open_range = state_.tracker.OpenEpochRange();
  return view;
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
    AdmitEndStream(conn, *end, replies);
  } else if (auto* reject = std::get_if<RejectEvent>(&event)) {
    std::optional<uint32_t> epoch;
    if (reject->has_epoch) epoch = reject->epoch;
    const bool is_sample = reject->rejection.has_sample_id() || charged_bytes > 0;
    // Only a sample of the connection's own producer counts in a stream (and
    // takes a position): a header naming another producer (the decoder
    // rejected it before any check against the connection) must not change
    // that producer's count or steal its seq.
    const bool own = !conn.producer_id.empty() && reject->rejection.producer_id() == conn.producer_id;
    if (own && reject->rejection.has_sample_id() && reject->has_epoch) {
      // Count it against the producer's stream so end_stream totals still match
      // (without opening bookkeeping for an epoch the daemon does not hold).
      if (AdmissionPolicy::EpochRefusal(reject->epoch, ViewOf(reject->epoch))) {
        state_.tracker.NoteRefused(reject->rejection.producer_id(), reject->epoch);
      } else {
        const bool live = !state_.tracker.OnSample(reject->rejection.producer_id(), reject->epoch,
                                                   reject->rejection.sample_id());
        // Its place in the order is taken: a deterministic rank does not wait for it
        // (if it belongs to a live stream: not after its producer ended it).
        // (Only within the seq window: a seq past it was never granted, and
        // noting it would let a producer spread runs without bound; one
        // that finds no room under the buffer's cap is not noted either.)
        if (live && options_.deterministic && reject->seq && !state_.tracker.IsClosed(reject->epoch) &&
            *reject->seq < SeqLimit(reject->epoch)) {
          state_.buffer.NoteSeq(reject->epoch, *reject->seq);
        }
      }
    }
    Reject(std::move(reject->rejection), epoch, is_sample);
  } else if (auto* s = std::get_if<SampleEvent>(&event)) {
    AdmitSample(conn, s->sample);
  }
}

void IngestChannel::AdmitEndStream(Conn& conn, const EndStreamEvent& end,
                                   std::vector<std::pair<Conn*, wire::IngestReply>>& replies) {
  std::optional<wire::Rejection> r;
  if (std::optional<std::string> why = AdmissionPolicy::EpochRefusal(end.epoch, ViewOf(end.epoch))) {
    r = AdmissionPolicy::RefuseEndStream(
        end.producer_id, *why, state_.tracker.Refused(end.producer_id, end.epoch), end.samples_sent);
  } else {
    r = state_.tracker.OnEndStream(end.producer_id, end.epoch, end.samples_sent);
  }
  wire::IngestReply reply = NewReply();
  if (r) {
    *reply.mutable_rejection() = *r;
    Reject(std::move(*r), end.epoch, false);
  } else {
    reply.mutable_stream_ack()->set_epoch(end.epoch);
    reply.mutable_stream_ack()->set_samples_received(end.samples_sent);
  }
  // The stream is over: its unused credit returns to the buffer (the client
  // drops its own when the acknowledgement arrives; it waits for it).
  ledger_.Release(conn.credit);
  conn.credit.ahead = end.epoch >= state_.current_epoch.value_or(state_.tracker.FirstOpenEpoch());
  replies.emplace_back(&conn, std::move(reply));
  spdlog::debug("producer '{}' ended epoch {} after {} samples", end.producer_id, end.epoch,
                end.samples_sent);
}

void IngestChannel::AdmitSample(Conn& conn, Sample& sample) {
  const uint32_t epoch = sample.epoch;
  const EpochView view = ViewOf(epoch);
  Verdict verdict = admission_.AtDoor(sample, conn.producer_id, view);
  switch (verdict.kind) {
    case Verdict::Kind::kPass:
      break;
    case Verdict::Kind::kRejectUncounted:
      Reject(std::move(verdict.rejection), epoch, true);
      return;
    case Verdict::Kind::kRejectCounted:
      state_.tracker.OnSample(sample.producer_id, epoch, sample.meta.id);
      Reject(std::move(verdict.rejection), epoch, true);
      return;
    case Verdict::Kind::kRefuse:
      // Counted as sent in the producer's stream (its end_stream then agrees).
      state_.tracker.NoteRefused(sample.producer_id, epoch);
      Reject(std::move(verdict.rejection), verdict.filed_epoch, true);
      return;
  }
  // Counted in its producer's stream first: a sample that belongs to no live
  // stream (its producer ended it, the epoch ended) takes no position.
  if (auto r = state_.tracker.OnSample(sample.producer_id, epoch, sample.meta.id)) {
    Reject(std::move(*r), epoch, true);
    return;
  }
  // Exactly once per position: a sample with a seq is known by it (in every
  // mode; planning goes by seq only under alignment.deterministic), noted
  // before the checks below so that a rejected one's place is taken too.
  const bool seq_noted = sample.seq.has_value() && !view.closed;
  if (seq_noted) {
    std::optional<wire::Rejection> refused;
    if (options_.deterministic && *sample.seq >= SeqLimit(epoch)) {
      // Never granted (ProducerCredit.seq_limit): a sample far ahead of the
      // frontier would sit in the buffer until its gap filled, taking the
      // room the frontier's own sample needs. Not noted: its place stays
      // open (the frontier waits for it as for any sample not yet sent).
      refused = admission_.SeqBeyondLimit(sample, SeqLimit(epoch), state_.buffer.Frontier(epoch));
    } else {
      switch (state_.buffer.NoteSeq(epoch, *sample.seq)) {
        case buffer::IdSet::Inserted::kNew:
          break;
        case buffer::IdSet::Inserted::kRepeat:
          refused = admission_.DuplicateSeq(sample);
          break;
        case buffer::IdSet::Inserted::kNoRoom:
          refused = state_.buffer.TooManyRuns(sample);
          break;
      }
    }
    if (refused) {
      Reject(std::move(*refused), epoch, true);
      return;
    }
  }
  auto schema = schemas_.find(epoch);
  if (schema == schemas_.end()) {
    const uint32_t oldest = view.trainer.value_or(view.first_open);
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
  conn.credit.ahead = epoch > state_.current_epoch.value_or(view.first_open);
  sample.meta.owner_rank = options_.rank;
  if (auto r = admission_.OverBudget(sample)) {
    Reject(std::move(*r), epoch, true);
    return;
  }
  if (auto r = state_.buffer.Add(std::move(sample), seq_noted)) {
    Reject(std::move(*r), epoch, true);
    return;
  }
  ++state_.epoch_received[epoch];
  metrics_.samples_received.fetch_add(1);
}

bool IngestChannel::Reply(Conn& conn, const wire::IngestReply& reply) {
  std::vector<zmq::message_t> parts;
  const std::string bytes = reply.SerializeAsString();
  parts.emplace_back(bytes.data(), bytes.size());
  Transfer t = TrySendTo(sockets_[conn.socket], conn.routing_id, parts);
  if (t.code == TransferCode::kUnreachable) {
    // The producer is gone: its credit returns to the buffer.
    ledger_.Release(conn.credit);
    return false;
  }
  if (!t.ok()) {
    spdlog::warn("reply to producer '{}' not sent ({})", conn.producer_id, TransferCodeName(t.code));
  }
  return true;
}

size_t IngestChannel::ProducerCount() const {
  size_t producers = 0;
  for (const auto& [key, conn] : conns_) producers += conn.producer_id.empty() ? 0 : 1;
  return producers;
}

void IngestChannel::GrantCredits() {
  CreditRoom room;
  {
    MutexLock lock(state_.mu);
    room.free_bytes = static_cast<int64_t>(state_.buffer.RoomBytes()) - ledger_.outstanding_bytes();
    room.free_samples = static_cast<int64_t>(state_.buffer.RoomSamples()) - ledger_.outstanding_samples();
    // Producers ahead of the epoch being planned share at most half the buffer.
    const uint32_t base = state_.current_epoch.value_or(state_.tracker.FirstOpenEpoch());
    const uint64_t outside = state_.buffer.BytesOutsideEpoch(base);
    room.ahead_bytes = static_cast<int64_t>(options_.buffer_max_bytes / 2) - static_cast<int64_t>(outside);
  }
  for (const auto& [key, conn] : conns_) {
    if (conn.credit.ahead) room.ahead_bytes -= std::max<int64_t>(conn.credit.bytes, 0);
  }
  const auto now = clock_.Now();
  const size_t producers = ProducerCount();
  // alignment.deterministic: a producer may send seq < frontier + window of
  // its epoch (ProducerCredit.seq_limit). A producer whose next sample is at
  // the limit asked for more (wanted_seq); it gets it once the frontier moved.
  std::map<uint32_t, uint64_t> seq_limits;
  uint32_t base_epoch = 0;
  if (options_.deterministic) {
    MutexLock lock(state_.mu);
    base_epoch = state_.current_epoch.value_or(state_.tracker.FirstOpenEpoch());
    seq_limits[base_epoch] = SeqLimit(base_epoch);
    for (const auto& [key, conn] : conns_) {
      if (conn.credit.wanted_seq) {
        const uint32_t e = conn.credit.wanted_seq_epoch;
        seq_limits[e] = SeqLimit(e);
      }
    }
  }
  auto set_limit = [&](wire::ProducerCredit& credit, uint32_t epoch) {
    credit.set_seq_limit(seq_limits[epoch]);
    credit.set_seq_epoch(epoch);
  };
  // Producers that went away without ending their stream hold credit; an
  // empty grant to each quiet connection finds them (ROUTER answers
  // EHOSTUNREACH) so their credit returns to the buffer.
  const bool probe = liveness_.ProbeDue();
  std::vector<ConnKey> gone;
  for (auto& [key, conn] : conns_) {
    CreditAccount& credit = conn.credit;
    if (conn.producer_id.empty()) {
      // Never said hello, holds no credit: forgotten once quiet.
      if (probe && liveness_.Quiet(conn.last_heard)) gone.push_back(key);
      continue;
    }
    if (credit.wanted_seq && seq_limits[credit.wanted_seq_epoch] > *credit.wanted_seq) {
      wire::IngestReply raise = NewReply();
      set_limit(*raise.mutable_credit(), credit.wanted_seq_epoch);
      credit.wanted_seq.reset();
      if (!Reply(conn, raise)) {
        gone.push_back(key);
        continue;
      }
    }
    // Every quiet connection is probed, also one that waits for room: a
    // producer that died while the buffer was full holds no credit, and
    // unless it is found gone its silence is taken for the daemon's own
    // back-pressure (CheckSilence) and the stall never gets a name.
    if (probe && liveness_.Quiet(conn.last_heard)) {
      wire::IngestReply ping = NewReply();
      ping.mutable_credit();
      if (!Reply(conn, ping)) {
        gone.push_back(key);
        continue;
      }
    }
    CreditLedger::NoteIdle(credit, now);
    const std::optional<CreditGrant> grant = ledger_.TopUp(credit, producers, room);
    if (!grant) continue;
    wire::IngestReply reply = NewReply();
    reply.mutable_credit()->set_bytes(static_cast<uint64_t>(grant->bytes));
    reply.mutable_credit()->set_samples(static_cast<uint32_t>(grant->samples));
    reply.mutable_credit()->set_max_sample_bytes(ledger_.max_sample_bytes());
    if (options_.deterministic) set_limit(*reply.mutable_credit(), base_epoch);
    ledger_.Grant(credit, *grant, room);
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
    MutexLock lock(state_.mu);
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

void IngestChannel::NoteEpochRequested() { liveness_.NoteHeard(); }

std::optional<std::string> IngestChannel::CheckStall() {
  if (!options_.deterministic) return std::nullopt;
  MutexLock lock(state_.mu);
  bool stalled = state_.current_epoch.has_value();
  StallReport report;
  if (stalled) {
    report.epoch = *state_.current_epoch;
    const size_t known = std::max(ProducerCount(), state_.tracker.ActiveProducers(report.epoch).size() +
                                                       state_.tracker.EndedCount(report.epoch));
    report.in_order =
        state_.buffer.PendingInOrder(report.epoch, static_cast<size_t>(options_.window) + 1, false).size();
    // Waiting for samples in order, every expected producer is there, and
    // none of them may send: each is out of credit (the buffer has no room
    // for it) or holds its next sample back at the seq limit.
    stalled = !state_.tracker.StreamFinished(report.epoch, state_.expected_producers) &&
              report.in_order <= options_.window && known >= state_.expected_producers && !conns_.empty();
    for (const auto& [key, conn] : conns_) {
      if (!stalled) break;
      if (!conn.producer_id.empty() && CreditLedger::MaySend(conn.credit)) stalled = false;
    }
  }
  if (!liveness_.Stalled(stalled)) return std::nullopt;
  report.rank = options_.rank;
  report.frontier = state_.buffer.Frontier(report.epoch);
  report.window = options_.window;
  report.buffered_samples = state_.buffer.count();
  report.buffered_bytes = state_.buffer.bytes();
  report.max_samples = options_.buffer_max_samples;
  report.max_bytes = options_.buffer_max_bytes;
  return DescribeStall(report);
}

std::optional<std::string> IngestChannel::CheckSilence() {
  if (options_.producer_timeout_ms == 0) return std::nullopt;
  MutexLock lock(state_.mu);
  if (!state_.current_epoch) {
    liveness_.NoteHeard();
    return std::nullopt;
  }
  const uint32_t epoch = *state_.current_epoch;
  if (state_.tracker.StreamFinished(epoch, state_.expected_producers)) return std::nullopt;
  // Silence is the producers' only while some producer may send: with every
  // credit used up, the daemon itself is holding them back.
  bool someone_may_send = conns_.empty();
  for (const auto& [key, conn] : conns_) {
    if (!conn.producer_id.empty() && CreditLedger::MaySend(conn.credit)) someone_may_send = true;
  }
  if (!someone_may_send) {
    liveness_.NoteHeard();
    return std::nullopt;
  }
  if (!liveness_.Silent()) return std::nullopt;
  SilenceReport report;
  report.timeout_ms = options_.producer_timeout_ms;
  report.epoch = epoch;
  report.expected = state_.expected_producers;
  report.ended = state_.tracker.EndedCount(epoch);
  for (const auto& p : state_.tracker.ActiveProducers(epoch)) report.open.push_back(p);
  // Input refused for this epoch (e.g. samples of an epoch the trainer does
  // not train) is often why its streams never complete.
  report.rejected = state_.rejections.Count(epoch);
  return DescribeSilence(report);
}

}  // namespace odb::ingest
