#ifndef ODB_EXCHANGE_PEER_AUTH_H_
#define ODB_EXCHANGE_PEER_AUTH_H_

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/common/clock.h"
#include "src/common/mutex.h"

namespace odb::exchange {

// Who may talk to a daemon's payload exchange: the job's other daemons, and
// nothing else. Each daemon makes a fresh CURVE keypair at start (the secret
// never leaves the process), announces its public key with its exchange
// endpoint through the job's own all-gather (the Gloo group that the
// rendezvous store formed under job_id/generation), and its exchange socket
// accepts only clients that prove they hold one of the announced keys
// (ZeroMQ's CURVE handshake; the key is checked by a ZAP handler, RFC 27).
// A connection from anything else never completes its handshake, so none of
// its frames reach the daemon; a frame from a peer carries the peer's rank as
// ZeroMQ's "User-Id" property, which the peer cannot choose.

// A CURVE keypair as Z85 text (40 characters each).
struct CurveKeypair {
  std::string public_key;
  std::string secret_key;
};

// A fresh keypair. Fails (naming the cause) when libzmq was built without CURVE.
absl::StatusOr<CurveKeypair> NewCurveKeypair();

// What a rank contributes to the job's all-gather for the exchange.
struct PeerAnnouncement {
  std::string endpoint;    // "tcp://HOST:PORT"
  std::string public_key;  // Z85
};
std::string EncodeAnnouncement(const PeerAnnouncement& a);
// Index = rank. An unreadable entry or a key two ranks share is an error
// naming the rank.
absl::StatusOr<std::vector<PeerAnnouncement>> DecodeAnnouncements(const std::vector<std::string>& gathered);

// The job's peers by public key. Thread-safe: installed by the planner
// thread, read by the ZAP handler thread.
class PeerKeyring {
 public:
  // Installs the job's public keys (Z85, index = rank); `self_rank`'s own key
  // is not a peer. Once only.
  absl::Status Install(const std::vector<std::string>& public_keys, int self_rank) ABSL_LOCKS_EXCLUDED(mu_);
  // The rank whose key is `raw_key` (32 bytes, as CURVE hands it to ZAP), or
  // nullopt. A peer may connect before this rank has learnt the keys (the
  // all-gather ends on each rank at its own time), so this waits for Install
  // until `clock` reaches `deadline`, or Close. Install and Close wake the
  // wait; it re-reads `clock` at least every kClockRecheck (a FakeClock moves
  // without waking anyone).
  std::optional<int> WaitRankOf(std::string_view raw_key, const Clock& clock, Clock::TimePoint deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Close() ABSL_LOCKS_EXCLUDED(mu_);  // wakes waiters; no install is coming
  static constexpr std::chrono::milliseconds kClockRecheck{50};

 private:
  Mutex mu_;
  CondVar cv_;
  bool installed_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, int> rank_of_ ABSL_GUARDED_BY(mu_);  // raw 32-byte key -> rank
};

// The ZAP handler of one ZeroMQ context (there can be one per context):
// answers "200, user id = rank" for a CURVE client of `domain` whose key is a
// peer's, "400" for everything else (other mechanisms, domains, keys).
class ZapAuthenticator {
 public:
  // `install_wait`: how long after Start a connection waits for the job's
  // keys, on `clock` (not owned, outlives this). `refused_counter` (optional)
  // is counted up with every refused connection too (every failed handshake
  // once WatchHandshakes is on, else every ZAP refusal).
  ZapAuthenticator(zmq::context_t& context, PeerKeyring& keyring, std::string domain,
                   std::chrono::milliseconds install_wait, const Clock& clock,
                   std::atomic<uint64_t>* refused_counter = nullptr);
  ~ZapAuthenticator();  // stops and joins
  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;

  // Also counts (and logs, rate-limited) every connection to `server` whose
  // handshake fails: not only keys ZAP refused, but clients without CURVE,
  // garbage and silent connections (ZeroMQ drops those before asking ZAP).
  // Call from the thread that owns `server`, before Start.
  absl::Status WatchHandshakes(zmq::socket_t& server);
  // Binds the context's ZAP endpoint and starts answering. Must run before any
  // CURVE server socket of the context binds: without a handler libzmq would
  // let every client in.
  absl::Status Start();
  void Stop();
  uint64_t refused() const { return refused_.load(); }  // keys ZAP refused
  uint64_t accepted() const { return accepted_.load(); }
  uint64_t handshakes_failed() const { return handshakes_failed_.load(); }

 private:
  void Loop();
  void OnMonitorEvent();
  // The reply to one ZAP request: {status code, status text, user id}.
  std::vector<std::string> Decide(const std::vector<zmq::message_t>& request);

  zmq::context_t& context_;
  PeerKeyring& keyring_;
  std::string domain_;
  std::chrono::milliseconds install_wait_;
  const Clock& clock_;
  zmq::socket_t socket_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> handshakes_failed_{0};
  std::atomic<uint64_t>* refused_counter_;  // counts failed handshakes when watched, else ZAP refusals
  std::optional<zmq::socket_t> monitor_;
  std::atomic<uint64_t> accepted_{0};
  Clock::TimePoint started_;  // on clock_
};

}  // namespace odb::exchange

#endif  // ODB_EXCHANGE_PEER_AUTH_H_
