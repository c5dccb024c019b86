#include "src/daemon/config.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <utility>

#include "src/daemon/settings.h"

namespace odb {
namespace {

TEST_CASE("empty config gives documented defaults") {
  auto c = ParseConfig("");
  REQUIRE(c.ok());
  CHECK(c->budget.max_tokens == 4096);
  CHECK(c->window == 512);
  CHECK(c->planner == PlannerKind::kGlobal);
  CHECK(c->trainer.outstanding_depth == 4);
  CHECK(c->steps.rejections_are_errors);
  REQUIRE(FinalizeConfig(*c, {}).ok());
  CHECK(c->rank == 0);
  CHECK(c->world_size == 1);
  CHECK(c->ingest.endpoints[0] == "ipc:///tmp/odb/odb-0-in.sock");
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
alignment: {mode: first_dry, seed: 7, store: redis, redis_port: 7000}
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
  CHECK(c->mode == align::EpochMode::kNonJoin);
  CHECK(c->store == StoreKind::kRedis);
  REQUIRE(c->collate.fields.size() == 2);
  CHECK(c->collate.fields[0].pad_value == -100);
  CHECK(c->collate.fields[1].rule == collate::FieldRule::kConcat);
  REQUIRE(FinalizeConfig(*c, {{"RANK", "3"}, {"WORLD_SIZE", "4"}}).ok());
  CHECK(c->rank == 3);
  CHECK(c->world_size == 4);
  CHECK(c->trainer.endpoint == "ipc:///tmp/x/odb-3-out.sock");
}

TEST_CASE(
    "grouping.mix_lengths: auto deals steps across lengths with the global planner, mixes packed groups with "
    "the local one; the others force one") {
  struct Case {
    const char* yaml;
    bool groups;
    bool steps;
  };
  const Case cases[] = {
      {"grouping: {cost_model: padded}", false, true},
      {"grouping: {cost_model: packed}", false, true},
      {"grouping: {cost_model: packed, mix_lengths: auto}", false, true},
      {"grouping: {cost_model: packed}\nalignment: {planner: local}", true, false},
      {"grouping: {cost_model: padded}\nalignment: {planner: local}", false, false},
      {"grouping: {cost_model: packed, mix_lengths: steps}\nalignment: {planner: local}", false, true},
      {"grouping: {cost_model: packed, mix_lengths: false}", false, false},
      {"grouping: {cost_model: padded, mix_lengths: false}", false, false},
      {"grouping: {cost_model: padded, mix_lengths: true}", true, false},
      {"grouping: {cost_model: padded, mix_lengths: auto}", false, true},
      {"grouping: {cost_model: packed, mix_lengths: steps}", false, true},
  };
  for (const Case& c : cases) {
    INFO(c.yaml);
    auto config = ParseConfig(c.yaml);
    REQUIRE(config.ok());
    CHECK(MixesLengths(*config) == c.groups);
    CHECK(MixesSteps(*config) == c.steps);
  }
  auto bad = ParseConfig("grouping: {mix_lengths: sometimes}");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("grouping.mix_lengths"));
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("auto"));
}

