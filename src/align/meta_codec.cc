#include "src/align/meta_codec.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/peer.pb.h"
#include "src/align/peer_wire.h"

namespace odb::align {
namespace {

absl::Status Corrupt(const std::string& what) { return absl::DataLossError("alignment metadata: " + what); }

}  // namespace

std::string EncodeRankRound(const RankRoundMessage& msg) {
  peer::RankRound p;
  p.set_epoch(msg.epoch);
  p.set_round(msg.round);
  p.set_rank(msg.rank);
  p.set_free_slots(msg.data.free_slots);
  p.set_flags((msg.data.stream_finished ? 1 : 0) | (msg.data.wait_expired ? 2 : 0) |
              (msg.data.stream_started ? 4 : 0) | (msg.data.input_blocked ? 8 : 0));
  p.set_wait_rounds(msg.data.wait_rounds);
  const int n = static_cast<int>(msg.data.pending.size());
  p.mutable_id_delta()->Reserve(n);
  p.mutable_tokens()->Reserve(n);
  p.mutable_vision_patches()->Reserve(n);
  p.mutable_audio_frames()->Reserve(n);
  p.mutable_payload_bytes()->Reserve(n);
  p.mutable_loss_tokens_plus_one()->Reserve(n);
  uint64_t prev = 0;
  for (const SampleMeta& m : msg.data.pending) {
    p.add_id_delta(static_cast<int64_t>(m.id - prev));
    prev = m.id;
    p.add_tokens(m.lengths.tokens);
    p.add_vision_patches(m.lengths.vision_patches);
    p.add_audio_frames(m.lengths.audio_frames);
    p.add_payload_bytes(m.payload_bytes);
    // Loss tokens + 1; 0: every token bears loss.
    p.add_loss_tokens_plus_one(m.loss_tokens == kEveryTokenBearsLoss ? 0 : m.loss_tokens + 1);
  }
  return EncodePeerMessage(p);
}

absl::StatusOr<RankRoundMessage> DecodeRankRound(std::string_view bytes) {
  // One message per thread, reused: its columns keep their capacity.
  thread_local peer::RankRound p;
  if (absl::Status s = ParsePeerMessage(bytes, "alignment metadata", p); !s.ok()) return s;
  const int n = p.tokens_size();
  if (p.id_delta_size() != n || p.vision_patches_size() != n || p.audio_frames_size() != n ||
      p.payload_bytes_size() != n || p.loss_tokens_plus_one_size() != n) {
    return Corrupt("sample columns of different lengths (" + std::to_string(p.id_delta_size()) + " ids, " +
                   std::to_string(n) + " token counts)");
  }
  if (p.rank() < 0) return Corrupt("rank " + std::to_string(p.rank()));
  if ((p.flags() & ~15u) != 0) return Corrupt("unknown flag bits " + std::to_string(p.flags()));
  RankRoundMessage msg;
  msg.epoch = p.epoch();
  msg.round = p.round();
  msg.rank = p.rank();
  msg.data.free_slots = p.free_slots();
  msg.data.stream_finished = (p.flags() & 1) != 0;
  msg.data.wait_expired = (p.flags() & 2) != 0;
  msg.data.stream_started = (p.flags() & 4) != 0;
  msg.data.input_blocked = (p.flags() & 8) != 0;
  msg.data.wait_rounds = p.wait_rounds();
  msg.data.pending.resize(n);
  std::vector<uint64_t> ids(n);
  uint64_t prev = 0;
  for (int i = 0; i < n; ++i) {
    SampleMeta& m = msg.data.pending[i];
    m.id = prev + static_cast<uint64_t>(p.id_delta(i));
    prev = m.id;
    ids[i] = m.id;
    m.owner_rank = msg.rank;
    m.lengths.tokens = p.tokens(i);
    m.lengths.vision_patches = p.vision_patches(i);
    m.lengths.audio_frames = p.audio_frames(i);
    m.payload_bytes = p.payload_bytes(i);
    const uint32_t loss = p.loss_tokens_plus_one(i);
    // loss - 1 <= tokens.
    if (uint64_t{loss} > uint64_t{m.lengths.tokens} + 1) {
      return Corrupt("sample " + std::to_string(i) + ": loss tokens over its tokens");
    }
    m.loss_tokens = loss == 0 ? kEveryTokenBearsLoss : loss - 1;
    if (m.lengths.tokens == 0) {
      return absl::InvalidArgumentError("alignment metadata: sample id " + std::to_string(m.id) +
                                        " of rank " + std::to_string(msg.rank) +
                                        " has 0 tokens (must be rejected at ingest)");
    }
  }
  std::sort(ids.begin(), ids.end());
  auto dup = std::adjacent_find(ids.begin(), ids.end());
  if (dup != ids.end()) {
    return absl::InvalidArgumentError("alignment metadata: duplicate sample id " + std::to_string(*dup) +
                                      " pending on rank " + std::to_string(msg.rank));
  }
  return msg;
}

std::string EncodeRoundSummary(uint32_t epoch, uint64_t round, int32_t rank, const RankSummary& s) {
  peer::RoundSummary p;
  p.set_epoch(epoch);
  p.set_round(round);
  p.set_rank(rank);
  p.set_pending(s.pending);
  p.set_free_slots(s.free_slots);
  p.set_flags((s.stream_finished ? 1 : 0) | (s.stream_started ? 2 : 0) | (s.wait_expired ? 4 : 0) |
              (s.input_blocked ? 8 : 0));
  p.set_wait_rounds(s.wait_rounds);
  p.set_group_bound(s.group_bound);
  return EncodePeerMessage(p);
}

absl::StatusOr<RankSummary> DecodeRoundSummary(std::string_view bytes, uint32_t& epoch, uint64_t& round,
                                               int32_t& rank) {
  thread_local peer::RoundSummary p;  // reused, as in DecodeRankRound
  if (absl::Status s = ParsePeerMessage(bytes, "round summary", p); !s.ok()) return s;
  if (p.flags() > 15)
    return absl::DataLossError("round summary: unknown flag bits " + std::to_string(p.flags()));
  epoch = p.epoch();
  round = p.round();
  rank = p.rank();
  RankSummary s;
  s.pending = p.pending();
  s.free_slots = p.free_slots();
  s.wait_rounds = p.wait_rounds();
  s.group_bound = p.group_bound();
  s.stream_finished = (p.flags() & 1) != 0;
  s.stream_started = (p.flags() & 2) != 0;
  s.wait_expired = (p.flags() & 4) != 0;
  s.input_blocked = (p.flags() & 8) != 0;
  // A group holds at least one sample, so a bound on a window's groups lies
  // in [0, pending]; anything else (NaN included) would make T garbage.
  if (!(s.group_bound >= 0.0 && s.group_bound <= static_cast<double>(s.pending))) {
    return absl::DataLossError("round summary with group bound " + std::to_string(s.group_bound) +
                               " outside [0, pending samples = " + std::to_string(s.pending) + "]");
  }
  return s;
}

std::string EncodeRankTotals(uint32_t epoch, uint64_t round, int32_t rank, const std::vector<uint64_t>& loss,
                             const std::vector<uint64_t>& real) {
  peer::RankTotals p;
  p.set_epoch(epoch);
  p.set_round(round);
  p.set_rank(rank);
  p.mutable_loss_tokens()->Add(loss.begin(), loss.end());
  p.mutable_real_tokens()->Add(real.begin(), real.end());
  return EncodePeerMessage(p);
}

absl::StatusOr<RankTotalsMessage> DecodeRankTotals(std::string_view bytes) {
  thread_local peer::RankTotals p;  // reused, as in DecodeRankRound
  if (absl::Status s = ParsePeerMessage(bytes, "token totals", p); !s.ok()) return s;
  if (p.loss_tokens_size() != p.real_tokens_size()) {
    return absl::DataLossError("token totals: " + std::to_string(p.loss_tokens_size()) + " loss counts but " +
                               std::to_string(p.real_tokens_size()) + " real token counts");
  }
  RankTotalsMessage t;
  t.epoch = p.epoch();
  t.round = p.round();
  t.rank = p.rank();
  t.loss.assign(p.loss_tokens().begin(), p.loss_tokens().end());
  t.real.assign(p.real_tokens().begin(), p.real_tokens().end());
  return t;
}

}  // namespace odb::align
