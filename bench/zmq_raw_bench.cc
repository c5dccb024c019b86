// zmq_raw_bench: the data-plane baseline. A raw ZMQ PUSH/PULL pair over the
// same transport odbd uses (ipc://), one thread each, one message per sample,
// no headers, no collation. Prints one JSON line with samples/s and MB/s.
//
//   bazel-bin/bench/zmq_raw_bench --endpoint ipc:///tmp/raw.sock --payload-bytes 65536 --count 20000
#include <zmq.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  std::string endpoint = "ipc:///tmp/odb-zmq-raw.sock";
  size_t payload = 1024, count = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--endpoint") {
      endpoint = argv[i + 1];
    } else if (flag == "--payload-bytes") {
      payload = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--count") {
      count = std::strtoull(argv[i + 1], nullptr, 10);
    } else {
      std::fprintf(stderr, "zmq_raw_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  zmq::context_t ctx(1);
  zmq::socket_t pull(ctx, zmq::socket_type::pull);
  pull.set(zmq::sockopt::linger, 0);
  pull.set(zmq::sockopt::rcvhwm, 1000);
  pull.bind(endpoint);
  std::thread producer([&] {
    zmq::socket_t push(ctx, zmq::socket_type::push);
    push.set(zmq::sockopt::linger, -1);
    push.set(zmq::sockopt::sndhwm, 1000);
    push.connect(endpoint);
    std::vector<uint8_t> data(payload);
    for (size_t i = 0; i < count; ++i) {
      std::memset(data.data(), static_cast<int>(i), std::min<size_t>(payload, 64));
      (void)push.send(zmq::buffer(data), zmq::send_flags::none);  // copies, as a producer's send does
    }
  });
  size_t bytes = 0;
  zmq::message_t msg;
  auto start = std::chrono::steady_clock::time_point{};
  for (size_t i = 0; i < count; ++i) {
    (void)pull.recv(msg, zmq::recv_flags::none);
    if (i == 0) start = std::chrono::steady_clock::now();  // exclude connection setup
    bytes += msg.size();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  producer.join();
  const double n = static_cast<double>(count - 1);
  std::printf("{\"payload_bytes\": %zu, \"samples\": %zu, \"bytes\": %zu, \"seconds\": %.4f, \"samples_per_s\": %.1f, "
              "\"mb_per_s\": %.2f}\n",
              payload, count, bytes, secs, n / secs, n * payload / secs / 1e6);
  return 0;
}
