// Fuzz target: the step-arena offer/reply exchange, both ends.
//  - Daemon end (byte 0 even): the request a trainer sends on the step-arena
//    socket for its session's arena fd (odb::emit::ParseStepArenaRequest, what
//    StepArenaServer::Answer runs on the received bytes).
//  - Trainer end (byte 0 odd): a daemon message whose step lies in a block of
//    the step arena the trainer mapped (StepArenaBlock + TensorDescs with
//    segment offsets), decoded by odb::client::DecodeDelivery with the
//    client's resolver: the block's generation must be the mapped one (77
//    stands for the offer's nonce here) and its bytes come from
//    shm::ArenaReader::View over a real 256 KiB arena (a memfd written by an
//    ArenaWriter, as the daemon's step arena is). The rest of the input is the frames
//    (fuzz_util.h: SplitFrames).
//
// Checks beyond "no crash, no sanitizer report": a request is accepted only
// as the canonical decimal text of a generation (what the client sends), and
// a refusal is printable text of bounded size (it goes to the log and back to
// the peer); an accepted arena step's tensors have numel x dtype bytes, lie
// inside its block, and view the arena's bytes at the offsets their
// TensorDescs name (the arena holds a position-dependent pattern).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "client/cpp/src/delivery_decoder.h"
#include "fuzz/arena_fixture.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/protobuf_quiet.h"
#include "proto/odb.pb.h"
#include "src/emit/step_arena.h"
#include "src/shm/arena_reader.h"

namespace {

constexpr uint64_t kGeneration = 77;

uint8_t Pattern(uint64_t segment_offset) { return static_cast<uint8_t>((segment_offset * 131 + 7) >> 3); }

struct Mapping {
  std::unique_ptr<odb::shm::ArenaWriter> writer = odb::fuzz::MakeArenaWriter();
  std::unique_ptr<odb::shm::ArenaReader> reader;
  Mapping() {
    odb::shm::Arena& a = writer->arena();
    if (a.data_offset() != odb::fuzz::kDataOffset) std::abort();  // the seeds' block offsets
    for (uint64_t k = a.data_offset(); k < a.data_offset() + a.capacity_bytes(); ++k) {
      a.base()[k] = static_cast<std::byte>(Pattern(k));
    }
    odb::shm::AttachOptions o;
    o.expected_generation = a.generation();
    o.expected_capacity_bytes = a.capacity_bytes();
    auto r = odb::shm::ArenaReader::AttachFd(a.fd(), o);
    if (!r.ok()) std::abort();
    reader = std::move(*r);
  }
};

size_t ElementSize(odb::client::DType dtype) {
  switch (static_cast<int>(dtype)) {
    case 1: case 2: case 10: return 1;
    case 3: case 6: case 7: return 2;
    case 4: case 8: return 4;
    case 5: case 9: return 8;
    default: return 0;
  }
}

void DaemonEnd(const uint8_t* data, size_t size) {
  const std::string_view request(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<uint64_t> generation = odb::emit::ParseStepArenaRequest(request);
  if (generation.ok()) {
    FUZZ_CHECK(std::to_string(*generation) == request, "accepted a request that is not a canonical generation");
    return;
  }
  const std::string why(generation.status().message());
  FUZZ_CHECK(!why.empty() && why.size() <= 512, "a refusal of " + std::to_string(why.size()) + " bytes");
  for (char c : why) FUZZ_CHECK(c >= 0x20 && c < 0x7f, "a refusal with a non-printable byte");
}

void TrainerEnd(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> split = odb::fuzz::SplitFrames(data, size);
  if (split.empty()) return;
  auto frames = std::make_shared<std::vector<zmq::message_t>>();
  for (std::string_view f : split) frames->emplace_back(f.data(), f.size());
  odb::wire::DaemonMessage header;
  const bool parsed = header.ParseFromArray(split[0].data(), static_cast<int>(split[0].size()));
  static Mapping* mapping = new Mapping();
  odb::client::BlockResolver resolve = [](uint64_t generation, uint64_t offset,
                                          uint64_t length) -> absl::StatusOr<odb::client::ResolvedBlock> {
    if (generation != kGeneration) return absl::DataLossError("its block is in another step arena");
    absl::StatusOr<std::span<std::byte>> bytes = mapping->reader->View(offset, length);
    if (!bytes.ok()) return bytes.status();
    return odb::client::ResolvedBlock{reinterpret_cast<const uint8_t*>(bytes->data()), nullptr};
  };
  auto delivery = odb::client::DecodeDelivery(std::move(frames), "fuzz://daemon", resolve);
  if (!delivery.ok()) {
    FUZZ_CHECK(!delivery.status().message().empty(), "an error without a message");
    return;
  }
  if (delivery->kind != odb::client::Delivery::Kind::kStep || !parsed || !header.step().has_arena()) return;
  const odb::wire::StepArenaBlock& b = header.step().arena();
  FUZZ_CHECK(static_cast<int>(delivery->tensors.size()) == header.step().tensors_size(),
             "tensor count differs from the header");
  for (size_t i = 0; i < delivery->tensors.size(); ++i) {
    const odb::client::TensorView& t = delivery->tensors[i];
    const odb::wire::TensorDesc& d = header.step().tensors(static_cast<int>(i));
    uint64_t numel = 1;
    for (int64_t dim : t.shape) {
      FUZZ_CHECK(dim >= 0, "negative dim in '" + t.name + "'");
      numel *= static_cast<uint64_t>(dim);
    }
    FUZZ_CHECK(ElementSize(t.dtype) > 0 && numel * ElementSize(t.dtype) == t.size_bytes,
               "'" + t.name + "' size != numel x dtype");
    if (t.size_bytes == 0) continue;
    FUZZ_CHECK(d.offset() >= b.offset() && d.offset() + t.size_bytes <= b.offset() + b.length(),
               "'" + t.name + "' accepted outside its block");
    for (uint64_t k = 0; k < t.size_bytes; ++k) {
      FUZZ_CHECK(t.data[k] == Pattern(d.offset() + k), "'" + t.name + "' does not view the arena at its offset");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = odb::fuzz::SilenceProtobufLogs();
  (void)quiet;
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    DaemonEnd(data + 1, size - 1);
  } else {
    TrainerEnd(data + 1, size - 1);
  }
  return 0;
}
