#include "odb/resume.h"

#include <catch2/catch.hpp>

namespace odb::client {
namespace {

TEST_CASE("consumed ids compact into a cursor and round-trip through the versioned text") {
  ConsumedSet set;
  for (uint64_t id : {3, 0, 1, 9, 2}) set.Add(id);
  REQUIRE(set.Contains(0));
  REQUIRE(set.Contains(3));
  REQUIRE(set.Contains(9));
  REQUIRE_FALSE(set.Contains(4));
  REQUIRE(set.size() == 5);
  const std::string text = set.Serialize(7);
  REQUIRE(text.find("\"cursor\":4") != std::string::npos);
  REQUIRE(text.find("\"extra\":[9]") != std::string::npos);
  auto parsed = ConsumedSet::Parse(text);
  REQUIRE(parsed.ok());
  REQUIRE(parsed->epoch == 7);
  REQUIRE(parsed->consumed.size() == 5);
  REQUIRE(parsed->consumed.Contains(9));
}

TEST_CASE("every rank's set merges into the union") {
  ConsumedSet a, b;
  for (uint64_t id : {0, 2, 4}) a.Add(id);
  for (uint64_t id : {1, 3, 5, 8}) b.Add(id);
  a.Merge(b);
  REQUIRE(a.size() == 7);
  for (uint64_t id = 0; id < 6; ++id) REQUIRE(a.Contains(id));
  REQUIRE(a.Serialize(0).find("\"cursor\":6") != std::string::npos);
}

TEST_CASE("a corrupt, truncated or other-version state is an error, never a wrong set") {
  const std::string good = [] {
    ConsumedSet s;
    s.Add(5);
    return s.Serialize(1);
  }();
  REQUIRE(ConsumedSet::Parse(good).ok());
  REQUIRE(ConsumedSet::Parse(good.substr(0, good.size() / 2)).status().message().find("not JSON") !=
          std::string::npos);
  REQUIRE(ConsumedSet::Parse(R"({"format":"x","version":1})").status().message().find("not an odb") !=
          std::string::npos);
  REQUIRE(ConsumedSet::Parse(R"({"format":"odb.ConsumedSet","version":2,"epoch":0,"consumed":{"cursor":0,"extra":[]}})")
              .status()
              .message()
              .find("version 2") != std::string::npos);
  REQUIRE(ConsumedSet::Parse(R"({"format":"odb.ConsumedSet","version":1,"epoch":0})").status().message().find(
              "truncated") != std::string::npos);
  REQUIRE(ConsumedSet::Parse(R"({"format":"odb.ConsumedSet","version":1,"epoch":0,"consumed":{"cursor":4,"extra":[2]}})")
              .status()
              .message()
              .find("not sorted") != std::string::npos);
}

TEST_CASE("the replay point: mid-round replays the round, a round's last step moves to the next") {
  StepInfo step;
  step.step_index = 12;
  step.round = 4;
  step.round_first_step = 10;
  step.round_steps = 5;
  CHECK_FALSE(ReplayPoint::After(step).has_value());  // not a deterministic daemon
  step.deterministic = true;
  auto mid = ReplayPoint::After(step);
  REQUIRE(mid.has_value());
  CHECK((mid->round == 4 && mid->first_step == 10 && mid->next_step == 13));
  step.step_index = 14;
  auto end = ReplayPoint::After(step);
  REQUIRE(end.has_value());
  CHECK((end->round == 5 && end->first_step == 15 && end->next_step == 15));
}

}  // namespace
}  // namespace odb::client
