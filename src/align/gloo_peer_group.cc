#include "src/align/gloo_peer_group.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <thread>
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
// Debian installs hiredis under <hiredis/hiredis.h>.
#ifndef HIREDIS_NESTED_INCLUDE
#define HIREDIS_NESTED_INCLUDE
#endif
#include <gloo/rendezvous/redis_store.h>
#include <gloo/transport/tcp/device.h>

#include <utility>

#include "proto/peer.pb.h"
#include "src/align/failure_report.h"
#include "src/align/gloo_store.h"
#include "src/align/peer_wire.h"
#include "src/common/mutex.h"

namespace odb::align {
namespace {

using Clock = std::chrono::steady_clock;
using internal::OpenStore;
using internal::ProbeTcp;

// Gloo's collectives use slot prefixes 0x01-0x08 (gloo/types.h); the log
// all-gather's messages get their own, so they never match theirs.
constexpr uint8_t kLogAllGatherSlotPrefix = 0x4c;

std::string Seconds(std::chrono::milliseconds ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(ms.count()) / 1000.0);
  return text;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

}  // namespace

// Notices stretches in which this process did not run at all: a thread wakes
// every kTick; when it wakes much later than that, no thread of the process
// ran in between (SIGSTOP, a debugger, a paused VM: the steady clock keeps
// running, the process does not). Scheduling delays on a loaded machine are
// far below the thresholds that matter (half the collective timeout).
class GlooPeerGroup::RunGapWatch {
 public:
  RunGapWatch() : last_tick_(Clock::now()), thread_([this] { Loop(); }) {}
  ~RunGapWatch() {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    thread_.join();
  }
  RunGapWatch(const RunGapWatch&) = delete;
  RunGapWatch& operator=(const RunGapWatch&) = delete;

  // The longest stretch without running that ended after `since`, including
  // one that is only ending now (the thread has not woken up yet).
  std::chrono::milliseconds LongestSince(Clock::time_point since) const {
    MutexLock lock(mu_);
    const auto now = Clock::now();
    std::chrono::milliseconds longest{0};
    if (now - last_tick_ > kTick + kMinGap) {
      longest = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_tick_);
    }
    for (const Gap& g : gaps_) {
      if (g.end > since) longest = std::max(longest, g.length);
    }
    return longest;
  }

 private:
  static constexpr std::chrono::milliseconds kTick{100};
  static constexpr std::chrono::milliseconds kMinGap{250};  // later than this is recorded
  struct Gap {
    Clock::time_point end;
    std::chrono::milliseconds length;
  };

  void Loop() {
    MutexLock lock(mu_);
    while (!stop_) {
      cv_.WaitFor(mu_, kTick);
      const auto now = Clock::now();
      if (now - last_tick_ > kTick + kMinGap) {
        gaps_.push_back({now, std::chrono::duration_cast<std::chrono::milliseconds>(now - last_tick_)});
        if (gaps_.size() > 16) gaps_.pop_front();
      }
      last_tick_ = now;
    }
  }

  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Clock::time_point last_tick_ ABSL_GUARDED_BY(mu_);
  std::deque<Gap> gaps_ ABSL_GUARDED_BY(mu_);  // the latest ones
  std::thread thread_;                         // last: starts once the rest is initialized
};

GlooPeerGroup::GlooPeerGroup(GlooPeerGroupOptions options)
    : options_(std::move(options)),
      run_gaps_(std::make_unique<RunGapWatch>()),
      last_ok_start_(Clock::now()),
      prefix_(options_.job_id + "/" + std::to_string(options_.generation)) {
  root_prefix_ = prefix_;
  for (int r = 0; r < options_.world_size; ++r) root_ranks_.push_back(r);
}
GlooPeerGroup::~GlooPeerGroup() = default;

namespace {

// The key of a rank's cause of failure, under the root group's prefix.
std::string CauseKey(int root_rank) { return "odb_cause_" + std::to_string(root_rank); }

}  // namespace

