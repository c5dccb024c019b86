// Fuzz target: the arena descriptor path of the ingest decoder. A sample
// whose header names a block of its producer's shared-memory arena
// (SampleHeader.arena) is resolved by odb::ingest::ArenaRegistry::Acquire and
// its tensors are checked with wire::DecodeArenaTensorDescs against the block
// (src/ingest/decoder.cc). The registry here holds one real arena (a sealed
// memfd) registered as the daemon's thread registers one (arena_fixture.h).
//
// Input: byte 0 = how many times the message is decoded while the earlier
// results are still held (1 + b % 3; bit 7: the connection says hello as
// another producer), then the frames (fuzz_util.h: SplitFrames).
//
// Checks beyond "no crash, no sanitizer report": an accepted arena sample
// has tokens > 0, numel x dtype bytes per tensor, each tensor's bytes are the
// arena's bytes at the segment offset its TensorDesc names (the data region
// is filled with a position-dependent pattern) and lie inside the block; two
// samples held at once never share a byte of the arena; another producer's
// hello never resolves the block; every rejection has a message.
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "fuzz/arena_fixture.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/protobuf_quiet.h"
#include "src/ingest/arena_registry.h"
#include "src/common/dtype.h"
#include "src/ingest/decoder.h"

namespace {

uint8_t Pattern(uint64_t segment_offset) { return static_cast<uint8_t>((segment_offset * 131 + 7) >> 3); }

struct Fixture {
  std::unique_ptr<odb::shm::ArenaWriter> writer = odb::fuzz::MakeArenaWriter();
  odb::SteadyClock clock;
  odb::ingest::ArenaRegistry registry{{}, clock};
  uint64_t arena_id = 0;

  Fixture() {
    odb::shm::Arena& a = writer->arena();
    if (a.data_offset() != odb::fuzz::kDataOffset) std::abort();  // the seeds' block offsets
    for (uint64_t k = a.data_offset(); k < a.data_offset() + a.capacity_bytes(); ++k) {
      a.base()[k] = static_cast<std::byte>(Pattern(k));
    }
    odb::fuzz::SocketPair pair;
    odb::wire::ArenaRegistered r = registry.Register(
        pair.fds[0], odb::fuzz::RegisterRequest(*writer, odb::fuzz::kProducer), odb::fuzz::DupFd(a.fd()));
    if (r.arena_id() != 1) {
      std::fprintf(stderr, "fuzz fixture: the arena was not registered as id 1: %s\n", r.error().c_str());
      std::abort();
    }
    arena_id = r.arena_id();
  }
};

void CheckArenaSample(const odb::Sample& s, const odb::wire::SampleHeader& h) {
  FUZZ_CHECK(s.meta.lengths.tokens > 0, "accepted a sample with 0 tokens");
  FUZZ_CHECK(static_cast<int>(s.tensors.size()) == h.tensors_size(), "tensor count differs from the header");
  const uint64_t block_begin = h.arena().offset(), block_end = block_begin + h.arena().length();
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const odb::TensorView& t = s.tensors[i];
    const odb::wire::TensorDesc& d = h.tensors(static_cast<int>(i));
    FUZZ_CHECK(t.name == d.name(), "tensor " + std::to_string(i) + " is not the header's");
    uint64_t numel = 1;
    for (int64_t dim : t.shape) {
      FUZZ_CHECK(dim >= 0, "negative dim in '" + t.name + "'");
      numel *= static_cast<uint64_t>(dim);
    }
    FUZZ_CHECK(numel * odb::DTypeSize(t.dtype) == t.size_bytes, "'" + t.name + "' size != numel x dtype");
    if (t.size_bytes == 0) continue;
    FUZZ_CHECK(d.offset() >= block_begin && d.offset() + t.size_bytes <= block_end,
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
  static Fixture* fixture = new Fixture();  // lives for the process: the registry's mapping is the target's
  if (size == 0) return 0;
  const int repeats = 1 + data[0] % 3;
  const bool other_producer = (data[0] & 0x80) != 0;
  const std::vector<std::string_view> frames = odb::fuzz::SplitFrames(data + 1, size - 1);
  odb::wire::ProducerMessage header;
  const bool parsed = !frames.empty() && header.ParseFromArray(frames[0].data(), static_cast<int>(frames[0].size()));

  std::vector<odb::Sample> held;
  std::vector<std::pair<uint64_t, uint64_t>> held_ranges;
  odb::ingest::ArenaContext ctx{&fixture->registry, other_producer ? "p1" : odb::fuzz::kProducer};
  for (int r = 0; r < repeats; ++r) {
    std::vector<zmq::message_t> parts;
    for (std::string_view f : frames) parts.emplace_back(f.data(), f.size());
    odb::ingest::DecodeOptions options;
    odb::ingest::IngestEvent event = odb::ingest::DecodeProducerMessage(std::move(parts), options, ctx);
    if (auto* s = std::get_if<odb::ingest::SampleEvent>(&event)) {
      if (!parsed || !header.has_sample() || !header.sample().has_arena()) continue;  // a frames sample
      FUZZ_CHECK(!other_producer, "another producer's hello resolved the arena's block");
      const odb::wire::ArenaBlock& b = header.sample().arena();
      CheckArenaSample(s->sample, header.sample());
      for (const auto& [begin, end] : held_ranges) {
        FUZZ_CHECK(b.length() == 0 || b.offset() >= end || b.offset() + b.length() <= begin,
                   "a block overlapping one still held was accepted");
      }
      held_ranges.emplace_back(b.offset(), b.offset() + b.length());
      held.push_back(std::move(s->sample));
    } else if (auto* rej = std::get_if<odb::ingest::RejectEvent>(&event)) {
      FUZZ_CHECK(!rej->rejection.message().empty(), "a rejection without a message");
    }
  }
  held.clear();                        // the blocks go back through the completion queue
  fixture->writer->Reclaim();          // and the queue is drained for the next input
  return 0;
}
