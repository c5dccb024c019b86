#ifndef ODB_ALIGN_META_CODEC_H_
#define ODB_ALIGN_META_CODEC_H_

// The per-round peer messages (proto/peer.proto, read through
// src/align/peer_wire.h): one rank's round metadata, and a partitioned
// round's two world-wide messages (a rank's summary and its per-step token
// totals).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "src/align/planner.h"

namespace odb::align {

// One rank's round contribution (what the all-gather carries): the header,
// then the pending samples as packed columns (peer.proto RankRound), a few
// bytes per sample. Samples carry no owner: the owner is the header's rank.
struct RankRoundMessage {
  uint32_t epoch = 0;
  uint64_t round = 0;
  int32_t rank = 0;
  RankRound data;
};

std::string EncodeRankRound(const RankRoundMessage& msg);

// Validates everything: the message (peer_wire.h: version, truncation,
// trailing bytes), columns of one length, tokens > 0, loss tokens <= tokens,
// duplicate ids, and sets owner_rank of every sample to the header's rank
// (on encode the caller's responsibility, see Aligner).
absl::StatusOr<RankRoundMessage> DecodeRankRound(std::string_view bytes);

// A rank's summary in a partitioned round (epoch, round and rank for the
// lockstep check, then the RankSummary; the bound travels as the double
// itself: every rank sums the same doubles).
std::string EncodeRoundSummary(uint32_t epoch, uint64_t round, int32_t rank, const RankSummary& summary);
// Decodes a summary: its header into the three fields; DataLoss when
// malformed or when its group bound lies outside [0, pending].
absl::StatusOr<RankSummary> DecodeRoundSummary(std::string_view bytes, uint32_t& epoch, uint64_t& round,
                                               int32_t& rank);

// A rank's loss and real tokens in each step of a partitioned round.
struct RankTotalsMessage {
  uint32_t epoch = 0;
  uint64_t round = 0;
  int32_t rank = 0;
  std::vector<uint64_t> loss;  // one per step
  std::vector<uint64_t> real;  // one per step, as many as loss
};
std::string EncodeRankTotals(uint32_t epoch, uint64_t round, int32_t rank, const std::vector<uint64_t>& loss,
                             const std::vector<uint64_t>& real);
absl::StatusOr<RankTotalsMessage> DecodeRankTotals(std::string_view bytes);

}  // namespace odb::align

#endif  // ODB_ALIGN_META_CODEC_H_
