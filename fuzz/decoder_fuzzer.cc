// Fuzz target: the daemon's ingest decoder (odb::ingest::DecodeProducerMessage),
// the first code that touches bytes from data workers. The input is split
// into the frames of one multipart message (fuzz_util.h: SplitFrames).
//
// Beyond "no crash, no sanitizer report", it checks the decoder's contract:
// an accepted sample has tokens > 0, every tensor view lies inside a frame
// the sample holds and has numel x dtype size bytes, and the length field's
// dim 0 equals the tokens.
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "fuzz/fuzz_util.h"
#include "fuzz/protobuf_quiet.h"
#include "src/common/dtype.h"
#include "src/ingest/decoder.h"

namespace {

void CheckSample(const odb::Sample& s, const odb::ingest::DecodeOptions& options) {
  FUZZ_CHECK(s.meta.lengths.tokens > 0, "accepted a sample with 0 tokens");
  uint64_t payload = 0;
  for (const odb::TensorView& t : s.tensors) {
    FUZZ_CHECK(!t.name.empty(), "accepted an unnamed tensor");
    const size_t elem = odb::DTypeSize(t.dtype);
    FUZZ_CHECK(elem > 0, "tensor '" + t.name + "' has no valid dtype");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      FUZZ_CHECK(d >= 0, "tensor '" + t.name + "' has a negative dim");
      numel *= static_cast<uint64_t>(d);
    }
    FUZZ_CHECK(numel * elem == t.size_bytes, "tensor '" + t.name + "' size_bytes != numel x dtype");
    if (t.size_bytes > 0) {
      FUZZ_CHECK(t.data != nullptr, "tensor '" + t.name + "' has bytes but no data");
      odb::fuzz::TouchBytes(t.data, t.size_bytes);  // ASan: the view is inside its frame
    }
    payload += t.size_bytes;
    if (t.name == options.length_field) {
      FUZZ_CHECK(!t.shape.empty() && t.shape[0] == static_cast<int64_t>(s.meta.lengths.tokens),
                 "length field's dim 0 differs from tokens");
    }
  }
  FUZZ_CHECK(payload == s.meta.payload_bytes, "payload_bytes is not the sum of the tensors");
  FUZZ_CHECK(s.tensors.empty() || !s.frames.empty(), "views without a frame holder");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // libprotobuf logs every invalid UTF-8 string it parses; silence it here
  // (it costs most of the time otherwise; see docs/fuzzing.md).
  static const bool quiet = odb::fuzz::SilenceProtobufLogs();
  (void)quiet;
  const std::vector<std::string_view> frames = odb::fuzz::SplitFrames(data, size);
  std::vector<zmq::message_t> parts;
  parts.reserve(frames.size());
  for (std::string_view f : frames) parts.emplace_back(f.data(), f.size());
  odb::ingest::DecodeOptions options;
  odb::ingest::IngestEvent event = odb::ingest::DecodeProducerMessage(std::move(parts), options);
  if (const auto* s = std::get_if<odb::ingest::SampleEvent>(&event)) {
    CheckSample(s->sample, options);
  } else if (const auto* r = std::get_if<odb::ingest::RejectEvent>(&event)) {
    FUZZ_CHECK(!r->rejection.message().empty(), "a rejection without a message");
    FUZZ_CHECK(r->rejection.producer_id().size() <= options.max_producer_id_bytes,
               "a rejection echoes an over-long producer id");
  } else if (const auto* h = std::get_if<odb::ingest::HelloEvent>(&event)) {
    FUZZ_CHECK(!h->producer_id.empty() && h->producer_id.size() <= options.max_producer_id_bytes,
               "hello producer id out of bounds");
  }
  return 0;
}
