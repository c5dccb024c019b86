#include "src/emit/connection_table.h"

namespace odb::emit {

uint64_t ConnectionTable::Accepted(int fd) {
  uint64_t& serial = open_[fd];
  if (serial != 0) Retire(serial);  // (its close was not reported: one I/O thread reports it first)
  serial = ++serial_;
  return serial;
}

std::optional<uint64_t> ConnectionTable::Closed(int fd) {
  auto it = open_.find(fd);
  if (it == open_.end()) return std::nullopt;
  const uint64_t closed = it->second;
  open_.erase(it);
  Retire(closed);
  return closed;
}

uint64_t ConnectionTable::Of(int fd) const {
  auto it = open_.find(fd);
  return it == open_.end() ? 0 : it->second;
}

uint64_t ConnectionTable::OfFrame(int fd, zmq::message_t& frame) {
  // "Socket-Type" is in every ZMTP 3 handshake: a pointer into the
  // connection's metadata object (null without metadata: by descriptor).
  const void* key = zmq_msg_gets(frame.handle(), "Socket-Type");
  if (key != nullptr) {
    auto known = by_metadata_.find(key);
    if (known != by_metadata_.end()) {
      return IsOpen(known->second.fd, known->second.serial) ? known->second.serial : 0;
    }
  }
  const uint64_t connection = Of(fd);
  if (connection != 0 && key != nullptr && !metadata_of_.count(connection)) {
    zmq::message_t keep;
    keep.copy(frame);
    by_metadata_.emplace(key, Known{fd, connection, std::move(keep)});
    metadata_of_[connection] = key;
  }
  return connection;
}

bool ConnectionTable::IsOpen(int fd, uint64_t connection) const {
  auto it = open_.find(fd);
  return connection != 0 && it != open_.end() && it->second == connection;
}

void ConnectionTable::Retire(uint64_t serial) {
  auto it = metadata_of_.find(serial);
  if (it == metadata_of_.end()) return;
  closed_known_.push_back(it->second);
  metadata_of_.erase(it);
  while (closed_known_.size() > kClosedKept) {
    by_metadata_.erase(closed_known_.front());
    closed_known_.pop_front();
  }
}

}  // namespace odb::emit
