// exchange_bench: how should daemons move sample payloads when a global plan
// assigns a sample to another rank? Compares, in one run, W ranks (threads in
// one process, loopback TCP):
//   gloo  - one gloo::alltoallv on a dedicated context moving every rank's
//           outgoing bytes at once (a collective: nobody has anything until
//           everybody is done);
//   zmq   - each rank a ROUTER for incoming payloads and a DEALER per peer,
//           every sample its own multipart message (what odbd does).
// Prints aggregate MB/s and, for zmq, the time until the first sample arrived
// (the trainer can start collating the first step then), per sample size.
//
//   bazel run -c opt //bench:exchange_bench -- [W] [MB per rank]
#include <gloo/alltoallv.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

namespace {

using Clock = std::chrono::steady_clock;

double GlooSeconds(int world, size_t sample_bytes, size_t per_peer) {
  gloo::rendezvous::HashStore store;
  std::vector<double> seconds(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      auto dev = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(r, world);
      ctx->connectFullMesh(store, dev);
      const size_t chunk = sample_bytes * per_peer;
      std::vector<int64_t> counts(world, static_cast<int64_t>(chunk));
      counts[r] = 0;
      std::vector<char> in(chunk * world, static_cast<char>(r)), out(chunk * world);
      const auto t0 = Clock::now();
      gloo::AlltoallvOptions opts(ctx);
      opts.setInput(in.data(), counts);
      opts.setOutput(out.data(), counts);
      opts.setTag(3);
      gloo::alltoallv(opts);
      seconds[r] = std::chrono::duration<double>(Clock::now() - t0).count();
    });
  }
  for (auto& t : ranks) t.join();
  double worst = 0;
  for (double s : seconds) worst = std::max(worst, s);
  return worst;
}

struct ZmqResult {
  double seconds = 0;
  double first_sample_seconds = 0;
};

ZmqResult ZmqSeconds(int world, size_t sample_bytes, size_t per_peer) {
  zmq::context_t ctx(2);
  std::vector<zmq::socket_t> routers;
  std::vector<std::string> endpoints;
  for (int r = 0; r < world; ++r) {
    routers.emplace_back(ctx, zmq::socket_type::router);
    routers.back().set(zmq::sockopt::rcvhwm, 0);
    routers.back().bind("tcp://127.0.0.1:*");
    endpoints.push_back(routers.back().get(zmq::sockopt::last_endpoint));
  }
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> done(world), first(world);
  // Connections are made before timing starts, as odbd makes them at start-up.
  Clock::time_point t0;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {  // sender
      std::vector<zmq::socket_t> dealers;
      for (int p = 0; p < world; ++p) {
        dealers.emplace_back(ctx, zmq::socket_type::dealer);
        dealers.back().set(zmq::sockopt::sndhwm, 0);
        dealers.back().set(zmq::sockopt::routing_id, std::to_string(r));
        if (p != r) dealers.back().connect(endpoints[p]);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the connects complete
      if (++ready == world) {
        t0 = Clock::now();
        go.store(true);
      }
      while (!go.load()) std::this_thread::yield();
      std::vector<char> payload(sample_bytes, static_cast<char>(r));
      char header[32] = {};
      for (size_t i = 0; i < per_peer; ++i) {
        for (int p = 0; p < world; ++p) {
          if (p == r) continue;
          dealers[p].send(zmq::buffer(header, sizeof(header)), zmq::send_flags::sndmore);
          dealers[p].send(zmq::buffer(payload), zmq::send_flags::none);
        }
      }
      // Keep the sockets open until every receiver is done (linger would do too).
      while (ready.load() < 2 * world) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    threads.emplace_back([&, r] {  // receiver
      const size_t expected = per_peer * (world - 1);
      while (!go.load()) std::this_thread::yield();
      for (size_t got = 0; got < expected; ++got) {
        zmq::message_t id, head, body;
        (void)routers[r].recv(id);
        (void)routers[r].recv(head);
        (void)routers[r].recv(body);
        if (got == 0) first[r] = std::chrono::duration<double>(Clock::now() - t0).count();
      }
      done[r] = std::chrono::duration<double>(Clock::now() - t0).count();
      ++ready;
    });
  }
  for (auto& t : threads) t.join();
  ZmqResult out;
  for (int r = 0; r < world; ++r) {
    out.seconds = std::max(out.seconds, done[r]);
    out.first_sample_seconds = std::max(out.first_sample_seconds, first[r]);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int world = argc > 1 ? std::atoi(argv[1]) : 4;
  const double mb_per_rank = argc > 2 ? std::atof(argv[2]) : 64.0;
  std::printf("exchange_bench: W=%d ranks (threads, loopback TCP), %.0f MB sent per rank, split evenly over peers\n",
              world, mb_per_rank);
  std::printf("%10s | %12s | %12s %14s | %s\n", "sample", "gloo MB/s", "zmq MB/s", "zmq first ms", "zmq/gloo");
  for (size_t sample : {size_t{4096}, size_t{65536}, size_t{1} << 20}) {
    const size_t per_peer = std::max<size_t>(
        1, static_cast<size_t>(mb_per_rank * 1e6 / static_cast<double>(sample) / (world - 1)));
    const double bytes = static_cast<double>(sample) * per_peer * (world - 1) * world;
    const double g = GlooSeconds(world, sample, per_peer);
    const ZmqResult z = ZmqSeconds(world, sample, per_peer);
    std::printf("%9zuB | %12.1f | %12.1f %14.2f | %.2f\n", sample, bytes / g / 1e6, bytes / z.seconds / 1e6,
                1e3 * z.first_sample_seconds, g / z.seconds);
  }
  return 0;
}
