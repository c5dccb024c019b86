// shm_bench: producer -> consumer transfer through a shared-memory arena
// (src/shm, docs/shm.md), two processes, next to single-thread memcpy measured
// in the same run. A figure, not a test.
//
// Per block the producer allocates from its arena (waiting on the completion
// queue when it is full), memcpys the payload in from its own memory (a
// producer writing a decoded sample), and sends the 16-byte (offset, length) descriptor over a
// SOCK_SEQPACKET socketpair (standing in for the ZeroMQ message that will
// carry it). The consumer receives it and either copies the block out into a
// buffer of its own ("copy": the daemon's collation copy) or does not touch it
// ("zero-copy": a trainer handing the tensor on), then returns the block through
// the completion queue. GB/s = payload bytes / wall time from the first
// allocation to the consumer's acknowledgement of the last block.
//
// Every copy, the baseline's included, reads from and writes to block-sized
// slots rotating over a working set as large as the arena (--working-set-mib),
// so no side runs from a cache-hot buffer the others lack: memcpy is one
// thread copying block-sized chunks between two such buffers. All buffers are
// page aligned, like arena blocks (64-byte aligned); --consumer-offset N moves
// the consumer's destination N bytes off that alignment (where a std::vector's
// data would be: 16), which on the development VM's AMD EPYC makes a 64 KiB
// copy out of the arena about 3.5x slower (docs/shm.md).
//
//   bazel build -c opt //bench:shm_bench && bazel-bin/bench/shm_bench
//   bazel-bin/bench/shm_bench --sizes 65536,1048576,16777216 --total-mib 2048 --repeat 3 --json
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "src/shm/arena_reader.h"
#include "src/shm/arena_writer.h"
#include "src/shm/fd_passing.h"

