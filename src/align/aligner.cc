#include "src/align/aligner.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "src/align/meta_codec.h"
#include "src/align/window.h"

namespace odb::align {

namespace {

// Errors reach the trainer through Daemon::Fail, which names the rank once
// (the fatal message's rank field, the log pattern): the aligner does not.
std::string Prefix(int /*rank*/) { return "aligner: "; }

// Every sample this rank owns must be accounted for exactly once by the plan:
// emitted (on any rank), kept pending, or reported not emitted. (Ids of one
// owner are unique, so sorting them finds a sample placed twice; cheaper per
// round than a hash set of keys.)
absl::Status CheckAccounting(const RoundPlan& plan, int me, const std::vector<SampleMeta>& pending) {
  std::vector<uint64_t> placed, kept, reported;
  placed.reserve(pending.size());
  for (const RankPlan& rp : plan.ranks) {
    for (const PlannedStep& s : rp.steps) {
      for (const SampleMeta& m : s.samples) {
        if (m.owner_rank == me) placed.push_back(m.id);
      }
    }
  }
  for (const SampleKey& k : plan.ranks[me].keep_pending) {
    if (k.owner_rank == me) kept.push_back(k.id);
  }
  for (const SampleKey& k : plan.ranks[me].not_emitted) {
    if (k.owner_rank == me) reported.push_back(k.id);
  }
  // The first id seen twice, in the order placed < kept < reported (the
  // order the checks ran in before), names the error.
  std::vector<uint64_t> all;
  all.reserve(placed.size() + kept.size() + reported.size());
  all.insert(all.end(), placed.begin(), placed.end());
  all.insert(all.end(), kept.begin(), kept.end());
  all.insert(all.end(), reported.begin(), reported.end());
  std::sort(all.begin(), all.end());
  if (auto dup = std::adjacent_find(all.begin(), all.end()); dup != all.end()) {
    auto times = [&](const std::vector<uint64_t>& ids) { return std::count(ids.begin(), ids.end(), *dup); };
    const std::string id = std::to_string(*dup);
    if (times(placed) > 1) return absl::InternalError("planner placed sample " + id + " twice");
    if (times(kept) > 0 && times(placed) + times(kept) > 1) {
      return absl::InternalError("planner kept sample " + id + " twice");
    }
    return absl::InternalError("planner reported sample " + id + " twice");
  }
  if (all.size() != pending.size()) {
    return absl::InternalError("planner accounted for " + std::to_string(all.size()) + " of " +
                               std::to_string(pending.size()) + " pending samples");
  }
  return absl::OkStatus();
}

}  // namespace

Aligner::Aligner(PeerGroup* peers, std::unique_ptr<Planner> planner, AlignerOptions options)
    : peers_(peers), planner_(std::move(planner)), options_(std::move(options)) {
  if (!options_.now) options_.now = [] { return std::chrono::steady_clock::now(); };
}

absl::Status Aligner::StartEpoch(uint32_t epoch, uint64_t first_round, uint64_t first_step) {
  if (epoch_ && !epoch_finished_) {
    return absl::FailedPreconditionError(Prefix(peers_->Rank()) + "StartEpoch(" + std::to_string(epoch) +
                                         ") while epoch " + std::to_string(*epoch_) + " is still running");
  }
  epoch_ = epoch;
  epoch_finished_ = false;
  round_ = 0;
  plan_round_ = first_round;
  next_step_ = first_step;
  wait_rounds_ = 0;
  wait_since_.reset();
  windows_ = WindowState{};
  return absl::OkStatus();
}

absl::StatusOr<RoundResult> Aligner::RunRound(const RoundInput& local) {
  const int me = peers_->Rank();
  const int world = peers_->Size();
  if (!epoch_ || epoch_finished_) {
    return absl::FailedPreconditionError(Prefix(me) + "RunRound outside a running epoch; call StartEpoch first");
  }
  if (local.epoch != *epoch_) {
    return absl::InvalidArgumentError(Prefix(me) + "round input is for epoch " + std::to_string(local.epoch) +
                                      " but epoch " + std::to_string(*epoch_) + " is running");
  }
  for (const SampleMeta& m : local.pending) {
    if (m.owner_rank != me) {
      return absl::InvalidArgumentError(Prefix(me) + "pending sample " + std::to_string(m.id) + " has owner_rank " +
                                        std::to_string(m.owner_rank));
    }
    if (m.lengths.tokens == 0) {
      return absl::InvalidArgumentError(Prefix(me) + "pending sample " + std::to_string(m.id) +
                                        " has 0 tokens; length-0 samples must be rejected at ingest");
    }
  }

  const PlannerConfig& config = planner_->config();
  RankRoundMessage msg;
  msg.epoch = *epoch_;
  msg.round = round_;
  msg.rank = me;
  msg.data.free_slots = local.free_slots;
  msg.data.input_blocked = local.input_blocked;
  // Deterministic: offer only what does not depend on timing (PlannerConfig::
  // deterministic). The first window+1 samples in list order are the same in
  // every run once the rank stops waiting; the rest stays here.
  size_t offered = local.pending.size();
  if (config.deterministic) {
    const size_t cap = static_cast<size_t>(config.window) + 1;
    offered = std::min(offered, cap);
    msg.data.pending.assign(local.pending.begin(), local.pending.begin() + offered);
    msg.data.stream_finished = local.stream_finished && offered <= config.window;
    msg.data.stream_started = true;
    msg.data.wait_rounds = 0;
    msg.data.wait_expired = false;
  } else {
    msg.data.pending = local.pending;
    msg.data.stream_finished = local.stream_finished;
    msg.data.stream_started = local.stream_started || local.stream_finished;
    msg.data.wait_rounds = wait_rounds_;
    const auto wait_bound = msg.data.stream_started ? options_.max_wait : options_.start_wait;
    msg.data.wait_expired = wait_since_ && options_.now() - *wait_since_ >= wait_bound;
  }

  RoundState state;
  state.epoch = *epoch_;
  state.round = config.deterministic ? plan_round_ : round_;
  state.first_step = next_step_;
  state.ranks.resize(world);
  if (world == 1) {
    // Alone: the all-gather would return our own message, so skip encoding
    // and decoding the metadata (a large part of a round's cost for W = 1).
    state.ranks[0] = std::move(msg.data);
  } else {
    auto gathered = peers_->AllGather(EncodeRankRound(msg));
    if (!gathered.ok()) {
      return absl::Status(gathered.status().code(), Prefix(me) + "epoch " + std::to_string(*epoch_) + " round " +
                                                        std::to_string(round_) + ": " +
                                                        std::string(gathered.status().message()));
    }
    if (static_cast<int>(gathered->size()) != world) {
      return absl::InternalError(Prefix(me) + "all-gather returned " + std::to_string(gathered->size()) +
                                 " entries for " + std::to_string(world) + " ranks");
    }
    for (int r = 0; r < world; ++r) {
      auto decoded = DecodeRankRound((*gathered)[r]);
      if (!decoded.ok()) {
        return absl::Status(decoded.status().code(), Prefix(me) + "metadata from rank " + std::to_string(r) + ": " +
                                                         std::string(decoded.status().message()));
      }
      if (decoded->rank != r || decoded->epoch != *epoch_ || decoded->round != round_) {
        return absl::FailedPreconditionError(
            Prefix(me) + "rank " + std::to_string(r) + " is out of lockstep: it sent rank " +
            std::to_string(decoded->rank) + " epoch " + std::to_string(decoded->epoch) + " round " +
            std::to_string(decoded->round) + ", this rank is at epoch " + std::to_string(*epoch_) + " round " +
            std::to_string(round_));
      }
      state.ranks[r] = std::move(decoded->data);
    }
  }
  RoundPlan plan = planner_->Plan(state);
  if (static_cast<int>(plan.ranks.size()) != world) {
    return absl::InternalError(Prefix(me) + "planner returned plans for " + std::to_string(plan.ranks.size()) +
                               " ranks");
  }
  for (const RankPlan& rp : plan.ranks) {
    if (rp.steps.size() != plan.num_steps) {
      return absl::InternalError(Prefix(me) + "planner gave a rank " + std::to_string(rp.steps.size()) +
                                 " steps instead of " + std::to_string(plan.num_steps));
    }
  }
  // Accumulation windows: identical on every rank (the same plan, the same
  // window state); may split steps, and hands an open window's samples back.
  ApplyWindows(WindowConfig{config.tokens_per_step, config.budget.model}, plan, windows_,
               InputsOpen(state, config.window));
  // What was not offered stays pending here.
  for (size_t i = offered; i < local.pending.size(); ++i) {
    plan.ranks[me].keep_pending.push_back(KeyOf(local.pending[i]));
  }
  if (absl::Status s = CheckAccounting(plan, me, local.pending); !s.ok()) {
    return absl::Status(s.code(), Prefix(me) + std::string(s.message()));
  }

  RoundResult result;
  result.epoch = *epoch_;
  result.round = round_;
  result.epoch_finished = plan.epoch_finished;
  result.waiting = plan.waiting;
  result.reason = plan.reason;
  RankPlan& mine = plan.ranks[me];
  result.steps.reserve(plan.num_steps);
  const uint64_t round_label = config.deterministic ? plan_round_ : round_;
  for (uint32_t k = 0; k < plan.num_steps; ++k) {
    PlannedStep s = mine.steps[k];
    s.step_index = next_step_ + k;
    s.round = round_label;
    s.round_first_step = next_step_;
    s.round_steps = plan.num_steps;
    for (const RankPlan& rp : plan.ranks) s.global_real_tokens += rp.steps[k].real_tokens;
    result.steps.push_back(std::move(s));
  }
  result.keep_pending = mine.keep_pending;
  result.not_emitted = mine.not_emitted;
  result.not_emitted_by_rank.resize(world);
  for (int r = 0; r < world; ++r) result.not_emitted_by_rank[r] = plan.ranks[r].not_emitted;

  // The wait budget counts consecutive waiting rounds of the whole job (the
  // same number on every rank), so a run of waiting rounds never exceeds
  // max_wait_rounds however the ranks take turns asking.
  if (plan.waiting) {
    ++wait_rounds_;
    if (!wait_since_) wait_since_ = options_.now();
  } else {
    wait_rounds_ = 0;
    wait_since_.reset();
  }
  next_step_ += plan.num_steps;
  ++round_;
  if (plan.num_steps > 0) ++plan_round_;
  if (plan.epoch_finished) epoch_finished_ = true;
  last_plan_ = std::move(plan);
  return result;
}

}  // namespace odb::align
