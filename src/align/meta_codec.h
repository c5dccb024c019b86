#ifndef ODB_ALIGN_META_CODEC_H_
#define ODB_ALIGN_META_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "src/align/planner.h"

namespace odb::align {

// Wire format of one rank's round contribution (what the all-gather carries).
// Hand-written and compact, a few bytes per sample:
//   u8 version (kMetaCodecVersion)
//   varint epoch, varint round, varint rank, varint free_slots,
//   u8 flags (bit0 stream_finished, bit1 wait_expired, bit2 stream_started, bit3 input_blocked),
//   varint wait_rounds,
//   varint count, then per sample:
//     varint zigzag(id - previous id), varint tokens, varint vision_patches,
//     varint audio_frames, varint payload_bytes,
//     varint loss_tokens + 1 (0: every token bears loss)
// Samples carry no owner: the owner is the header's rank.
inline constexpr uint8_t kMetaCodecVersion = 3;

struct RankRoundMessage {
  uint32_t epoch = 0;
  uint64_t round = 0;
  int32_t rank = 0;
  RankRound data;
};

std::string EncodeRankRound(const RankRoundMessage& msg);

// Validates everything: version, truncation, varint overflow, trailing bytes,
// sample count against the bytes present, tokens > 0, duplicate ids, and
// owner_rank of every input sample equal to the header's rank (on encode the
// caller's responsibility, see Aligner).
absl::StatusOr<RankRoundMessage> DecodeRankRound(std::string_view bytes);

}  // namespace odb::align

#endif  // ODB_ALIGN_META_CODEC_H_
