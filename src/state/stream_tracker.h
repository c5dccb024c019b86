#ifndef ODB_STATE_STREAM_TRACKER_H_
#define ODB_STATE_STREAM_TRACKER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "proto/odb.pb.h"

namespace odb {

// Knows which producers exist and where each one's stream stands per epoch.
// It decides when an epoch's input is complete (every expected producer sent
// end_stream) and rejects input that the stateless decoder cannot judge:
// samples from producers that never said hello, and samples for epochs that
// are already closed. Not thread-safe; owned by the ingest loop.
class StreamTracker {
 public:
  StreamTracker() = default;
  StreamTracker(const StreamTracker&) = delete;
  StreamTracker& operator=(const StreamTracker&) = delete;

  void OnHello(const std::string& producer_id);

  // Counts a sample (accepted or rejected later) against its producer's
  // stream. Returns a rejection when the producer is unknown or the epoch closed.
  std::optional<wire::Rejection> OnSample(const std::string& producer_id, uint32_t epoch, uint64_t sample_id);

  // Records the end of a producer's stream. Returns a rejection when the
  // producer is unknown, ended twice, or its count disagrees with what arrived.
  std::optional<wire::Rejection> OnEndStream(const std::string& producer_id, uint32_t epoch,
                                             uint64_t samples_sent);

  // True once `expected_producers` distinct producers ended their stream for `epoch`.
  bool StreamFinished(uint32_t epoch, uint32_t expected_producers) const;
  // True once anything of `epoch` arrived: a sample or an end of stream.
  bool StreamStarted(uint32_t epoch) const;

  uint64_t Received(uint32_t epoch) const;
  // Producers that said hello but have not ended their stream for `epoch`.
  std::vector<std::string> OpenProducers(uint32_t epoch) const;
  // Producers that sent a sample of `epoch` and have not ended its stream
  // (what a timeout can truthfully blame), and how many ended it.
  std::vector<std::string> ActiveProducers(uint32_t epoch) const;
  size_t EndedCount(uint32_t epoch) const;
  bool HasEnded(const std::string& producer_id, uint32_t epoch) const;
  // `quota_closed`: the epoch ended by Non-Join quota closure, so samples that
  // still arrive for it are LATE_FOR_CLOSED_EPOCH, not WRONG_EPOCH.
  void CloseEpoch(uint32_t epoch, bool quota_closed = false);
  bool IsClosed(uint32_t epoch) const { return closed_.count(epoch) > 0; }
  // The epoch after the last closed one (0 before any closed).
  uint32_t FirstOpenEpoch() const { return closed_.empty() ? 0 : *closed_.rbegin() + 1; }
  size_t ProducerCount() const { return producers_.size(); }
  // The lowest and highest epoch not closed that anything arrived for (a
  // sample or an end of stream); nullopt when there is none.
  std::optional<std::pair<uint32_t, uint32_t>> OpenEpochRange() const;
  // The epochs below `epoch` that are not closed and that anything arrived for.
  std::vector<uint32_t> OpenEpochsBefore(uint32_t epoch) const;

  // A sample that the daemon refused without counting it in its stream (its
  // epoch is outside the epochs the daemon holds, see IngestChannel): its
  // producer's end of stream counts it as sent. Bounded: past
  // kMaxRefusedStreams (producer, epoch) pairs, refusals are not remembered
  // (the end of stream then reports the counts as they are).
  void NoteRefused(const std::string& producer_id, uint32_t epoch);
  uint64_t Refused(const std::string& producer_id, uint32_t epoch) const;
  static constexpr size_t kMaxRefusedStreams = 4096;

 private:
  struct EpochStream {
    std::map<std::string, uint64_t> received_by_producer;
    std::set<std::string> ended;
    uint64_t received = 0;
  };

  std::set<std::string> producers_;
  std::map<uint32_t, EpochStream> epochs_;
  std::set<uint32_t> closed_;
  std::set<uint32_t> quota_closed_;
  std::map<std::pair<std::string, uint32_t>, uint64_t> refused_;
};

}  // namespace odb

#endif  // ODB_STATE_STREAM_TRACKER_H_
