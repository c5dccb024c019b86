#ifndef ODB_EMIT_STEP_BUILDER_OPTIONS_H_
#define ODB_EMIT_STEP_BUILDER_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "src/collate/collator.h"

namespace odb::emit {

// What the step builder reads of the daemon's configuration.
//
// Each field's comment starts with where its value comes from
// (tools/check_stage_options.py holds every options struct to this):
//  - "<key>:": a knob only this stage reads. The config parser writes it
//    straight into DaemonConfig::steps and its default is the one below,
//    nowhere else. A new knob of this stage is a field here, a line of the
//    parser and its doc (configs/odbd.yaml, docs/config.md) — nothing more.
//  - "derived": config that several parts of the daemon read; it stays at
//    DaemonConfig's top level and the daemon copies it in, in one place
//    (src/daemon/stage_options.cc).
struct StepBuilderOptions {
  // collate.encoder_fields: with alignment.phase_plans, these fields go to
  // the encoder batch ("enc.<name>").
  std::vector<std::string> encoder_fields;
  // bad_input: error (true) or skip_and_report (false); stamped on every step
  // header and epoch summary for the client.
  bool rejections_are_errors = true;
  // shm.step_arena_wait_ms: how long to wait for a block of a full step arena.
  uint32_t step_arena_wait_ms = 120000;

  int rank = 0;  // derived (rank): samples owned by this rank are in the local buffer
  collate::CollateOptions collate;  // derived (collate)
  bool phase_plans = false;         // derived (alignment.phase_plans)
  // derived (collate.audio_fields): the audio encoder batch ("audio.<name>");
  // the round runner reads it too (whether a step has an audio phase).
  std::vector<std::string> audio_fields;
  bool deterministic = false;       // derived (alignment.deterministic): stamped on every step header
  // derived (alignment.planner, alignment.phase_plans): a global planner or
  // per-phase plans move samples between ranks; stamped on every step header.
  bool samples_may_move = true;
  // derived (alignment.mode): non_join reports an epoch's leftover samples
  // instead of emitting them.
  bool non_join = false;
};

}  // namespace odb::emit

#endif  // ODB_EMIT_STEP_BUILDER_OPTIONS_H_
