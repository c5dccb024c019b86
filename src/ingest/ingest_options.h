#ifndef ODB_INGEST_INGEST_OPTIONS_H_
#define ODB_INGEST_INGEST_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "src/collate/collator.h"
#include "src/grouping/budget.h"

namespace odb::ingest {

// What the ingest channel reads of the daemon's configuration.
//
// Each field's comment starts with where its value comes from
// (tools/check_stage_options.py holds every options struct to this):
//  - "<key>:": a knob only this stage reads. The config parser writes it
//    straight into DaemonConfig::ingest and its default is the one below,
//    nowhere else. A new knob of this stage is a field here, a line of the
//    parser and its doc (configs/odbd.yaml, docs/config.md) — nothing more.
//  - "derived": config that several parts of the daemon read; it stays at
//    DaemonConfig's top level and the daemon copies it in, in one place
//    (src/daemon/stage_options.cc).
struct IngestOptions {
  // ingest_endpoints: where producers connect ("{rank}"/"{run}" expanded by
  // the daemon's config before the channel sees them).
  std::vector<std::string> endpoints = {"ipc://{run}/odb-{rank}-in.sock"};
  int hwm = 1000;  // ingest_hwm: the ZMQ receive high-water mark of each ingest socket
  // grouping.over_budget: reject (true) or isolate (false) a sample that fits
  // no budget alone; `budget` is what it must fit.
  bool reject_over_budget = false;
  uint32_t producer_timeout_ms = 600000;  // emit.producer_timeout_ms: 0 = never

  int rank = 0;  // derived (rank): a producer's hello that names another rank is refused
  // derived (buffer.max_bytes, buffer.max_samples: the buffer has the same
  // bounds): bound what is buffered plus every credit granted; a sample may
  // take at most half of max_bytes.
  uint64_t buffer_max_bytes = uint64_t{1} << 30;
  uint64_t buffer_max_samples = 65536;  // derived (buffer.max_samples), as above
  uint32_t window = 512;                // derived (grouping.window): samples per rank per round
  bool deterministic = false;           // derived (alignment.deterministic): credit by seq order
  grouping::Budget budget;              // derived (grouping.*): what a sample must fit alone
  // derived (collate): what every admitted sample must be collatable with (an
  // epoch's schema).
  collate::CollateOptions collate;
  bool phase_plans = false;  // derived (alignment.phase_plans): the schema is never packed
};

}  // namespace odb::ingest

#endif  // ODB_INGEST_INGEST_OPTIONS_H_
