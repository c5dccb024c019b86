#ifndef ODB_INGEST_DECODER_H_
#define ODB_INGEST_DECODER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <zmq.hpp>

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
};

// Decodes and validates one multipart producer message, stateless: header
// parses, protocol version, producer id size, length > 0, the tensor
// descriptions against the frames (wire::DecodeTensorDescs: names, dtypes,
// frame count and indices, overflow-checked shape x dtype = frame size), and
// tokens = dim 0 of options.length_field when the sample carries it.
// Stateful checks (duplicate ids, unknown producers, epochs, the epoch's
// schema) belong to the StreamTracker and EpochSchema. Payload frames are
// moved into the Sample, never copied.
IngestEvent DecodeProducerMessage(std::vector<zmq::message_t>&& parts,
                                  const DecodeOptions& options = {});

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
