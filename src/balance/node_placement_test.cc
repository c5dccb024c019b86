#include "src/balance/node_placement.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "src/align/planner.h"
#include "src/balance/global_planner.h"

namespace odb::balance {
namespace {

using Groups = std::vector<std::vector<size_t>>;

SampleMeta Meta(uint64_t id, int32_t owner, uint32_t tokens) {
  SampleMeta m;
  m.id = id;
  m.owner_rank = owner;
  m.lengths.tokens = tokens;
  m.payload_bytes = 4ull * tokens;
  return m;
}

double GroupCost(const grouping::StepTimeModel& model, const std::vector<SampleMeta>& metas,
                 const std::vector<size_t>& g) {
  uint64_t longest = 0;
  for (size_t i : g) longest = std::max<uint64_t>(longest, metas[i].lengths.tokens);
  return model.per_step + model.per_padded_token * static_cast<double>(longest * g.size());
}

double StepCost(const grouping::StepTimeModel& model, const std::vector<SampleMeta>& metas,
                const Groups& groups) {
  double c = 0.0;
  for (const auto& g : groups) c = std::max(c, GroupCost(model, metas, g));
  return c;
}

bool GroupFits(const grouping::Budget& budget, const std::vector<SampleMeta>& metas,
               const std::vector<size_t>& g) {
  std::vector<SampleLengths> lens;
  for (size_t i : g) lens.push_back(metas[i].lengths);
  return lens.size() == 1 || grouping::FitsBudget(budget, lens);
}

// Every guarantee of PlaceOnNodes against the step before it.
void RequireValid(const grouping::Budget& budget, const grouping::StepTimeModel& model,
                  const std::vector<SampleMeta>& metas, const Groups& before, const Groups& after,
                  uint32_t lws) {
  REQUIRE(after.size() == before.size());
  std::vector<int> seen(metas.size(), 0);
  for (const auto& g : after) {
    REQUIRE_FALSE(g.empty());
    REQUIRE(GroupFits(budget, metas, g));
    for (size_t i : g) ++seen[i];
  }
  std::vector<int> expected(metas.size(), 0);
  for (const auto& g : before) {
    for (size_t i : g) ++expected[i];
  }
  REQUIRE(seen == expected);  // every sample exactly once, nothing added
  REQUIRE(StepCost(model, metas, after) <= StepCost(model, metas, before));
  REQUIRE(InterNodeBytes(metas, after, lws) <= InterNodeBytes(metas, before, lws));
}

// The fewest inter-node bytes over every way to run the step's samples on its
// ranks with no empty rank, every group in the budget and no group slower
// than the step (exhaustive: ranks^samples placements).
uint64_t BruteForceMinimum(const grouping::Budget& budget, const grouping::StepTimeModel& model,
                           const std::vector<SampleMeta>& metas, const Groups& groups, uint32_t lws) {
  const double capacity = StepCost(model, metas, groups);
  std::vector<size_t> samples;
  for (const auto& g : groups) samples.insert(samples.end(), g.begin(), g.end());
  const size_t w = groups.size();
  std::vector<size_t> rank_of(samples.size(), 0);
  uint64_t best = UINT64_MAX;
  while (true) {
    Groups trial(w);
    for (size_t k = 0; k < samples.size(); ++k) trial[rank_of[k]].push_back(samples[k]);
    bool ok = true;
    for (const auto& g : trial) {
      ok = ok && !g.empty() && GroupFits(budget, metas, g) && GroupCost(model, metas, g) <= capacity;
    }
    if (ok) best = std::min(best, InterNodeBytes(metas, trial, lws));
    size_t k = 0;
    while (k < samples.size() && ++rank_of[k] == w) rank_of[k++] = 0;
    if (k == samples.size()) break;
  }
  return best;
}

TEST_CASE("a long sample and two short ones trade nodes when no single swap fits", "[node_placement]") {
  // Ranks 0, 1 on node 0 and 2, 3 on node 1. The step time is 512 + 1000:
  // a 1000-token sample runs alone, two 500-token samples fit together. Rank
  // 0 runs node 1's long sample and rank 2 node 0's two short ones; moving
  // one sample or swapping one pair breaks the step time, re-splitting the
  // three samples between the nodes costs nothing.
  const grouping::Budget budget;  // padded, 4096 tokens
  const grouping::StepTimeModel model;
  const std::vector<SampleMeta> metas = {Meta(0, 2, 1000), Meta(1, 0, 500), Meta(2, 1, 500), Meta(3, 1, 1000),
                                         Meta(4, 3, 1000)};
  Groups groups = {{0}, {3}, {1, 2}, {4}};
  const Groups before = groups;
  REQUIRE(InterNodeBytes(metas, before, 2) == 4000 + 2000 + 2000);
  const NodePlacementStats stats = PlaceOnNodes(budget, model, metas, groups, 2);
  RequireValid(budget, model, metas, before, groups, 2);
  REQUIRE(stats.inter_node_bytes_before == 8000);
  REQUIRE(stats.inter_node_bytes_after == 0);
  REQUIRE(InterNodeBytes(metas, groups, 2) == 0);
  REQUIRE(BruteForceMinimum(budget, model, metas, before, 2) == 0);
  // Node 0 runs the two 500s together and rank 1's own 1000 on rank 1;
  // node 1 the 1000s of ranks 2 and 3, each on its owner.
  REQUIRE(groups[1] == std::vector<size_t>{3});
  REQUIRE(groups[2] == std::vector<size_t>{0});
  REQUIRE(groups[3] == std::vector<size_t>{4});
}

TEST_CASE("two nodes: the re-split reaches the exhaustive minimum", "[node_placement]") {
  const grouping::StepTimeModel model;
  std::mt19937_64 rng(7);
  int improved = 0, cases = 0;
  for (int trial = 0; trial < 150; ++trial) {
    grouping::Budget budget;
    budget.max_tokens = trial % 3 == 0 ? 2048 : 4096;
    budget.max_group_size = trial % 5 == 0 ? 3 : 0;
    const uint32_t lws = trial % 2 == 0 ? 2 : 1;
    const size_t world = 2 * lws;
    const size_t n = world + rng() % (8 - world + 1);  // <= 8 samples: 4^8 placements at most
    std::vector<SampleMeta> metas;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t tokens = 50 + static_cast<uint32_t>(rng() % 1200);
      metas.push_back(Meta(i, static_cast<int32_t>(rng() % world), tokens));
    }
    // A random valid step: samples dealt to ranks, every rank non-empty.
    Groups groups(world);
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t k = 0; k < n; ++k) groups[k < world ? k : rng() % world].push_back(order[k]);
    bool fits = true;
    for (const auto& g : groups) fits = fits && GroupFits(budget, metas, g);
    if (!fits) continue;
    ++cases;
    const Groups before = groups;
    const NodePlacementStats stats = PlaceOnNodes(budget, model, metas, groups, lws);
    RequireValid(budget, model, metas, before, groups, lws);
    const uint64_t minimum = BruteForceMinimum(budget, model, metas, before, lws);
    INFO("trial " << trial);
    REQUIRE(stats.inter_node_bytes_after == InterNodeBytes(metas, groups, lws));
    REQUIRE(InterNodeBytes(metas, groups, lws) == minimum);
    improved += InterNodeBytes(metas, groups, lws) < InterNodeBytes(metas, before, lws) ? 1 : 0;
  }
  REQUIRE(cases >= 60);
  REQUIRE(improved >= 20);  // the random starts are mostly not optimal
}

