#ifndef ODB_DAEMON_STAGE_OPTIONS_H_
#define ODB_DAEMON_STAGE_OPTIONS_H_

#include "src/daemon/config.h"
#include "src/emit/step_builder_options.h"
#include "src/emit/trainer_channel_options.h"
#include "src/exchange/exchange_options.h"
#include "src/ingest/ingest_options.h"

namespace odb {

// Each I/O stage's options, from the daemon's one config (finalized:
// endpoints expanded, rank known). A stage's own knobs are already in its
// member of DaemonConfig (the parser writes them there); these copy it and
// fill in the fields its header marks "derived": config that several parts
// of the daemon read, kept once at DaemonConfig's top level. This file is the
// one place that copies config into a stage (tools/check_stage_options.py).
ingest::IngestOptions IngestOptionsFor(const DaemonConfig& config);
emit::TrainerChannelOptions TrainerChannelOptionsFor(const DaemonConfig& config);
emit::StepBuilderOptions StepBuilderOptionsFor(const DaemonConfig& config);
exchange::ExchangeOptions ExchangeOptionsFor(const DaemonConfig& config);

}  // namespace odb

#endif  // ODB_DAEMON_STAGE_OPTIONS_H_
