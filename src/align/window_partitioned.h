#ifndef ODB_ALIGN_WINDOW_PARTITIONED_H_
#define ODB_ALIGN_WINDOW_PARTITIONED_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/align/planner.h"
#include "src/align/window.h"

namespace odb::align {

// Accumulation windows under partitioned planning (alignment.partition_ranks
// with optimizer.tokens_per_step; docs/alignment.md, "Windows with
// partitioned planning"). A rank sees only its block's steps, and of the
// other ranks only the world-wide loss and real token totals of each step (the
// partitioned round's totals all-gather). Windows are cut from those totals:
//
// 1. Nominal ends. The round's j-th window ends nominally at j x target loss
//    tokens from the round's start (world-wide, steps in order). The nominal
//    ends depend on the totals alone, so every rank knows them, and where an
//    end falls inside a step, at which fraction of that step's loss tokens.
// 2. Offers. At each nominal end inside a step, every rank cuts its own
//    micro-step at that shared fraction of its own loss tokens: the longest
//    prefix within its share, and the one sample after it. These (a few
//    numbers per end) are all-gathered once more, only in rounds with an end
//    inside a step.
// 3. The choice, identical on every rank (the same offers everywhere): from
//    every rank's prefix, the ranks' next samples are added smallest first
//    until the nominal end is reached, which brackets it within one sample
//    (as window.cc's BracketCuts does with every sample in view). Of the
//    nearest end under it (L, a step boundary or the bracket's lower side)
//    and over it (H), H is taken with probability (end - L) / (H - L), drawn
//    from a hash of the round's totals and offers, so each end holds its
//    nominal position in expectation. An end that makes a window more than
//    10% over the target is refused when an end under it exists. Because the
//    nominal ends are fixed, a window's error (the realised end minus the
//    nominal one, within a sample or so) is undone by the next window's:
//    errors never accumulate and the mean window over a round is the target
//    up to the last end's error.
// 4. Each rank cuts its block's micro-steps at the chosen ends (a part of a
//    micro-step is within the memory budget; a rank with nothing in a part
//    runs it IDLE), and weights every part over its window's realised total:
//    rank r's weight is W * loss_tokens_r / window_loss_tokens, the sum over
//    the window's micro-steps and all W ranks is W, exactly as window.h.
//
// Micro-step-aware ends (optimizer.window_spread > 0; window.h): every
// nominal end inside a step costs a split (the step runs as two micro-steps
// on every rank). With tol > 0 (SpreadTolerance of window.h on the round's
// world-wide sample count, loss tokens and their squares, which the totals
// all-gather carries: the tol ApplyWindows would take on the whole plan), a
// nominal end inside a step ends at a boundary of that step instead (its
// start or its end, no split, no offer) when the boundary lies within tol of
// the nominal end and the window it closes (from the previous end: a
// boundary where that one moved there, else its nominal position) stays
// within [target - tol, target + tol]; of two such boundaries the nearer,
// the one before on a tie. The nominal ends stay j x target, so the moves do
// not accumulate either: the round's windows sum to their targets up to the
// last end's error (at most tol at a boundary, about a sample at a split),
// and no window closed at a moved end leaves the band. Decided in the constructor from world-wide values
// alone, so every rank moves the same ends, before the offers. tol = 0: the ends above.
//
// Merged parts (one micro-step out of two steps' parts). A split costs every
// rank a micro-step; where a window's part of a split step and its part of the
// step next to it (in the same window) fit one micro-step on every rank, they
// run as one. The candidates are the step boundaries k | k+1 next to an
// inside end (step k or k+1 holds one): the left part is step k's last
// (after its last inside end's cut, else the whole step), the right part step
// k+1's first (up to its first inside end's cut, else the whole step). With
// its offers every rank sends one bit per candidate (MergeFits): 1 when its
// largest possible left part (the cut at its prefix) and its largest
// possible right part (the cut past its next sample) together fit the
// grouping budget (GroupTally, as the planner groups) and cost no more as one
// micro-step than as two (MicroStepCost; an empty part costs a), so a merge
// never makes a micro-step's slowest rank slower than the two it replaces.
// After the choice (identical everywhere) a boundary merges when every rank
// sent 1, the window does not close there, the parts are the ones the bits
// judged (the inside ends next to the boundary were split, not moved to a
// boundary or skipped; the realised parts are subsets of the judged ones,
// and the budget and the cost are monotone in a part's samples) and its left
// part did not merge with the boundary before it (left to right). A merged
// micro-step holds its left part's samples then its right part's, on every
// rank; it never spans two windows, so the weights, window fields and
// global real tokens are computed over the merged pieces as over any other.
// Rounds without an inside end have no candidate (and no offers all-gather).
//
// Windows smaller than a global micro-step (W = 2,560 with an 8k budget holds
// ~20M tokens a step) are several ends inside one step: every rank's share
// of each window is a part of its micro-step. The open window at the end of
// a round goes back to pending or closes short, by the rules of window.h
// (WindowState, kMaxHeldRounds), and windows depend on the round's plan
// alone, so a reproducible epoch resumed at a round cuts the same windows.
// The window state stays identical on every rank: it is updated from
// world-wide values only.

// What a rank says of its own micro-step at one nominal end inside it.
struct CutOffer {
  uint64_t loss = 0;       // loss tokens of the longest prefix within its share
  uint64_t real = 0;       // real tokens of that prefix
  uint64_t next_loss = 0;  // loss tokens of the sample after it (0: none; a sample there has > 0)
  uint64_t next_real = 0;  // its real tokens
};

// The windows of one partitioned round, cut in three stages (see above):
// construct from the world-wide totals, Offers (this rank's numbers for the
// exchange), Decide (every rank's offers), Apply (the block's steps).
class PartitionedWindows {
 public:
  // `step_loss` and `step_real`: every planned step's loss and real tokens
  // summed over all W ranks (the totals all-gather); `target`:
  // tokens_per_step (> 0); `tol`: how far an end may move to a step
  // boundary (micro-step-aware ends, above; SpreadTolerance of window.h on
  // the world-wide counts; 0: nominal ends only).
  PartitionedWindows(uint64_t target, std::vector<uint64_t> step_loss, std::vector<uint64_t> step_real,
                     size_t world, uint64_t tol = 0);

