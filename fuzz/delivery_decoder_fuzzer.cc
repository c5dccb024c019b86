// Fuzz target: the C++ client's step decoder (odb::client::DecodeDelivery,
// client/cpp/src/delivery_decoder.h), which turns daemon messages into the
// tensors handed to the trainer (and to torch, zero-copy). The input is split
// into [DaemonMessage header][tensor frame]... (fuzz_util.h: SplitFrames).
//
// Checks: no crash or sanitizer report; every tensor of an accepted step lies
// inside a frame the Delivery owns and has numel x dtype size bytes (touched
// byte by byte, so ASan sees a view past its frame).
// It also checks that the per-sample arrays of a step agree in length
// (sample_ids, lengths, owner_ranks, llm_src_rank; the enc_* arrays among
// themselves), which consumers index in parallel (finding 1, now refused by
// DecodeDelivery).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "client/cpp/src/delivery_decoder.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/protobuf_quiet.h"

namespace {

size_t ElementSize(odb::client::DType dtype) {
  switch (static_cast<int>(dtype)) {
    case 1: case 2: case 10: return 1;  // uint8, int8, bool
    case 3: case 6: case 7: return 2;   // int16, float16, bfloat16
    case 4: case 8: return 4;           // int32, float32
    case 5: case 9: return 8;           // int64, float64
    default: return 0;
  }
}

void CheckParallelArrays(const odb::client::StepInfo& s) {
  const size_t n = s.sample_ids.size();
  FUZZ_CHECK(s.lengths.size() == n, "step has " + std::to_string(n) + " sample_ids but " +
                                        std::to_string(s.lengths.size()) + " lengths");
  FUZZ_CHECK(s.owner_ranks.empty() || s.owner_ranks.size() == n, "owner_ranks length");
  FUZZ_CHECK(s.seqs.size() == n, "seqs length");  // one (maybe unknown) seq per sample, always
  FUZZ_CHECK(s.llm_src_rank.empty() || s.llm_src_rank.size() == n, "llm_src_rank length");
  const size_t e = s.enc_sample_ids.size();
  FUZZ_CHECK(s.enc_owner_ranks.size() == e && s.enc_dest_rank.size() == e &&
                 s.enc_dest_index.size() == e,
             "enc_* arrays differ in length");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // libprotobuf logs every invalid UTF-8 string it parses; silence it here
  // (it costs most of the time otherwise; see docs/fuzzing.md).
  static const bool quiet = odb::fuzz::SilenceProtobufLogs();
  (void)quiet;
  const std::vector<std::string_view> split = odb::fuzz::SplitFrames(data, size);
  if (split.empty()) return 0;  // DecodeDelivery requires the header frame
  auto frames = std::make_shared<std::vector<zmq::message_t>>();
  frames->reserve(split.size());
  for (std::string_view f : split) frames->emplace_back(f.data(), f.size());
  std::vector<std::pair<const void*, size_t>> owned;
  for (const zmq::message_t& f : *frames) owned.emplace_back(f.data(), f.size());

  auto delivery = odb::client::DecodeDelivery(std::move(frames), "fuzz://daemon");
  if (!delivery.ok()) {
    FUZZ_CHECK(!delivery.status().message().empty(), "an error without a message");
    return 0;
  }
  if (delivery->kind != odb::client::Delivery::Kind::kStep) return 0;
  CheckParallelArrays(delivery->step);  // DecodeDelivery refuses lists that disagree (finding 1)
  for (const odb::client::TensorView& t : delivery->tensors) {
    const size_t elem = ElementSize(t.dtype);
    FUZZ_CHECK(elem > 0, "tensor '" + t.name + "' has an unknown dtype");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      FUZZ_CHECK(d >= 0, "negative dim in '" + t.name + "'");
      numel *= static_cast<uint64_t>(d);
    }
    FUZZ_CHECK(numel * elem == t.size_bytes, "tensor '" + t.name + "' size != numel x dtype");
    bool inside = t.size_bytes == 0;
    for (const auto& [p, n] : owned) {
      const auto* b = static_cast<const uint8_t*>(p);
      inside = inside || (t.data >= b && t.data + t.size_bytes <= b + n);
    }
    FUZZ_CHECK(inside, "tensor '" + t.name + "' is not inside a frame of the message");
    if (t.size_bytes > 0) odb::fuzz::TouchBytes(t.data, t.size_bytes);
    FUZZ_CHECK(delivery->Find(t.name) != nullptr, "Find misses '" + t.name + "'");
  }
  FUZZ_CHECK(delivery->tensors.empty() || delivery->frames != nullptr, "views without their frames");
  return 0;
}
