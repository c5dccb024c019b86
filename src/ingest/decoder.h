#ifndef ODB_INGEST_DECODER_H_
#define ODB_INGEST_DECODER_H_

#include <cstdint>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "absl/status/statusor.h"
#include "proto/odb.pb.h"
#include "src/common/sample.h"
#include "src/wire/tensor_codec.h"

namespace odb::ingest {

struct HelloEvent {
  std::string producer_id;
  int32_t rank = -1;
};

struct StartEpochEvent {
  std::string producer_id;
  uint32_t epoch = 0;
};

struct EndStreamEvent {
  std::string producer_id;
  uint32_t epoch = 0;
  uint64_t samples_sent = 0;
};

struct SampleEvent {
  Sample sample;
};

// Input that could not be accepted. Carries the sample id and producer when
// they could be read, so the report names them.
struct RejectEvent {
  wire::Rejection rejection;
  uint32_t epoch = 0;
  bool has_epoch = false;
  std::optional<uint64_t> seq;  // the sample's seq, when its header had one
};

using IngestEvent = std::variant<HelloEvent, StartEpochEvent, EndStreamEvent, SampleEvent, RejectEvent>;

// What the decoder checks input against; every limit here is documented to
// producers (a violation is TOO_LARGE naming the limit).
struct DecodeOptions {
  // The tensor whose dim 0 is the sample's token count (collate.length_field).
  // A sample that carries it must declare `tokens` equal to its dim 0: the
  // budget and padding are computed from `tokens`, the batch from the rows.
  std::string length_field = "input_ids";
  // Producer ids are kept per producer and echoed in reports.
  size_t max_producer_id_bytes = 256;
  // Tensor names, ranks, dims (see wire::DecodeTensorDescs).
  wire::TensorDescLimits tensor_limits;
  // SampleHeader.daemon_key is how one daemon tells another under which key
  // its buffer holds a sample (a repeated id keyed apart): only the payload
  // exchange (peer daemons, CURVE-authenticated) sets this. Anywhere else a
  // header with daemon_key is refused here (MALFORMED_HEADER naming its
  // sample_id), so no later check, log or count ever sees a key a producer
  // chose in place of its id.
  bool accept_daemon_key = false;
};

// The shared-memory data plane: a sample's tensors may be a block of its
// producer's registered arena (SampleHeader.arena) instead of frames. A source
// resolves such a block to bytes the daemon may read for as long as it keeps
// the returned holder; releasing the holder hands the block back to the
// producer. Implemented by ArenaRegistry; a fake in tests.
class ArenaBlockSource {
 public:
  virtual ~ArenaBlockSource() = default;
  struct Acquired {
    const uint8_t* data = nullptr;  // the block's first byte
    std::shared_ptr<FrameHolder> holder;
  };
  // `producer_id` is the id the message's connection said hello with. The
  // error's message is the rejection's reason (INVALID_ARENA_BLOCK): unknown
  // arena, another producer's arena, a block outside the arena's data region
  // or misaligned, a block overlapping one the daemon still holds.
  virtual absl::StatusOr<Acquired> Acquire(std::string_view producer_id, const wire::ArenaBlock& block) = 0;
};

// What arena samples are resolved against: null source = none accepted
// (INVALID_ARENA_BLOCK), e.g. for payloads from peer daemons.
struct ArenaContext {
  ArenaBlockSource* source = nullptr;
  std::string_view producer_id;  // the connection's hello id
};

// Decodes and validates one multipart producer message, stateless: header
// parses, protocol version, producer id size, length > 0, the tensor
// descriptions against the frames (wire::DecodeTensorDescs: names, dtypes,
// frame count and indices, overflow-checked shape x dtype = frame size), and
// tokens = dim 0 of options.length_field when the sample carries it.
// Stateful checks (duplicate ids, unknown producers, epochs, the epoch's
// schema) belong to the StreamTracker and EpochSchema. Payload frames are
// moved into the Sample, never copied.
//
// A sample whose header names an arena block (and has no payload frames) is
// resolved through `arenas` first, before any other check, so that whatever
// rejects it afterwards releases the block (back to its producer); its
// tensors are then checked with wire::DecodeArenaTensorDescs against the
// block and their views point into the mapped arena (no copy either).
IngestEvent DecodeProducerMessage(std::vector<zmq::message_t>&& parts,
                                  const DecodeOptions& options = {}, const ArenaContext& arenas = {});
// The same for a message whose header frame (parts[0]) the caller has
// already parsed into `msg`.
IngestEvent DecodeParsedProducerMessage(const wire::ProducerMessage& msg, std::vector<zmq::message_t>&& parts,
                                        const DecodeOptions& options = {}, const ArenaContext& arenas = {});

// Holds the received zmq frames of one message alive for the TensorViews
// pointing into them (one holder per sample, not one per frame).
class ZmqFrames : public FrameHolder {
 public:
  explicit ZmqFrames(std::vector<zmq::message_t>&& parts) : parts_(std::move(parts)) {}
  const uint8_t* data(size_t i) const { return static_cast<const uint8_t*>(parts_[i].data()); }
  size_t size(size_t i) const { return parts_[i].size(); }

 private:
  std::vector<zmq::message_t> parts_;
};

RejectEvent MakeReject(wire::ErrorCode code, const std::string& message,
                       const std::string& producer_id = "", const uint64_t* sample_id = nullptr);

}  // namespace odb::ingest

#endif  // ODB_INGEST_DECODER_H_