TEST_CASE("three nodes: the triple re-split reaches the exhaustive minimum that pairs miss",
          "[node_placement]") {
  // Moves around a cycle (A's sample leaves B for A, A's short ones leave for
  // C, C's for B) are beyond any pair of nodes; a re-split of the three nodes
  // together finds them. One rank a node, <= 9 samples: 3^9 placements.
  const grouping::StepTimeModel model;
  std::mt19937_64 rng(23);
  int cases = 0, pairs_missed = 0;
  for (int trial = 0; trial < 150; ++trial) {
    grouping::Budget budget;
    budget.max_tokens = trial % 3 == 0 ? 2048 : 4096;
    const uint32_t lws = 1;
    const size_t world = 3;
    const size_t n = 5 + rng() % 5;
    std::vector<SampleMeta> metas;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t tokens = 50 + static_cast<uint32_t>(rng() % 1200);
      metas.push_back(Meta(i, static_cast<int32_t>(rng() % world), tokens));
    }
    Groups groups(world);
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t k = 0; k < n; ++k) groups[k < world ? k : rng() % world].push_back(order[k]);
    bool fits = true;
    for (const auto& g : groups) fits = fits && GroupFits(budget, metas, g);
    if (!fits) continue;
    ++cases;
    const Groups before = groups;
    const uint64_t minimum = BruteForceMinimum(budget, model, metas, before, lws);
    INFO("trial " << trial);
    Groups pairs_only = groups;
    NodePlacementOptions no_triples;
    no_triples.triples = false;
    PlaceOnNodes(budget, model, metas, pairs_only, lws, no_triples);
    RequireValid(budget, model, metas, before, pairs_only, lws);
    pairs_missed += InterNodeBytes(metas, pairs_only, lws) > minimum ? 1 : 0;
    const NodePlacementStats stats = PlaceOnNodes(budget, model, metas, groups, lws);
    RequireValid(budget, model, metas, before, groups, lws);
    REQUIRE(stats.inter_node_bytes_after == InterNodeBytes(metas, groups, lws));
    REQUIRE(InterNodeBytes(metas, groups, lws) == minimum);
  }
  REQUIRE(cases >= 60);
  REQUIRE(pairs_missed >= 3);  // the instances need three-node moves
}