TEST_CASE("errors name the field") {
  auto typo = ParseConfig("grouping: {max_tokns: 5}");
  REQUIRE_FALSE(typo.ok());
  CHECK_THAT(std::string(typo.status().message()), Catch::Contains("grouping.max_tokns"));

  auto bad_enum = ParseConfig("alignment: {mode: sometimes}");
  REQUIRE_FALSE(bad_enum.ok());
  CHECK_THAT(std::string(bad_enum.status().message()),
             Catch::Contains("alignment.mode") && Catch::Contains("every_sample, first_dry"));

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


// Parses and finalizes `yaml`; returns the error message ("" when accepted).
std::string StartupError(const std::string& yaml,
                         const std::map<std::string, std::string>& env = {}) {
  auto c = ParseConfig(yaml);
  if (!c.ok()) return std::string(c.status().message());
  absl::Status s = FinalizeConfig(*c, env);
  return s.ok() ? "" : std::string(s.message());
}

TEST_CASE("a non-integer pad_value needs a declared floating dtype") {
  std::string e = StartupError("collate: {fields: [{name: labels, pad_value: 1.5}]}");
  CHECK_THAT(e, Catch::Contains("collate.fields[0].pad_value") && Catch::Contains("1.5") &&
                    Catch::Contains("labels") && Catch::Contains("dtype: float32"));
  e = StartupError("collate: {fields: [{name: labels, pad_value: 1.5, dtype: int64}]}");
  CHECK_THAT(e, Catch::Contains("collate.fields[0].pad_value") &&
                    Catch::Contains("not representable as int64"));
  CHECK(StartupError("collate: {fields: [{name: x, pad_value: 1.5, dtype: float32}]}").empty());
  CHECK(StartupError("collate: {fields: [{name: x, pad_value: 1.5, dtype: bfloat16}]}").empty());
  CHECK(StartupError("collate: {fields: [{name: labels, pad_value: -100}]}").empty());
  CHECK(StartupError("collate: {fields: [{name: labels, pad_value: -100, dtype: int64}]}").empty());
  // +-inf is a legitimate float pad (masks); never without a floating dtype.
  CHECK(StartupError("collate: {fields: [{name: m, pad_value: -.inf, dtype: float16}]}").empty());
  CHECK_THAT(StartupError("collate: {fields: [{name: m, pad_value: -.inf}]}"),
             Catch::Contains("not an integer"));
}

TEST_CASE("a declared dtype must represent the pad value") {
  struct Case {
    const char* yaml_field;
    const char* expect;
  };
  const Case cases[] = {
      {"{name: a, pad_value: 256, dtype: uint8}", "not representable as uint8"},
      {"{name: a, pad_value: -1, dtype: uint8}", "not representable as uint8"},
      {"{name: a, pad_value: 128, dtype: int8}", "not representable as int8"},
      {"{name: a, pad_value: 32768, dtype: int16}", "not representable as int16"},
      {"{name: a, pad_value: 2147483648, dtype: int32}", "not representable as int32"},
      {"{name: a, pad_value: 1e19, dtype: int64}", "not representable as int64"},
      {"{name: a, pad_value: 65520, dtype: float16}", "overflows float16"},
      {"{name: a, pad_value: 1e39, dtype: float32}", "overflows float32"},
      {"{name: a, pad_value: 1e39, dtype: bfloat16}", "overflows bfloat16"},
      {"{name: a, pad_value: 2, dtype: bool}", "must be 0 or 1"},
      {"{name: a, pad_value: .nan, dtype: float32}", "NaN"},
      {"{name: a, pad_value: .nan}", "NaN"},
      {"{name: a, pad_value: 1e300}", "2^53"},
      {"{name: a, dtype: int4}", "collate.fields[0].dtype"},
  };
  for (const Case& c : cases) {
    INFO(c.yaml_field);
    CHECK_THAT(StartupError(std::string("collate: {fields: [") + c.yaml_field + "]}"),
               Catch::Contains(c.expect) && Catch::Contains("collate.fields[0]"));
  }
  // The largest finite values still round to finite.
  CHECK(StartupError("collate: {fields: [{name: a, pad_value: 65504, dtype: float16}]}").empty());
  CHECK(StartupError("collate: {fields: [{name: a, pad_value: 65519, dtype: float16}]}").empty());
  CHECK(StartupError("collate: {fields: [{name: a, pad_value: 255, dtype: uint8}]}").empty());
  CHECK(StartupError("collate: {fields: [{name: a, pad_value: 1e300, dtype: float64}]}").empty());
  CHECK(StartupError("collate: {fields: [{name: a, pad_value: -9.2233720368547758e18, dtype: int64}]}")
            .empty());

  auto parsed = ParseConfig("collate: {fields: [{name: a, pad_value: 1.5, dtype: float16}]}");
  REQUIRE(parsed.ok());
  REQUIRE(parsed->collate.fields[0].dtype.has_value());
  CHECK(*parsed->collate.fields[0].dtype == DType::kFloat16);
}

TEST_CASE("every float of the config is finite and in range, named in the error") {
  struct Case {
    const char* yaml;
    const char* field;
  };
  const Case cases[] = {
      {"grouping: {step_time: {per_step: .nan}}", "grouping.step_time.per_step"},
      {"grouping: {step_time: {per_padded_token: .inf}}", "grouping.step_time.per_padded_token"},
      {"grouping: {step_time: {per_len_sq: .nan}}", "grouping.step_time.per_len_sq"},
      {"grouping: {step_time: {per_len_sq: -1}}", "grouping.step_time.per_len_sq"},
      {"grouping: {step_time: {per_step: 1e300}}", "grouping.step_time.per_step"},
      {"grouping: {step_time: {per_step: 0, per_padded_token: 0, per_len_sq: 0}}", "grouping.step_time"},
      {"grouping: {quadratic_q: .nan}", "grouping.quadratic_q"},
      {"grouping: {quadratic_q: .inf}", "grouping.quadratic_q"},
      {"grouping: {quadratic_q: -5}", "grouping.quadratic_q"},
      {"grouping: {quadratic_q: 1e-300}", "grouping.quadratic_q"},
      {"alignment: {locality: .nan}", "alignment.locality"},
      {"alignment: {locality: 1.5}", "alignment.locality"},
      {"alignment: {partition_ranks: -4}", "alignment.partition_ranks"},
      {"alignment: {encoder_cost_per_patch: .nan}", "alignment.encoder_cost_per_patch"},
      {"alignment: {encoder_cost_per_patch: -.inf}", "alignment.encoder_cost_per_patch"},
      {"alignment: {vision_cost: {per_sample: .nan}}", "alignment.vision_cost.per_sample"},
      {"alignment: {vision_cost: {per_unit: -1}}", "alignment.vision_cost.per_unit"},
      {"alignment: {audio_cost: {per_unit_sq: .inf}}", "alignment.audio_cost.per_unit_sq"},
      {"alignment: {audio_cost: {per_frame: 1}}", "alignment.audio_cost.per_frame"},
      {"alignment: {llm_memory: {per_unit: -1}}", "alignment.llm_memory.per_unit"},
      {"alignment: {memory_slack: 11}", "alignment.memory_slack"},
      {"alignment: {memory_cap_margin: -0.1}", "alignment.memory_cap_margin"},
      {"alignment: {memory_peak_ratio: 0.5}", "alignment.memory_peak_ratio"},
      {"alignment: {memory_peak_ratio: 11}", "alignment.memory_peak_ratio"},
      {"alignment: {memory_peak_ratio: .nan}", "alignment.memory_peak_ratio"},
      {"alignment: {memory_time_floor: 0.3}", "alignment.memory_time_floor"},
      {"alignment: {memory_time_floor: 1}", "alignment.memory_time_floor"},
      {"alignment: {memory_time_floor: -0.1}", "alignment.memory_time_floor"},
      {"alignment: {memory_time_floor: .nan}", "alignment.memory_time_floor"},
      {"alignment: {memory_llm_slack: -0.1}", "alignment.memory_llm_slack"},
      {"alignment: {memory_llm_slack: 11}", "alignment.memory_llm_slack"},
      {"alignment: {memory_llm_slack: .inf}", "alignment.memory_llm_slack"},
      {"optimizer: {window_spread: -0.5}", "optimizer.window_spread"},
      {"optimizer: {window_spread: 4}", "optimizer.window_spread"},
      {"optimizer: {window_spread: .nan}", "optimizer.window_spread"},
  };
  for (const Case& c : cases) {
    INFO(c.yaml);
    CHECK_THAT(StartupError(c.yaml), Catch::Contains(c.field));
  }
  CHECK_THAT(StartupError("grouping: {quadratic_q: .nan}"), Catch::Contains("nan"));
  CHECK(StartupError("grouping: {quadratic_q: 2048}").empty());
  CHECK(StartupError("grouping: {quadratic_q: 0}").empty());
  CHECK(StartupError("alignment: {memory_peak_ratio: 1.09}").empty());
  CHECK(StartupError("alignment: {memory_peak_ratio: 0}").empty());
  {
    auto round = ParseConfig("alignment: {memory_peak_ratio: 1.09, memory_peak_round: true}");
    REQUIRE(round.ok());
    CHECK(round->memory_peak_round);
    CHECK_FALSE(ParseConfig("")->memory_peak_round);
  }
  {
    auto floor = ParseConfig("alignment: {memory_time_floor: 0.97}");
    REQUIRE(floor.ok());
    CHECK(floor->memory_time_floor == 0.97);
    CHECK(ParseConfig("")->memory_time_floor == 0.0);
    CHECK(StartupError("alignment: {memory_time_floor: 0.5}").empty());
  }
  {
    auto slack = ParseConfig("alignment: {memory_llm_slack: 0.25}");
    REQUIRE(slack.ok());
    CHECK(slack->memory_llm_slack == 0.25);
    CHECK(ParseConfig("")->memory_llm_slack == 0.0);
  }
  CHECK(StartupError("grouping: {step_time: {per_step: 0}}").empty());
  CHECK(StartupError("alignment: {partition_ranks: 4}").empty());
  // Accumulation windows under partitioned planning (window_partitioned.h).
  CHECK(StartupError("alignment: {partition_ranks: 4}\noptimizer: {tokens_per_step: 4096}").empty());
  {
    // Per-phase cost models: vision's per_unit defaults to encoder_cost_per_patch.
    auto legacy = ParseConfig("alignment: {encoder_cost_per_patch: 2.5}");
    REQUIRE(legacy.ok());
    CHECK(legacy->vision_cost.per_unit == 2.5);
    CHECK(legacy->vision_cost.per_sample == 0.0);
    CHECK(legacy->audio_cost.per_unit == 1.0);
    auto fitted = ParseConfig(
        "alignment: {encoder_cost_per_patch: 2.5, vision_cost: {per_sample: 40, per_unit: 3},\n"
        "            audio_cost: {per_sample: 7, per_unit: 0.5, per_unit_sq: 0.001}}");
    REQUIRE(fitted.ok());
    CHECK(fitted->vision_cost.per_unit == 3.0);
    CHECK(fitted->vision_cost.Of(10) == 70.0);
    CHECK(fitted->vision_cost.OfInput(0) == 0.0);
    CHECK(fitted->audio_cost.Of(100) == 7.0 + 50.0 + 10.0);
  }
  auto partitioned = ParseConfig("alignment: {partition_ranks: 3}");
  REQUIRE(partitioned.ok());
  CHECK(partitioned->partition_ranks == 3);
  CHECK_THAT(StartupError("alignment: {partition_ranks: many}"), Catch::Contains("alignment.partition_ranks"));
  CHECK_THAT(StartupError("alignment: {partition_ranks: many}"), Catch::Contains("or auto"));
}

TEST_CASE("alignment.partition_ranks auto: one pool up to 256 ranks, equal blocks of at most 256 above") {
  auto defaults = ParseConfig("");
  REQUIRE(defaults.ok());
  CHECK_FALSE(defaults->partition_ranks.has_value());  // auto is the default
  auto spelled = ParseConfig("alignment: {partition_ranks: auto}");
  REQUIRE(spelled.ok());
  CHECK_FALSE(spelled->partition_ranks.has_value());
  const std::vector<std::pair<int, uint32_t>> auto_blocks = {
      {1, 0},     {2, 0},     {32, 0},    {256, 0},   {257, 129},  {300, 150},
      {512, 256}, {513, 171}, {1024, 256}, {1100, 220}, {2560, 256}, {2561, 233}};
  for (const auto& [world, block] : auto_blocks) {
    INFO("world " << world);
    CHECK(PartitionRanks(*defaults, world) == block);
    if (block > 0) {  // at most kAutoPartitionMaxBlock ranks, the fewest such blocks, equal up to one rank
      const uint32_t blocks = (static_cast<uint32_t>(world) + block - 1) / block;
      CHECK(block <= kAutoPartitionMaxBlock);
      CHECK(blocks == (static_cast<uint32_t>(world) + kAutoPartitionMaxBlock - 1) / kAutoPartitionMaxBlock);
      CHECK(static_cast<uint32_t>(world) > (blocks - 1) * block);
    }
  }
  // A number is kept at every size; 0 keeps one pool.
  auto off = ParseConfig("alignment: {partition_ranks: 0}");
  REQUIRE(off.ok());
  CHECK(PartitionRanks(*off, 2560) == 0);
  auto eight = ParseConfig("alignment: {partition_ranks: 8}");
  REQUIRE(eight.ok());
  CHECK(PartitionRanks(*eight, 16) == 8);
  CHECK(PartitionRanks(*eight, 2560) == 8);
  // The default config file and the settings table spell it.
  bool shown = false;
  for (const auto& [path, value] : ConfigFieldDefaults()) {
    if (path == "alignment.partition_ranks") {
      CHECK(value == "auto");
      shown = true;
    }
  }
  CHECK(shown);
}

TEST_CASE("cross-field constraints that could only fail later are start-up errors") {
  CHECK_THAT(StartupError("collate: {length_field: ''}"), Catch::Contains("collate.length_field"));
  CHECK(StartupError("collate: {length_field: '', attention_mask: false}").empty());
  CHECK_THAT(StartupError("collate: {length_field: '', packed: true, attention_mask: false}"),
             Catch::Contains("packed"));
  // A field named like a tensor the collator adds.
  CHECK_THAT(StartupError("collate: {fields: [{name: attention_mask}]}"),
             Catch::Contains("collate.fields[0].name") && Catch::Contains("attention_mask"));
  CHECK_THAT(StartupError("collate: {packed: true, fields: [{name: cu_seqlens}]}"),
             Catch::Contains("cu_seqlens"));
  CHECK_THAT(StartupError("collate: {fields: [{name: px, rule: concat}, {name: px_offsets}]}"),
             Catch::Contains("collate.fields[1].name"));
  // phase_plans moves encoder fields out of the LLM batch: not the length field.
  CHECK_THAT(StartupError("alignment: {phase_plans: true}\ncollate: {encoder_fields: [input_ids]}"),
             Catch::Contains("collate.length_field") && Catch::Contains("encoder_fields"));
  CHECK(StartupError("alignment: {phase_plans: true}\ncollate: {encoder_fields: [pixel_values]}").empty());
  CHECK_THAT(StartupError("collate: {encoder_fields: [a, a]}"), Catch::Contains("encoder_fields[1]"));
  // The audio encoder phase: only with phase_plans, its own fields, never the length field.
  const std::string audio = "alignment: {phase_plans: true}\ncollate: {encoder_fields: [px], audio_fields: ";
  CHECK(StartupError(audio + "[wave]}").empty());
  CHECK_THAT(StartupError("collate: {audio_fields: [wave]}"),
             Catch::Contains("collate.audio_fields") && Catch::Contains("phase_plans"));
  CHECK_THAT(StartupError(audio + "[wave, px]}"), Catch::Contains("collate.audio_fields[1]"));
  CHECK_THAT(StartupError(audio + "[wave, wave]}"), Catch::Contains("collate.audio_fields[1]"));
  CHECK_THAT(StartupError(audio + "[input_ids]}"),
             Catch::Contains("collate.length_field") && Catch::Contains("audio_fields"));
  // The same endpoint twice would fail at bind.
  CHECK_THAT(StartupError("ingest_endpoints: [ipc:///tmp/a.sock]\ntrainer_endpoint: ipc:///tmp/a.sock"),
             Catch::Contains("trainer_endpoint"));
  CHECK_THAT(StartupError("ingest_endpoints: [tcp://*:5000, tcp://*:5000]"),
             Catch::Contains("listed twice"));
  CHECK_THAT(StartupError("trainer_endpoint: udp://x"), Catch::Contains("trainer_endpoint"));
  CHECK_THAT(StartupError("ingest_endpoints: [tcp://host]"), Catch::Contains("ingest_endpoints[0]"));
  CHECK_THAT(StartupError("ingest_endpoints: ['tcp://host:99999']"), Catch::Contains("port"));
  CHECK_THAT(StartupError("metrics_endpoint: 'tcp://0.0.0.0:x'"), Catch::Contains("metrics_endpoint"));
  CHECK(StartupError("metrics_endpoint: 'tcp://127.0.0.1:*'").empty());
  CHECK(StartupError("round_trace: '{run}/rounds-{rank}.txt'").empty());
  CHECK(StartupError("buffer: {max_id_runs: 100000}").empty());
  CHECK_THAT(StartupError("buffer: {max_id_runs: 100}"), Catch::Contains("buffer.max_id_runs"));
  CHECK_THAT(StartupError("buffer: {max_id_runs: 8589934592}"), Catch::Contains("buffer.max_id_runs"));
  CHECK_THAT(StartupError("round_trace: '" + std::string(5000, 'a') + "'"), Catch::Contains("round_trace"));
  CHECK_THAT(StartupError("alignment: {job_id: a/b}"), Catch::Contains("alignment.job_id"));
  CHECK_THAT(StartupError("alignment: {store: redis, redis_host: ''}"),
             Catch::Contains("alignment.redis_host"));
  CHECK_THAT(StartupError("alignment: {gloo_hostname: ''}"), Catch::Contains("alignment.gloo_hostname"));
  // A negative rank is a typo, not "take it from $RANK".
  CHECK_THAT(StartupError("rank: -2", {{"RANK", "0"}}), Catch::Contains("rank"));
  CHECK_THAT(StartupError("world_size: 0"), Catch::Contains("world_size"));
}

// Integers from the environment are decimal digits within int: 2^32 must
// not wrap to rank 0 (two daemons of the job both rank 0), 10^20 must not
// clamp and wrap to -1, and " 1" / "+1" / "0x1" are typos, not ranks.
TEST_CASE(
    "RANK / WORLD_SIZE / LOCAL_* from the environment: digits within int, else an error naming the "
    "variable") {
  for (const std::string name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
    for (const std::string value : {"4294967296", "4294967297", "2147483648", "99999999999999999999", " 1",
                                    "1 ", "+1", "-1", "0x1", "1e3"}) {
      std::map<std::string, std::string> env = {{"RANK", "0"}, {"WORLD_SIZE", "2"}};
      env[name] = value;
      INFO(name << "='" << value << "'");
      const std::string e = StartupError("", env);
      CHECK_THAT(e,
                 Catch::Contains("environment variable " + name + "='") && Catch::Contains("0..2147483647"));
    }
  }
  CHECK(StartupError("", {{"RANK", "1"}, {"WORLD_SIZE", "2"}}).empty());
  CHECK(StartupError("", {{"RANK", "2147483646"}, {"WORLD_SIZE", "2147483647"}}).empty());
}

// A value of the wrong type names the field and what it takes, for every
// kind of field (the settings of sessions 11-12 among them).
TEST_CASE("a value of the wrong type names the field and what the field takes") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"buffer: {max_id_runs: -1}",
       "'buffer.max_id_runs': cannot read '-1' as the expected type; use a whole "
       "number in 0..18446744073709551615"},
      {"buffer: {max_id_runs: 1e30}", "use a whole number in 0..18446744073709551615"},
      {"buffer: {max_id_runs: many}", "'buffer.max_id_runs'"},
      {"buffer: {max_id_runs: [1]}", "'buffer.max_id_runs'"},
      {"emit: {trainer_timeout_ms: -5}",
       "'emit.trainer_timeout_ms': cannot read '-5' as the expected type; use "
       "a whole number in 0..4294967295"},
      {"emit: {exit_when_trainer_done: maybe}", "'emit.exit_when_trainer_done'"},
      {"emit: {exit_when_trainer_done: maybe}", "use true or false"},
      {"round_trace: [a, b]", "'round_trace': cannot read"},
      {"round_trace: {a: b}", "use a string"},
      {"grouping: {quadratic_q: fast}", "use a number"},
      {"ingest_endpoints: 5", "use a list of strings"},
      {"rank: 99999999999", "use a whole number in -2147483648..2147483647"},
  };
  for (const auto& [yaml, expected] : cases) {
    INFO(yaml);
    CHECK_THAT(StartupError(yaml), Catch::Contains(expected));
  }
  // A long value is shortened in the message.
  const std::string e = StartupError("buffer: {max_id_runs: " + std::string(1000, '9') + "}");
  CHECK_THAT(e, Catch::Contains("'buffer.max_id_runs'") && Catch::Contains("[1000 bytes]"));
  CHECK(e.size() < 300);
}

