#include "src/common/zmq_transfer.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <zmq_addon.hpp>

namespace odb {
namespace {

Transfer FromError(const zmq::error_t& e) {
  switch (e.num()) {
    case EAGAIN:
      return {TransferCode::kAgain, ""};
    case EHOSTUNREACH:
      return {TransferCode::kUnreachable, e.what()};
    case EINTR:
      return {TransferCode::kInterrupted, ""};
    default:
      return {TransferCode::kError, e.what()};
  }
}

}  // namespace

Transfer TryRecvMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>& parts) {
  parts.clear();
  try {
    auto got = zmq::recv_multipart(socket, std::back_inserter(parts), zmq::recv_flags::dontwait);
    if (!got) return {TransferCode::kAgain, ""};
  } catch (const zmq::error_t& e) {
    return FromError(e);
  }
  return {};
}

Transfer TrySendMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>& parts) {
  if (parts.empty()) return {TransferCode::kError, "empty message"};
  try {
    auto sent = zmq::send_multipart(socket, parts, zmq::send_flags::dontwait);
    if (!sent) return {TransferCode::kAgain, ""};
  } catch (const zmq::error_t& e) {
    return FromError(e);
  }
  return {};
}

Transfer TrySendTo(zmq::socket_t& socket, const std::string& routing_id, std::vector<zmq::message_t>& parts) {
  // The routing frame is a copy; `parts` stay the caller's on failure. Only
  // the first part may fail with EAGAIN/EHOSTUNREACH: once it is queued
  // ZeroMQ takes the rest of the message atomically.
  try {
    zmq::message_t id(routing_id.data(), routing_id.size());
    auto sent = socket.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (!sent) return {TransferCode::kAgain, ""};
    for (size_t i = 0; i < parts.size(); ++i) {
      socket.send(parts[i], i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  } catch (const zmq::error_t& e) {
    return FromError(e);
  }
  return {};
}

void EnsureIpcDirectory(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) != 0) return;
  std::filesystem::path path(endpoint.substr(6));
  std::error_code ignored;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ignored);
}

std::string RestrictIpcSocket(const std::string& bound_endpoint) {
  if (bound_endpoint.rfind("ipc://", 0) != 0) return "";
  const std::string path = bound_endpoint.substr(6);
  if (::chmod(path.c_str(), kIpcSocketMode) != 0) {
    return "chmod " + path + " to 0660: " + std::strerror(errno);
  }
  return "";
}

const char* TransferCodeName(TransferCode code) {
  switch (code) {
    case TransferCode::kSuccess:
      return "success";
    case TransferCode::kAgain:
      return "again";
    case TransferCode::kUnreachable:
      return "unreachable";
    case TransferCode::kInterrupted:
      return "interrupted";
    case TransferCode::kError:
      return "error";
  }
  return "?";
}

}  // namespace odb