  // Nominal ends inside a step that stay there (not moved to a boundary):
  // the number of offers each rank sends. 0: no exchange is needed (every
  // end, if any, is a step boundary).
  size_t inside_ends() const { return inside_.size(); }

  // Nominal ends moved to a step boundary (micro-step-aware ends; 0 without tol).
  size_t moved_ends() const { return moved_; }

  // This rank's offers, one per inside end, from its own micro-steps
  // (`steps`: this rank's RankPlan::steps before Apply).
  std::vector<CutOffer> Offers(const std::vector<PlannedStep>& steps) const;

  // The step boundaries that may merge (Merged parts, above): one bit per
  // rank each, sent with the offers. 0 when inside_ends() is 0.
  size_t merge_candidates() const { return boundaries_.size(); }

  // Turns merges on (before MergeFits and Apply; off: every bit 0): the
  // budget and step costs, and whether samples may move to another rank of
  // their block (Planner::MovesSamples).
  void EnableMerges(const WindowBalanceConfig& config, bool move_samples);

  // The block's bits, one per candidate, from its ranks' micro-steps before
  // Apply (ranks [begin, end) of `plan`): 1 when the block's largest parts
  // either side of the boundary lay out in one micro-step within the budget
  // and no rank's cost exceeds the block's costliest left part plus its
  // costliest right part. Every rank of the block sends these bits.
  std::vector<uint8_t> MergeFits(const RoundPlan& plan, int begin, int end) const;

  // Chooses every end from all ranks' offers (`offers[r]`: rank r's, from
  // Offers; W empty lists when inside_ends() is 0) and the merges from all
  // ranks' MergeFits (`fits[r]`; empty: no merge). Identical on every rank.
  // Fails (InvalidArgument) when the offers contradict the totals (a peer
  // that planned something else) or a rank's bits are not one per candidate.
  absl::Status Decide(const std::vector<std::vector<CutOffer>>& offers,
                      const std::vector<std::vector<uint8_t>>& fits = {});

  // Cuts the steps of ranks [begin, end) of `plan` (the block; the others'
  // steps are left empty) into the round's micro-steps, sets every part's
  // loss_tokens, loss_weight and window fields, hands the samples of a window
  // that must wait back to their owners' keep_pending (owners are in the
  // block), updates `windows` and fills `global_real` (each final
  // micro-step's real tokens over all ranks). `inputs_open`: InputsOpen over
  // all W ranks (from the round summaries). Call after Decide.
  // `last_samples`: this round planned every sample the epoch has left, so
  // an open window closes short now, as at the epoch's end.
  void Apply(RoundPlan& plan, int begin, int end, grouping::CostModel model, WindowState& windows,
             bool inputs_open, bool last_samples, std::vector<uint64_t>& global_real);

  // The loss tokens of every window Apply closed in this round (world-wide),
  // short ones included (for benches and tests).
  const std::vector<uint64_t>& closed_windows() const { return closed_; }

  // The boundaries Apply merged (micro-steps saved) in this round.
  size_t merged() const { return merged_; }

 private:
  struct End {
    uint32_t step = 0;
    uint64_t offset = 0;  // world loss tokens of the step before the nominal end
    bool inside = false;  // 0 < offset < step_loss[step] and not moved: a split, with offers
    int8_t moved = 0;     // micro-step-aware: -1 ends at the step's start, +1 at its end
  };
  // A chosen end.
  enum class Kind : uint8_t { kSkip, kBefore, kAfter, kSplit };
  struct Chosen {
    Kind kind = Kind::kSkip;
    uint32_t step = 0;
    uint64_t loss = 0;          // world loss tokens of the step before it (kSplit)
    uint64_t real = 0;          // world real tokens of the step before it (kSplit)
    std::vector<uint8_t> over;  // kSplit: per rank, 1 = its prefix plus its next sample
  };

