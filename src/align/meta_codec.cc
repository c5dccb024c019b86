#include "src/align/meta_codec.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace odb::align {
namespace {

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

uint64_t ZigZag(int64_t v) { return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63); }
int64_t UnZigZag(uint64_t v) { return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1); }

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  bool Byte(uint8_t& out) {
    if (pos_ >= b_.size()) return false;
    out = static_cast<uint8_t>(b_[pos_++]);
    return true;
  }
  bool Varint(uint64_t& out) {
    out = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t c;
      if (!Byte(c)) return false;
      if (shift == 63 && (c & 0x7e) != 0) return false;  // overflows 64 bits
      out |= static_cast<uint64_t>(c & 0x7f) << shift;
      if ((c & 0x80) == 0) return true;
    }
    return false;
  }
  size_t remaining() const { return b_.size() - pos_; }
  size_t pos() const { return pos_; }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

absl::Status Corrupt(const std::string& what, size_t pos) {
  return absl::DataLossError("alignment metadata: " + what + " at byte " + std::to_string(pos));
}

}  // namespace

std::string EncodeRankRound(const RankRoundMessage& msg) {
  std::string out;
  out.reserve(16 + msg.data.pending.size() * 8);
  out.push_back(static_cast<char>(kMetaCodecVersion));
  PutVarint(out, msg.epoch);
  PutVarint(out, msg.round);
  PutVarint(out, static_cast<uint64_t>(msg.rank));
  PutVarint(out, msg.data.free_slots);
  out.push_back(static_cast<char>((msg.data.stream_finished ? 1 : 0) | (msg.data.wait_expired ? 2 : 0) |
                                  (msg.data.stream_started ? 4 : 0) | (msg.data.input_blocked ? 8 : 0)));
  PutVarint(out, msg.data.wait_rounds);
  PutVarint(out, msg.data.pending.size());
  uint64_t prev = 0;
  for (const SampleMeta& m : msg.data.pending) {
    PutVarint(out, ZigZag(static_cast<int64_t>(m.id - prev)));
    prev = m.id;
    PutVarint(out, m.lengths.tokens);
    PutVarint(out, m.lengths.vision_patches);
    PutVarint(out, m.lengths.audio_frames);
    PutVarint(out, m.payload_bytes);
    // Loss tokens + 1; 0: every token bears loss.
    PutVarint(out, m.loss_tokens == kEveryTokenBearsLoss ? 0 : uint64_t{m.loss_tokens} + 1);
  }
  return out;
}

absl::StatusOr<RankRoundMessage> DecodeRankRound(std::string_view bytes) {
  Reader r(bytes);
  uint8_t version;
  if (!r.Byte(version)) return Corrupt("empty message", 0);
  if (version != kMetaCodecVersion) {
    return absl::FailedPreconditionError("alignment metadata: version " + std::to_string(version) +
                                         ", this build speaks " + std::to_string(kMetaCodecVersion) +
                                         " (all daemons of a job must run the same odb version)");
  }
  RankRoundMessage msg;
  uint64_t epoch, round, rank, free_slots, wait_rounds, count;
  uint8_t flags;
  if (!r.Varint(epoch) || !r.Varint(round) || !r.Varint(rank) || !r.Varint(free_slots) || !r.Byte(flags) ||
      !r.Varint(wait_rounds) || !r.Varint(count)) {
    return Corrupt("truncated header", r.pos());
  }
  constexpr uint64_t kU32 = std::numeric_limits<uint32_t>::max();
  if (epoch > kU32 || rank > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()) ||
      free_slots > kU32 || wait_rounds > kU32) {
    return Corrupt("header field out of range", r.pos());
  }
  if ((flags & ~15u) != 0) return Corrupt("unknown flag bits " + std::to_string(flags), r.pos());
  // Every sample takes at least 6 bytes: reject absurd counts before allocating.
  if (count > r.remaining() / 6) return Corrupt("sample count " + std::to_string(count) + " exceeds the bytes present", r.pos());
  msg.epoch = static_cast<uint32_t>(epoch);
  msg.round = round;
  msg.rank = static_cast<int32_t>(rank);
  msg.data.free_slots = static_cast<uint32_t>(free_slots);
  msg.data.stream_finished = (flags & 1) != 0;
  msg.data.wait_expired = (flags & 2) != 0;
  msg.data.stream_started = (flags & 4) != 0;
  msg.data.input_blocked = (flags & 8) != 0;
  msg.data.wait_rounds = static_cast<uint32_t>(wait_rounds);
  msg.data.pending.resize(count);
  uint64_t prev = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t dz, tokens, vision, audio, payload, loss;
    if (!r.Varint(dz) || !r.Varint(tokens) || !r.Varint(vision) || !r.Varint(audio) || !r.Varint(payload) ||
        !r.Varint(loss)) {
      return Corrupt("truncated sample " + std::to_string(i), r.pos());
    }
    if (tokens > kU32 || vision > kU32 || audio > kU32) return Corrupt("sample length out of range", r.pos());
    SampleMeta& m = msg.data.pending[i];
    m.id = prev + static_cast<uint64_t>(UnZigZag(dz));
    prev = m.id;
    m.owner_rank = msg.rank;
    m.lengths.tokens = static_cast<uint32_t>(tokens);
    m.lengths.vision_patches = static_cast<uint32_t>(vision);
    m.lengths.audio_frames = static_cast<uint32_t>(audio);
    m.payload_bytes = payload;
    // loss - 1 <= tokens, and never the "every token" sentinel itself (canonical).
    if (loss > tokens + 1 || loss > kEveryTokenBearsLoss) {
      return Corrupt("sample loss tokens over its tokens", r.pos());
    }
    m.loss_tokens = loss == 0 ? kEveryTokenBearsLoss : static_cast<uint32_t>(loss - 1);
    if (m.lengths.tokens == 0) {
      return absl::InvalidArgumentError("alignment metadata: sample id " + std::to_string(m.id) + " of rank " +
                                        std::to_string(rank) + " has 0 tokens (must be rejected at ingest)");
    }
  }
  if (r.remaining() != 0) return Corrupt(std::to_string(r.remaining()) + " trailing bytes", r.pos());
  std::vector<uint64_t> ids;
  ids.reserve(count);
  for (const SampleMeta& m : msg.data.pending) ids.push_back(m.id);
  std::sort(ids.begin(), ids.end());
  auto dup = std::adjacent_find(ids.begin(), ids.end());
  if (dup != ids.end()) {
    return absl::InvalidArgumentError("alignment metadata: duplicate sample id " + std::to_string(*dup) +
                                      " pending on rank " + std::to_string(rank));
  }
  return msg;
}

}  // namespace odb::align
