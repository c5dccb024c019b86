#include "src/exchange/peer_auth.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "proto/peer.pb.h"
#include "src/align/peer_wire.h"

namespace odb::exchange {
namespace {

constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";  // fixed by RFC 27
constexpr size_t kKeyBytes = 32;
constexpr size_t kZ85KeyChars = 40;
constexpr char kMonitorEndpoint[] = "inproc://odb-exchange-handshakes";

bool LogThis(uint64_t n) { return n <= 5 || n % 1000 == 0; }  // a flood must not flood the log

std::optional<std::string> RawKey(const std::string& z85) {
  if (z85.size() != kZ85KeyChars) return std::nullopt;
  uint8_t raw[kKeyBytes];
  if (zmq_z85_decode(raw, z85.c_str()) == nullptr) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(raw), kKeyBytes);
}

}  // namespace

absl::StatusOr<CurveKeypair> NewCurveKeypair() {
  if (!zmq_has("curve")) {
    return absl::FailedPreconditionError(
        "this libzmq has no CURVE security (built without libsodium); the payload exchange cannot "
        "authenticate its peers");
  }
  char pub[kZ85KeyChars + 1];
  char sec[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return absl::InternalError(std::string("cannot make a CURVE keypair: ") + zmq_strerror(zmq_errno()));
  }
  return CurveKeypair{pub, sec};
}

std::string EncodeAnnouncement(const PeerAnnouncement& a) {
  peer::ExchangeAnnouncement p;
  p.set_endpoint(a.endpoint);
  p.set_public_key(a.public_key);
  return align::EncodePeerMessage(p);
}

absl::StatusOr<std::vector<PeerAnnouncement>> DecodeAnnouncements(const std::vector<std::string>& gathered) {
  std::vector<PeerAnnouncement> out;
  std::set<std::string> keys;
  for (size_t r = 0; r < gathered.size(); ++r) {
    peer::ExchangeAnnouncement p;
    if (absl::Status s = align::ParsePeerMessage(gathered[r], "payload-exchange announcement", p); !s.ok()) {
      return absl::Status(s.code(), "rank " + std::to_string(r) + ": " + std::string(s.message()));
    }
    PeerAnnouncement a{p.endpoint(), p.public_key()};
    if (!RawKey(a.public_key) || a.endpoint.rfind("tcp://", 0) != 0) {
      return absl::InvalidArgumentError(
          "rank " + std::to_string(r) +
          " announced an unreadable payload-exchange endpoint or key (endpoint '" + a.endpoint.substr(0, 64) +
          "', a key of " + std::to_string(a.public_key.size()) + " characters)");
    }
    if (!keys.insert(a.public_key).second) {
      return absl::InvalidArgumentError("rank " + std::to_string(r) +
                                        " announced a payload-exchange key another rank uses");
    }
    out.push_back(std::move(a));
  }
  return out;
}

absl::Status PeerKeyring::Install(const std::vector<std::string>& public_keys, int self_rank) {
  std::map<std::string, int> rank_of;
  for (size_t r = 0; r < public_keys.size(); ++r) {
    std::optional<std::string> raw = RawKey(public_keys[r]);
    if (!raw) return absl::InvalidArgumentError("rank " + std::to_string(r) + "'s public key is not Z85");
    if (static_cast<int>(r) == self_rank) continue;
    if (!rank_of.emplace(*raw, static_cast<int>(r)).second) {
      return absl::InvalidArgumentError("rank " + std::to_string(r) + "'s public key is another rank's");
    }
  }
  MutexLock lock(mu_);
  if (installed_) return absl::FailedPreconditionError("the peer keys are already installed");
  rank_of_ = std::move(rank_of);
  installed_ = true;
  cv_.NotifyAll();
  return absl::OkStatus();
}

std::optional<int> PeerKeyring::WaitRankOf(std::string_view raw_key, const Clock& clock,
                                           Clock::TimePoint deadline) {
  MutexLock lock(mu_);
  for (Clock::TimePoint now = clock.Now(); !installed_ && !closed_ && now < deadline; now = clock.Now()) {
    cv_.WaitFor(mu_, std::min<Clock::TimePoint::duration>(deadline - now, kClockRecheck));
  }
  if (!installed_) return std::nullopt;
  auto it = rank_of_.find(std::string(raw_key));
  if (it == rank_of_.end()) return std::nullopt;
  return it->second;
}

void PeerKeyring::Close() {
  MutexLock lock(mu_);
  closed_ = true;
  cv_.NotifyAll();
}

ZapAuthenticator::ZapAuthenticator(zmq::context_t& context, PeerKeyring& keyring, std::string domain,
                                   std::chrono::milliseconds install_wait, const Clock& clock,
                                   std::atomic<uint64_t>* refused_counter)
    : context_(context),
      keyring_(keyring),
      domain_(std::move(domain)),
      install_wait_(install_wait),
      clock_(clock),
      socket_(context, zmq::socket_type::rep),
      refused_counter_(refused_counter) {}