TEST_CASE("many nodes: valid, never worse, deterministic", "[node_placement]") {
  const grouping::StepTimeModel model;
  const grouping::Budget budget;
  std::mt19937_64 rng(11);
  uint64_t total_before = 0, total_after = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const uint32_t lws = 1 + trial % 4;
    const size_t world = lws * (2 + trial % 5);
    // Groups of similar lengths, as the planner forms them.
    std::vector<SampleMeta> metas;
    Groups groups(world);
    for (size_t r = 0; r < world; ++r) {
      const uint32_t base = 60 + static_cast<uint32_t>(rng() % 1500);
      const size_t n = 1 + rng() % std::max<uint32_t>(1, 3000 / base);
      for (size_t k = 0; k < n; ++k) {
        groups[r].push_back(metas.size());
        metas.push_back(Meta(metas.size(), static_cast<int32_t>(rng() % world),
                             base - static_cast<uint32_t>(rng() % (base / 2))));
      }
    }
    for (const auto& g : groups) REQUIRE(GroupFits(budget, metas, g));
    const Groups before = groups;
    Groups again = groups;
    PlaceOnNodes(budget, model, metas, groups, lws);
    PlaceOnNodes(budget, model, metas, again, lws);
    RequireValid(budget, model, metas, before, groups, lws);
    REQUIRE(groups == again);
    total_before += InterNodeBytes(metas, before, lws);
    total_after += InterNodeBytes(metas, groups, lws);
  }
  REQUIRE(total_after < total_before);
}