TEST_CASE("string fields are bounded") {
  const std::string long_id(129, 'j');
  std::string e = StartupError("alignment: {job_id: " + long_id + "}");
  CHECK_THAT(e, Catch::Contains("alignment.job_id") && Catch::Contains("129 bytes") &&
                    Catch::Contains("128"));
  CHECK(e.size() < 400);  // the value is cut in the message
  CHECK(StartupError("alignment: {job_id: " + std::string(128, 'j') + "}").empty());

  // A Unix socket path holds 107 bytes; a long run_dir makes bind fail.
  const std::string run_dir = "/tmp/" + std::string(100, 'r');
  e = StartupError("run_dir: " + run_dir);
  CHECK_THAT(e, Catch::Contains("ingest_endpoints[0]") && Catch::Contains("shorter run_dir"));
  CHECK_THAT(StartupError("trainer_endpoint: tcp://" + std::string(2000, 'h') + ":1"),
             Catch::Contains("trainer_endpoint") && Catch::Contains("1024"));
  CHECK_THAT(StartupError("alignment: {gloo_iface: " + std::string(16, 'e') + "}"),
             Catch::Contains("alignment.gloo_iface"));
  CHECK_THAT(StartupError("alignment: {gloo_hostname: " + std::string(254, 'h') + "}"),
             Catch::Contains("alignment.gloo_hostname"));
  CHECK_THAT(StartupError("run_dir: /" + std::string(5000, 'd')), Catch::Contains("run_dir"));
  CHECK_THAT(StartupError("collate: {fields: [{name: " + std::string(256, 'f') + "}]}"),
             Catch::Contains("collate.fields[0].name"));
  CHECK_THAT(StartupError("collate: {length_field: 'input ids'}"),
             Catch::Contains("collate.length_field"));
  CHECK_THAT(StartupError("log_level: " + std::string(1000, 'x')),
             Catch::Contains("log_level") && Catch::Contains("1000 bytes"));
}