void GlooPeerGroup::ReportFailure(const std::string& cause) {
  {
    MutexLock lock(causes_->mu);
    if (!causes_->cause.empty() || cause.empty()) return;  // the first cause sticks
    causes_->cause = cause;
  }
  if (options_.world_size <= 1) return;
  try {
    std::unique_ptr<gloo::rendezvous::Store> store = OpenStore(options_);
    gloo::rendezvous::PrefixStore root(root_prefix_, *store);
    const std::string bytes = EncodeFailureCause(cause);
    root.set(CauseKey(root_ranks_[options_.rank]), std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception&) {
    // The store is unreachable: peers report what they see (a lost peer).
  }
}

std::string GlooPeerGroup::PeerCause(int rank_here) {
  try {
    gloo::rendezvous::PrefixStore root(root_prefix_, *store_);
    const std::string key = CauseKey(root_ranks_[rank_here]);
    root.wait({key}, std::chrono::milliseconds(1));
    const std::vector<char> bytes = root.get(key);
    auto cause = DecodeFailureCause(std::string_view(bytes.data(), bytes.size()));
    if (!cause.ok()) return "a cause this rank cannot read (" + std::string(cause.status().message()) + ")";
    return cause->empty() ? "an empty cause" : *cause;
  } catch (const std::exception&) {
    return "";
  }
}

std::string GlooPeerGroup::Describe() const {
  const std::string& prefix = prefix_;
  if (options_.store == GlooPeerGroupOptions::StoreKind::kRedis) {
    return "redis:" + options_.redis_host + ":" + std::to_string(options_.redis_port) + " " + prefix;
  }
  return "file:" + options_.file_store_dir + " " + prefix;
}

absl::StatusOr<std::unique_ptr<GlooPeerGroup>> GlooPeerGroup::Connect(const GlooPeerGroupOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError("gloo peer group: rank " + std::to_string(options.rank) +
                                      " out of range for world_size " + std::to_string(options.world_size));
  }
  if (options.job_id.empty() || options.job_id.find('/') != std::string::npos) {
    return absl::InvalidArgumentError("gloo peer group: job_id must be non-empty and contain no '/'");
  }
  std::unique_ptr<GlooPeerGroup> group(new GlooPeerGroup(options));
  absl::Status s = group->ConnectImpl();
  if (!s.ok()) return s;
  return group;
}

