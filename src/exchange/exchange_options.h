#ifndef ODB_EXCHANGE_EXCHANGE_OPTIONS_H_
#define ODB_EXCHANGE_EXCHANGE_OPTIONS_H_

#include <cstdint>
#include <string>

namespace odb::exchange {

// What the payload exchange reads of the daemon's configuration.
//
// Each field's comment starts with where its value comes from
// (tools/check_stage_options.py holds every options struct to this):
//  - "<key>:": a knob only this stage reads. The config parser writes it
//    straight into DaemonConfig::exchange and its default is the one below,
//    nowhere else. A new knob of this stage is a field here, a line of the
//    parser and its doc (configs/odbd.yaml, docs/config.md) — nothing more.
//  - "derived": config that several parts of the daemon read; it stays at
//    DaemonConfig's top level and the daemon copies it in, in one place
//    (src/daemon/stage_options.cc).
// Today every field is derived: the exchange shares its address and
// timeouts with the Gloo peer group.
struct ExchangeOptions {
  int rank = 0;                          // derived (rank)
  std::string hostname = "127.0.0.1";    // derived (alignment.gloo_hostname): the address it binds
  uint32_t connect_timeout_ms = 30000;   // derived (alignment.connect_timeout_ms)
  // derived (alignment.collective_timeout_ms): a payload that never comes is
  // an error after this.
  uint32_t collective_timeout_ms = 120000;
};

}  // namespace odb::exchange

#endif  // ODB_EXCHANGE_EXCHANGE_OPTIONS_H_