TEST_CASE("the shared-memory data plane's keys") {
  auto defaults = ParseConfig("");
  REQUIRE(defaults.ok());
  CHECK(defaults->shm_producer_arenas);
  CHECK(defaults->shm_max_arenas == 1024);
  auto off = ParseConfig("shm: {producer_arenas: false, max_arenas: 8}");
  REQUIRE(off.ok());
  CHECK_FALSE(off->shm_producer_arenas);
  CHECK(off->shm_max_arenas == 8);
  REQUIRE(FinalizeConfig(*off, {}).ok());
  auto typo = ParseConfig("shm: {producer_arena: true}");
  REQUIRE_FALSE(typo.ok());
  CHECK_THAT(std::string(typo.status().message()), Catch::Contains("shm.producer_arena"));
  auto zero = ParseConfig("shm: {max_arenas: 0}");
  REQUIRE(zero.ok());
  absl::Status s = FinalizeConfig(*zero, {});
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(std::string(s.message()), Catch::Contains("shm.max_arenas"));
}

TEST_CASE("the step arena's keys") {
  auto defaults = ParseConfig("");
  REQUIRE(defaults.ok());
  CHECK(defaults->trainer.step_arena);
  CHECK_FALSE(defaults->trainer.step_arena_required);
  CHECK(defaults->trainer.step_arena_bytes == (uint64_t{1} << 30));
  auto zmq = ParseConfig("shm: {trainer_data_plane: zmq, step_arena_bytes: 4194304, step_arena_wait_ms: 500}");
  REQUIRE(zmq.ok());
  CHECK_FALSE(zmq->trainer.step_arena);
  CHECK_FALSE(zmq->trainer.step_arena_required);
  CHECK(zmq->trainer.step_arena_bytes == 4194304);
  CHECK(zmq->steps.step_arena_wait_ms == 500);
  REQUIRE(FinalizeConfig(*zmq, {}).ok());
  auto bad = ParseConfig("shm: {trainer_data_plane: off}");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("trainer_data_plane"));
  auto remote = ParseConfig("trainer_endpoint: tcp://127.0.0.1:5999\nshm: {trainer_data_plane: shm}");
  REQUIRE(remote.ok());
  absl::Status s = FinalizeConfig(*remote, {});
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(std::string(s.message()), Catch::Contains("ipc://"));
  auto tiny = ParseConfig("shm: {step_arena_bytes: 4096}");
  REQUIRE(tiny.ok());
  s = FinalizeConfig(*tiny, {});
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(std::string(s.message()), Catch::Contains("shm.step_arena_bytes"));
}

}  // namespace
}  // namespace odb

