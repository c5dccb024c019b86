#ifndef ODB_INGEST_DECODER_H_
#define ODB_INGEST_DECODER_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "proto/odb.pb.h"
#include "src/common/sample.h"

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
};

using IngestEvent = std::variant<HelloEvent, StartEpochEvent, EndStreamEvent, SampleEvent, RejectEvent>;

// Decodes and validates one multipart producer message, stateless: header
// parses, protocol version, dtypes, frame count and indices, shape x dtype =
// frame size, length > 0. Stateful checks (duplicate ids, unknown producers,
// epochs) belong to the StreamTracker. Payload frames are moved into the
// Sample, never copied.
IngestEvent DecodeProducerMessage(std::vector<zmq::message_t>&& parts);

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
