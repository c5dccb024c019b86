// The admission policy alone: samples and epoch views in, verdicts out.
#include "src/ingest/admission.h"

#include <catch2/catch.hpp>

namespace odb::ingest {
namespace {

Sample MakeSample(const std::string& producer, uint32_t epoch, uint64_t id, std::optional<uint64_t> seq) {
  Sample s;
  s.producer_id = producer;
  s.epoch = epoch;
  s.meta.id = id;
  s.seq = seq;
  return s;
}

TEST_CASE("epochs are held from the trainer's on, at most kEpochHorizon past it") {
  EpochView v;
  v.trainer = 5;
  CHECK_FALSE(AdmissionPolicy::EpochRefusal(5, v));
  CHECK_FALSE(AdmissionPolicy::EpochRefusal(5 + AdmissionPolicy::kEpochHorizon, v));
  const auto before = AdmissionPolicy::EpochRefusal(4, v);
  REQUIRE(before);
  CHECK_THAT(*before, Catch::Contains("epoch 4 is before epoch 5"));
  const auto after = AdmissionPolicy::EpochRefusal(6 + AdmissionPolicy::kEpochHorizon, v);
  REQUIRE(after);
  CHECK_THAT(*after, Catch::Contains("epochs after epoch 5"));
  v.closed = true;  // a closed epoch is the stream tracker's to judge
  CHECK_FALSE(AdmissionPolicy::EpochRefusal(4, v));
}

TEST_CASE("before the trainer asks, epochs are held near those producers send, from the first open one") {
  EpochView v;
  v.first_open = 2;
  CHECK_THAT(AdmissionPolicy::EpochRefusal(1, v).value_or(""),
             Catch::Contains("first one this daemon has not"));
  CHECK_FALSE(AdmissionPolicy::EpochRefusal(100, v));  // nothing sent yet: a resumed job may start anywhere
  v.open_range = std::make_pair(uint32_t{10}, uint32_t{11});
  CHECK_FALSE(AdmissionPolicy::EpochRefusal(14, v));
  CHECK_THAT(AdmissionPolicy::EpochRefusal(15, v).value_or(""), Catch::Contains("away from epoch 10"));
  CHECK_THAT(AdmissionPolicy::EpochRefusal(6, v).value_or(""), Catch::Contains("away from epoch 11"));
}

TEST_CASE("a sample passes the door when its producer, epoch and seq are in order") {
  AdmissionPolicy policy(AdmissionOptions{});
  EpochView v;
  v.trainer = 0;
  const Verdict verdict = policy.AtDoor(MakeSample("w0", 0, 1, std::nullopt), "w0", v);
  CHECK(verdict.kind == Verdict::Kind::kPass);
}

TEST_CASE("a sample naming another producer than its connection is rejected, uncounted") {
  AdmissionPolicy policy(AdmissionOptions{});
  EpochView v;
  const Verdict verdict = policy.AtDoor(MakeSample("w1", 0, 9, std::nullopt), "w0", v);
  CHECK(verdict.kind == Verdict::Kind::kRejectUncounted);
  CHECK(verdict.rejection.code() == wire::UNKNOWN_PRODUCER);
  CHECK(verdict.rejection.sample_id() == 9);
  CHECK_THAT(verdict.rejection.message(), Catch::Contains("said hello as 'w0'"));
}

TEST_CASE("a sample outside the held epochs is refused and filed under the trainer's epoch") {
  AdmissionPolicy policy(AdmissionOptions{});
  EpochView v;
  v.trainer = 3;
  Verdict verdict = policy.AtDoor(MakeSample("w0", 1, 4, std::nullopt), "w0", v);
  CHECK(verdict.kind == Verdict::Kind::kRefuse);
  CHECK(verdict.filed_epoch == 3);
  CHECK(verdict.rejection.code() == wire::WRONG_EPOCH);
  CHECK_THAT(verdict.rejection.message(), Catch::Contains("sample 4 from producer 'w0' refused: epoch 1"));
  // Before the trainer asks: under the lowest epoch producers send.
  v.trainer.reset();
  v.open_range = std::make_pair(uint32_t{20}, uint32_t{21});
  verdict = policy.AtDoor(MakeSample("w0", 30, 4, std::nullopt), "w0", v);
  CHECK(verdict.kind == Verdict::Kind::kRefuse);
  CHECK(verdict.filed_epoch == 20);
}

TEST_CASE("alignment.deterministic: a sample without seq is rejected and counted in its stream") {
  AdmissionOptions options;
  options.deterministic = true;
  AdmissionPolicy policy(options);
  EpochView v;
  Verdict verdict = policy.AtDoor(MakeSample("w0", 0, 5, std::nullopt), "w0", v);
  CHECK(verdict.kind == Verdict::Kind::kRejectCounted);
  CHECK(verdict.rejection.code() == wire::MALFORMED_HEADER);
  CHECK_THAT(verdict.rejection.message(), Catch::Contains("has no seq"));
  CHECK(policy.AtDoor(MakeSample("w0", 0, 5, 0), "w0", v).kind == Verdict::Kind::kPass);
  v.closed = true;  // a closed epoch's samples go to the tracker's judgement
  CHECK(policy.AtDoor(MakeSample("w0", 0, 5, std::nullopt), "w0", v).kind == Verdict::Kind::kPass);
  const wire::Rejection dup = policy.DuplicateSeq(MakeSample("w0", 2, 6, 11));
  CHECK(dup.code() == wire::DUPLICATE_ID);
  CHECK_THAT(dup.message(), Catch::Contains("has seq 11, which another sample of epoch 2 already had"));
}

TEST_CASE("grouping.over_budget: reject refuses a sample that fits no budget, naming its lengths") {
  AdmissionOptions options;
  options.reject_over_budget = true;
  options.budget.max_tokens = 100;
  AdmissionPolicy policy(options);
  Sample s = MakeSample("w0", 0, 8, std::nullopt);
  s.meta.lengths.tokens = 101;
  const auto r = policy.OverBudget(s);
  REQUIRE(r);
  CHECK(r->code() == wire::OVER_BUDGET);
  CHECK_THAT(r->message(), Catch::Contains("sample 8 (tokens=101"));
  s.meta.lengths.tokens = 100;
  CHECK_FALSE(policy.OverBudget(s));
  options.reject_over_budget = false;
  s.meta.lengths.tokens = 1000;
  CHECK_FALSE(AdmissionPolicy(options).OverBudget(s));
}

TEST_CASE("an end_stream of an epoch not held says how many of its samples were refused") {
  const wire::Rejection r = AdmissionPolicy::RefuseEndStream("w0", "epoch 1 is before epoch 2", 3, 10);
  CHECK(r.code() == wire::WRONG_EPOCH);
  CHECK_THAT(r.message(),
             Catch::Contains("end_stream of producer 'w0' refused: epoch 1 is before epoch 2 (3 of "
                             "its 10 samples"));
  CHECK_THAT(AdmissionPolicy::RefuseEndStream("w0", "x", 0, 10).message(),
             !Catch::Contains("samples of that"));
}


TEST_CASE("a sample that sets daemon_key (the payload exchange's field) is rejected at the door") {
  AdmissionPolicy policy(AdmissionOptions{});
  EpochView v;
  Sample s = MakeSample("w0", 0, 77, 4);
  s.user_id = 12;  // what the decoder makes of a header with daemon_key 77 and sample_id 12
  const Verdict verdict = policy.AtDoor(s, "w0", v);
  CHECK(verdict.kind == Verdict::Kind::kRejectCounted);
  CHECK(verdict.rejection.code() == wire::MALFORMED_HEADER);
  CHECK(verdict.rejection.sample_id() == 12);
  CHECK_THAT(verdict.rejection.message(), Catch::Contains("daemon_key"));
}

TEST_CASE("a duplicate seq's rejection names the seq and the epoch, not the id as the reason") {
  AdmissionPolicy policy(AdmissionOptions{});
  const wire::Rejection r = policy.DuplicateSeq(MakeSample("w0", 2, 7, 41));
  CHECK(r.code() == wire::DUPLICATE_ID);
  CHECK(r.sample_id() == 7);
  CHECK_THAT(r.message(), Catch::Contains("seq 41") && Catch::Contains("epoch 2"));
}

}  // namespace
}  // namespace odb::ingest
