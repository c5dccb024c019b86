#ifndef ODB_EMIT_CREDIT_QUEUE_H_
#define ODB_EMIT_CREDIT_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>
#include <zmq.hpp>

#include "src/common/mutex.h"
#include "src/emit/step_arena.h"

namespace odb::emit {

// What the daemon sends its trainer, under the credit window
// (docs/protocol.md, "Flow control"): the planner thread queues messages, the
// I/O thread takes a control message at once and a step while it holds a
// credit, and keeps what it sent until the trainer's credits show it arrived,
// so that a reconnect can send it again. The trainer channel (its session and
// socket) owns one.
//
// Push*, QueuedSteps and Empty may be called from any thread; the rest from
// the I/O thread only.
class CreditQueue {
 public:
  struct Message {
    std::vector<zmq::message_t> parts;
    bool is_step = false;
    std::shared_ptr<StepArena> arena;  // the step's bytes are in this arena's block (null: frames)
  };

  // `depth`: emit.outstanding_depth, the credit a new session starts with.
  explicit CreditQueue(uint32_t depth) : depth_(depth) {}

  void PushStep(std::vector<zmq::message_t>&& parts, std::shared_ptr<StepArena> arena)
      ABSL_LOCKS_EXCLUDED(mu_);
  void PushControl(std::vector<zmq::message_t>&& parts) ABSL_LOCKS_EXCLUDED(mu_);
  // Ahead of every queued message (a fatal error does not wait for credits).
  void PushFront(std::vector<zmq::message_t>&& parts) ABSL_LOCKS_EXCLUDED(mu_);
  size_t QueuedSteps() const ABSL_LOCKS_EXCLUDED(mu_);
  bool Empty() const ABSL_LOCKS_EXCLUDED(mu_);

  // The next message that may go now: a control message, or a step while a
  // credit is left. Hand it back with Unsend if it could not be sent, else
  // report it with Sent.
  std::optional<Message> Next() ABSL_LOCKS_EXCLUDED(mu_);
  void Unsend(Message message) ABSL_LOCKS_EXCLUDED(mu_);
  // `parts` (a reference-counted copy of what went) reached the socket.
  void Sent(std::vector<zmq::message_t> parts, bool is_step) ABSL_LOCKS_EXCLUDED(mu_);

  // The trainer consumed `steps` more steps: they arrived, and everything
  // sent before them (ordered delivery), and the credit grows back by as
  // many (at most the depth).
  void Credit(uint32_t steps);
  // A new session: the full credit window, nothing in flight.
  void Reset();
  // A reconnect: calls `send` with a copy of each message sent and not known
  // to have arrived, in the order sent, until it returns false.
  template <typename Send>
  void Resend(Send send) {
    for (InFlight& sent : in_flight_) {
      if (!send(CopyParts(sent.parts))) break;
    }
  }

  // Sent and not known to have arrived: steps, and epoch ends.
  size_t Unacknowledged() const { return in_flight_.size(); }
  size_t UnacknowledgedSteps() const;
  // Steps sent since the last control message (an epoch's summary).
  uint64_t DeliveredInEpoch() const { return delivered_in_epoch_; }

  // Shares the frames' bytes (reference counted): no copy of the payload.
  static std::vector<zmq::message_t> CopyParts(std::vector<zmq::message_t>& parts);

 private:
  const uint32_t depth_;
  mutable Mutex mu_;
  std::deque<Message> out_ ABSL_GUARDED_BY(mu_);
  size_t queued_steps_ ABSL_GUARDED_BY(mu_) = 0;

  // I/O thread only.
  uint64_t credits_ = 0;
  // Sent and not known to have arrived, in the order sent: steps until a
  // credit counts them, an epoch summary (or fatal) until a credit counts a
  // step sent after it (ordered delivery: it arrived before that step). A
  // reconnect re-sends them all; the client drops what it already has.
  struct InFlight {
    std::vector<zmq::message_t> parts;
    bool is_step = false;
  };
  std::deque<InFlight> in_flight_;
  static constexpr size_t kControlsKept = 16;  // summaries of empty epochs in a row, at most
  uint64_t delivered_in_epoch_ = 0;
};

}  // namespace odb::emit

#endif  // ODB_EMIT_CREDIT_QUEUE_H_
