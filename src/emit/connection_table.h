// The trainer socket's connections as the monitor reports them, each with a
// serial of its own, so that the connection a session is bound to is not
// confused with a later one on the same descriptor (the OS reuses them), and
// a message read after its connection closed is known as late.
#ifndef ODB_EMIT_CONNECTION_TABLE_H_
#define ODB_EMIT_CONNECTION_TABLE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <zmq.hpp>

namespace odb::emit {

class ConnectionTable {
 public:
  // ZMQ_EVENT_ACCEPTED on `fd`: a new connection (the descriptor may be one a
  // closed connection had, whose close was not reported yet). Its serial.
  uint64_t Accepted(int fd);
  // ZMQ_EVENT_DISCONNECTED on `fd`: the serial of the connection that
  // closed, nullopt when none was open there.
  std::optional<uint64_t> Closed(int fd);
  // The open connection on `fd`; 0 when none.
  uint64_t Of(int fd) const;
  // The connection a message came on, known by its ZeroMQ metadata: every
  // message of one connection refers to the one metadata object its
  // handshake made, so its address names the connection even after the OS
  // gave the descriptor to a new one. 0 when that connection has closed (a
  // late message) or none is open on `fd`. `frame`: any frame of the message.
  uint64_t OfFrame(int fd, zmq::message_t& frame);
  bool IsOpen(int fd, uint64_t connection) const;
  size_t open() const { return open_.size(); }

 private:
  // Forgets the metadata of a connection that closed, once kClosedKept more
  // have closed after it.
  void Retire(uint64_t serial);

  std::unordered_map<int, uint64_t> open_;  // descriptor -> serial, one per open descriptor
  uint64_t serial_ = 0;
  // Bound at the first message read while the connection is open; kept, with
  // a copy of that message (which keeps the object, and so the address,
  // alive), while it is open and for the last kClosedKept closed ones: their
  // late messages are known as late whatever their descriptor is by then.
  struct Known {
    int fd;
    uint64_t serial;
    zmq::message_t keep;
  };
  std::unordered_map<const void*, Known> by_metadata_;
  std::unordered_map<uint64_t, const void*> metadata_of_;  // open connection's serial -> its key
  std::deque<const void*> closed_known_;                   // oldest first
  static constexpr size_t kClosedKept = 64;
};

}  // namespace odb::emit

#endif  // ODB_EMIT_CONNECTION_TABLE_H_
