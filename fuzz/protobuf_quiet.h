#ifndef ODB_FUZZ_PROTOBUF_QUIET_H_
#define ODB_FUZZ_PROTOBUF_QUIET_H_

#include <string>

#include <google/protobuf/stubs/logging.h>

namespace odb::fuzz {

// Drops libprotobuf's log lines. Parsing a string field with invalid UTF-8
// logs "[libprotobuf ERROR ...] String field ... contains invalid UTF-8" for
// every such message: most of a fuzzer's time and output otherwise (the
// daemon logs the same line for each such producer message: docs/fuzzing.md).
// Returns true, to initialize a function-local static once.
inline bool SilenceProtobufLogs() {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return true;
}

}  // namespace odb::fuzz

#endif  // ODB_FUZZ_PROTOBUF_QUIET_H_
