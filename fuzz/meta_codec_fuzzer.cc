// Fuzz target: the alignment metadata codec (src/align/meta_codec.h, the
// RankRound message of proto/peer.proto), which decodes what every peer
// daemon all-gathers each round.
//
// Checks: DecodeRankRound never crashes; whatever it accepts satisfies its
// documented contract (tokens > 0, unique ids, owner = header rank) and
// survives a round trip: Decode(Encode(m)) == m, and Encode is canonical
// (re-encoding the re-decoded message gives the same bytes).
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "src/align/meta_codec.h"

namespace {

bool Same(const odb::align::RankRoundMessage& a, const odb::align::RankRoundMessage& b) {
  if (a.epoch != b.epoch || a.round != b.round || a.rank != b.rank) return false;
  const odb::align::RankRound& x = a.data;
  const odb::align::RankRound& y = b.data;
  if (x.free_slots != y.free_slots || x.stream_finished != y.stream_finished ||
      x.wait_expired != y.wait_expired || x.stream_started != y.stream_started ||
      x.wait_rounds != y.wait_rounds || x.pending.size() != y.pending.size()) {
    return false;
  }
  for (size_t i = 0; i < x.pending.size(); ++i) {
    const odb::SampleMeta& m = x.pending[i];
    const odb::SampleMeta& n = y.pending[i];
    if (m.id != n.id || m.owner_rank != n.owner_rank || m.payload_bytes != n.payload_bytes ||
        m.lengths.tokens != n.lengths.tokens || m.lengths.vision_patches != n.lengths.vision_patches ||
        m.lengths.audio_frames != n.lengths.audio_frames || m.loss_tokens != n.loss_tokens) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto decoded = odb::align::DecodeRankRound(bytes);
  if (!decoded.ok()) {
    FUZZ_CHECK(!decoded.status().message().empty(), "an error without a message");
    return 0;
  }
  std::set<uint64_t> ids;
  for (const odb::SampleMeta& m : decoded->data.pending) {
    FUZZ_CHECK(m.lengths.tokens > 0, "accepted a sample with 0 tokens");
    FUZZ_CHECK(m.owner_rank == decoded->rank, "owner differs from the header's rank");
    FUZZ_CHECK(ids.insert(m.id).second, "accepted a duplicate id");
  }
  FUZZ_CHECK(decoded->rank >= 0, "accepted a negative rank");
  const std::string encoded = odb::align::EncodeRankRound(*decoded);
  // Protobuf also reads a column written unpacked (a tag per value): one
  // value so written is a byte shorter than packed, at most 6 columns.
  FUZZ_CHECK(encoded.size() <= size + 6, "re-encoding grew the message");
  auto again = odb::align::DecodeRankRound(encoded);
  FUZZ_CHECK(again.ok(), "cannot decode its own encoding: " + std::string(again.status().message()));
  FUZZ_CHECK(Same(*decoded, *again), "round trip changed the message");
  FUZZ_CHECK(odb::align::EncodeRankRound(*again) == encoded, "encoding is not canonical");
  return 0;
}
