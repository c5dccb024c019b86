#include "src/common/zmq_transfer.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

namespace odb {
namespace {

std::vector<zmq::message_t> Parts(const std::vector<std::string>& texts) {
  std::vector<zmq::message_t> parts;
  for (const std::string& t : texts) parts.emplace_back(t.data(), t.size());
  return parts;
}

TEST_CASE("a receive with nothing queued is kAgain and leaves no parts") {
  zmq::context_t context;
  zmq::socket_t rx(context, zmq::socket_type::pair);
  rx.bind("inproc://zmq-transfer-empty");
  std::vector<zmq::message_t> parts = Parts({"stale"});
  Transfer t = TryRecvMultipart(rx, parts);
  CHECK(t.code == TransferCode::kAgain);
  CHECK(!t.ok());
  CHECK(parts.empty());
}

TEST_CASE("a multipart message arrives whole, in order") {
  zmq::context_t context;
  zmq::socket_t rx(context, zmq::socket_type::pair);
  zmq::socket_t tx(context, zmq::socket_type::pair);
  rx.bind("inproc://zmq-transfer-whole");
  tx.connect("inproc://zmq-transfer-whole");
  std::vector<zmq::message_t> out = Parts({"header", "", "payload"});
  REQUIRE(TrySendMultipart(tx, out).ok());
  std::vector<zmq::message_t> in;
  // inproc delivery is immediate once the send returned.
  REQUIRE(TryRecvMultipart(rx, in).ok());
  REQUIRE(in.size() == 3);
  CHECK(in[0].to_string() == "header");
  CHECK(in[1].size() == 0);
  CHECK(in[2].to_string() == "payload");
}

TEST_CASE("a send that would block is kAgain and the caller keeps every part") {
  zmq::context_t context;
  zmq::socket_t tx(context, zmq::socket_type::push);  // no peer: nowhere to queue
  tx.set(zmq::sockopt::linger, 0);
  tx.bind("inproc://zmq-transfer-blocked");
  std::vector<zmq::message_t> out = Parts({"a", "bc"});
  Transfer t = TrySendMultipart(tx, out);
  CHECK(t.code == TransferCode::kAgain);
  REQUIRE(out.size() == 2);
  CHECK(out[1].to_string() == "bc");
}

TEST_CASE("a ROUTER send to a peer that is not connected is kUnreachable, not an exception") {
  zmq::context_t context;
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::router_mandatory, 1);
  router.set(zmq::sockopt::linger, 0);
  router.bind("inproc://zmq-transfer-router");
  std::vector<zmq::message_t> out = Parts({"step"});
  Transfer t = TrySendTo(router, "nobody", out);
  CHECK(t.code == TransferCode::kUnreachable);
  CHECK(std::string(TransferCodeName(t.code)) == "unreachable");
  CHECK(out.size() == 1);
}

TEST_CASE("a ROUTER send reaches the peer by its routing id") {
  zmq::context_t context;
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::router_mandatory, 1);
  router.bind("inproc://zmq-transfer-routed");
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::routing_id, "trainer");
  dealer.connect("inproc://zmq-transfer-routed");
  std::vector<zmq::message_t> out = Parts({"one", "two"});
  REQUIRE(TrySendTo(router, "trainer", out).ok());
  std::vector<zmq::message_t> in;
  REQUIRE(TryRecvMultipart(dealer, in).ok());
  REQUIRE(in.size() == 2);
  CHECK(in[0].to_string() == "one");
  CHECK(in[1].to_string() == "two");
}

TEST_CASE("EnsureIpcDirectory makes an ipc endpoint's directory and ignores other transports") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("odb-zmq-transfer-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  EnsureIpcDirectory("ipc://" + (dir / "sub" / "out.sock").string());
  CHECK(std::filesystem::is_directory(dir / "sub"));
  EnsureIpcDirectory("tcp://127.0.0.1:0");  // nothing to make, nothing thrown
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace odb
