// The step-arena handshake alone: a real arena server on a temp ipc path, the
// offer and the answer carried by hand (no ZeroMQ, no trainer).
#include "src/emit/step_arena_handshake.h"

#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <future>
#include <string>

#include "src/common/clock.h"

namespace odb::emit {
namespace {

SteadyClock steady;  // the handshakes whose waits the tests do not drive

struct TempDir {
  TempDir() {
    char pattern[] = "/tmp/odb-handshake-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    path = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string endpoint() const { return "ipc://" + path + "/out.sock"; }
  std::string path;
};

StepArenaHandshakeOptions Options(bool required = false) {
  StepArenaHandshakeOptions o;
  o.arena_bytes = 1 << 20;
  o.required = required;
  o.offer_wait = std::chrono::milliseconds(1);  // an unanswered offer is given up at once
  return o;
}

wire::StepArenaReply Answer(const wire::DaemonMessage& offer, bool attached) {
  wire::StepArenaReply r;
  r.set_generation(offer.step_arena().generation());
  r.set_attached(attached);
  if (!attached) r.set_error("mmap refused");
  return r;
}

TEST_CASE("a remote trainer (tcp) is offered no arena: its steps go as frames") {
  StepArenaHandshake h(Options(/*required=*/true), steady);
  REQUIRE(h.Listen("tcp://127.0.0.1:5555").ok());
  auto offer = h.NewSession();
  REQUIRE(offer.ok());
  CHECK_FALSE(offer->has_value());
  CHECK(h.Active() == nullptr);
  CHECK(h.ForNextStep() == nullptr);
}

TEST_CASE("a session's steps use its arena once it answered that it mapped it") {
  TempDir dir;
  StepArenaHandshake h(Options(), steady);
  REQUIRE(h.Listen(dir.endpoint()).ok());
  auto offer = h.NewSession();
  REQUIRE(offer.ok());
  REQUIRE(offer->has_value());
  const wire::DaemonMessage& o = **offer;
  CHECK(o.step_arena().capacity_bytes() >= (1u << 20));
  CHECK(o.step_arena().socket_path() == StepArenaSocketPath(dir.path + "/out.sock"));
  CHECK(h.ForNextStep() == nullptr);  // offer not delivered yet: no wait, frames
  h.OfferDelivered();
  REQUIRE(h.OnReply(Answer(o, true)).ok());
  std::shared_ptr<StepArena> active = h.ForNextStep();
  REQUIRE(active != nullptr);
  CHECK(active->generation() == o.step_arena().generation());
  CHECK(h.Active() == active);
}

TEST_CASE("a planner waiting for the answer gets the arena when it comes") {
  TempDir dir;
  StepArenaHandshakeOptions options = Options();
  options.offer_wait = std::chrono::seconds(60);  // the answer, not the wait, ends it
  StepArenaHandshake h(options, steady);
  REQUIRE(h.Listen(dir.endpoint()).ok());
  auto offer = h.NewSession();
  REQUIRE(offer.ok());
  REQUIRE(offer->has_value());
  h.OfferDelivered();
  auto planner = std::async(std::launch::async, [&] { return h.ForNextStep(); });
  REQUIRE(h.OnReply(Answer(**offer, true)).ok());
  std::shared_ptr<StepArena> got = planner.get();
  REQUIRE(got != nullptr);
  CHECK(got->generation() == (**offer).step_arena().generation());
}

TEST_CASE("an answer to another generation is ignored; an unanswered offer falls back to frames") {
  TempDir dir;
  StepArenaHandshake h(Options(), steady);
  REQUIRE(h.Listen(dir.endpoint()).ok());
  auto offer = h.NewSession();
  REQUIRE(offer.ok());
  REQUIRE(offer->has_value());
  h.OfferDelivered();
  wire::StepArenaReply stale = Answer(**offer, true);
  stale.set_generation(stale.generation() + 1000);
  CHECK(h.OnReply(stale).ok());
  CHECK(h.Active() == nullptr);
  CHECK(h.ForNextStep() == nullptr);  // offer_wait passed: frames
}

TEST_CASE("an unanswered offer is given up when the injected clock passes offer_wait, without real waiting") {
  TempDir dir;
  FakeClock clock;
  StepArenaHandshakeOptions options = Options();
  options.offer_wait = std::chrono::hours(1);  // only the fake clock's advance can end the wait
  StepArenaHandshake h(options, clock);
  REQUIRE(h.Listen(dir.endpoint()).ok());
  auto offer = h.NewSession();
  REQUIRE(offer.ok());
  REQUIRE(offer->has_value());
  h.OfferDelivered();
  auto planner = std::async(std::launch::async, [&] { return h.ForNextStep(); });
  struct AnswerOnExit {  // a failed check must not leave the planner waiting an hour
    StepArenaHandshake& h;
    wire::StepArenaReply reply;
    ~AnswerOnExit() { (void)h.OnReply(reply); }
  } answer_on_exit{h, Answer(**offer, false)};
  // The planner reads the clock when it starts waiting: advance until it has
  // seen an hour pass (each look is at most kClockRecheck apart).
  const auto real_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (planner.wait_for(StepArenaHandshake::kClockRecheck * 2) != std::future_status::ready &&
         std::chrono::steady_clock::now() < real_deadline) {
    clock.Advance(options.offer_wait);
  }
  REQUIRE(planner.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
  CHECK(planner.get() == nullptr);  // frames
  // The offer was given up: the next step does not wait again.
  CHECK(h.ForNextStep() == nullptr);
}

TEST_CASE("a declined arena means frames, or an error naming why when the arena is required") {
  TempDir dir;
  SECTION("auto") {
    StepArenaHandshake h(Options(), steady);
    REQUIRE(h.Listen(dir.endpoint()).ok());
    auto offer = h.NewSession();
    REQUIRE(offer.ok());
    REQUIRE(offer->has_value());
    h.OfferDelivered();
    CHECK(h.OnReply(Answer(**offer, false)).ok());
    CHECK(h.ForNextStep() == nullptr);
    // A later answer for the withdrawn offer changes nothing.
    CHECK(h.OnReply(Answer(**offer, true)).ok());
    CHECK(h.Active() == nullptr);
  }
  SECTION("required") {
    StepArenaHandshake h(Options(/*required=*/true), steady);
    REQUIRE(h.Listen(dir.endpoint()).ok());
    auto offer = h.NewSession();
    REQUIRE(offer.ok());
    REQUIRE(offer->has_value());
    h.OfferDelivered();
    absl::Status s = h.OnReply(Answer(**offer, false));
    CHECK_FALSE(s.ok());
    CHECK_THAT(std::string(s.message()), Catch::Contains("did not map the step arena: mmap refused"));
    CHECK_THAT(std::string(s.message()), Catch::Contains("shm.trainer_data_plane: shm"));
  }
}

TEST_CASE("a new session retires the previous session's arena and is offered a new one") {
  TempDir dir;
  StepArenaHandshake h(Options(), steady);
  REQUIRE(h.Listen(dir.endpoint()).ok());
  auto first = h.NewSession();
  REQUIRE(first.ok());
  REQUIRE(first->has_value());
  h.OfferDelivered();
  REQUIRE(h.OnReply(Answer(**first, true)).ok());
  std::shared_ptr<StepArena> old = h.Active();
  REQUIRE(old != nullptr);
  auto second = h.NewSession();
  REQUIRE(second.ok());
  REQUIRE(second->has_value());
  CHECK(h.Active() == nullptr);  // frames until the new session answers
  CHECK((**second).step_arena().generation() != (**first).step_arena().generation());
  // The old session's answer is not the new one's.
  h.OfferDelivered();
  CHECK(h.OnReply(Answer(**first, true)).ok());
  CHECK(h.Active() == nullptr);
  REQUIRE(h.OnReply(Answer(**second, true)).ok());
  CHECK(h.Active() != nullptr);
  CHECK(h.Active() != old);
}

TEST_CASE("an arena that cannot be created is an error when required, frames otherwise") {
  TempDir dir;
  StepArenaHandshakeOptions options = Options(/*required=*/true);
  options.arena_bytes = uint64_t{1} << 62;
  StepArenaHandshake required(options, steady);
  REQUIRE(required.Listen(dir.endpoint()).ok());
  auto offer = required.NewSession();
  REQUIRE_FALSE(offer.ok());
  CHECK_THAT(std::string(offer.status().message()), Catch::Contains("shm.step_arena_bytes"));
  required.Stop();

  TempDir other;
  options.required = false;
  StepArenaHandshake fallback(options, steady);
  REQUIRE(fallback.Listen(other.endpoint()).ok());
  auto none = fallback.NewSession();
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());
}

}  // namespace
}  // namespace odb::emit
