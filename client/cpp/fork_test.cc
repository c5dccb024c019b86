// A Producer or Consumer inherited by a fork()ed child (a DataLoader worker, a
// test's forked rank) must neither hang nor touch the parent's connection:
// ZeroMQ contexts do not survive fork, and zmq_ctx_term on the copy spun
// forever (a garbage-collected Consumer hung a forked trainer in CI).
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <zmq.hpp>

#include "odb/consumer.h"
#include "odb/producer.h"

namespace odb::client {
namespace {

// Runs `child` in a fork with a 20 s alarm; returns its wait status.
template <typename F>
int InFork(F child) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);  // a hang kills the child with SIGALRM: a failure, not a stuck suite
    _exit(child());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

std::string Describe(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status)) + " (14 = hang)";
  return "exit code " + std::to_string(WEXITSTATUS(status));
}

struct Fixture {
  char dir[32] = "/tmp/odb-fork-XXXXXX";
  std::string endpoint;
  zmq::context_t context{1};
  zmq::socket_t daemon{context, zmq::socket_type::router};  // stands in for odbd's sockets
  std::unique_ptr<Consumer> consumer;
  std::unique_ptr<Producer> producer;

  Fixture() {
    REQUIRE(mkdtemp(dir) != nullptr);
    endpoint = std::string("ipc://") + dir + "/in.sock";
    daemon.set(zmq::sockopt::rcvtimeo, 10000);
    daemon.bind(endpoint);
    auto c = Consumer::Connect({endpoint, 1000});
    REQUIRE(c.ok());
    consumer = std::move(*c);
    ProducerOptions options;
    options.endpoint = endpoint;
    options.producer_id = "fork-test";
    options.data_plane = DataPlane::kZmq;
    options.send_timeout_ms = 1000;
    auto p = Producer::Connect(options);
    REQUIRE(p.ok());
    producer = std::move(*p);
    ReceiveOne();  // both hellos arrived: the contexts' I/O threads are running
    ReceiveOne();
  }
  ~Fixture() {
    daemon.close();
    std::string path = std::string(dir) + "/in.sock";
    unlink(path.c_str());
    rmdir(dir);
  }

  // One message from a client (routing id + body); false on timeout.
  bool ReceiveOne() {
    zmq::message_t part;
    do {
      if (!daemon.recv(part)) return false;
    } while (part.more());
    return true;
  }
};

TEST_CASE("destroying an inherited Producer or Consumer in a forked child returns at once") {
  Fixture f;
  const int status = InFork([&f] {
    f.consumer.reset();
    f.producer.reset();
    return 0;
  });
  INFO(Describe(status));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

TEST_CASE("an inherited Producer or Consumer refuses every call in a forked child, naming fork") {
  Fixture f;
  const int status = InFork([&f] {
    int failures = 0;
    auto expect_refused = [&failures](const absl::Status& s) {
      if (s.code() != absl::StatusCode::kFailedPrecondition || std::string(s.message()).find("fork") == std::string::npos) {
        ++failures;
      }
    };
    expect_refused(f.consumer->Next().status());
    expect_refused(f.consumer->StartEpoch(0));
    expect_refused(f.producer->StartEpoch(0));
    int64_t token = 7;
    expect_refused(f.producer->Send(1, 0, Lengths{1, 0, 0, std::nullopt}, {{"input_ids", DType::kInt64, {1}, &token, 8}}));
    expect_refused(f.producer->EndStream(0));
    return failures;
  });
  INFO(Describe(status));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  // The parent's connection is untouched: it still sends.
  REQUIRE(f.consumer->StartEpoch(0).ok());
  REQUIRE(f.ReceiveOne());
  REQUIRE(f.producer->StartEpoch(0).ok());
  REQUIRE(f.ReceiveOne());
}

}  // namespace
}  // namespace odb::client
