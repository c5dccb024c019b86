#ifndef ODB_INGEST_INGEST_CHANNEL_H_
#define ODB_INGEST_INGEST_CHANNEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "absl/status/status.h"
#include "src/collate/collator.h"
#include "src/common/clock.h"
#include "src/grouping/budget.h"
#include "src/ingest/admission.h"
#include "src/ingest/credit_ledger.h"
#include "src/ingest/decoder.h"
#include "src/ingest/ingest_options.h"
#include "src/ingest/producer_liveness.h"
#include "src/ingest/schema.h"
#include "src/state/daemon_state.h"
#include "src/state/metrics.h"

namespace odb::ingest {

// The producers' side of the daemon: owns the ingest sockets (ROUTER, one per
// endpoint), decodes what arrives, admits samples into the buffer and tells
// each producer how much more it may send.
//
// Flow control is by credit, in samples and payload bytes, per producer
// connection. A producer sends a sample only while it holds credit, so
// nothing waits inside ZeroMQ that the buffer cannot take: the channel reads
// its sockets at all times (even with a full buffer), and a producer that
// closes its socket right after its last message loses nothing. (With the old
// PUSH/PULL scheme the daemon stopped reading when the buffer was full; when
// a producer then closed, ZeroMQ dropped what was still in the kernel's socket
// buffer: the last samples and end_stream of each producer.) The memory held
// for ingest is bounded in bytes: buffer.max_bytes covers buffered samples
// and every credit granted, and no sample is larger than MaxSampleBytes().
//
// Credit for producers that are ahead of the epoch being planned (they ended
// its stream, or send a later epoch) comes from at most half of the buffer,
// so a future epoch can never starve the current one.
//
// Every end_stream is acknowledged once its samples are all read
// (StreamAck); the client's EndStream returns only then.
//
// The channel wires three units that are tested alone: the credit ledger
// (CreditLedger: what each connection holds, top-ups, returns), the
// admission policy (AdmissionPolicy: sample in, verdict out) and the liveness
// timers (ProducerLiveness, on the injected clock).
//
// Runs on the daemon's I/O thread; takes DaemonState::mu to admit.
class IngestChannel {
 public:
  IngestChannel(zmq::context_t& context, IngestOptions options, DaemonState& state, DaemonMetrics& metrics,
                const Clock& clock);
  IngestChannel(const IngestChannel&) = delete;
  IngestChannel& operator=(const IngestChannel&) = delete;

  // The producers' shared-memory arenas (not owned; null: samples that name
  // an arena block are rejected). Set before the first OnReadable.
  void SetArenaSource(ArenaBlockSource* arenas) { arenas_ = arenas; }

  // Binds every ingest endpoint. Errors name the endpoint.
  absl::Status Bind();
  const std::vector<std::string>& endpoints() const { return bound_; }
  size_t socket_count() const { return sockets_.size(); }
  zmq::socket_t& socket(size_t i) { return sockets_[i]; }

  // Reads a bounded burst of messages from socket `i` and admits them.
  void OnReadable(size_t i);
  // Grants credit where the buffer has room (call whenever it may have shrunk).
  void GrantCredits();

  // The trainer started an epoch: producer silence counts from now.
  void NoteEpochRequested();
  // A fatal message when the epoch's input is incomplete and no producer that
  // holds credit has sent anything for producer_timeout_ms; names the
  // producers whose streams are open.
  std::optional<std::string> CheckSilence();
  // alignment.deterministic: a fatal message when the rank has waited 2 s
  // for its next sample in order while no producer may send anything (no
  // credit left, or held at the seq limit): the buffer is too small for
  // the window, and waiting longer cannot help.
  std::optional<std::string> CheckStall();
  // The first CONFIG_MISMATCH since the last call (the config does not fit
  // the data: every sample of that schema is rejected alike), for the daemon
  // to fail the job with at once under bad_input: error, instead of
  // rejecting a whole epoch sample by sample.
  std::optional<std::string> TakeConfigMismatch();

  // The largest sample a producer may send: half the buffer at most, so a
  // sample always fits once the buffer drains.
  uint64_t MaxSampleBytes() const { return ledger_.max_sample_bytes(); }
  uint64_t OutstandingBytes() const { return ledger_.outstanding_bytes(); }
  int64_t OutstandingSamples() const { return ledger_.outstanding_samples(); }
  size_t ConnectionCount() const { return conns_.size(); }

 private:
  struct Conn {
    size_t socket = 0;
    std::string routing_id;
    std::string producer_id;  // empty until hello
    CreditAccount credit;
    Clock::TimePoint last_heard;
  };
  using ConnKey = std::pair<size_t, std::string>;

  // The connection `routing_id` on socket `i`, tracked from its first
  // message on (null: too many connections, the message was refused).
  Conn* ConnFor(size_t i, const std::string& routing_id);  // takes state_.mu to refuse
  // One message of `conn` (its frames after the routing id) charged against
  // its credit and decoded: a sample without credit, or too large, becomes a
  // rejection that still names it. Sets `charged` to the payload charged.
  IngestEvent Receive(Conn& conn, std::vector<zmq::message_t>&& body,
                      std::optional<wire::ProducerMessage>&& arena_sample, uint64_t& charged);
  void Admit(Conn& conn, IngestEvent&& event, uint64_t charged_bytes,
             std::vector<std::pair<Conn*, wire::IngestReply>>& replies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void AdmitSample(Conn& conn, Sample& sample) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void AdmitEndStream(Conn& conn, const EndStreamEvent& end,
                      std::vector<std::pair<Conn*, wire::IngestReply>>& replies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void Reject(wire::Rejection rejection, std::optional<uint32_t> epoch, bool is_sample)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // What admission needs to know of `epoch` now.
  EpochView ViewOf(uint32_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // alignment.deterministic: the first seq of `epoch` a producer may not send
  // yet (the epoch's frontier + the window).
  uint64_t SeqLimit(uint32_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // Drops a connection found gone, with a log line when it left its
  // producer's stream of the current epoch open. Takes state_.mu.
  void Forget(const ConnKey& key);
  // False when the producer is gone (its credit then returns to the buffer).
  bool Reply(Conn& conn, const wire::IngestReply& reply);
  size_t ProducerCount() const;  // connections that said hello

  zmq::context_t& context_;
  const IngestOptions options_;
  DaemonState& state_;
  DaemonMetrics& metrics_;
  const Clock& clock_;
  DecodeOptions decode_options_;
  ArenaBlockSource* arenas_ = nullptr;
  std::vector<zmq::socket_t> sockets_;
  std::vector<std::string> bound_;
  std::map<ConnKey, Conn> conns_;
  // Each open epoch's schema, fixed by its first admitted sample: a sample
  // that could not be collated with the others is rejected at the door.
  std::map<uint32_t, std::unique_ptr<EpochSchema>> schemas_;
  CreditLedger ledger_;
  AdmissionPolicy admission_;
  ProducerLiveness liveness_;
  std::vector<zmq::message_t> parts_;  // reused per message
  std::optional<std::string> config_mismatch_;  // the first since TakeConfigMismatch (main thread)
};

}  // namespace odb::ingest

#endif  // ODB_INGEST_INGEST_CHANNEL_H_
