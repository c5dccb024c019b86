#include "src/align/aligner.h"

#include <algorithm>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "src/align/meta_codec.h"
#include "src/align/window.h"
#include "src/align/window_partitioned.h"

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

  RoundPlan plan;
  std::vector<uint64_t> global_real;  // each step's real tokens over all ranks
  last_received_bytes_ = 0;
  const size_t block = planner_->BlockRanks(static_cast<size_t>(world));
  if (world > 1 && block < static_cast<size_t>(world)) {
    if (absl::Status s = PartitionedRound(msg, block, plan, global_real); !s.ok()) return s;
  } else {
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
      for (const std::string& g : *gathered) last_received_bytes_ += g.size();
      for (int r = 0; r < world; ++r) {
        auto decoded = DecodeRankRound((*gathered)[r]);
        if (!decoded.ok()) {
          return absl::Status(decoded.status().code(), Prefix(me) + "metadata from rank " + std::to_string(r) +
                                                           ": " + std::string(decoded.status().message()));
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
    plan = planner_->Plan(state);
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
    // Before the epoch's first window: a target below one sample is a mistake
    // (the same plan, so every rank fails alike).
    if (windows_.next_window == 0) {
      if (absl::Status s = CheckWindowTarget(config.tokens_per_step, plan); !s.ok()) {
        return absl::Status(
            s.code(), Prefix(me) + "epoch " + std::to_string(*epoch_) + ": " + std::string(s.message()));
      }
    }
    // Accumulation windows: identical on every rank (the same plan, the same
    // window state); may split steps, and hands an open window's samples back.
    WindowConfig window_config{config.tokens_per_step, config.budget.model};
    window_config.spread = config.window_spread;
    if (planner_->MovesSamples())
      window_config.balance = WindowBalanceConfig{config.budget, config.step_model};
    ApplyWindows(window_config, plan, windows_, InputsOpen(state, config.window));
    global_real.assign(plan.num_steps, 0);
    for (const RankPlan& rp : plan.ranks) {
      for (uint32_t k = 0; k < plan.num_steps; ++k) global_real[k] += rp.steps[k].real_tokens;
    }
  }
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
    s.global_real_tokens = global_real[k];
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

absl::Status Aligner::PartitionedRound(const RankRoundMessage& msg, size_t block, RoundPlan& plan,
                                       std::vector<uint64_t>& global_real) {
  const int me = peers_->Rank();
  const int world = peers_->Size();
  const PlannerConfig& config = planner_->config();
  const std::string where =
      Prefix(me) + "epoch " + std::to_string(*epoch_) + " round " + std::to_string(round_) + ": ";
  const auto begin = static_cast<int>(static_cast<size_t>(me) / block * block);
  const int end = std::min(world, begin + static_cast<int>(block));
  if (!block_peers_) {
    // Collective over the world: every rank reaches its first partitioned
    // round at the same collective (the same config, the same rounds).
    auto split = peers_->Split(me / static_cast<int>(block));
    if (!split.ok()) {
      return absl::Status(split.status().code(),
                          where + "making the block's peer group: " + std::string(split.status().message()));
    }
    if ((*split)->Size() != end - begin || (*split)->Rank() != me - begin) {
      return absl::InternalError(where + "the block's peer group has rank " + std::to_string((*split)->Rank()) +
                                 " of " + std::to_string((*split)->Size()) + "; expected " +
                                 std::to_string(me - begin) + " of " + std::to_string(end - begin));
    }
    block_peers_ = std::move(*split);
  }
  auto failed = [&](const absl::Status& s, const std::string& what) {
    return absl::Status(s.code(), where + what + ": " + std::string(s.message()));
  };

  // 1. Every rank's summary, world-wide: the gates and T.
  BlockRoundState bs;
  bs.epoch = *epoch_;
  bs.round = config.deterministic ? plan_round_ : round_;
  bs.first_step = next_step_;
  bs.begin = begin;
  {
    const RankSummary mine = SummaryOf(msg.data, planner_->GroupBound(msg.data));
    auto gathered = peers_->AllGather(EncodeRoundSummary(*epoch_, round_, me, mine));
    if (!gathered.ok()) return failed(gathered.status(), "summary all-gather");
    if (static_cast<int>(gathered->size()) != world) {
      return absl::InternalError(where + "summary all-gather returned " + std::to_string(gathered->size()) +
                                 " entries for " + std::to_string(world) + " ranks");
    }
    bs.summaries.resize(world);
    for (int r = 0; r < world; ++r) {
      const std::string& g = (*gathered)[r];
      last_received_bytes_ += g.size();
      uint32_t epoch = 0;
      uint64_t round = 0;
      int32_t rank = 0;
      auto decoded = DecodeRoundSummary(g, epoch, round, rank);
      if (!decoded.ok()) return failed(decoded.status(), "round summary from rank " + std::to_string(r));
      bs.summaries[r] = *decoded;
      if (rank != r || epoch != *epoch_ || round != round_) {
        return absl::FailedPreconditionError(
            where + "rank " + std::to_string(r) + " is out of lockstep: it sent rank " + std::to_string(rank) +
            " epoch " + std::to_string(epoch) + " round " + std::to_string(round) + " (a round summary)");
      }
    }
  }
  // A gated round (end of epoch, waits, credit; the gates every planner
  // applies first) plans nothing: the block's metadata is not needed.
  uint32_t min_free = 0;
  if (auto gated = ApplyRoundGates(config, bs.summaries, min_free)) {
    plan = std::move(*gated);
    FillGatedLists(config, std::span<const RankRound>(&msg.data, 1), me, plan);
    return absl::OkStatus();
  }

  // 2. The block's metadata, within the block.
  {
    auto gathered = block_peers_->AllGather(EncodeRankRound(msg));
    if (!gathered.ok()) return failed(gathered.status(), "block all-gather");
    if (static_cast<int>(gathered->size()) != end - begin) {
      return absl::InternalError(where + "block all-gather returned " + std::to_string(gathered->size()) +
                                 " entries for " + std::to_string(end - begin) + " ranks");
    }
    bs.ranks.resize(end - begin);
    for (int i = 0; i < end - begin; ++i) {
      const int r = begin + i;
      last_received_bytes_ += (*gathered)[i].size();
      auto decoded = DecodeRankRound((*gathered)[i]);
      if (!decoded.ok()) return failed(decoded.status(), "metadata from rank " + std::to_string(r));
      if (decoded->rank != r || decoded->epoch != *epoch_ || decoded->round != round_) {
        return absl::FailedPreconditionError(
            where + "rank " + std::to_string(r) + " is out of lockstep: it sent rank " +
            std::to_string(decoded->rank) + " epoch " + std::to_string(decoded->epoch) + " round " +
            std::to_string(decoded->round) + " (block metadata)");
      }
      bs.ranks[i] = std::move(decoded->data);
    }
  }
  plan = planner_->PlanBlock(bs);
  if (static_cast<int>(plan.ranks.size()) != world) {
    return absl::InternalError(where + "planner returned plans for " + std::to_string(plan.ranks.size()) +
                               " ranks");
  }
  for (int r = begin; r < end; ++r) {
    if (plan.ranks[r].steps.size() != plan.num_steps) {
      return absl::InternalError(where + "planner gave rank " + std::to_string(r) + " " +
                                 std::to_string(plan.ranks[r].steps.size()) + " steps instead of " +
                                 std::to_string(plan.num_steps));
    }
  }
  const uint32_t t = plan.num_steps;
  if (t == 0) return absl::OkStatus();

  // 3. Every rank's per-step totals, world-wide. Each rank sends its own
  // (a few bytes per step, about the same size on every rank), not one per block: a
  // collective in which a few ranks send and the rest nothing cannot fit the
  // peer group's slot (sized to a few times the mean message) and would pay
  // a second all-gather every round. The sums are integers, so every rank
  // gets the same totals whoever adds them.
  std::vector<uint64_t> loss(t, 0), real(t, 0);
  uint64_t planned = 0;  // samples in this rank's steps
  for (uint32_t k = 0; k < t; ++k) {
    const PlannedStep& s = plan.ranks[me].steps[k];
    for (const SampleMeta& m : s.samples) loss[k] += LossTokensOf(m);
    real[k] = s.real_tokens;
    planned += s.samples.size();
  }
  // With accumulation windows, one more entry: the count of samples this
  // rank's steps hold (the window target check, and whether the round planned
  // every sample the epoch has left: see PartitionedWindowRound), and with
  // optimizer.window_spread the sum of the squares of their loss tokens
  // (saturating; with the counts and the loss totals, every rank takes the
  // same tol of micro-step-aware ends: window_partitioned.h). A rank that
  // sends 0 there adds nothing: the sums of squares then fall short and the
  // tol with them (to 0 where every rank sends 0), identically everywhere.
  const bool windowed = config.tokens_per_step != 0;
  if (windowed) {
    loss.push_back(planned);
    real.push_back(config.window_spread > 0.0 ? SquaredLossTokens(plan.ranks[me].steps) : 0);
  }
  auto gathered = peers_->AllGather(EncodeRankTotals(*epoch_, round_, me, loss, real));
  if (!gathered.ok()) return failed(gathered.status(), "token totals all-gather");
  if (static_cast<int>(gathered->size()) != world) {
    return absl::InternalError(where + "token totals all-gather returned " + std::to_string(gathered->size()) +
                               " entries for " + std::to_string(world) + " ranks");
  }
  std::vector<uint64_t> loss_total(t, 0);
  global_real.assign(t, 0);
  uint64_t planned_total = 0, planned_sq = 0;
  for (int r = 0; r < world; ++r) {
    const std::string& g = (*gathered)[r];
    last_received_bytes_ += g.size();
    auto totals = DecodeRankTotals(g);
    if (!totals.ok()) return failed(totals.status(), "token totals of rank " + std::to_string(r));
    if (totals->epoch != *epoch_ || totals->round != round_ || totals->rank != r ||
        totals->loss.size() != loss.size()) {
      return absl::FailedPreconditionError(
          where + "token totals of rank " + std::to_string(r) + " do not match this round (it sent rank " +
          std::to_string(totals->rank) + " epoch " + std::to_string(totals->epoch) + " round " +
          std::to_string(totals->round) + " and planned " + std::to_string(totals->loss.size()) +
          " steps, this rank " + std::to_string(t) + ")");
    }
    for (uint32_t k = 0; k < t; ++k) {
      loss_total[k] += totals->loss[k];
      global_real[k] += totals->real[k];
    }
    if (windowed) {
      planned_total += totals->loss[t];
      planned_sq = SaturatingAdd(planned_sq, totals->real[t]);
    }
  }
  if (windowed) {
    return PartitionedWindowRound(bs, begin, end, loss_total, planned_total, planned_sq, plan, global_real);
  }
  // Exact weights: what ApplyWindows gives the whole plan with every step its
  // own window (w_r = W * t_r / sum over all W ranks), the same expression.
  const double w = static_cast<double>(world);
  for (int r = begin; r < end; ++r) {
    for (uint32_t k = 0; k < t; ++k) {
      PlannedStep& s = plan.ranks[r].steps[k];
      s.loss_tokens = 0;
      for (const SampleMeta& m : s.samples) s.loss_tokens += LossTokensOf(m);
      s.window = windows_.next_window + k;
      s.window_steps = 1;
      s.window_loss_tokens = loss_total[k];
      s.closes_window = true;
      s.window_short = false;
      s.window_target = 0;
      s.loss_weight = (s.idle || loss_total[k] == 0)
                          ? 0.0
                          : w * static_cast<double>(s.loss_tokens) / static_cast<double>(loss_total[k]);
    }
  }
  windows_.next_window += t;
  windows_.held_rounds = 0;
  windows_.held_tokens = 0;
  return absl::OkStatus();
}

absl::Status Aligner::PartitionedWindowRound(const BlockRoundState& bs, int begin, int end,
                                             const std::vector<uint64_t>& loss_total, uint64_t planned,
                                             uint64_t planned_sq, RoundPlan& plan,
                                             std::vector<uint64_t>& global_real) {
  const int me = peers_->Rank();
  const int world = peers_->Size();
  const PlannerConfig& config = planner_->config();
  const std::string where =
      Prefix(me) + "epoch " + std::to_string(*epoch_) + " round " + std::to_string(round_) + ": ";
  uint64_t total = 0;
  for (uint64_t l : loss_total) total += l;
  // Micro-step-aware ends: the tol ApplyWindows would take on the whole
  // plan, from the world-wide counts (identical on every rank).
  const uint64_t tol =
      SpreadTolerance(planned, total, planned_sq, config.tokens_per_step, config.window_spread);
  PartitionedWindows cut(config.tokens_per_step, loss_total, global_real, static_cast<size_t>(world), tol);
  cut.EnableMerges(WindowBalanceConfig{config.budget, config.step_model}, planner_->MovesSamples());
  std::vector<std::vector<CutOffer>> offers(static_cast<size_t>(world));
  std::vector<std::vector<uint8_t>> fits;  // per rank: its merge bits (none without offers)
  // Before the epoch's first window: a target below one sample is a mistake
  // (CheckWindowTarget), judged on the world's planned samples.
  if (windows_.next_window == 0) {
    if (absl::Status s = CheckWindowTargetCounts(config.tokens_per_step, planned, total, world); !s.ok()) {
      return absl::Status(s.code(),
                          Prefix(me) + "epoch " + std::to_string(*epoch_) + ": " + std::string(s.message()));
    }
  }
  if (cut.inside_ends() > 0) {
    // 4. The window ends' offers, world-wide, only in rounds with an end
    // inside a step. Carried as token totals: loss tokens (the prefix's,
    // the next sample's) in one list, real tokens in the other, two per end;
    // then this rank's merge bits, one per candidate boundary, 32 in an
    // entry of each list (window_partitioned.h, "Merged parts").
    const std::vector<CutOffer> mine = cut.Offers(plan.ranks[me].steps);
    const size_t bits = cut.merge_candidates();
    std::vector<uint64_t> loss, real;
    loss.reserve(2 * mine.size() + MergeBitEntries(bits));
    real.reserve(2 * mine.size() + MergeBitEntries(bits));
    for (const CutOffer& o : mine) {
      loss.insert(loss.end(), {o.loss, o.next_loss});
      real.insert(real.end(), {o.real, o.next_real});
    }
    AppendMergeBits(cut.MergeFits(plan, begin, end), loss, real);
    fits.resize(static_cast<size_t>(world));
    auto gathered = peers_->AllGather(EncodeRankTotals(*epoch_, round_, me, loss, real));
    if (!gathered.ok()) {
      return absl::Status(gathered.status().code(),
                          where + "window ends all-gather: " + std::string(gathered.status().message()));
    }
    if (static_cast<int>(gathered->size()) != world) {
      return absl::InternalError(where + "window ends all-gather returned " +
                                 std::to_string(gathered->size()) + " entries for " + std::to_string(world) +
                                 " ranks");
    }
    for (int r = 0; r < world; ++r) {
      const std::string& g = (*gathered)[r];
      last_received_bytes_ += g.size();
      auto got = DecodeRankTotals(g);
      if (!got.ok()) {
        return absl::Status(got.status().code(), where + "window ends of rank " + std::to_string(r) + ": " +
                                                     std::string(got.status().message()));
      }
      if (got->epoch != *epoch_ || got->round != round_ || got->rank != r ||
          got->loss.size() != loss.size()) {
        return absl::FailedPreconditionError(
            where + "window ends of rank " + std::to_string(r) + " do not match this round (it sent rank " +
            std::to_string(got->rank) + " epoch " + std::to_string(got->epoch) + " round " +
            std::to_string(got->round) + " and " + std::to_string(got->loss.size()) + " numbers, this rank " +
            std::to_string(loss.size()) + ")");
      }
      std::vector<CutOffer>& o = offers[r];
      o.resize(cut.inside_ends());
      for (size_t i = 0; i < o.size(); ++i) {
        o[i] = CutOffer{got->loss[2 * i], got->real[2 * i], got->loss[2 * i + 1], got->real[2 * i + 1]};
      }
      auto rank_bits = ReadMergeBits(got->loss, got->real, 2 * o.size(), bits);
      if (!rank_bits.ok()) {
        return absl::Status(rank_bits.status().code(), where + "window ends of rank " + std::to_string(r) +
                                                           ": " + std::string(rank_bits.status().message()));
      }
      fits[r] = *std::move(rank_bits);
    }
  }
  if (absl::Status s = cut.Decide(offers, fits); !s.ok()) {
    return absl::Status(s.code(), where + std::string(s.message()));
  }
  // InputsOpen (window.h) on the round summaries: some rank's stream is open,
  // its buffer has room and its planner window is not full. And whether this
  // round planned every sample the epoch has left (every stream finished,
  // as many samples planned as were pending world-wide): its open window is
  // then the epoch's last and closes short now. (A draining round's T counts
  // each finished rank's own groups, GlobalPlanner::GroupBound, and plans
  // what is left in one round unless the credit, the planner window or a
  // block that pools into more groups than its ranks' counts stop it; a
  // round that leaves samples holds its tail, which grows with them next
  // round.)
  bool inputs_open = false, all_finished = true;
  uint64_t pending = 0;
  for (const RankSummary& r : bs.summaries) {
    inputs_open = inputs_open || (!r.stream_finished && !r.input_blocked &&
                                  (config.window == 0 || r.pending < config.window));
    all_finished = all_finished && r.stream_finished;
    pending += r.pending;
  }
  cut.Apply(plan, begin, end, config.budget.model, windows_, inputs_open, all_finished && planned == pending,
            global_real);
  // Balance over the window, within the block's micro-steps (the world-wide
  // totals above stay; window_partitioned.h).
  if (planner_->MovesSamples()) {
    BalanceBlockWindows(WindowBalanceConfig{config.budget, config.step_model}, plan, begin, end);
  }
  return absl::OkStatus();
}

}  // namespace odb::align
