#include "src/exchange/payload_exchange.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <utility>

#include "src/common/zmq_transfer.h"
#include "src/ingest/decoder.h"
#include "src/wire/tensor_codec.h"

namespace odb::exchange {

namespace {

constexpr char kZapDomain[] = "odb-exchange";

}  // namespace

PayloadExchange::PayloadExchange(ExchangeOptions options, DaemonState& state, DaemonMetrics& metrics,
                                 const Clock& clock)
    : options_(std::move(options)),
      state_(state),
      metrics_(metrics),
      clock_(clock),
      rx_(context_, zmq::socket_type::router) {}

PayloadExchange::~PayloadExchange() {
  // Sockets close before the authenticator stops: a handshake in progress
  // then never waits on a handler that is gone.
  senders_.clear();
  if (zap_) zmq_socket_monitor(rx_.handle(), nullptr, 0);
  rx_.close();
  if (zap_) zap_->Stop();
}

std::string PayloadExchange::Announcement() const {
  return EncodeAnnouncement(PeerAnnouncement{bound_, keys_.public_key});
}

absl::Status PayloadExchange::Bind() {
  auto keys = NewCurveKeypair();
  if (!keys.ok()) return keys.status();
  keys_ = std::move(*keys);
  // A peer that connects before this rank has the job's keys is held until
  // then (at most the connect timeout), not refused.
  zap_ = std::make_unique<ZapAuthenticator>(context_, keyring_, kZapDomain,
                                            std::chrono::milliseconds(options_.connect_timeout_ms), clock_,
                                            &metrics_.exchange_connections_refused);
  if (absl::Status s = zap_->WatchHandshakes(rx_); !s.ok()) return s;
  if (absl::Status s = zap_->Start(); !s.ok()) return s;
  try {
    rx_.set(zmq::sockopt::linger, 0);
    rx_.set(zmq::sockopt::rcvhwm, 0);  // bounded by the plan (samples already buffered on a peer)
    rx_.set(zmq::sockopt::curve_server, true);
    rx_.set(zmq::sockopt::curve_secretkey, keys_.secret_key);
    rx_.set(zmq::sockopt::zap_domain, kZapDomain);
    // A connection that does not finish its handshake (a port scanner, a
    // silent client) is dropped after this long, so it holds no descriptor.
    rx_.set(zmq::sockopt::handshake_ivl,
            static_cast<int>(std::max<uint32_t>(1000, options_.connect_timeout_ms)));
    rx_.bind("tcp://" + options_.hostname + ":*");
    bound_ = rx_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError("cannot bind the payload exchange on " + options_.hostname + " (" +
                                  e.what() + ")");
  }
  return absl::OkStatus();
}

absl::Status PayloadExchange::OnReadable() {
  std::vector<zmq::message_t> parts;
  for (int n = 0; n < 256; ++n) {
    Transfer t = TryRecvMultipart(rx_, parts);
    if (t.code == TransferCode::kAgain) return absl::OkStatus();
    if (t.code == TransferCode::kInterrupted) continue;
    if (!t.ok()) return absl::UnavailableError("payload exchange receive failed: " + t.error);
    if (parts.size() < 2) continue;
    // The sender's rank as the authenticator established it from its key;
    // the routing id is the sender's own word and must agree.
    const char* user_id = nullptr;
    try {
      user_id = parts.back().gets("User-Id");
    } catch (const zmq::error_t&) {
      user_id = nullptr;
    }
    if (user_id == nullptr || *user_id == '\0') {
      return absl::InternalError("a payload-exchange message arrived without an authenticated peer");
    }
    const int32_t owner = std::atoi(user_id);
    if (parts[0].to_string() != user_id) {
      return absl::InternalError("rank " + std::to_string(owner) + " sent a payload under routing id '" +
                                 parts[0].to_string() + "', not its rank");
    }
    std::vector<zmq::message_t> body(std::make_move_iterator(parts.begin() + 1),
                                     std::make_move_iterator(parts.end()));
    ingest::DecodeOptions decode;
    decode.accept_daemon_key = true;  // the owner's key for a repeated id (see SendOutgoing)
    auto event = ingest::DecodeProducerMessage(std::move(body), decode);
    auto* s = std::get_if<ingest::SampleEvent>(&event);
    if (s == nullptr) {
      return absl::InternalError("rank " + std::to_string(owner) +
                                 " sent an unreadable sample payload (its frames are no sample message)");
    }
    s->sample.meta.owner_rank = owner;
    MutexLock lock(mu_);
    parked_.emplace(SampleKey{owner, s->sample.meta.id}, std::move(s->sample));
    cv_.NotifyAll();
  }
  return absl::OkStatus();
}

absl::Status PayloadExchange::Connect(const std::vector<std::string>& announcements) {
  auto peers = DecodeAnnouncements(announcements);
  if (!peers.ok()) return peers.status();
  std::vector<std::string> keys;
  for (const PeerAnnouncement& a : *peers) keys.push_back(a.public_key);
  if (absl::Status s = keyring_.Install(keys, options_.rank); !s.ok()) return s;
  try {
    for (size_t r = 0; r < peers->size(); ++r) {
      zmq::socket_t socket(context_, zmq::socket_type::dealer);
      socket.set(zmq::sockopt::linger, 0);
      socket.set(zmq::sockopt::sndhwm, 0);  // bounded by the plan, never dropped
      socket.set(zmq::sockopt::routing_id, std::to_string(options_.rank));
      // This rank proves its key; the peer proves the key it announced.
      socket.set(zmq::sockopt::curve_serverkey, (*peers)[r].public_key);
      socket.set(zmq::sockopt::curve_publickey, keys_.public_key);
      socket.set(zmq::sockopt::curve_secretkey, keys_.secret_key);
      if (static_cast<int>(r) != options_.rank) socket.connect((*peers)[r].endpoint);
      senders_.push_back(std::move(socket));
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(std::string("cannot connect the payload exchange: ") + e.what());
  }
  spdlog::info("payload exchange ready: {} peers, CURVE-authenticated", peers->size() - 1);
  return absl::OkStatus();
}

absl::Status PayloadExchange::SendOutgoing(uint32_t epoch, const RoundOutcome& outcome) {
  // Samples this rank also needs itself (it encodes or emits them too) stay
  // here, parked with the payloads that arrive from peers.
  std::set<uint64_t> needed_here;
  for (const StepPlan& step : outcome.steps) {
    for (size_t i = 0; i < step.sample_ids.size(); ++i) {
      if (step.sample_owners[i] == options_.rank) needed_here.insert(step.sample_ids[i]);
    }
    for (const PhaseRoute& route : step.phases) {
      for (size_t i = 0; i < route.ids.size(); ++i) {
        if (route.owners[i] == options_.rank) needed_here.insert(route.ids[i]);
      }
    }
  }
  std::map<uint64_t, Sample> taken;
  {
    MutexLock lock(state_.mu);
    for (const auto& [dest, ids] : outcome.outgoing) {
      for (uint64_t id : ids) {
        if (taken.count(id)) continue;
        std::optional<Sample> one = state_.buffer.TakeOne(epoch, id);
        if (!one) {
          return absl::InternalError("the plan moves sample " + std::to_string(id) + " that rank " +
                                     std::to_string(options_.rank) + " does not hold");
        }
        taken.emplace(id, std::move(*one));
      }
    }
  }
  for (const auto& [dest, ids] : outcome.outgoing) {
    for (uint64_t id : ids) {
      const Sample& sample = taken.at(id);
      wire::ProducerMessage m;
      m.set_version(wire::PROTOCOL_VERSION_CURRENT);
      wire::SampleHeader* h = m.mutable_sample();
      h->set_producer_id(sample.producer_id);
      h->set_sample_id(sample.UserId());
      if (sample.user_id) h->set_daemon_key(sample.meta.id);  // a repeated id, keyed apart by its owner
      h->set_epoch(epoch);
      h->set_tokens(sample.meta.lengths.tokens);
      h->set_vision_patches(sample.meta.lengths.vision_patches);
      h->set_audio_frames(sample.meta.lengths.audio_frames);
      // Everything the producer said about the sample travels with it: the
      // step names the seq (the copy of a repeated id) and weighs loss tokens.
      if (sample.seq) h->set_seq(*sample.seq);
      if (sample.meta.loss_tokens != kEveryTokenBearsLoss) h->set_loss_tokens(sample.meta.loss_tokens);
      for (size_t i = 0; i < sample.tensors.size(); ++i) {
        const TensorView& t = sample.tensors[i];
        wire::EncodeTensorDesc(t.name, t.dtype, t.shape, static_cast<uint32_t>(i + 1), h->add_tensors());
      }
      std::vector<zmq::message_t> parts;
      const std::string header = m.SerializeAsString();
      parts.emplace_back(header.data(), header.size());
      for (const TensorView& t : sample.tensors) parts.emplace_back(t.data, t.size_bytes);
      Transfer sent = TrySendMultipart(senders_.at(static_cast<size_t>(dest)), parts);
      if (sent.ok()) metrics_.exchange_bytes_sent.fetch_add(sample.meta.payload_bytes);
      if (!sent.ok()) {
        // sndhwm is 0 (unbounded): only a broken socket fails here.
        return absl::UnavailableError("sending sample " + std::to_string(sample.meta.id) + " to rank " +
                                      std::to_string(dest) + " failed (" + TransferCodeName(sent.code) + " " +
                                      sent.error + ")");
      }
    }
  }
  MutexLock lock(mu_);
  for (auto& [id, sample] : taken) {
    if (needed_here.count(id)) parked_.emplace(SampleKey{options_.rank, id}, std::move(sample));
  }
  return absl::OkStatus();
}

Clock::TimePoint PayloadExchange::PayloadDeadline() const {
  return clock_.Now() + std::chrono::milliseconds(options_.collective_timeout_ms);
}

size_t PayloadExchange::Parked() const {
  MutexLock lock(mu_);
  return parked_.size();
}

void PayloadExchange::WakeAll() {
  // Under mu_: a Take between its checks and its wait cannot miss the wake-up.
  MutexLock lock(mu_);
  cv_.NotifyAll();
}

absl::StatusOr<Sample> PayloadExchange::Take(const SampleKey& key, Clock::TimePoint deadline,
                                             const std::function<bool()>& cancelled) {
  MutexLock lock(mu_);
  while (parked_.find(key) == parked_.end()) {
    if (key.owner_rank == options_.rank) {
      return absl::InternalError("planner returned sample " + std::to_string(key.id) +
                                 " that is not buffered on rank " + std::to_string(options_.rank));
    }
    if (cancelled()) return absl::CancelledError("daemon stopping");
    const Clock::TimePoint now = clock_.Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError("sample " + std::to_string(key.id) + " from rank " +
                                         std::to_string(key.owner_rank) + " did not arrive within " +
                                         std::to_string(options_.collective_timeout_ms) +
                                         " ms (alignment.collective_timeout_ms)");
    }
    cv_.WaitFor(mu_, std::min<Clock::TimePoint::duration>(deadline - now, kClockRecheck));
  }
  auto it = parked_.lower_bound(key);  // the oldest copy of this key
  Sample out = std::move(it->second);
  parked_.erase(it);
  return out;
}

}  // namespace odb::exchange