namespace odb {
namespace {

const collate::FieldSpec* FindField(const DaemonConfig& c, const std::string& name) {
  for (const auto& f : c.collate.fields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

TEST_CASE("labels pad with the ignore index -100 unless the config lists them") {
  auto empty = ParseConfig("");
  REQUIRE(empty.ok());
  const collate::FieldSpec* labels = FindField(*empty, "labels");
  REQUIRE(labels != nullptr);
  CHECK(labels->pad_value == -100);
  CHECK(labels->rule == collate::FieldRule::kPad);
  // A list of other fields keeps the labels default.
  auto others = ParseConfig("collate: {fields: [{name: pixel_values, rule: concat}]}");
  REQUIRE(others.ok());
  REQUIRE(FindField(*others, "labels") != nullptr);
  CHECK(FindField(*others, "labels")->pad_value == -100);
  // A listed labels field is the user's choice, even 0.
  auto listed = ParseConfig("collate: {fields: [{name: labels, pad_value: 0}]}");
  REQUIRE(listed.ok());
  CHECK(listed->collate.fields.size() == 1);
  CHECK(FindField(*listed, "labels")->pad_value == 0);
  // Another default rule: nothing is added.
  auto stacked = ParseConfig("collate: {default_rule: stack}");
  REQUIRE(stacked.ok());
  CHECK(FindField(*stacked, "labels") == nullptr);
}

TEST_CASE("a config path that does not exist or is a directory is an error naming it") {
  auto missing = LoadConfigFile("/nonexistent/odbd.yaml");
  REQUIRE(!missing.ok());
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("/nonexistent/odbd.yaml") && Catch::Contains("does not exist"));
  auto dir = LoadConfigFile("/tmp");
  REQUIRE(!dir.ok());
  CHECK_THAT(std::string(dir.status().message()), Catch::Contains("'/tmp' is a directory"));
}

TEST_CASE("ConfigFieldDefaults lists every field with the parser's default") {
  std::map<std::string, std::string> fields;
  for (const auto& [path, value] : ConfigFieldDefaults()) fields[path] = value;
  CHECK(fields.at("alignment.job_id") == "odb");
  CHECK(fields.at("grouping.cost_model") == "padded");
  CHECK(fields.at("shm.step_arena_bytes").size() > 0);
  CHECK(fields.at("grouping.step_time.per_step") == "512");
  CHECK(fields.at("collate.fields") == "[{name: labels, pad_value: -100}]");
  CHECK(fields.count("ingest_endpoints") == 1);
}

TEST_CASE("config values with which every sample must fail are refused at start-up, naming the field") {
  // No sample (not even one tensor of one byte) fits half of such a buffer.
  CHECK_THAT(StartupError("buffer: {max_bytes: 1}"),
             Catch::Contains("buffer.max_bytes") && Catch::Contains("at least 1026"));
  CHECK_THAT(StartupError("buffer: {max_bytes: 1025}"), Catch::Contains("buffer.max_bytes"));
  CHECK(StartupError("buffer: {max_bytes: 1026}").empty());
  // A key without a value is not the text "null" (no sample has a tensor of that name).
  CHECK_THAT(StartupError("collate: {length_field: }"),
             Catch::Contains("collate.length_field") && Catch::Contains("has no value"));
  CHECK_THAT(StartupError("collate:\n  length_field:\n"), Catch::Contains("collate.length_field"));
  CHECK_THAT(StartupError("grouping: {max_tokens: ~}"), Catch::Contains("grouping.max_tokens"));
}

TEST_CASE("alignment.mode's older names still read") {
  for (const auto& [text, mode] :
       {std::pair{"every_sample", align::EpochMode::kJoin},
        std::pair{"first_dry", align::EpochMode::kNonJoin}, std::pair{"join", align::EpochMode::kJoin},
        std::pair{"non_join", align::EpochMode::kNonJoin}}) {
    auto c = ParseConfig(std::string("alignment: {mode: ") + text + "}");
    REQUIRE(c.ok());
    CHECK(c->mode == mode);
  }
  // The defaults print uses the new name.
  const auto defaults = ConfigFieldDefaults();
  const std::map<std::string, std::string> fields(defaults.begin(), defaults.end());
  CHECK(fields.at("alignment.mode") == "every_sample");
}

TEST_CASE("the job-wide settings are the table's job-wide rows, with their values") {
  auto a = ParseConfig("alignment: {locality: 0.25}\ngrouping: {max_tokens: 8192}\nrun_dir: /tmp/a");
  REQUIRE(a.ok());
  std::map<std::string, std::string> job;
  for (const auto& [path, value] : JobWideSettings(*a)) job[path] = value;
  CHECK(job.at("alignment.locality") == "0.25");
  CHECK(job.at("grouping.max_tokens") == "8192");
  for (const char* key :
       {"alignment.phase_plans", "alignment.vision_cost.per_unit", "optimizer.tokens_per_step",
        "emit.queue_steps", "alignment.mode", "grouping.step_time.per_step"}) {
    CHECK(job.count(key) == 1);
  }
  // Per-rank settings (addresses, directories, logging) may differ between ranks.
  for (const char* key : {"rank", "run_dir", "alignment.gloo_hostname", "log_level", "trainer_endpoint"}) {
    CHECK(job.count(key) == 0);
  }
  size_t rows = 0;
  for (const Setting& s : Settings()) rows += !s.is_section && s.scope == Scope::kJob;
  CHECK(job.size() == rows);
}

}  // namespace
}  // namespace odb
