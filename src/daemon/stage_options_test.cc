// Every knob reaches the stage that reads it: a stage's own knobs through its
// member of DaemonConfig, the shared ones through stage_options.cc.
#include "src/daemon/stage_options.h"

#include <catch2/catch.hpp>

namespace odb {
namespace {

DaemonConfig Finalized(const std::string& yaml, const std::map<std::string, std::string>& env) {
  auto c = ParseConfig(yaml);
  REQUIRE(c.ok());
  const absl::Status s = FinalizeConfig(*c, env);
  INFO(s.message());
  REQUIRE(s.ok());
  return *c;
}

// Every key differs from its default, so a knob that does not arrive shows.
constexpr const char* kEveryKnob = R"(
run_dir: /tmp/odb-so
ingest_endpoints: ["ipc://{run}/a-{rank}.sock", "tcp://127.0.0.1:7001"]
trainer_endpoint: "ipc://{run}/t-{rank}.sock"
ingest_hwm: 17
bad_input: skip_and_report
shm: {trainer_data_plane: shm, step_arena_bytes: 4194304, step_arena_wait_ms: 900}
buffer: {max_bytes: 1048576, max_samples: 4096}
grouping: {max_tokens: 777, window: 64, over_budget: reject}
alignment:
  mode: non_join
  planner: local
  deterministic: true
  gloo_hostname: 10.1.2.3
  connect_timeout_ms: 1111
  collective_timeout_ms: 2222
emit: {outstanding_depth: 7, producer_timeout_ms: 3333, trainer_timeout_ms: 4444}
collate: {packed: true, encoder_fields: [pixel_values]}
)";

TEST_CASE("a stage's own knobs arrive through its member, the shared ones through stage_options") {
  const DaemonConfig c = Finalized(kEveryKnob, {{"RANK", "2"}, {"WORLD_SIZE", "3"}});

  const ingest::IngestOptions in = IngestOptionsFor(c);
  CHECK(in.endpoints == std::vector<std::string>{"ipc:///tmp/odb-so/a-2.sock", "tcp://127.0.0.1:7001"});
  CHECK(in.hwm == 17);
  CHECK(in.reject_over_budget);
  CHECK(in.producer_timeout_ms == 3333);
  CHECK(in.rank == 2);
  CHECK(in.buffer_max_bytes == 1048576);
  CHECK(in.buffer_max_samples == 4096);
  CHECK(in.window == 64);
  CHECK(in.deterministic);
  CHECK(in.budget.max_tokens == 777);
  CHECK(in.collate.packed);
  CHECK_FALSE(in.phase_plans);

  const emit::TrainerChannelOptions tr = TrainerChannelOptionsFor(c);
  CHECK(tr.endpoint == "ipc:///tmp/odb-so/t-2.sock");
  CHECK(tr.outstanding_depth == 7);
  CHECK(tr.step_arena);
  CHECK(tr.step_arena_required);
  CHECK(tr.step_arena_bytes == 4194304);
  CHECK(tr.trainer_timeout_ms == 4444);
  CHECK(tr.rank == 2);

  const emit::StepBuilderOptions st = StepBuilderOptionsFor(c);
  CHECK(st.encoder_fields == std::vector<std::string>{"pixel_values"});
  CHECK_FALSE(st.rejections_are_errors);
  CHECK(st.step_arena_wait_ms == 900);
  CHECK(st.rank == 2);
  CHECK(st.collate.packed);
  CHECK_FALSE(st.phase_plans);
  CHECK(st.deterministic);
  CHECK_FALSE(st.samples_may_move);  // local planner, no per-phase plans
  CHECK(st.non_join);

  const exchange::ExchangeOptions ex = ExchangeOptionsFor(c);
  CHECK(ex.rank == 2);
  CHECK(ex.hostname == "10.1.2.3");
  CHECK(ex.connect_timeout_ms == 1111);
  CHECK(ex.collective_timeout_ms == 2222);
}

TEST_CASE("an empty config gives every stage its own defaults") {
  const DaemonConfig c = Finalized("", {});
  const ingest::IngestOptions in = IngestOptionsFor(c);
  CHECK(in.endpoints == std::vector<std::string>{"ipc:///tmp/odb/odb-0-in.sock"});
  CHECK(in.hwm == ingest::IngestOptions{}.hwm);
  CHECK_FALSE(in.reject_over_budget);
  const emit::TrainerChannelOptions tr = TrainerChannelOptionsFor(c);
  CHECK(tr.endpoint == "ipc:///tmp/odb/odb-0-out.sock");
  CHECK(tr.step_arena);  // auto
  CHECK_FALSE(tr.step_arena_required);
  const emit::StepBuilderOptions st = StepBuilderOptionsFor(c);
  CHECK(st.rejections_are_errors);  // bad_input: error
  CHECK(st.samples_may_move);       // the global planner
  CHECK_FALSE(st.non_join);
  const emit::StepBuilderOptions phases = StepBuilderOptionsFor(Finalized("alignment: {phase_plans: true, planner: local}\n"
                                                                       "collate: {encoder_fields: [pixel_values]}",
                                                                       {}));
  CHECK(phases.samples_may_move);  // per-phase plans move encoder outputs even with the local planner
  CHECK_FALSE(TrainerChannelOptionsFor(Finalized("shm: {trainer_data_plane: zmq}", {})).step_arena);
}

}  // namespace
}  // namespace odb
