// The daemon's round runner with alignment.partition_ranks over threaded fake
// ranks: MakePlanner wires the knob through, steps, payload moves and (with
// phase_plans) encoder routes stay within the block, and the weights of every
// step sum to W over all ranks.
#include "src/daemon/aligned_round_runner.h"

#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "src/align/fake_peer_group.h"

namespace odb {
namespace {

// Hands a FakeWorld rank (owned by the world) to a runner that owns its peers.
class Borrowed final : public align::PeerGroup {
 public:
  explicit Borrowed(align::PeerGroup* p) : p_(p) {}
  int Rank() const override { return p_->Rank(); }
  int Size() const override { return p_->Size(); }
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view bytes) override { return p_->AllGather(bytes); }
  absl::StatusOr<std::unique_ptr<align::PeerGroup>> Split(int color) override { return p_->Split(color); }

 private:
  align::PeerGroup* p_;
};

struct RankRun {
  absl::Status status;
  std::vector<StepPlan> steps;
  std::set<std::pair<int, int>> moves;  // (from, to)
};

void RunPartitioned(const std::string& yaml) {
  constexpr int kWorld = 4;
  auto config = ParseConfig(yaml);
  REQUIRE(config.ok());
  REQUIRE(MakePlanner(*config)->Name().find("partition_ranks=2") != std::string::npos);
  align::FakeWorld fake(kWorld, std::chrono::seconds(30));
  std::vector<RankRun> runs(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      AlignedRoundRunner runner(std::make_unique<Borrowed>(fake.Rank(r)), *config);
      runner.StartEpoch(0, 0, 0);
      std::mt19937_64 rng(17 + r);
      std::vector<SampleMeta> pending;
      for (uint64_t i = 0; i < (r == 3 ? 0u : 30u + 20u * r); ++i) {
        SampleMeta m;
        m.id = i;
        m.owner_rank = r;
        m.lengths.tokens = static_cast<uint32_t>(1 + rng() % 900);
        m.lengths.vision_patches = static_cast<uint32_t>(rng() % 64);
        pending.push_back(m);
      }
      for (int round = 0; round < 500; ++round) {
        RoundRequest req;
        req.pending = pending;
        req.free_slots = 64;
        req.stream_finished = true;
        auto out = runner.Run(req);
        if (!out.ok()) {
          runs[r].status = out.status();
          return;
        }
        std::set<uint64_t> gone;
        for (const StepPlan& s : out->steps) {
          runs[r].steps.push_back(s);
          for (size_t i = 0; i < s.sample_ids.size(); ++i) {
            if (s.sample_owners[i] == r) gone.insert(s.sample_ids[i]);
          }
        }
        for (const auto& [to, ids] : out->outgoing) {
          runs[r].moves.insert({r, to});
          gone.insert(ids.begin(), ids.end());
        }
        std::erase_if(pending, [&](const SampleMeta& m) { return gone.count(m.id) > 0; });
        if (out->epoch_finished) return;
      }
      runs[r].status = absl::DeadlineExceededError("the epoch did not finish");
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::pair<int, uint64_t>> emitted;
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << runs[r].status.ToString());
    REQUIRE(runs[r].status.ok());
    REQUIRE(runs[r].steps.size() == runs[0].steps.size());
    for (const auto& [from, to] : runs[r].moves) REQUIRE(from / 2 == to / 2);
    for (const StepPlan& s : runs[r].steps) {
      for (size_t i = 0; i < s.sample_ids.size(); ++i) {
        REQUIRE(s.sample_owners[i] / 2 == r / 2);
        REQUIRE(emitted.insert({s.sample_owners[i], s.sample_ids[i]}).second);
      }
      for (int32_t owner : s.phase(EncoderPhase::kVision).owners) REQUIRE(owner / 2 == r / 2);
      for (int32_t dest : s.phase(EncoderPhase::kVision).dest_rank) REQUIRE(dest / 2 == r / 2);
    }
  }
  REQUIRE(emitted.size() == 30 + 50 + 70);  // Join: every sample once
  REQUIRE(!runs[0].steps.empty());
  for (size_t k = 0; k < runs[0].steps.size(); ++k) {
    double sum = 0;
    for (int r = 0; r < kWorld; ++r) sum += runs[r].steps[k].loss_weight;
    REQUIRE(sum == Approx(kWorld).epsilon(1e-12));
  }
  // The empty rank 3 trains samples of its block-mate.
  size_t rank3 = 0;
  for (const StepPlan& s : runs[3].steps) rank3 += s.sample_ids.size();
  REQUIRE(rank3 > 0);
}

TEST_CASE("partitioned rounds through the daemon's runner keep samples in their block", "[partition]") {
  RunPartitioned("local_world_size: 1\ngrouping: {window: 64}\nalignment: {planner: global, partition_ranks: 2}\n");
}

TEST_CASE("partitioned rounds with per-phase plans route encoders within the block", "[partition]") {
  RunPartitioned(
      "local_world_size: 1\ngrouping: {window: 64}\ncollate: {encoder_fields: [pixel_values]}\n"
      "alignment: {planner: global, partition_ranks: 2, phase_plans: true}\n");
}

}  // namespace
}  // namespace odb
