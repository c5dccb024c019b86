#ifndef ODB_CLIENT_SRC_DELIVERY_DECODER_H_
#define ODB_CLIENT_SRC_DELIVERY_DECODER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "absl/status/statusor.h"
#include "odb/consumer.h"

namespace odb::client {

// Turns one received daemon message, [DaemonMessage header][tensor frame]...,
// into a Delivery: no socket, no state, so it is tested and fuzzed alone.
// Checks the protocol version, turns a fatal message into an error, and
// validates every step tensor through wire::DecodeTensorDescs (names, dtype,
// frame index, shape x dtype = frame size, overflow-checked), so a tensor
// handed to the trainer (and to torch) never reads past its frame.
// The Delivery's views point into `frames`, which it keeps alive.
// Errors name `endpoint_for_errors`:
//  - DataLoss: unreadable header, neither step nor epoch end, a bad tensor;
//  - FailedPrecondition: another protocol version;
//  - Aborted: the daemon reports a fatal error.
// `frames` must hold at least the header frame.
//
// A step in the session's step arena (Step.arena set, docs/shm.md) has no
// tensor frames: `resolve_block` maps its block (generation, offset, length)
// to the block's first byte and a holder that returns the block when the
// last reference goes; the tensors are validated to lie inside the block
// (wire::DecodeArenaTensorDescs) and the Delivery keeps the holder (and the
// header frame). Without a resolver such a step is DataLoss.
struct ResolvedBlock {
  const uint8_t* data = nullptr;  // the block's first byte
  std::shared_ptr<void> holder;
};
using BlockResolver =
    std::function<absl::StatusOr<ResolvedBlock>(uint64_t generation, uint64_t offset, uint64_t length)>;
absl::StatusOr<Delivery> DecodeDelivery(std::shared_ptr<std::vector<zmq::message_t>> frames,
                                        const std::string& endpoint_for_errors,
                                        const BlockResolver& resolve_block = nullptr);

}  // namespace odb::client

#endif  // ODB_CLIENT_SRC_DELIVERY_DECODER_H_
