#include "src/emit/credit_queue.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace odb::emit {
namespace {

std::vector<zmq::message_t> Parts(const std::string& text) {
  std::vector<zmq::message_t> parts;
  parts.emplace_back(text.data(), text.size());
  return parts;
}

std::string Text(const std::vector<zmq::message_t>& parts) { return parts.front().to_string(); }

// Takes what may go now and reports it sent, as the trainer channel's Flush does.
std::vector<std::string> SendAll(CreditQueue& q) {
  std::vector<std::string> sent;
  while (auto m = q.Next()) {
    sent.push_back(Text(m->parts));
    q.Sent(CreditQueue::CopyParts(m->parts), m->is_step);
  }
  return sent;
}

std::vector<std::string> Resent(CreditQueue& q) {
  std::vector<std::string> out;
  q.Resend([&](std::vector<zmq::message_t> parts) {
    out.push_back(Text(parts));
    return true;
  });
  return out;
}

TEST_CASE("steps go while credits last, control messages at once, a fatal first") {
  CreditQueue q(2);
  q.PushStep(Parts("s1"), nullptr);
  CHECK(q.QueuedSteps() == 1);
  CHECK_FALSE(q.Next().has_value());  // no session yet: no credit
  q.Reset();
  q.PushStep(Parts("s2"), nullptr);
  q.PushStep(Parts("s3"), nullptr);
  q.PushControl(Parts("end"));
  q.PushFront(Parts("fatal"));
  CHECK(SendAll(q) == std::vector<std::string>{"fatal", "s1", "s2"});
  CHECK(q.QueuedSteps() == 1);  // s3 waits for a credit; "end" waits behind it (order kept)
  q.Credit(1);
  CHECK(SendAll(q) == std::vector<std::string>{"s3", "end"});
  CHECK(q.QueuedSteps() == 0);
  CHECK(q.Empty());
}

TEST_CASE("a credit acknowledges the oldest steps and what was sent before them; the rest is re-sent") {
  CreditQueue q(4);
  q.Reset();
  for (const char* s : {"a", "b"}) q.PushStep(Parts(s), nullptr);
  q.PushControl(Parts("end1"));
  q.PushStep(Parts("c"), nullptr);
  SendAll(q);
  CHECK(q.DeliveredInEpoch() == 1);  // "c", after the epoch's end
  CHECK(q.UnacknowledgedSteps() == 3);
  CHECK(Resent(q) == std::vector<std::string>{"a", "b", "end1", "c"});
  q.Credit(2);  // a and b arrived; end1 was sent after b, so it is not known to have arrived
  CHECK(Resent(q) == std::vector<std::string>{"end1", "c"});
  q.Credit(1);  // c arrived, so end1 before it did too
  CHECK(q.Unacknowledged() == 0);
  q.Credit(100);  // never more credit than the depth
  for (const char* s : {"d", "e", "f", "g", "h"}) q.PushStep(Parts(s), nullptr);
  CHECK(SendAll(q).size() == 4);
}

TEST_CASE("a message that could not be sent goes first again; a new session starts clean") {
  CreditQueue q(1);
  q.Reset();
  q.PushStep(Parts("s1"), nullptr);
  q.PushStep(Parts("s2"), nullptr);
  auto m = q.Next();
  REQUIRE(m.has_value());
  q.Unsend(std::move(*m));
  CHECK(SendAll(q) == std::vector<std::string>{"s1"});
  q.Reset();
  CHECK(q.Unacknowledged() == 0);
  CHECK(SendAll(q) == std::vector<std::string>{"s2"});
}

TEST_CASE("at most 16 epoch ends are kept unacknowledged") {
  CreditQueue q(1);
  q.Reset();
  for (int i = 0; i < 20; ++i) q.PushControl(Parts("end" + std::to_string(i)));
  SendAll(q);
  const std::vector<std::string> kept = Resent(q);
  REQUIRE(kept.size() == 16);
  CHECK(kept.front() == "end4");
  CHECK(kept.back() == "end19");
}

}  // namespace
}  // namespace odb::emit
