#ifndef ODB_CLIENT_SRC_DELIVERY_DECODER_H_
#define ODB_CLIENT_SRC_DELIVERY_DECODER_H_

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
absl::StatusOr<Delivery> DecodeDelivery(std::shared_ptr<std::vector<zmq::message_t>> frames,
                                        const std::string& endpoint_for_errors);

}  // namespace odb::client

#endif  // ODB_CLIENT_SRC_DELIVERY_DECODER_H_