ZapAuthenticator::~ZapAuthenticator() { Stop(); }

absl::Status ZapAuthenticator::WatchHandshakes(zmq::socket_t& server) {
  try {
    const int events = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    if (zmq_socket_monitor(server.handle(), kMonitorEndpoint, events) != 0) throw zmq::error_t();
    monitor_.emplace(context_, zmq::socket_type::pair);
    monitor_->set(zmq::sockopt::linger, 0);
    monitor_->connect(kMonitorEndpoint);
  } catch (const zmq::error_t& e) {
    return absl::InternalError(std::string("cannot watch the payload exchange's handshakes: ") + e.what());
  }
  return absl::OkStatus();
}

void ZapAuthenticator::OnMonitorEvent() {
  std::vector<zmq::message_t> event;
  while (true) {
    zmq::message_t part;
    if (!monitor_->recv(part, zmq::recv_flags::dontwait)) break;
    const bool more = part.more();
    event.push_back(std::move(part));
    if (!more) break;
  }
  if (event.empty() || event[0].size() < 6) return;
  uint16_t id = 0;
  uint32_t value = 0;
  std::memcpy(&id, event[0].data(), 2);
  std::memcpy(&value, static_cast<const char*>(event[0].data()) + 2, 4);
  const char* what = id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH       ? "its key is no peer's of this job"
                     : id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? "not a CURVE ZeroMQ client"
                                                                 : "no valid handshake in time, or garbage";
  const uint64_t n = handshakes_failed_.fetch_add(1) + 1;
  if (refused_counter_ != nullptr) refused_counter_->fetch_add(1);
  if (LogThis(n)) {
    spdlog::warn(
        "payload exchange: refused a connection: {} (code {:#x}; {} refused so far); only this job's "
        "daemons may connect",
        what, value, n);
  }
}

absl::Status ZapAuthenticator::Start() {
  try {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind(kZapEndpoint);
  } catch (const zmq::error_t& e) {
    return absl::InternalError(std::string("cannot start the payload exchange's authenticator: ") + e.what());
  }
  started_ = clock_.Now();
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void ZapAuthenticator::Stop() {
  stop_.store(true);
  keyring_.Close();
  if (thread_.joinable()) thread_.join();
  monitor_.reset();
}

std::vector<std::string> ZapAuthenticator::Decide(const std::vector<zmq::message_t>& request) {
  // RFC 27: version, request id, domain, address, routing id, mechanism, credentials...
  const std::string address = request.size() > 3 ? request[3].to_string() : "?";
  std::string why;
  if (request.size() < 6 || request[0].to_string() != "1.0") {
    why = "malformed ZAP request";
  } else if (request[2].to_string() != domain_) {
    why = "not the payload exchange";
  } else if (request[5].to_string() != "CURVE" || request.size() < 7 || request[6].size() != kKeyBytes) {
    why = "no CURVE key (only this job's daemons may connect)";
  } else if (std::optional<int> rank =
                 keyring_.WaitRankOf(request[6].to_string_view(), clock_, started_ + install_wait_)) {
    accepted_.fetch_add(1);
    return {"200", "OK", std::to_string(*rank)};
  } else {
    why = "its key is no peer's of this job";
  }
  // Rate-limited: a port scan or flood must not flood the log either.
  const uint64_t n = refused_.fetch_add(1) + 1;
  if (refused_counter_ != nullptr && !monitor_) refused_counter_->fetch_add(1);
  if (LogThis(n)) {
    spdlog::warn("payload exchange: refused a connection from {}: {} ({} refused so far)", address, why, n);
  }
  return {"400", why, ""};
}

void ZapAuthenticator::Loop() {
  while (!stop_.load()) {
    zmq::pollitem_t items[2] = {
        {socket_.handle(), 0, ZMQ_POLLIN, 0},
        {monitor_ ? monitor_->handle() : nullptr, -1, static_cast<short>(monitor_ ? ZMQ_POLLIN : 0), 0}};
    if (zmq_poll(items, 2, 100) <= 0) continue;
    std::vector<zmq::message_t> request;
    try {
      if (items[1].revents & ZMQ_POLLIN) OnMonitorEvent();
      if ((items[0].revents & ZMQ_POLLIN) == 0) continue;
      while (true) {
        zmq::message_t part;
        if (!socket_.recv(part, zmq::recv_flags::dontwait)) break;
        const bool more = part.more();
        request.push_back(std::move(part));
        if (!more) break;
      }
      if (request.empty()) continue;
      std::vector<std::string> decision = Decide(request);
      std::vector<std::string> reply = {
          "1.0", request.size() > 1 ? request[1].to_string() : "", decision[0], decision[1], decision[2], ""};
      for (size_t i = 0; i < reply.size(); ++i) {
        socket_.send(zmq::buffer(reply[i]),
                     i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      spdlog::warn("payload exchange authenticator: {}", e.what());
    }
  }
}

}  // namespace odb::exchange
