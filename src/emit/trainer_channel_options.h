#ifndef ODB_EMIT_TRAINER_CHANNEL_OPTIONS_H_
#define ODB_EMIT_TRAINER_CHANNEL_OPTIONS_H_

#include <cstdint>
#include <string>

#include "src/collate/collator.h"

namespace odb::emit {

// What the trainer channel reads of the daemon's configuration.
//
// Each field's comment starts with where its value comes from
// (tools/check_stage_options.py holds every options struct to this):
//  - "<key>:": a knob only this stage reads. The config parser writes it
//    straight into DaemonConfig::trainer and its default is the one below,
//    nowhere else. A new knob of this stage is a field here, a line of the
//    parser and its doc (configs/odbd.yaml, docs/config.md) — nothing more.
//  - "derived": config that several parts of the daemon read; it stays at
//    DaemonConfig's top level and the daemon copies it in, in one place
//    (src/daemon/stage_options.cc).
struct TrainerChannelOptions {
  // trainer_endpoint: where the trainer connects ("{rank}"/"{run}" expanded
  // by the daemon's config before the channel sees it).
  std::string endpoint = "ipc://{run}/odb-{rank}-out.sock";
  uint32_t outstanding_depth = 4;  // emit.outstanding_depth: steps sent ahead of credit
  // shm.trainer_data_plane: auto and shm offer each session a step arena when
  // the endpoint is ipc://; zmq sends frames only.
  bool step_arena = true;
  // shm.trainer_data_plane: shm makes a failure to create or offer the arena
  // an error instead of falling back to frames.
  bool step_arena_required = false;
  uint64_t step_arena_bytes = uint64_t{1} << 30;  // shm.step_arena_bytes: the arena's capacity
  uint32_t trainer_timeout_ms = 30000;            // emit.trainer_timeout_ms: 0 = never

  int rank = 0;  // derived (rank): named in fatal messages

  // derived (optimizer.tokens_per_step): with the data plane above and these,
  // what every SessionAck tells the trainer (JobSettings, docs/protocol.md).
  uint64_t window_target = 0;
  collate::CollateOptions collate;  // derived (collate): packed, length_field, the labels' pad value
};

}  // namespace odb::emit

#endif  // ODB_EMIT_TRAINER_CHANNEL_OPTIONS_H_
