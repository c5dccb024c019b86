#ifndef ODB_DAEMON_STAGE_OPTIONS_H_
#define ODB_DAEMON_STAGE_OPTIONS_H_

#include "src/daemon/config.h"
#include "src/emit/step_builder.h"
#include "src/emit/trainer_channel.h"
#include "src/exchange/payload_exchange.h"
#include "src/ingest/ingest_channel.h"

namespace odb {

// Each I/O stage declares the options it reads beside it; these fill them
// from the daemon's one config (finalized: endpoints expanded, rank known).
// A knob that one stage reads is a field of that stage's options, parsed
// into DaemonConfig and copied here.
ingest::IngestOptions IngestOptionsFor(const DaemonConfig& config);
emit::TrainerChannelOptions TrainerChannelOptionsFor(const DaemonConfig& config);
emit::StepBuilderOptions StepBuilderOptionsFor(const DaemonConfig& config);
exchange::ExchangeOptions ExchangeOptionsFor(const DaemonConfig& config);

}  // namespace odb

#endif  // ODB_DAEMON_STAGE_OPTIONS_H_