absl::Status GlooPeerGroup::ConnectImpl() {
  const auto deadline = Clock::now() + options_.connect_timeout;
  auto left = [&deadline]() {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  const std::string me = "gloo peer group rank " + std::to_string(options_.rank) + "/" +
                         std::to_string(options_.world_size) + " (" + Describe() + "): ";
  const std::string& prefix = prefix_;
  std::string stage = "creating the rendezvous store";
  try {
    if (options_.store == GlooPeerGroupOptions::StoreKind::kFile) {
      std::error_code ec;
      if (options_.file_store_dir.empty() || !std::filesystem::is_directory(options_.file_store_dir, ec)) {
        return absl::FailedPreconditionError(me + "rendezvous directory '" + options_.file_store_dir +
                                             "' does not exist (create it on a filesystem all ranks share)");
      }
      // PrefixStore joins with '/', which FileStore maps to subdirectories.
      std::filesystem::create_directories(std::filesystem::path(options_.file_store_dir) / prefix, ec);
      if (ec) {
        return absl::FailedPreconditionError(me + "cannot create " + prefix + " under the rendezvous directory: " +
                                             ec.message());
      }
      store_ = std::make_unique<gloo::rendezvous::FileStore>(options_.file_store_dir);
    } else {
      if (absl::Status s = ProbeTcp(options_.redis_host, options_.redis_port, left()); !s.ok()) {
        return absl::UnavailableError(me + std::string(s.message()));
      }
      store_ = std::make_unique<gloo::rendezvous::RedisStore>(options_.redis_host, options_.redis_port);
    }
    prefix_store_ = std::make_unique<gloo::rendezvous::PrefixStore>(prefix, *store_);

    // Our own join barrier first, so a missing rank is named.
    stage = "announcing this rank in the store";
    const std::string self_key = "odb_join_" + std::to_string(options_.rank);
    prefix_store_->set(self_key, std::vector<char>{'1'});
    for (int r = 0; r < options_.world_size; ++r) {
      if (r == options_.rank) continue;
      stage = "waiting for rank " + std::to_string(r) + " to join";
      try {
        prefix_store_->wait({"odb_join_" + std::to_string(r)}, left());
      } catch (const std::exception& e) {
        return absl::DeadlineExceededError(me + "peer rank " + std::to_string(r) +
                                           " did not reach the rendezvous within " +
                                           std::to_string(options_.connect_timeout.count()) +
                                           " ms (is it running, with the same job_id and generation?): " + e.what());
      }
    }

    stage = "creating the TCP device";
    gloo::transport::tcp::attr attr;
    if (!options_.iface.empty()) {
      attr.iface = options_.iface;
    } else if (!options_.hostname.empty()) {
      attr.hostname = options_.hostname;
    }
    device_ = gloo::transport::tcp::CreateDevice(attr);

    stage = "connecting the full mesh";
    context_ = std::make_shared<gloo::rendezvous::Context>(options_.rank, options_.world_size);
    context_->setTimeout(left());
    context_->connectFullMesh(*prefix_store_, device_);
    context_->setTimeout(options_.collective_timeout);
  } catch (const gloo::IoException& e) {
    context_.reset();
    return absl::UnavailableError(me + stage + " failed (I/O): " + e.what());
  } catch (const gloo::EnforceNotMet& e) {
    context_.reset();
    return absl::UnavailableError(me + stage + " failed (gloo check): " + e.what());
  } catch (const std::exception& e) {
    context_.reset();
    return absl::UnavailableError(me + stage + " failed: " + e.what());
  }

  // Hello under the connect deadline.
  const auto collective = options_.collective_timeout;
  context_->setTimeout(left());
  absl::Status hello = ExchangeHello(*this, options_.hello);
  if (context_) context_->setTimeout(collective);
  if (!hello.ok()) return absl::Status(hello.code(), me + std::string(hello.message()));
  return absl::OkStatus();
}

std::string GlooPeerGroup::DiagnoseFailure(bool timed_out) {
  // Gloo names addresses, not ranks. Every failing rank leaves a report in the
  // store and then drops its connections, so peers still blocked on it fail at
  // once and leave theirs; a rank that leaves none within the window is lost.
  const int me = options_.rank;
  const std::string timeout_ms = std::to_string(options_.collective_timeout.count());
  FailureReport mine;
  mine.timed_out = timed_out;
  // A stop of this process long enough to make peers give up on it: half the
  // collective timeout (a wait that long is already beyond any scheduling
  // delay), and at least 500 ms.
  const auto stopped = run_gaps_->LongestSince(last_ok_start_);
  const bool was_stopped =
      stopped >= std::max<std::chrono::milliseconds>(std::chrono::milliseconds(500), options_.collective_timeout / 2);
  if (was_stopped) mine.stopped = stopped;
  const std::string stopped_text = "this process did not run for " + Seconds(stopped) +
                                   " (stopped or suspended? SIGSTOP, a debugger, a paused VM)";
  const auto mark = [](int r) { return "odb_failed_" + std::to_string(r); };
  try {
    const std::string report = EncodeFailureReport(mine);
    prefix_store_->set(mark(me), std::vector<char>(report.begin(), report.end()));
  } catch (const std::exception&) {
    if (was_stopped) return stopped_text + "; the rendezvous store is unreachable too";
    return "a peer daemon died, hung or is unreachable (the store is unreachable too)";
  }
  context_.reset();
  const auto window = std::min<std::chrono::milliseconds>(options_.collective_timeout,
                                                          std::chrono::milliseconds(3000));
  const auto deadline = Clock::now() + window;
  std::map<int, FailureReport> reports;
  std::map<int, std::string> unreadable;  // rank -> why its report could not be read
  std::vector<int> missing;
  do {
    missing.clear();
    for (int r = 0; r < options_.world_size; ++r) {
      if (r == me || reports.count(r) || unreadable.count(r)) continue;
      try {
        prefix_store_->wait({mark(r)}, std::chrono::milliseconds(20));
        const std::vector<char> bytes = prefix_store_->get(mark(r));
        auto report = DecodeFailureReport(std::string_view(bytes.data(), bytes.size()));
        if (report.ok()) {
          reports[r] = *report;
        } else {
          unreadable[r] = std::string(report.status().message());
        }
      } catch (const std::exception&) {
        missing.push_back(r);
      }
    }
  } while (!missing.empty() && Clock::now() < deadline);

  // A rank that failed the job for a reason of its own said why (ReportFailure): that is the
  // job's first cause, and what every rank reports, before what its own collective saw.
  {
    MutexLock lock(causes_->mu);
    if (!causes_->cause.empty()) return "this rank failed the job: " + causes_->cause;
  }
  std::vector<int> caused;
  std::string first_cause;
  for (int r = 0; r < options_.world_size; ++r) {
    if (r == me) continue;
    std::string cause = PeerCause(r);
    if (cause.empty()) continue;
    if (first_cause.empty()) first_cause = std::move(cause);
    caused.push_back(root_ranks_[r]);
  }
  if (!caused.empty()) {
    return "rank " + std::to_string(caused.front()) + " failed the job: " + first_cause +
           (caused.size() > 1 ? " (rank " + RankList(caused) + " reported causes of their own)" : "");
  }
  if (!unreadable.empty()) {
    return "rank " + std::to_string(unreadable.begin()->first) +
           " left a failure report this rank cannot read (" + unreadable.begin()->second + ")";
  }
  std::vector<int> timed_out_peers, stopped_peers;
  for (const auto& [r, report] : reports) {
    if (report.timed_out) timed_out_peers.push_back(r);
    if (report.stopped.count() > 0) stopped_peers.push_back(r);
  }
  if (was_stopped) {
    // The peers' side of the story, when they left it.
    if (!timed_out_peers.empty()) {
      return stopped_text + "; peers timed out waiting for rank " + std::to_string(me) + " (rank " +
             RankList(timed_out_peers) + " reported no answer within collective_timeout_ms = " + timeout_ms + ")";
    }
    if (!reports.empty()) {
      std::vector<int> reported;
      for (const auto& [r, report] : reports) reported.push_back(r);
      return stopped_text + "; the collective failed when it resumed (rank " + RankList(reported) +
             " reported a failure too)";
    }
    return stopped_text + "; no peer left a failure report within " + std::to_string(window.count()) +
           " ms (they may have exited already)";
  }
  if (!missing.empty()) {
    const std::string no_report = "left no failure report within " + std::to_string(window.count()) + " ms";
    if (timed_out) {
      return "timed out waiting for rank " + RankList(missing) + ": " + (missing.size() == 1 ? "it" : "they") +
             " did not answer within collective_timeout_ms = " + timeout_ms + " and " + no_report +
             " (alive but unresponsive: stopped, hung or starved; or dead)";
    }
    return "lost peer rank " + RankList(missing) + " (its daemon died or hangs: it " + no_report + ")";
  }
  if (!stopped_peers.empty()) {
    std::string text = "rank " + RankList(stopped_peers) + " did not answer within collective_timeout_ms = " +
                       timeout_ms + ": its process did not run for";
    for (size_t i = 0; i < stopped_peers.size(); ++i) {
      text += (i ? ", " : " ") + Seconds(reports[stopped_peers[i]].stopped);
    }
    return text + " (stopped or suspended; it said so when it resumed)";
  }
  if (timed_out) {
    return "timed out after collective_timeout_ms = " + timeout_ms +
           ", but every peer is running and reported a failure too (a slow or broken network between the ranks?)";
  }
  return "every peer reported a failure too (a network problem, not a dead daemon)";
}

void GlooPeerGroup::ResizeSlot(size_t largest, size_t total) {
  const auto round_up = [](size_t n) { return (n + 63) / 64 * 64; };
  // Padding every slot to the largest message costs W x largest; past
  // kPaddingFactor x the bytes themselves, the large messages overflow
  // instead (two collectives for them, but no rank receives W copies of one
  // large message's size).
  const size_t cap = std::max(kMinSlotBytes, round_up(kPaddingFactor * total / static_cast<size_t>(options_.world_size)));
  const size_t wanted = std::clamp<size_t>(std::min(round_up(largest + largest / 4), cap), kMinSlotBytes, kMaxSlotBytes);
  recent_wants_.push_back(wanted);
  if (recent_wants_.size() > kSlotMemory) recent_wants_.erase(recent_wants_.begin());
  slot_bytes_ = *std::max_element(recent_wants_.begin(), recent_wants_.end());
}

void GlooPeerGroup::BruckAllGather(uint32_t tag, std::string_view mine, const std::vector<size_t>& sizes, char* out,
                                   Clock::time_point deadline) {
  const int n = options_.world_size;
  const int me = options_.rank;
  // Position i of `held` is rank (me + i) mod n's block; off[i] where it starts.
  std::vector<size_t> off(static_cast<size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i) off[i + 1] = off[i] + sizes[(me + i) % n];
  std::vector<char> held(off[n]);
  if (!mine.empty()) std::memcpy(held.data(), mine.data(), mine.size());
  struct Step {
    int to, from;
    size_t send_bytes;               // positions [0, count): what this rank holds
    size_t recv_at, recv_bytes;      // positions [d, d + count): the peer's first count
    std::unique_ptr<gloo::transport::UnboundBuffer> send, recv;
  };
  std::vector<Step> steps;
  for (int d = 1; d < n; d *= 2) {
    const int count = std::min(d, n - d);
    steps.push_back({(me - d + n) % n, (me + d) % n, off[count], off[d], off[d + count] - off[d], nullptr, nullptr});
  }
  // The remaining time of this collective, at least 1 ms (a wait of 0 would
  // mean "the context's default").
  const auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  const auto slot = [&](size_t k) { return gloo::Slot::build(kLogAllGatherSlotPrefix, tag) + static_cast<uint8_t>(k); };
  // Zero-byte transfers are skipped on both sides: both know every size.
  for (size_t k = 0; k < steps.size(); ++k) {
    Step& s = steps[k];
    if (s.recv_bytes == 0) continue;
    s.recv = context_->createUnboundBuffer(held.data() + s.recv_at, s.recv_bytes);
    s.recv->recv(s.from, slot(k));
  }
  const auto wait_recv = [&](Step& s) {
    if (s.recv && !s.recv->waitRecv(left())) throw gloo::IoException("log all-gather: receive aborted");
  };
  for (size_t k = 0; k < steps.size(); ++k) {
    Step& s = steps[k];
    // What this step forwards arrived in the previous steps.
    if (k > 0) wait_recv(steps[k - 1]);
    if (s.send_bytes == 0) continue;
    s.send = context_->createUnboundBuffer(held.data(), s.send_bytes);
    s.send->send(s.to, slot(k));
  }
  if (!steps.empty()) wait_recv(steps.back());
  for (Step& s : steps) {
    if (s.send && !s.send->waitSend(left())) throw gloo::IoException("log all-gather: send aborted");
  }
  // Back to rank order.
  size_t at = 0;
  std::vector<size_t> start(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    start[r] = at;
    at += sizes[r];
  }
  for (int i = 0; i < n; ++i) {
    const int r = (me + i) % n;
    if (sizes[r] > 0) std::memcpy(out + start[r], held.data() + off[i], sizes[r]);
  }
}

absl::StatusOr<std::vector<std::string>> GlooPeerGroup::AllGather(std::string_view bytes) {
  if (!broken_.ok()) return broken_;
  const int world = options_.world_size;
  const uint64_t op = ops_++;
  const auto op_start = Clock::now();
  // Gloo says "Timed out waiting ..." / "Read timeout ..."; the elapsed time covers any other wording.
  const auto is_timeout = [&](const std::string& what) {
    return what.find("imed out") != std::string::npos || what.find("timeout") != std::string::npos ||
           Clock::now() - op_start >= options_.collective_timeout;
  };
  try {
    // One slot per rank: the size of its message, then as much of it as fits.
    constexpr size_t kHeader = sizeof(uint64_t);
    const size_t slot = slot_bytes_;
    const size_t frame = kHeader + slot;
    std::vector<char> in(frame, 0);
    const uint64_t mine = announce_for_test_.value_or(bytes.size());
    std::memcpy(in.data(), &mine, kHeader);
    std::memcpy(in.data() + kHeader, bytes.data(), std::min(bytes.size(), slot));
    std::vector<char> out(frame * static_cast<size_t>(world));
    const bool log_gather = UsesLogAllGather();
    const auto deadline = op_start + options_.collective_timeout;
    if (log_gather) {
      BruckAllGather(next_tag_++, std::string_view(in.data(), in.size()), std::vector<size_t>(world, frame),
                     out.data(), deadline);
    } else {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(in.data(), in.size());
      opts.setOutput(out.data(), out.size());
      opts.setTag(next_tag_++);
      gloo::allgather(opts);
    }
    std::vector<size_t> sizes(world);
    std::vector<size_t> rest(world, 0);  // what did not fit in each rank's slot
    size_t rest_total = 0;
    size_t largest = 0;
    size_t total = 0;
    // The headers are a peer's word: checked against the limits before any
    // size below is taken from them (the overflow buffer, the second
    // collective's sizes). Every rank reads the same headers, so every rank
    // fails here alike and none waits in a second collective alone.
    // This rank's own header is its true size (unless a test announces
    // another): then the message itself is too large, not a peer's header
    // corrupt, and the other ranks' errors name this rank.
    const bool own_is_true = !announce_for_test_.has_value();
    const auto corrupt = [&](const std::string& what, int culprit) {
      const std::string why =
          culprit == options_.rank && own_is_true
              ? " (this rank's own message: a round's message is its pending window of sample records; "
                "lower grouping.window)"
              : " (a corrupt header: is every rank running the same odbd?)";
      broken_ = absl::DataLossError("gloo all-gather #" + std::to_string(op) + " on rank " +
                                    std::to_string(options_.rank) + ": " + what + why);
      return broken_;
    };
    for (int r = 0; r < world; ++r) {
      uint64_t size = 0;
      std::memcpy(&size, out.data() + frame * static_cast<size_t>(r), kHeader);
      if (size > options_.max_message_bytes) {
        return corrupt("rank " + std::to_string(r) + " announced a message of " + std::to_string(size) +
                           " bytes, over the limit of " + std::to_string(options_.max_message_bytes) +
                           " per rank",
                       r);
      }
      sizes[r] = static_cast<size_t>(size);
      largest = std::max(largest, sizes[r]);
      total += sizes[r];
      if (total > options_.max_gather_bytes) {
        return corrupt("ranks 0-" + std::to_string(r) + " announced " + std::to_string(total) +
                           " bytes together, over the limit of " + std::to_string(options_.max_gather_bytes) +
                           " for one all-gather (rank " + std::to_string(r) + " announced " +
                           std::to_string(size) + ")",
                       r);
      }
      if (sizes[r] > slot) {
        rest[r] = sizes[r] - slot;
        rest_total += rest[r];
      }
    }
    std::vector<char> overflow(rest_total);
    if (rest_total > 0) {
      // Every rank saw the same headers, so every rank takes this branch.
      ++overflows_;
      // Exactly what this rank announced past its slot (its true remainder,
      // except under AnnounceSizeForTest: then zero-padded or cut to it).
      std::string tail(bytes.size() > slot ? bytes.substr(slot) : std::string_view());
      tail.resize(rest[options_.rank]);
      if (log_gather) {
        BruckAllGather(next_tag_++, tail, rest, overflow.data(), deadline);
      } else {
        gloo::AllgathervOptions opts(context_);
        opts.setInput(tail.data(), tail.size());
        opts.setOutput(overflow.data(), rest);
        opts.setTag(next_tag_++);
        gloo::allgatherv(opts);
      }
    }
    std::vector<std::string> result;
    result.reserve(world);
    size_t off = 0;
    for (int r = 0; r < world; ++r) {
      std::string& s = result.emplace_back(out.data() + frame * static_cast<size_t>(r) + kHeader,
                                           std::min(sizes[r], slot));
      s.append(overflow.data() + off, rest[r]);
      off += rest[r];
    }
    ResizeSlot(largest, total);
    last_ok_start_ = op_start;
    return result;
  } catch (const gloo::IoException& e) {
    broken_ = absl::UnavailableError("gloo all-gather #" + std::to_string(op) + " on rank " +
                                     std::to_string(options_.rank) + " failed: " + DiagnoseFailure(is_timeout(e.what())) +
                                     " (gloo: " + e.what() + ")");
  } catch (const gloo::EnforceNotMet& e) {
    broken_ = absl::InternalError("gloo all-gather #" + std::to_string(op) + " on rank " +
                                  std::to_string(options_.rank) + " failed a gloo check: " + e.what());
  } catch (const std::exception& e) {
    broken_ = absl::UnavailableError("gloo all-gather #" + std::to_string(op) + " on rank " +
                                     std::to_string(options_.rank) + " failed: " + e.what());
  }
  return broken_;
}

absl::StatusOr<std::unique_ptr<PeerGroup>> GlooPeerGroup::Split(int color) {
  if (!broken_.ok()) return broken_;
  const uint64_t split = splits_++;
  const std::string me = "gloo peer group rank " + std::to_string(options_.rank) + "/" +
                         std::to_string(options_.world_size) + " (" + Describe() + "): split #" +
                         std::to_string(split) + " (color " + std::to_string(color) + "): ";
  peer::SplitColor mine;
  mine.set_color(color);
  auto gathered = AllGather(EncodePeerMessage(mine));
  if (!gathered.ok())
    return absl::Status(gathered.status().code(), me + std::string(gathered.status().message()));
  std::vector<int32_t> colors(options_.world_size);
  int new_rank = -1;
  int new_size = 0;
  for (int r = 0; r < options_.world_size; ++r) {
    peer::SplitColor theirs;
    if (absl::Status s = ParsePeerMessage((*gathered)[r], "split color", theirs); !s.ok()) {
      broken_ = absl::Status(s.code(), me + "rank " + std::to_string(r) + ": " + std::string(s.message()) +
                                           " (is every rank calling Split here?)");
      return broken_;
    }
    colors[r] = theirs.color();
    if (colors[r] != color) continue;
    if (r == options_.rank) new_rank = new_size;
    ++new_size;
  }
  GlooPeerGroupOptions child_options = options_;
  child_options.rank = new_rank;
  child_options.world_size = new_size;
  std::unique_ptr<GlooPeerGroup> child(new GlooPeerGroup(child_options));
  child->store_ = store_;
  child->device_ = device_;
  // Unique per split of this group and per color; the split counter keeps
  // the keys of two splits with the same color apart.
  child->prefix_ = prefix_ + "/split" + std::to_string(split) + "_c" + std::to_string(color);
  // Causes of failure stay the root group's: a member's is read under its root rank.
  child->causes_ = causes_;
  child->root_prefix_ = root_prefix_;
  child->root_ranks_.clear();
  for (int r = 0; r < options_.world_size; ++r) {
    if (colors[r] == color) child->root_ranks_.push_back(root_ranks_[r]);
  }
  const auto deadline = Clock::now() + options_.connect_timeout;
  try {
    if (options_.store == GlooPeerGroupOptions::StoreKind::kFile) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(options_.file_store_dir) / child->prefix_, ec);
      if (ec) {
        return absl::FailedPreconditionError(me + "cannot create " + child->prefix_ +
                                             " under the rendezvous directory: " + ec.message());
      }
    }
    child->prefix_store_ = std::make_unique<gloo::rendezvous::PrefixStore>(child->prefix_, *store_);
    child->context_ = std::make_shared<gloo::rendezvous::Context>(new_rank, new_size);
    child->context_->setTimeout(options_.connect_timeout);
    child->context_->connectFullMesh(*child->prefix_store_, device_);
    child->context_->setTimeout(options_.collective_timeout);
  } catch (const std::exception& e) {
    const bool timed_out = Clock::now() >= deadline;
    return absl::UnavailableError(me + "connecting the " + std::to_string(new_size) + " ranks of color " +
                                  std::to_string(color) + (timed_out ? " timed out after connect_timeout_ms = " +
                                                                           std::to_string(options_.connect_timeout.count())
                                                                     : " failed") +
                                  " (a rank of this color did not call Split, or died): " + e.what());
  }
  child->last_ok_start_ = Clock::now();
  return std::unique_ptr<PeerGroup>(std::move(child));
}

}  // namespace odb::align