TEST_CASE("one-rank nodes: the home flow brings home more than pairs and triples for the same work",
          "[node_placement]") {
  // Steps shaped like bench/real_rounds.py's (one-rank nodes, a few short
  // samples a rank, max_tokens 128, payload 8 B a token): with
  // local_world_size 1 the flow runs first and the search gets work_base
  // expansions. Against the search alone with the same work, every step
  // stays valid and deterministic, and the steps keep fewer bytes in all.
  const grouping::StepTimeModel model;
  grouping::Budget budget;
  budget.max_tokens = 128;
  std::mt19937_64 rng(29);
  uint64_t with_flow = 0, without = 0, before_total = 0;
  int flow_helped = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const size_t world = 8 + 8 * (trial % 4);
    std::vector<SampleMeta> metas;
    Groups groups(world);
    for (size_t r = 0; r < world; ++r) {
      const uint32_t longest = 1 + static_cast<uint32_t>(rng() % 32);
      const size_t n = 1 + rng() % std::min<uint32_t>(6, 128 / longest);
      for (size_t k = 0; k < n; ++k) {
        groups[r].push_back(metas.size());
        SampleMeta m = Meta(metas.size(), static_cast<int32_t>(rng() % world),
                            k == 0 ? longest : 1 + static_cast<uint32_t>(rng() % longest));
        m.payload_bytes = 8ull * m.lengths.tokens;
        metas.push_back(m);
      }
    }
    for (const auto& g : groups) REQUIRE(GroupFits(budget, metas, g));
    INFO("trial " << trial);
    const Groups before = groups;
    Groups again = groups, search = groups;
    const NodePlacementStats stats = PlaceOnNodes(budget, model, metas, groups, 1);
    PlaceOnNodes(budget, model, metas, again, 1);
    RequireValid(budget, model, metas, before, groups, 1);
    REQUIRE(groups == again);
    NodePlacementOptions search_only;
    search_only.one_rank_homes = false;
    search_only.small_step_work = search_only.work_base;  // the same work as with the flow
    PlaceOnNodes(budget, model, metas, search, 1, search_only);
    RequireValid(budget, model, metas, before, search, 1);
    flow_helped += stats.home_rounds_improved > 0 ? 1 : 0;
    before_total += InterNodeBytes(metas, before, 1);
    with_flow += InterNodeBytes(metas, groups, 1);
    without += InterNodeBytes(metas, search, 1);
  }
  INFO("bytes before " << before_total << ", search alone " << without << ", with the flow " << with_flow);

  REQUIRE(flow_helped >= 30);
  REQUIRE(with_flow < without);
}

TEST_CASE("models it cannot place exactly are left alone", "[node_placement]") {
  std::vector<SampleMeta> metas = {Meta(0, 2, 100), Meta(1, 0, 100), Meta(2, 3, 100), Meta(3, 1, 100)};
  const Groups before = {{0}, {2}, {1}, {3}};
  grouping::StepTimeModel quadratic;
  quadratic.per_len_sq = 1e-3;
  grouping::Budget packed;
  packed.model = grouping::CostModel::kPacked;
  grouping::Budget vision;
  vision.max_vision_patches = 10;
  REQUIRE_FALSE(NodePlacementApplies(grouping::Budget{}, quadratic));
  REQUIRE_FALSE(NodePlacementApplies(packed, grouping::StepTimeModel{}));
  REQUIRE_FALSE(NodePlacementApplies(vision, grouping::StepTimeModel{}));
  REQUIRE(NodePlacementApplies(grouping::Budget{}, grouping::StepTimeModel{}));
  for (const auto& [budget, model] :
       {std::pair(grouping::Budget{}, quadratic), std::pair(packed, grouping::StepTimeModel{}),
        std::pair(vision, grouping::StepTimeModel{})}) {
    Groups groups = before;
    PlaceOnNodes(budget, model, metas, groups, 2);
    REQUIRE(groups == before);
  }
  // The same step under the default model is fixed (a swap per node pair).
  Groups groups = before;
  PlaceOnNodes(grouping::Budget{}, grouping::StepTimeModel{}, metas, groups, 2);
  REQUIRE(InterNodeBytes(metas, groups, 2) == 0);
  // A partial step (an idle rank) and a single node are left alone.
  Groups partial = {{0, 2}, {}, {1}, {3}};
  const Groups partial_before = partial;
  PlaceOnNodes(grouping::Budget{}, grouping::StepTimeModel{}, metas, partial, 2);
  REQUIRE(partial == partial_before);
  Groups one_node = before;
  PlaceOnNodes(grouping::Budget{}, grouping::StepTimeModel{}, metas, one_node, 4);
  REQUIRE(one_node == before);
}

TEST_CASE("an over-budget sample stays alone and samples of no rank count as inter-node",
          "[node_placement]") {
  const grouping::Budget budget;  // 4096 tokens
  const grouping::StepTimeModel model;
  // Sample 0 (5000 tokens) fits no budget: it runs alone wherever it goes.
  std::vector<SampleMeta> metas = {Meta(0, 2, 5000), Meta(1, 0, 200), Meta(2, 0, 200),
                                   Meta(3, 1, 300),  Meta(4, 3, 300), Meta(5, 99, 100)};
  Groups groups = {{0}, {4, 5}, {1, 2}, {3}};
  const Groups before = groups;
  PlaceOnNodes(budget, model, metas, groups, 2);
  RequireValid(budget, model, metas, before, groups, 2);
  REQUIRE(InterNodeBytes(metas, groups, 2) == BruteForceMinimum(budget, model, metas, before, 2));
  REQUIRE(InterNodeBytes(metas, groups, 2) < InterNodeBytes(metas, before, 2));
}

