#include "odb/consumer.h"

#include <cerrno>
#include <cstdio>
#include <map>
#include <random>
#include <zmq.hpp>

#include "client/cpp/src/delivery_decoder.h"
#include "client/cpp/src/fork_guard.h"
#include "proto/odb.pb.h"

namespace odb::client {
struct Consumer::Impl {
  ConsumerOptions options;
  ForkGuard owner;  // see fork_guard.h
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::dealer};
  bool owe_credit = false;
  // The session's routing id: the daemon serves one trainer session and, if
  // this one reconnects, re-sends the steps it had not acknowledged.
  std::string session;
  // The last step delivered per epoch: re-sent steps already delivered are dropped.
  std::map<uint32_t, uint64_t> next_step;

  absl::Status SendTrainer(const wire::TrainerMessage& m) {
    std::string bytes = m.SerializeAsString();
    try {
      if (!socket.send(zmq::buffer(bytes), zmq::send_flags::dontwait)) {
        return absl::UnavailableError("cannot reach the daemon at " + options.endpoint +
                                      " (send queue full)");
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError("send to daemon at " + options.endpoint + " failed: " + e.what());
    }
    return absl::OkStatus();
  }
};

Consumer::Consumer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Consumer::~Consumer() {
  // A forked copy must not touch the context (zmq_ctx_term would wait forever).
  if (impl_ && impl_->owner.forked()) (void)impl_.release();
}

absl::StatusOr<std::unique_ptr<Consumer>> Consumer::Connect(const ConsumerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  try {
    impl->socket.set(zmq::sockopt::linger, 0);
    impl->socket.set(zmq::sockopt::rcvtimeo, options.receive_timeout_ms);
    impl->socket.set(zmq::sockopt::sndhwm, 1000);
    std::random_device random;
    char id[32];
    std::snprintf(id, sizeof(id), "trainer-%08x%08x", random(), random());
    impl->session = id;
    impl->socket.set(zmq::sockopt::routing_id, impl->session);
    impl->socket.connect(options.endpoint);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError("cannot connect to '" + options.endpoint + "': " + e.what());
  }
  // Announce the session (a credit of 0 steps): a daemon that already serves
  // another trainer answers SESSION_REFUSED at once.
  wire::TrainerMessage hello;
  hello.set_version(wire::PROTOCOL_VERSION_CURRENT);
  hello.mutable_credit()->set_steps(0);
  if (absl::Status s = impl->SendTrainer(hello); !s.ok()) return s;
  return std::unique_ptr<Consumer>(new Consumer(std::move(impl)));
}

absl::Status Consumer::StartEpoch(uint32_t epoch, uint32_t expected_producers, uint64_t first_round,
                                  uint64_t first_step) {
  if (absl::Status s = impl_->owner.Check("this odb Consumer"); !s.ok()) return s;
  wire::TrainerMessage m;
  m.set_version(wire::PROTOCOL_VERSION_CURRENT);
  m.mutable_start_epoch()->set_epoch(epoch);
  m.mutable_start_epoch()->set_expected_producers(expected_producers);
  m.mutable_start_epoch()->set_first_round(first_round);
  m.mutable_start_epoch()->set_first_step(first_step);
  return impl_->SendTrainer(m);
}

absl::StatusOr<Delivery> Consumer::Next() {
  if (absl::Status s = impl_->owner.Check("this odb Consumer"); !s.ok()) return s;
  if (impl_->owe_credit) {
    wire::TrainerMessage credit;
    credit.set_version(wire::PROTOCOL_VERSION_CURRENT);
    credit.mutable_credit()->set_steps(1);
    if (absl::Status s = impl_->SendTrainer(credit); !s.ok()) return s;
    impl_->owe_credit = false;
  }
  while (true) {
  auto frames = std::make_shared<std::vector<zmq::message_t>>();
  try {
    do {
      zmq::message_t part;
      // A signal (e.g. the SIGCHLD PyTorch's DataLoader gets when a worker
      // exits) interrupts recv with EINTR: that is not an error, retry.
      zmq::recv_result_t got;
      while (true) {
        try {
          got = impl_->socket.recv(part);
          break;
        } catch (const zmq::error_t& e) {
          if (e.num() != EINTR) throw;
        }
      }
      if (!got) {
        return absl::DeadlineExceededError(
            "no step from the daemon at " + impl_->options.endpoint + " within " +
            std::to_string(impl_->options.receive_timeout_ms) +
            " ms: is odbd running, and are its producers sending?");
      }
      frames->push_back(std::move(part));
    } while (frames->back().more());
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError("receive from daemon at " + impl_->options.endpoint +
                                  " failed: " + e.what());
  }
  absl::StatusOr<Delivery> d = DecodeDelivery(std::move(frames), impl_->options.endpoint);
  if (d.ok() && d->kind == Delivery::Kind::kSessionAck) continue;  // the daemon checking this session
  if (d.ok() && d->kind == Delivery::Kind::kStep) {
    // After a reconnect the daemon re-sends the steps it had no credit for;
    // the ones delivered already are dropped here (steps arrive in order).
    uint64_t& next = impl_->next_step[d->step.epoch];
    if (d->step.step_index < next) continue;
    next = d->step.step_index + 1;
    impl_->owe_credit = true;
  }
  return d;
  }
}

}  // namespace odb::client