  // Rank r's largest parts either side of boundary k | k+1, appended.
  void LargestParts(const RoundPlan& plan, int r, uint32_t k, std::vector<SampleMeta>* left,
                    std::vector<SampleMeta>* right) const;
  // The block's merged micro-step at k | k+1 laid out on the largest parts,
  // one group per rank of the block (with moves: LayPart's groups, fewer
  // where it leaves ranks empty; without: each rank's own); nullopt: no
  // merge (over the budget, costlier, or an over-budget step).
  std::optional<std::vector<std::vector<SampleMeta>>> MergedLayout(const RoundPlan& plan, int begin, int end,
                                                                   uint32_t k) const;

  // Index of the longest prefix within rank's share of `offset` of step k, and
  // its offer.
  size_t PrefixAt(const PlannedStep& step, const End& e, CutOffer* offer) const;

  uint64_t target_;
  std::vector<uint64_t> step_loss_, step_real_;
  std::vector<uint64_t> step_begin_;  // world loss tokens of the round before step k
  size_t world_;
  uint64_t tol_;
  size_t moved_ = 0;
  std::vector<End> ends_;
  std::vector<size_t> inside_;  // indices into ends_ of the inside ones
  std::vector<Chosen> chosen_;  // per end
  std::vector<uint64_t> closed_;
  std::vector<uint32_t> boundaries_;             // merge candidates: k of k | k+1
  std::vector<int> first_inside_, last_inside_;  // per step: index into ends_, -1 none
  std::vector<uint8_t> merge_;                   // per candidate: every rank sent 1
  size_t merged_ = 0;
  bool merge_enabled_ = false, merge_moves_ = false;
  WindowBalanceConfig merge_config_;
  // MergeFits' layouts that fit, by (block's first rank, k), for Apply.
  mutable std::map<std::pair<int, uint32_t>, std::vector<std::vector<SampleMeta>>> layouts_;
};

// The merge bits on the wire: appended to the offers' two number lists, 32
// bits in each entry (bits [64m, 64m + 32) in loss entry m, the next 32 in
// real entry m), so both lists grow by MergeBitEntries(bits) entries.
size_t MergeBitEntries(size_t bits);
void AppendMergeBits(const std::vector<uint8_t>& bits, std::vector<uint64_t>& loss,
                     std::vector<uint64_t>& real);
// Reads `bits` bits from entries [offset, offset + MergeBitEntries(bits)) of
// both lists (which the caller checked hold them); an entry over 32 bits is
// refused (DataLoss).
absl::StatusOr<std::vector<uint8_t>> ReadMergeBits(const std::vector<uint64_t>& loss,
                                                   const std::vector<uint64_t>& real, size_t offset,
                                                   size_t bits);

// Balance over the window for a partitioned round (docs/alignment.md,
// invariant 6): after Apply, each closed window's part in the block (ranks
// [begin, end) of `plan`) is laid out again within its micro-steps: a sample
// moves only to another rank of the block in the same micro-step, so every
// micro-step's loss and real tokens over the block, hence the world-wide
// totals the blocks exchanged (the window sums, the steps' global real
// tokens), stay as they are, and no exchange is needed. Candidates:
// MoveSamples on the cut (window_balance.h: single moves off the block's
// slowest rank), and a re-layout of each micro-step's block samples (padded:
// contiguous runs of the length-sorted list, the costliest run as cheap as a
// searched cap allows; packed: longest first onto the cheapest rank; both
// within the budget; empty ranks then take halves of the costliest groups),
// its groups handed costliest first to the ranks of least cost so far in the
// window, of those the one that owns most of the group's samples, alone and
// followed by MoveSamples. MoveSamples on the cut is kept when its block's
// slowest rank over the window (time model b) is no costlier than the cut's;
// a re-layout replaces it when its (b) is no costlier than that and its
// (a) + (b) over the block is less ((a): the sum over micro-steps of the
// slowest rank's cost), or the same with fewer IDLE rank-steps. (A window
// end inside a step cuts every rank's micro-step at a shared fraction of
// its loss tokens, so a part keeps whatever lengths fell into it: one rank
// with a long sample, another with short ones or none; single moves stop as
// soon as the slowest rank holds one sample. docs/benchmarks.md,
// "Partitioned windows in the simulator".)
// Each moved part gets its real and padded tokens, loss tokens and loss
// weight (W x its loss tokens / the window's) again; the window fields stay.
// Identical on every rank of the block (a pure function of the block's plan;
// ties by sample key). A window with an over-budget step is left as cut.
// Returns whether a window changed.
bool BalanceBlockWindows(const WindowBalanceConfig& config, RoundPlan& plan, int begin, int end);

// The sum of the squares of the loss tokens of every sample in `steps`
// (saturating): a rank's entry for the world-wide tol (the totals all-gather).
uint64_t SquaredLossTokens(const std::vector<PlannedStep>& steps);

// CheckWindowTarget (window.h) on world-wide counts: `samples` planned
// samples carrying `loss` loss tokens over `world` ranks.
absl::Status CheckWindowTargetCounts(uint64_t tokens_per_step, uint64_t samples, uint64_t loss, size_t world);

}  // namespace odb::align

#endif  // ODB_ALIGN_WINDOW_PARTITIONED_H_