TEST_CASE("a set that cannot beat its bytes stops where every partial split reaches them",
          "[node_placement]") {
  const grouping::Budget budget;
  const grouping::StepTimeModel model;
  // Two one-rank nodes. Rank 0 runs x (owned by rank 1, 1000 tokens, 4000
  // B); rank 1 runs three short samples it owns, each 5000 B. x can go home
  // only if a short one leaves (a group of x holds one sample within the
  // step's time, and each node has one rank), which costs more than x: the
  // placement is optimal. The DP places x first (longest): x on node 0
  // already costs the current 4000 B; x on node 1 leaves no room for the
  // next sample on node 1 and putting it on node 0 costs 5000 B. So the
  // search ends at the second sample: the m samples' set-up plus two
  // states per layer for two layers.
  std::vector<SampleMeta> metas = {Meta(0, 1, 1000), Meta(1, 1, 10), Meta(2, 1, 10), Meta(3, 1, 10)};
  for (size_t i = 1; i < metas.size(); ++i) metas[i].payload_bytes = 5000;
  Groups groups = {{0}, {1, 2, 3}};
  const Groups before = groups;
  NodePlacementOptions options;
  options.triples = false;
  const NodePlacementStats stats = PlaceOnNodes(budget, model, metas, groups, 1, options);
  REQUIRE(groups == before);
  REQUIRE(stats.pairs_tried == 1);
  REQUIRE(stats.pairs_improved == 0);
  CHECK(stats.work <= metas.size() + 2 * 2);
}

TEST_CASE("the global planner's steps on two nodes are already at the pair minimum",
          "[node_placement][global]") {
  // Two nodes of one rank: PlaceOnNodes is exact there, so on a plan that
  // went through it every step is a fixed point; a plan without it (the
  // balanced groups permuted for locality, then single moves and swaps)
  // leaves steps that one re-split improves.
  uint64_t planned_inter = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    GlobalPlannerConfig gcfg;
    gcfg.base.max_wait_rounds = 0;
    gcfg.local_world_size = 1;
    std::mt19937_64 rng(seed);
    align::RoundState st;
    st.ranks.resize(2);
    for (int32_t r = 0; r < 2; ++r) {
      for (uint64_t i = 0; i < 24; ++i) {
        // Mostly short samples with a few long ones, as chat traffic is.
        const uint32_t tokens = rng() % 5 == 0 ? 900 + static_cast<uint32_t>(rng() % 900)
                                               : 40 + static_cast<uint32_t>(rng() % 300);
        st.ranks[r].pending.push_back(Meta(i, r, tokens));
      }
      st.ranks[r].free_slots = 8;
    }
    const align::RoundPlan plan = GlobalPlanner(gcfg).Plan(st);
    REQUIRE(plan.num_steps > 0);
    for (uint32_t k = 0; k < plan.num_steps; ++k) {
      std::vector<SampleMeta> metas;
      Groups groups(2);
      for (size_t r = 0; r < 2; ++r) {
        for (const SampleMeta& m : plan.ranks[r].steps[k].samples) {
          groups[r].push_back(metas.size());
          metas.push_back(m);
        }
      }
      if (groups[0].empty() || groups[1].empty()) continue;
      planned_inter += InterNodeBytes(metas, groups, 1);
      const Groups before = groups;
      PlaceOnNodes(gcfg.base.budget, gcfg.base.step_model, metas, groups, 1);
      INFO("seed " << seed << " step " << k);
      REQUIRE(groups == before);
    }
  }
  REQUIRE(planned_inter > 0);  // the steps do move bytes: the fixed point is not trivial
}

}  // namespace
}  // namespace odb::balance