namespace {

using odb::shm::ArenaOptions;
using odb::shm::ArenaReader;
using odb::shm::ArenaWriter;
using odb::shm::AttachOptions;

struct Descriptor {
  uint64_t offset;
  uint64_t length;  // ~0: end of the run
};
constexpr uint64_t kEnd = ~uint64_t{0};

struct ConsumerDone {
  double cpu_seconds;
  uint64_t blocks;
  uint64_t errors;
};

// Page-aligned anonymous memory (std::vector's data sits 16 bytes past a page
// for large sizes, which changes what memcpy costs).
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t size) : size_(size) {
    if (size_ == 0) return;
    void* p = mmap(nullptr, size_ + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    data_ = static_cast<char*>(p);
  }
  ~AlignedBuffer() {
    if (data_ != nullptr) munmap(data_, size_ + 4096);
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  size_t size_;
  char* data_ = nullptr;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void Die(const std::string& what) {
  std::fprintf(stderr, "shm_bench: %s\n", what.c_str());
  std::exit(1);
}

bool SendAll(int sock, const void* data, size_t size) {
  return send(sock, data, size, MSG_NOSIGNAL) == static_cast<ssize_t>(size);
}
bool RecvAll(int sock, void* data, size_t size) {
  return recv(sock, data, size, 0) == static_cast<ssize_t>(size);
}

// Child: attach the arena received over `sock`, consume until kEnd, report.
int Consumer(int sock, bool copy, uint64_t block_bytes, uint64_t working_set, uint64_t offset) {
  std::string payload;
  absl::StatusOr<odb::shm::UniqueFd> fd = odb::shm::RecvFd(sock, &payload);
  if (!fd.ok()) return 10;
  AttachOptions options;
  options.expected_generation = std::strtoull(payload.c_str(), nullptr, 10);
  options.populate = true;
  absl::StatusOr<std::unique_ptr<ArenaReader>> reader = ArenaReader::AttachFd(fd->get(), options);
  if (!reader.ok()) {
    std::fprintf(stderr, "consumer: %s\n", std::string(reader.status().message()).c_str());
    return 11;
  }
  const uint64_t slots = std::max<uint64_t>(1, working_set / block_bytes);
  AlignedBuffer out(copy ? slots * block_bytes + offset : 0);
  if (copy) std::memset(out.data(), 1, out.size());  // fault it in before the clock starts
  uint64_t slot = 0;
  const char ready = 'r';
  if (!SendAll(sock, &ready, 1)) return 12;
  const double cpu0 = CpuSeconds();
  ConsumerDone done{0, 0, 0};
  Descriptor d;
  while (RecvAll(sock, &d, sizeof(d)) && d.length != kEnd) {
    if (copy) {
      absl::StatusOr<std::span<std::byte>> view = (*reader)->View(d.offset, d.length);
      if (!view.ok()) {
        ++done.errors;
      } else {
        std::memcpy(out.data() + offset + slot * block_bytes, view->data(), view->size());
        slot = slot + 1 == slots ? 0 : slot + 1;
      }
    }
    if (!(*reader)->Return(d.offset, d.length).ok()) ++done.errors;
    ++done.blocks;
  }
  done.cpu_seconds = CpuSeconds() - cpu0;
  return SendAll(sock, &done, sizeof(done)) ? 0 : 13;
}

struct TransferResult {
  double gb_per_s;
  double producer_cpu_us_per_block;
  double consumer_cpu_us_per_block;
  uint64_t writer_waits;
};

// `src`: the producer's working set, whole blocks of block_bytes.
TransferResult Transfer(uint64_t block_bytes, uint64_t blocks, uint64_t arena_bytes, const std::string& dir,
                        bool copy, const AlignedBuffer& src, uint64_t working_set, uint64_t consumer_offset) {
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0) Die("socketpair");
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    close(sp[0]);
    _exit(Consumer(sp[1], copy, block_bytes, working_set, consumer_offset));
  }
  close(sp[1]);
  const int sock = sp[0];
  ArenaOptions options;
  options.dir = dir;
  options.capacity_bytes = arena_bytes;
  options.max_blocks = 4096;
  options.populate = true;
  absl::StatusOr<std::unique_ptr<ArenaWriter>> writer = ArenaWriter::Create(options);
  if (!writer.ok()) Die(std::string(writer.status().message()));
  const std::string generation = std::to_string((*writer)->arena().generation());
  if (!odb::shm::SendFd(sock, (*writer)->arena().fd(), generation).ok()) Die("SendFd");
  const uint64_t slots = src.size() / block_bytes;
  char ready;
  if (!RecvAll(sock, &ready, 1)) Die("the consumer did not attach");

  const double t0 = Now();
  const double cpu0 = CpuSeconds();
  for (uint64_t i = 0; i < blocks; ++i) {
    absl::StatusOr<odb::shm::Block> block = (*writer)->Allocate(block_bytes, absl::Seconds(30));
    if (!block.ok()) Die(std::string(block.status().message()));
    std::memcpy(block->data, src.data() + (i % slots) * block_bytes, block_bytes);
    const Descriptor d{block->offset, block->length};
    if (!SendAll(sock, &d, sizeof(d))) Die("send descriptor");
  }
  const Descriptor end{0, kEnd};
  if (!SendAll(sock, &end, sizeof(end))) Die("send end");
  ConsumerDone done;
  if (!RecvAll(sock, &done, sizeof(done))) Die("the consumer did not finish");
  const double seconds = Now() - t0;
  const double producer_cpu = CpuSeconds() - cpu0;
  int status = 0;
  waitpid(child, &status, 0);
  close(sock);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || done.errors != 0 || done.blocks != blocks) {
    Die("consumer failed (exit " + std::to_string(WEXITSTATUS(status)) + ", " + std::to_string(done.errors) +
        " errors)");
  }
  return TransferResult{static_cast<double>(block_bytes * blocks) / seconds / 1e9,
                        producer_cpu / static_cast<double>(blocks) * 1e6,
                        done.cpu_seconds / static_cast<double>(blocks) * 1e6, (*writer)->stats().waits};
}

