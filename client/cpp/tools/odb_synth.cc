// odb_synth: a synthetic producer and a verifying consumer built on the C++
// client. Used by the integration tests, the demo and the benchmarks.
//
//   odb_synth produce --endpoint E --producer-id P --count N [--seed S] ...
//   odb_synth consume --endpoint E [--epochs 1] [--max-tokens 4096] ...
//
// Sample content is a pure function of (id, position) so the consumer checks
// every byte without sharing state with the producers.
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <map>
#include <string>
#include <random>
#include <set>
#include <numeric>
#include <thread>
#include <vector>

#include "odb/consumer.h"
#include "odb/producer.h"

namespace {

int64_t TokenValue(uint64_t id, int64_t position) {
  return static_cast<int64_t>((id * 1000003ull + static_cast<uint64_t>(position) * 7919ull) % 50257ull);
}

// The "blob" payload of sample `id`: byte k is (id + k) mod 256. It is a
// window of one precomputed ramp (RampPattern), so the producer sends it
// without generating anything per sample (a benchmark measures the daemon,
// not the tool) and the consumer compares it with memcmp.
std::vector<uint8_t> RampPattern(size_t payload_bytes) {
  std::vector<uint8_t> ramp(payload_bytes + 256);
  for (size_t k = 0; k < ramp.size(); ++k) ramp[k] = static_cast<uint8_t>(k);
  return ramp;
}

const uint8_t* BlobOf(const std::vector<uint8_t>& ramp, uint64_t id) { return ramp.data() + (id & 255); }

struct ProduceArgs {
  std::string endpoint, producer_id;
  uint64_t count = 1000, seed = 1, id_offset = 0;
  uint32_t epoch = 0, min_len = 1, max_len = 1024, payload_bytes = 0;
  int rank = -1;
  std::string distribution = "lognormal";
  bool no_end = false;
  std::string data_plane = "auto";
  uint64_t arena_mib = 256;
  bool shuffled_ids = false;  // ids: a seeded permutation of id_offset + [0, count) (a shuffled dataset)
  bool seq = false;           // send seq = i, the sample's position (what OdbDataLoader sends)
};

int Produce(const ProduceArgs& a) {
  odb::client::ProducerOptions options;
  options.endpoint = a.endpoint;
  options.producer_id = a.producer_id;
  options.rank = a.rank;
  options.data_plane = *odb::client::ParseDataPlane(a.data_plane);  // checked by the option's validator
  options.arena_bytes = a.arena_mib << 20;
  auto producer = odb::client::Producer::Connect(options);
  if (!producer.ok()) {
    std::fprintf(stderr, "odb_synth produce: %s\n", std::string(producer.status().message()).c_str());
    return 1;
  }
  std::mt19937_64 rng(a.seed);
  std::lognormal_distribution<double> lognormal(std::log(std::max<double>(a.max_len / 8.0, 1.0)), 0.9);
  std::uniform_int_distribution<uint32_t> uniform(a.min_len, a.max_len);
  std::vector<int64_t> tokens;
  const std::vector<uint8_t> ramp = RampPattern(a.payload_bytes);
  std::vector<uint64_t> permutation;
  if (a.shuffled_ids) {
    permutation.resize(a.count);
    std::iota(permutation.begin(), permutation.end(), a.id_offset);
    std::mt19937_64 shuffle_rng(a.seed ^ 0x5eed);
    std::shuffle(permutation.begin(), permutation.end(), shuffle_rng);
  }
  for (uint64_t i = 0; i < a.count; ++i) {
    const uint64_t id = a.shuffled_ids ? permutation[i] : a.id_offset + i;
    uint32_t len;
    if (a.distribution == "uniform") {
      len = uniform(rng);
    } else {
      len = static_cast<uint32_t>(std::clamp<double>(lognormal(rng), a.min_len, a.max_len));
    }
    tokens.resize(len);
    for (uint32_t j = 0; j < len; ++j) tokens[j] = TokenValue(id, j);
    std::vector<odb::client::TensorInput> tensors = {
        {"input_ids", odb::client::DType::kInt64, {len}, tokens.data(), len * sizeof(int64_t)}};
    if (a.payload_bytes > 0) {
      tensors.push_back({"blob", odb::client::DType::kUInt8, {1, a.payload_bytes}, BlobOf(ramp, id),
                         a.payload_bytes});
    }
    const std::optional<uint64_t> seq = a.seq ? std::optional<uint64_t>(i) : std::nullopt;
    if (auto s = (*producer)->Send(id, a.epoch, {len, 0, 0, std::nullopt}, tensors, seq); !s.ok()) {
      std::fprintf(stderr, "odb_synth produce: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  if (!a.no_end) {
    if (auto s = (*producer)->EndStream(a.epoch); !s.ok()) {
      std::fprintf(stderr, "odb_synth produce: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  return 0;
}

struct ConsumeArgs {
  std::string endpoint;
  uint32_t epochs = 1, first_epoch = 0, expected_producers = 0;
  uint64_t max_tokens = 4096;
  int slow_ms = 0, timeout_ms = 60000;
  bool packed = false, quiet = false;
  // Adds "step_records" to each epoch's JSON: one [step_index, idle,
  // loss_weight, real_tokens, global_real_tokens, [lengths], [window,
  // window_steps, window_loss_tokens, closes_window, loss_tokens]] per step, in
  // arrival order, so a test can check every step across ranks.
  bool step_records = false;
  int rank = -1;  // when set, count samples whose payload came from another rank
  // "blob" payloads: compare every byte (full) or the first and last 64 bytes
  // of each sample's row (edges: catches a misplaced or misrouted payload at
  // a cost that does not grow with the payload, for benchmarks).
  std::string verify_payload = "full";
  std::string data_plane = "auto";  // ConsumerOptions::data_plane: the step arena or frames
};

// Prints one JSON object per epoch on stdout; returns non-zero on any check failure.
int Consume(const ConsumeArgs& a) {
  // Steps of big samples are tens of MiB. glibc maps every allocation over
  // its (at most 32 MiB) mmap threshold afresh, so each received step would
  // cost a page fault and a page clear per 4 KiB (more than the receive
  // itself); keeping freed memory in the heap lets the next step reuse it.
  // A trainer process can get the same with
  // GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296:glibc.malloc.arena_max=1.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_ARENA_MAX, 1);  // ZeroMQ's I/O thread allocates too; per-thread heaps are capped at 64 MiB
  odb::client::ConsumerOptions options;
  options.endpoint = a.endpoint;
  options.receive_timeout_ms = a.timeout_ms;
  options.data_plane = a.data_plane;
  auto consumer = odb::client::Consumer::Connect(options);
  if (!consumer.ok()) {
    std::fprintf(stderr, "odb_synth consume: %s\n", std::string(consumer.status().message()).c_str());
    return 1;
  }
  int failures = 0;
  auto fail = [&](const std::string& what) {
    if (failures++ < 20) std::fprintf(stderr, "odb_synth consume: CHECK FAILED: %s\n", what.c_str());
  };
  const bool full_payload = a.verify_payload == "full";
  std::vector<uint8_t> ramp;  // grows to the largest payload seen
  auto check_blob = [&](uint64_t id, const uint8_t* row, size_t n) {
    if (ramp.size() < n + 256) ramp = RampPattern(n);
    const uint8_t* want = BlobOf(ramp, id);
    const size_t edge = std::min<size_t>(n, 64);
    const bool ok = full_payload ? std::memcmp(row, want, n) == 0
                                 : std::memcmp(row, want, edge) == 0 &&
                                       std::memcmp(row + n - edge, want + n - edge, edge) == 0;
    if (!ok) fail("sample " + std::to_string(id) + " payload corrupted");
  };
  int all_rejected = 0;  // epochs whose every received sample was rejected
  for (uint32_t e = a.first_epoch; e < a.first_epoch + a.epochs; ++e) {
    if (auto s = (*consumer)->StartEpoch(e, a.expected_producers); !s.ok()) {
      std::fprintf(stderr, "odb_synth consume: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    std::map<uint64_t, int> seen;
    uint64_t steps = 0, idle = 0, real = 0, padded = 0, bytes = 0, rejections = 0, moved_in = 0;
    double weight_sum = 0;
    std::string records;  // --step-records: JSON array elements, comma-separated
    auto start = std::chrono::steady_clock::now();
    while (true) {
      auto d = (*consumer)->Next();
      if (!d.ok()) {
        std::fprintf(stderr, "odb_synth consume: %s\n", std::string(d.status().message()).c_str());
        return 3;
      }
      if (d->kind == odb::client::Delivery::Kind::kEpochEnd) {
        const auto& s = d->summary;
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        uint64_t dup = 0;
        for (auto& [id, n] : seen) dup += n > 1;
        if (s.emitted != seen.size()) fail("summary emitted " + std::to_string(s.emitted) + " != received " + std::to_string(seen.size()));
        if (s.steps != steps) fail("summary steps mismatch");
        std::printf(
            "{\"epoch\": %u, \"unique_ids\": %zu, \"duplicates\": %lu, \"steps\": %lu, \"idle_steps\": %lu, "
            "\"real_tokens\": %lu, \"padded_tokens\": %lu, \"bytes\": %lu, \"seconds\": %.4f, "
            "\"summary_received\": %lu, \"summary_emitted\": %lu, \"summary_rejected\": %lu, "
            "\"not_emitted\": %zu, \"step_rejections\": %lu, \"weight_sum\": %.6f, \"failures\": %d, "
            "\"moved_in\": %lu, \"data_plane\": \"%s\", \"rejection_codes\": [",
            e, seen.size(), dup, steps, idle, real, padded, bytes, secs, s.received, s.emitted, s.rejected,
            s.not_emitted_ids.size(), rejections, weight_sum, failures, moved_in,
            (*consumer)->data_plane().c_str());
        for (size_t i = 0; i < s.rejections.size(); ++i) {
          std::printf("%s[\"%s\", %lu]", i ? ", " : "", s.rejections[i].code.c_str(),
                      s.rejections[i].has_sample_id ? s.rejections[i].sample_id : 0ul);
        }
        std::printf("]");
        if (a.step_records) std::printf(", \"step_records\": [%s]", records.c_str());
        std::printf(", \"ids\": [");
        bool first = true;
        for (auto& [id, n] : seen) {
          std::printf("%s%lu", first ? "" : ",", id);
          first = false;
        }
        std::printf("]}\n");
        std::fflush(stdout);
        if (s.received > 0 && s.emitted == 0 && s.rejected > 0) {
          // Nothing to consume is not a success: say so, and exit non-zero.
          ++all_rejected;
          std::fprintf(stderr,
                       "odb_synth consume: epoch %u: every sample the daemon received was rejected "
                       "(%lu of %lu; codes in rejection_codes): nothing was consumed\n",
                       e, s.rejected, s.received);
        }
        break;
      }
      ++steps;
      const auto& st = d->step;
      rejections += st.rejections.size();
      weight_sum += st.loss_weight;
      if (a.step_records) {
        char head[160];
        // %.17g: the weight round-trips exactly, so the test sees the double the daemon sent.
        std::snprintf(head, sizeof(head), "%s[%lu, %s, %.17g, %lu, %lu, [", records.empty() ? "" : ", ",
                      st.step_index, st.idle ? "true" : "false", st.loss_weight, st.real_tokens,
                      st.global_real_tokens);
        records += head;
        for (size_t i = 0; i < st.lengths.size(); ++i) {
          records += (i ? "," : "") + std::to_string(st.lengths[i]);
        }
        // The accumulation window: [window, window_steps, window_loss_tokens, closes_window, loss_tokens].
        std::snprintf(head, sizeof(head), "], [%lu, %u, %lu, %s, %lu]]", st.window, st.window_steps,
                      st.window_loss_tokens, st.closes_window ? "true" : "false", st.loss_tokens);
        records += head;
      }
      if (st.idle) {
        ++idle;
        if (st.loss_weight != 0.0) fail("IDLE step with non-zero weight");
        continue;
      }
      real += st.real_tokens;
      padded += st.padded_tokens;
      if (!st.over_budget && st.padded_tokens > a.max_tokens) {
        fail("step " + std::to_string(st.step_index) + " has " + std::to_string(st.padded_tokens) +
             " padded tokens > budget " + std::to_string(a.max_tokens));
      }
      const odb::client::TensorView* ids = d->Find("input_ids");
      if (ids == nullptr) {
        fail("step without input_ids");
        continue;
      }
      bytes += ids->size_bytes;
      const odb::client::TensorView* blob = d->Find("blob");
      if (blob != nullptr && !st.sample_ids.empty()) {
        const size_t row = blob->size_bytes / st.sample_ids.size();
        for (size_t i = 0; i < st.sample_ids.size(); ++i) check_blob(st.sample_ids[i], blob->data + i * row, row);
      }
      const int64_t* v = reinterpret_cast<const int64_t*>(ids->data);
      int64_t offset = 0;
      for (size_t i = 0; i < st.sample_ids.size(); ++i) {
        const uint64_t id = st.sample_ids[i];
        ++seen[id];
        if (a.rank >= 0 && i < st.owner_ranks.size() && st.owner_ranks[i] != a.rank) ++moved_in;
        const int64_t len = st.lengths[i];
        const int64_t* row = a.packed ? v + offset : v + i * ids->shape[1];
        offset += len;
        for (int64_t j = 0; j < len; ++j) {
          if (row[j] != TokenValue(id, j)) {
            fail("sample " + std::to_string(id) + " token " + std::to_string(j) + " corrupted");
            break;
          }
        }
      }
      if (a.slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.slow_ms));
    }
  }
  if (failures > 0) return 4;
  return all_rejected > 0 ? 5 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"odb_synth: synthetic producer / verifying consumer"};
  app.require_subcommand(1);
  ProduceArgs p;
  auto* produce = app.add_subcommand("produce", "send synthetic samples");
  produce->add_option("--endpoint", p.endpoint)->required();
  produce->add_option("--producer-id", p.producer_id)->required();
  produce->add_option("--count", p.count);
  produce->add_option("--seed", p.seed);
  produce->add_option("--id-offset", p.id_offset);
  produce->add_option("--epoch", p.epoch);
  produce->add_option("--min-len", p.min_len);
  produce->add_option("--max-len", p.max_len);
  produce->add_option("--payload-bytes", p.payload_bytes, "extra uint8 tensor per sample");
  produce->add_option("--rank", p.rank);
  produce->add_option("--distribution", p.distribution, "lognormal|uniform");
  produce->add_flag("--no-end", p.no_end, "do not end the stream");
  produce->add_flag("--shuffled-ids", p.shuffled_ids, "ids: a seeded permutation of the id range");
  produce->add_flag("--seq", p.seq, "send each sample's position as its seq");
  produce->add_option("--data-plane", p.data_plane, "auto|shm|zmq (docs/shm.md)")
      ->check(CLI::IsMember({"auto", "shm", "zmq"}));
  produce->add_option("--arena-mib", p.arena_mib, "the shared-memory arena's capacity");
  ConsumeArgs c;
  auto* consume = app.add_subcommand("consume", "receive and verify steps");
  consume->add_option("--endpoint", c.endpoint)->required();
  consume->add_option("--epochs", c.epochs);
  consume->add_option("--first-epoch", c.first_epoch);
  consume->add_option("--expected-producers", c.expected_producers);
  consume->add_option("--max-tokens", c.max_tokens);
  consume->add_option("--slow-ms", c.slow_ms);
  consume->add_option("--timeout-ms", c.timeout_ms);
  consume->add_flag("--packed", c.packed);
  consume->add_flag("--step-records", c.step_records,
                    "add each step's [index, idle, weight, real, global real tokens, [lengths]] to the JSON");
  consume->add_option("--rank", c.rank, "this consumer's rank (reports moved_in)");
  consume->add_option("--data-plane", c.data_plane,
                      "auto (the daemon's step arena when offered, else frames) | shm (an arena that cannot be "
                      "mapped is an error) | zmq (frames)")
      ->check(CLI::IsMember({"auto", "shm", "zmq"}));
  consume->add_option("--verify-payload", c.verify_payload, "blob payload check: full|edges")
      ->check(CLI::IsMember({"full", "edges"}));
  CLI11_PARSE(app, argc, argv);
  if (produce->parsed()) return Produce(p);
  return Consume(c);
}
