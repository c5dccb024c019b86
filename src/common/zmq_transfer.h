#ifndef ODB_COMMON_ZMQ_TRANSFER_H_
#define ODB_COMMON_ZMQ_TRANSFER_H_

#include <string>
#include <vector>
#include <zmq.hpp>

namespace odb {

// The outcome of one send or receive on a ZeroMQ socket, as FairMQ's
// TransferCode: a loop branches on it; nothing throws into the loop.
enum class TransferCode {
  kSuccess,
  kAgain,        // would block: back-pressure on send, nothing to read on receive
  kUnreachable,  // ROUTER: the addressed peer is not connected (EHOSTUNREACH)
  kInterrupted,  // EINTR: a signal arrived; the caller decides whether to retry
  kError,        // anything else; `error` says what
};

struct Transfer {
  TransferCode code = TransferCode::kSuccess;
  std::string error;  // zmq_strerror text for kError
  bool ok() const { return code == TransferCode::kSuccess; }
};

// Receives one whole multipart message without blocking (cppzmq's
// recv_multipart). `parts` is cleared first; on kAgain it stays empty.
Transfer TryRecvMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>& parts);

// Sends one whole multipart message without blocking (cppzmq's
// send_multipart): ZeroMQ takes a multipart message atomically, so kAgain
// means no part was queued and the caller still owns `parts`.
Transfer TrySendMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>& parts);

// As TrySendMultipart, with a routing-id frame first (ROUTER sockets).
Transfer TrySendTo(zmq::socket_t& socket, const std::string& routing_id, std::vector<zmq::message_t>& parts);

// Makes the directory of an ipc:// endpoint, so bind() works on a fresh
// machine; other endpoints are left alone.
void EnsureIpcDirectory(const std::string& endpoint);

// The mode of the daemon's ipc:// socket files, whatever the umask: the
// daemon's user and group may connect (a trainer or worker in the daemon's
// group), nobody else. Under umask 000 a bound socket was world-writable.
inline constexpr unsigned kIpcSocketMode = 0660;

// Sets kIpcSocketMode on a bound ipc:// endpoint's socket file (other
// transports: nothing to do). Returns "" or why it failed, for the bind error.
std::string RestrictIpcSocket(const std::string& bound_endpoint);

// Name of a code, for logs.
const char* TransferCodeName(TransferCode code);

}  // namespace odb

#endif  // ODB_COMMON_ZMQ_TRANSFER_H_