double Memcpy(uint64_t block_bytes, uint64_t blocks, const AlignedBuffer& src, AlignedBuffer& dst) {
  const uint64_t slots = src.size() / block_bytes;
  const double t0 = Now();
  for (uint64_t i = 0; i < blocks; ++i) {
    const uint64_t slot = i % slots;
    std::memcpy(dst.data() + slot * block_bytes, src.data() + ((slot * 7 + 3) % slots) * block_bytes,
                block_bytes);
  }
  const double seconds = Now() - t0;
  volatile char sink = dst.data()[blocks % dst.size()];
  (void)sink;
  return static_cast<double>(block_bytes * blocks) / seconds / 1e9;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> sizes = {64 << 10, 1 << 20, 16 << 20};
  uint64_t total_mib = 2048, arena_mib = 256, working_set_mib = 0, consumer_offset = 0;
  int repeat = 3;
  bool json = false;
  std::string dir;  // empty: memfd
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value for " + flag);
      return argv[++i];
    };
    if (flag == "--sizes") {
      sizes.clear();
      std::string list = value();
      for (size_t pos = 0; pos < list.size();) {
        const size_t comma = list.find(',', pos);
        sizes.push_back(std::strtoull(list.substr(pos, comma - pos).c_str(), nullptr, 10));
        pos = comma == std::string::npos ? list.size() : comma + 1;
      }
    } else if (flag == "--total-mib") {
      total_mib = std::strtoull(value().c_str(), nullptr, 10);
    } else if (flag == "--arena-mib") {
      arena_mib = std::strtoull(value().c_str(), nullptr, 10);
    } else if (flag == "--working-set-mib") {
      working_set_mib = std::strtoull(value().c_str(), nullptr, 10);
    } else if (flag == "--consumer-offset") {
      consumer_offset = std::strtoull(value().c_str(), nullptr, 10);
    } else if (flag == "--repeat") {
      repeat = std::max(1, std::atoi(value().c_str()));
    } else if (flag == "--dir") {
      dir = value();
    } else if (flag == "--json") {
      json = true;
    } else {
      Die("unknown flag " + flag +
          " (--sizes a,b,c --total-mib N --arena-mib N --working-set-mib N --consumer-offset N --repeat N "
          "--dir DIR (default: "
          "memfd) "
          "--json)");
    }
  }
  const uint64_t arena_bytes = arena_mib << 20;
  const uint64_t working_set = (working_set_mib == 0 ? arena_mib : working_set_mib) << 20;
  if (!json) {
    std::printf(
        "producer -> consumer through a %llu MiB arena (%s), %llu MiB per measurement, working sets of %llu "
        "MiB, "
        "consumer destination %llu bytes off page alignment, median of %d\n",
        static_cast<unsigned long long>(arena_mib), dir.empty() ? "memfd" : dir.c_str(),
        static_cast<unsigned long long>(total_mib), static_cast<unsigned long long>(working_set >> 20),
        static_cast<unsigned long long>(consumer_offset), repeat);
    std::printf("%10s %12s %14s %8s %16s %8s %18s %18s\n", "block", "memcpy GB/s", "shm copy GB/s", "/memcpy",
                "shm 0-copy GB/s", "/memcpy", "producer us/block", "consumer us/block");
  }
  for (const uint64_t size : sizes) {
    if (size == 0 || size > arena_bytes) Die("block size " + std::to_string(size) + " outside (0, arena]");
    const uint64_t blocks = std::max<uint64_t>(16, (total_mib << 20) / size);
    const uint64_t slots = std::max<uint64_t>(1, working_set / size);
    AlignedBuffer src(slots * size), dst(slots * size);
    for (size_t i = 0; i < src.size(); i += 4096) src.data()[i] = static_cast<char>(i >> 12);
    std::memset(dst.data(), 4, dst.size());  // faulted in before any clock starts
    std::vector<double> mem, copy, zero;
    TransferResult last_copy{};
    for (int r = 0; r < repeat; ++r) {
      mem.push_back(Memcpy(size, blocks, src, dst));
      last_copy = Transfer(size, blocks, arena_bytes, dir, /*copy=*/true, src, working_set, consumer_offset);
      copy.push_back(last_copy.gb_per_s);
      zero.push_back(
          Transfer(size, blocks, arena_bytes, dir, /*copy=*/false, src, working_set, consumer_offset)
              .gb_per_s);
    }
    const double m = Median(mem), c = Median(copy), z = Median(zero);
    if (json) {
      std::printf(
          "{\"payload_bytes\": %llu, \"blocks\": %llu, \"consumer_offset\": %llu, \"memcpy_gb_per_s\": %.3f, "
          "\"shm_copy_gb_per_s\": %.3f, \"shm_zero_copy_gb_per_s\": %.3f, \"shm_copy_vs_memcpy\": %.3f, "
          "\"producer_cpu_us_per_block\": %.2f, \"consumer_cpu_us_per_block\": %.2f, \"writer_waits\": "
          "%llu}\n",
          static_cast<unsigned long long>(size), static_cast<unsigned long long>(blocks),
          static_cast<unsigned long long>(consumer_offset), m, c, z, c / m,
          last_copy.producer_cpu_us_per_block, last_copy.consumer_cpu_us_per_block,
          static_cast<unsigned long long>(last_copy.writer_waits));
    } else {
      std::printf("%9lluK %12.2f %14.2f %8.2f %16.2f %8.2f %18.2f %18.2f\n",
                  static_cast<unsigned long long>(size >> 10), m, c, c / m, z, z / m,
                  last_copy.producer_cpu_us_per_block, last_copy.consumer_cpu_us_per_block);
    }
    std::fflush(stdout);
  }
  return 0;
}
