#ifndef ODB_ALIGN_ALIGNER_H_
#define ODB_ALIGN_ALIGNER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/align/meta_codec.h"
#include "src/align/peer_group.h"
#include "src/align/planner.h"
#include "src/align/window.h"
#include "src/common/sample.h"

namespace odb::align {

struct AlignerOptions {
  // Wall-clock bound on asking rounds to wait for more samples: once this
  // rank has been waiting this long it takes part anyway (in addition to the
  // planner's max_wait_rounds). Default 2 s.
  std::chrono::milliseconds max_wait{2000};
  // The same bound for a rank whose stream has not started this epoch
  // (RoundInput::stream_started false): its workers may take seconds to
  // start, and waiting for them costs nothing (DDP cannot run ahead of a
  // rank anyway) while not waiting costs a burst of IDLE steps. Default 60 s.
  std::chrono::milliseconds start_wait{60000};
  // Clock, injectable for tests. Default steady_clock::now.
  std::function<std::chrono::steady_clock::time_point()> now;
};

// What the daemon hands in each round.
struct RoundInput {
  uint32_t epoch = 0;
  // Every sample of the epoch this rank holds and has not emitted, in a stable
  // order (arrival). owner_rank must be this rank; tokens > 0 (the daemon
  // rejects length-0 samples at ingest); ids unique.
  std::vector<SampleMeta> pending;
  // Steps the emitter can accept right now (credit window minus queued).
  uint32_t free_slots = 0;
  // No further sample of this epoch will arrive at this rank.
  bool stream_finished = false;
  // A sample or the end of the stream of this epoch has reached this rank.
  bool stream_started = true;
  // The daemon's buffer is full: no input is read until steps go out.
  bool input_blocked = false;
};

struct RoundResult {
  uint32_t epoch = 0;
  uint64_t round = 0;
  std::vector<PlannedStep> steps;  // same count on every rank (may be 0), step_index and round set
  bool epoch_finished = false;  // after these steps; call StartEpoch next
  bool waiting = false;         // no steps because a rank waits for samples
  std::string reason;           // why the round has its step count (for logs)
  // Samples of this rank that stay pending: offer them again next round.
  std::vector<SampleKey> keep_pending;
  // Non-Join closing round: this rank's samples the epoch never emits, and
  // the same report for every rank (index = rank; in a partitioned round
  // only this rank's entry is filled: other ranks' samples never reach it). Samples of this epoch that
  // arrive after the closing round are also not emitted: the daemon reports
  // them itself.
  std::vector<SampleKey> not_emitted;
  std::vector<std::vector<SampleKey>> not_emitted_by_rank;
};

// The DGAP stage: once per round, all-gathers every rank's pending metadata
// over the PeerGroup, runs the deterministic Planner on the identical gathered
// state, and returns this rank's share of the plan. With a partitioned planner
// (Planner::BlockRanks < W) a round is three collectives instead: a world-wide
// all-gather of every rank's RankSummary (a few dozen bytes: the round gates
// and T), an all-gather of the full metadata within the rank's block only (a
// PeerGroup::Split sub-group, made at the first such round), and a world-wide
// all-gather of every rank's per-step loss and real token counts (the same
// size from every rank, so the peer group's slot fits them), so that loss weights are normalised over all W
// ranks exactly as the unpartitioned plan's are. With accumulation windows (tokens_per_step) a round with a
// window end inside a step adds a fourth, world-wide: every rank's cut at each such end
// (window_partitioned.h). Payload moves stay in the block. RunRound is collective: every rank calls it the
// same number of times per epoch (one call = one round), so the daemon must call it at a steady pace even
// with nothing to do (e.g. whenever a slot frees or a tick passes). Not thread-safe; one caller.
class Aligner {
 public:
  Aligner(PeerGroup* peers, std::unique_ptr<Planner> planner, AlignerOptions options = {});
  Aligner(const Aligner&) = delete;
  Aligner& operator=(const Aligner&) = delete;

  // Begins `epoch` (rounds and step indices restart at 0, or at first_round
  // and first_step: a deterministic epoch resumed at one of its rounds, see
  // docs/resume.md). Fails if the previous epoch was started and has not
  // finished.
  absl::Status StartEpoch(uint32_t epoch, uint64_t first_round = 0, uint64_t first_step = 0);

  absl::StatusOr<RoundResult> RunRound(const RoundInput& local);

  // Bytes this rank's last round received from its collectives (all of them).
  uint64_t last_round_received_bytes() const { return last_received_bytes_; }

  // The full plan of the last round (every rank's steps), for diagnostics.
  // In a partitioned round only the RankPlans of this rank's block are
  // filled (the other blocks' windows never reach this rank).
  const RoundPlan& last_plan() const { return last_plan_; }
  const Planner& planner() const { return *planner_; }
  PeerGroup& peers() { return *peers_; }

 private:
  // The partitioned round (see the class comment): fills `plan` (every rank's
  // RankPlan, the block's filled, weights exact) and each step's real tokens
  // over all ranks.
  absl::Status PartitionedRound(const RankRoundMessage& msg, size_t block, RoundPlan& plan,
                                std::vector<uint64_t>& global_real);
  // Its accumulation windows (window_partitioned.h): ranks [begin, end) are
  // the block, `loss_total` and `global_real` each step's totals over all
  // ranks (the latter replaced by each final micro-step's), `planned` the
  // samples in all ranks' steps, `planned_sq` the sum of the squares of
  // their loss tokens (saturating; 0 without optimizer.window_spread).
  absl::Status PartitionedWindowRound(const BlockRoundState& bs, int begin, int end,
                                      const std::vector<uint64_t>& loss_total, uint64_t planned,
                                      uint64_t planned_sq, RoundPlan& plan,
                                      std::vector<uint64_t>& global_real);

  PeerGroup* peers_;
  std::unique_ptr<PeerGroup> block_peers_;  // this rank's block (partitioned rounds)
  uint64_t last_received_bytes_ = 0;
  std::unique_ptr<Planner> planner_;
  AlignerOptions options_;
  std::optional<uint32_t> epoch_;
  bool epoch_finished_ = false;
  uint64_t round_ = 0;       // every round (the lockstep check)
  uint64_t plan_round_ = 0;  // rounds that planned steps, from first_round (deterministic seeds)
  uint64_t next_step_ = 0;
  uint32_t wait_rounds_ = 0;
  WindowState windows_;
  std::optional<std::chrono::steady_clock::time_point> wait_since_;
  RoundPlan last_plan_;
};

}  // namespace odb::align

#endif  // ODB_ALIGN_ALIGNER_H_
