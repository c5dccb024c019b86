#include "src/daemon/config.h"

#include <catch2/catch.hpp>

namespace odb {
namespace {

TEST_CASE("empty config gives documented defaults") {
  auto c = ParseConfig("");
  REQUIRE(c.ok());
  CHECK(c->budget.max_tokens == 4096);
  CHECK(c->window == 256);
  CHECK(c->outstanding_depth == 4);
  CHECK(c->bad_input == BadInputPolicy::kError);
  REQUIRE(FinalizeConfig(*c, {}).ok());
  CHECK(c->rank == 0);
  CHECK(c->world_size == 1);
  CHECK(c->ingest_endpoints[0] == "ipc:///tmp/odb/odb-0-in.sock");
}

TEST_CASE("fields parse and launcher variables fill rank and world") {
  auto c = ParseConfig(R"(
run_dir: /tmp/x
grouping:
  cost_model: packed
  max_tokens: 8192
  quadratic_q: 2048
  window: 64
  step_time: {per_step: 100, per_padded_token: 1}
alignment: {mode: non_join, seed: 7, store: redis, redis_port: 7000}
emit: {outstanding_depth: 2}
collate:
  packed: true
  fields:
    - {name: labels, rule: pad, pad_value: -100}
    - {name: pixel_values, rule: concat}
)");
  REQUIRE(c.ok());
  CHECK(c->budget.model == grouping::CostModel::kPacked);
  CHECK(c->budget.max_tokens == 8192);
  CHECK(c->mode == AlignMode::kNonJoin);
  CHECK(c->store == StoreKind::kRedis);
  REQUIRE(c->collate.fields.size() == 2);
  CHECK(c->collate.fields[0].pad_value == -100);
  CHECK(c->collate.fields[1].rule == collate::FieldRule::kConcat);
  REQUIRE(FinalizeConfig(*c, {{"RANK", "3"}, {"WORLD_SIZE", "4"}}).ok());
  CHECK(c->rank == 3);
  CHECK(c->world_size == 4);
  CHECK(c->trainer_endpoint == "ipc:///tmp/x/odb-3-out.sock");
}

TEST_CASE("errors name the field") {
  auto typo = ParseConfig("grouping: {max_tokns: 5}");
  REQUIRE_FALSE(typo.ok());
  CHECK_THAT(std::string(typo.status().message()), Catch::Contains("grouping.max_tokns"));

  auto bad_enum = ParseConfig("alignment: {mode: sometimes}");
  REQUIRE_FALSE(bad_enum.ok());
  CHECK_THAT(std::string(bad_enum.status().message()),
             Catch::Contains("alignment.mode") && Catch::Contains("join, non_join"));

  auto bad_type = ParseConfig("grouping: {window: lots}");
  REQUIRE_FALSE(bad_type.ok());
  CHECK_THAT(std::string(bad_type.status().message()), Catch::Contains("grouping.window"));

  auto zero = ParseConfig("grouping: {max_tokens: 0}");
  REQUIRE(zero.ok());
  auto s = FinalizeConfig(*zero, {});
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(std::string(s.message()), Catch::Contains("grouping.max_tokens"));

  auto rank = ParseConfig("rank: 4\nworld_size: 4");
  REQUIRE(rank.ok());
  CHECK_FALSE(FinalizeConfig(*rank, {}).ok());

  auto env = ParseConfig("");
  REQUIRE(env.ok());
  auto bad_env = FinalizeConfig(*env, {{"RANK", "x1"}});
  REQUIRE_FALSE(bad_env.ok());
  CHECK_THAT(std::string(bad_env.message()), Catch::Contains("RANK"));
}

}  // namespace
}  // namespace odb
