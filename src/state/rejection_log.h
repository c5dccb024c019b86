#ifndef ODB_STATE_REJECTION_LOG_H_
#define ODB_STATE_REJECTION_LOG_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "proto/odb.pb.h"

namespace odb {

// Every rejection of the daemon, bounded in memory whatever the input: per
// epoch the first `max_kept` are kept (strings truncated), later ones are
// only counted, so a flood of bad input costs a counter, not memory. The
// count is always exact; summaries say how many were not listed.
// Not thread-safe; the daemon's state mutex guards it.
class RejectionLog {
 public:
  static constexpr size_t kMaxKeptPerEpoch = 1000;
  static constexpr size_t kMaxUnreported = 256;
  static constexpr size_t kMaxProducerIdBytes = 256;
  static constexpr size_t kMaxMessageBytes = 1024;

  explicit RejectionLog(size_t max_kept = kMaxKeptPerEpoch) : max_kept_(max_kept) {}

  // Returns false when the rejection was only counted (over the bound).
  bool Record(wire::Rejection rejection, uint32_t epoch);

  // Rejections not yet reported in a step header (at most kMaxUnreported;
  // the rest are in the epoch summary).
  std::vector<wire::Rejection> TakeUnreported();

  struct EpochRecord {
    uint64_t count = 0;                 // every rejection of the epoch
    std::vector<wire::Rejection> kept;  // the first max_kept of them
  };
  EpochRecord TakeEpoch(uint32_t epoch);
  uint64_t Count(uint32_t epoch) const;

  // Shortens the strings of a rejection to the bounds above.
  static void Truncate(wire::Rejection& rejection);

 private:
  size_t max_kept_;
  std::map<uint32_t, EpochRecord> epochs_;
  std::vector<wire::Rejection> unreported_;
};

}  // namespace odb

#endif  // ODB_STATE_REJECTION_LOG_H_
