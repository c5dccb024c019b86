#ifndef ODB_EXCHANGE_PAYLOAD_EXCHANGE_H_
#define ODB_EXCHANGE_PAYLOAD_EXCHANGE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "absl/status/statusor.h"
#include "src/align/planner.h"
#include "src/common/clock.h"
#include "src/common/mutex.h"
#include "src/common/sample.h"
#include "src/exchange/exchange_options.h"
#include "src/exchange/peer_auth.h"
#include "src/state/daemon_state.h"
#include "src/state/metrics.h"
#include "src/state/round.h"

namespace odb::exchange {

using SampleKey = align::SampleKey;  // (owner rank, id): the planner's

// Moves sample payloads between daemons when a global plan emits a sample on
// another rank than the one that received it (Ray keeps object transfer out
// of its node manager in the same way). Owns the receiving ROUTER (polled by
// the I/O loop) and one DEALER per peer (used by the planner thread).
// Payloads that arrive, and this rank's own samples that a step here still
// needs after sending them away, are parked until the step builder takes them.
//
// The link belongs to the job (see peer_auth.h): the ROUTER is a CURVE server
// that admits only the keys the job's daemons announced, on a ZeroMQ context
// of its own (its ZAP handler then sees no other socket of the daemon).
//
// Its timeouts (collective_timeout_ms for a payload, connect_timeout_ms for a
// peer's handshake) are read on the injected `clock` (not owned, outlives
// this; the daemon's, as for its round timing), so a test moves a FakeClock
// instead of waiting. Blocking waits are woken by their event and re-read the
// clock at least every kClockRecheck.
class PayloadExchange {
 public:
  PayloadExchange(ExchangeOptions options, DaemonState& state, DaemonMetrics& metrics, const Clock& clock);
  ~PayloadExchange();
  PayloadExchange(const PayloadExchange&) = delete;
  PayloadExchange& operator=(const PayloadExchange&) = delete;

  // Makes this run's keypair, starts the authenticator, binds.
  absl::Status Bind();
  const std::string& endpoint() const { return bound_; }
  // What this rank contributes to the job's all-gather: endpoint and public key.
  std::string Announcement() const;
  zmq::socket_t& socket() { return rx_; }

  // I/O thread: parks the payloads that arrived (only authenticated peers can
  // send any). An unreadable payload is an error naming the peer that sent it
  // (the peers' plan is broken), returned for the daemon to fail.
  absl::Status OnReadable() ABSL_LOCKS_EXCLUDED(mu_);

  // Planner thread: learns the job's keys and connects to every peer's
  // endpoint; `announcements` is the all-gather of Announcement() (index = rank).
  absl::Status Connect(const std::vector<std::string>& announcements);
  // Connections refused (not a peer of this job: wrong key, no CURVE, garbage).
  uint64_t RefusedConnections() const { return zap_ ? zap_->handshakes_failed() : 0; }
  // Planner thread: sends the samples this round moves away.
  absl::Status SendOutgoing(uint32_t epoch, const RoundOutcome& outcome) ABSL_LOCKS_EXCLUDED(mu_);
  // When the payloads that a step needs from now on must have arrived:
  // collective_timeout_ms from now, on the exchange's clock (for Take).
  Clock::TimePoint PayloadDeadline() const;
  // Planner thread: the parked payload of `key`, waiting until the
  // exchange's clock reaches `deadline` (or until `cancelled` says stop;
  // WakeAll makes it look).
  absl::StatusOr<Sample> Take(const SampleKey& key, Clock::TimePoint deadline,
                              const std::function<bool()>& cancelled) ABSL_LOCKS_EXCLUDED(mu_);
  void WakeAll() ABSL_LOCKS_EXCLUDED(mu_);
  // Payloads parked now (arrived or kept here, not yet taken).
  size_t Parked() const ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr std::chrono::milliseconds kClockRecheck{50};

 private:
  const ExchangeOptions options_;
  DaemonState& state_;
  DaemonMetrics& metrics_;
  const Clock& clock_;
  zmq::context_t context_{1};
  CurveKeypair keys_;
  PeerKeyring keyring_;
  std::unique_ptr<ZapAuthenticator> zap_;  // outlives no socket of context_: declared after it
  zmq::socket_t rx_;
  std::string bound_;
  std::vector<zmq::socket_t> senders_;  // planner thread only

  mutable Mutex mu_;
  CondVar cv_;
  // A key may be parked more than once: an owner's key is unique among the
  // samples its buffer holds, so a dataset index sampled again (with
  // replacement) after its first copy left the buffer for this rank keys the
  // same, and its second copy can arrive before the first one's step is
  // built. Copies of one key come in the order they were sent (one DEALER
  // per peer, and steps are built in plan order), so Take hands out the
  // oldest: equal keys sit in insertion order (multimap::emplace adds at the
  // end of their range).
  std::multimap<SampleKey, Sample> parked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace odb::exchange

#endif  // ODB_EXCHANGE_PAYLOAD_EXCHANGE_H_
