#ifndef ODB_DAEMON_ALIGNED_ROUND_RUNNER_H_
#define ODB_DAEMON_ALIGNED_ROUND_RUNNER_H_

#include <memory>

#include "src/align/aligner.h"
#include "src/align/peer_group.h"
#include "src/balance/phase_plan.h"
#include "src/common/clock.h"
#include "src/daemon/config.h"
#include "src/daemon/round_runner.h"

namespace odb {

// The daemon's RoundRunner over the alignment layer: one Aligner round per
// Run, translated into this rank's steps (with the all-rank token total of
// each step, read off the round's full plan, so no second exchange is needed).
class AlignedRoundRunner final : public RoundRunner {
 public:
  // `clock` (not owned; null: the steady clock) decides the round's waits:
  // pass the daemon's.
  AlignedRoundRunner(std::unique_ptr<align::PeerGroup> peers, const DaemonConfig& config,
                     const Clock* clock = nullptr);

  void StartEpoch(uint32_t epoch, uint64_t first_round, uint64_t first_step) override;
  absl::StatusOr<RoundOutcome> Run(const RoundRequest& request) override;
  bool HasPeers() const override { return peers_->Size() > 1; }
  int Rank() const override { return peers_->Rank(); }
  absl::StatusOr<std::vector<std::string>> ExchangeEndpoints(const std::string& mine) override {
    return peers_->AllGather(mine);
  }
  void ReportFailure(const std::string& cause) override { peers_->ReportFailure(cause); }

 private:
  // Per-phase plans for the round's steps (alignment.phase_plans); `plan`
  // holds every rank's steps (all num_steps of them). True when the encoder
  // planner moved LLM samples for memory (alignment.memory_llm_slack):
  // `moved_plan` is then `plan` with the moves, and this rank's `outcome`
  // steps have them too.
  bool AddPhasePlans(const align::RoundPlan& plan, RoundOutcome& outcome, align::RoundPlan& moved_plan);

  std::unique_ptr<align::PeerGroup> peers_;
  align::Aligner aligner_;
  absl::Status start_status_;
  bool phase_plans_;
  grouping::CostModel budget_model_;  // grouping.cost_model
  bool audio_phase_;  // collate.audio_fields: an audio encoder phase too
  // Each step's encoder layouts (stateful: the job's memory peak so far, the
  // same on every rank since the plans are).
  balance::EncoderStepPlanner encoder_planner_;
  // Per rank: (owner, id) of the samples it encodes (either encoder) this round.
  std::vector<std::vector<std::pair<int32_t, uint64_t>>> encoder_needs_;
};

// The encoder phases' costs and memory models, from the daemon config.
balance::EncoderPlanConfig EncoderPlanConfigFrom(const DaemonConfig& config);

// The planner configuration every rank must share, derived from the daemon config.
align::PlannerConfig PlannerConfigFrom(const DaemonConfig& config);

// The configured planner (local or global); every rank builds the same one.
std::unique_ptr<align::Planner> MakePlanner(const DaemonConfig& config);

}  // namespace odb

#endif  // ODB_DAEMON_ALIGNED_ROUND_RUNNER_H_
