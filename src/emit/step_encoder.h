#ifndef ODB_EMIT_STEP_ENCODER_H_
#define ODB_EMIT_STEP_ENCODER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include <zmq.hpp>

#include "proto/odb.pb.h"
#include "src/collate/collator.h"
#include "src/common/buffer_pool.h"

namespace odb::emit {

// Builds the multipart message [DaemonMessage{step}][tensor frame]... The
// batch tensors' buffers are handed to ZeroMQ without a copy; the header's
// tensor list is filled from them (frame i+1 holds tensor i). With `buffers`,
// each tensor's buffer goes back to that pool once ZeroMQ is done with it.
std::vector<zmq::message_t> EncodeStep(wire::Step step, std::vector<collate::BatchTensor>&& tensors,
                                       std::shared_ptr<BufferPool> buffers = nullptr);

// Where a step's tensors are in the trainer's step arena: the block, and each
// tensor's offset (from the segment's start, 64-byte aligned, in order).
struct ArenaPlacement {
  uint64_t generation = 0;
  uint64_t block_offset = 0;
  uint64_t block_length = 0;
  std::vector<uint64_t> tensor_offsets;
};

// The message of a step whose tensors are already written into the step
// arena: the header alone, each TensorDesc naming (offset, length) in the
// arena and Step.arena naming the block (docs/protocol.md).
std::vector<zmq::message_t> EncodeArenaStep(wire::Step step, const std::vector<collate::BatchTensorLayout>& tensors,
                                            const ArenaPlacement& where);

// A single-frame message (epoch summary, fatal error).
std::vector<zmq::message_t> EncodeControl(const wire::DaemonMessage& message);

}  // namespace odb::emit

#endif  // ODB_EMIT_STEP_ENCODER_H_
