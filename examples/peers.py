"""What users run instead of odb: four batching methods of other projects, reimplemented here from
their published descriptions (no code of theirs), for examples/train_demo.py --methods.

Each method turns one epoch's training ids into a *plan*: a list of optimizer steps, each a list
over the ranks of that rank's micro-batches (lists of sample ids). Every rank computes the whole
plan from the same seed and takes its own part, as the samplers below do in their projects (the
same random stream on every rank; no collective is needed to agree on it). The demo runs the plan
with gradient accumulation (DDP no_sync on every micro-batch of an optimizer step but the last)
and the loss of each optimizer step the mean over all of its loss tokens on all ranks.

Methods (the memory budget `max_tokens` per rank and micro-batch is odb's: padded tokens for the
padded layout, real tokens for the packed one):
  length_grouped  Hugging Face Trainer `group_by_length` (`LengthGroupedSampler`,
                  `get_length_grouped_indices`): a random permutation cut into megabatches of
                  50 x the per-device batch x gradient accumulation (fewer when the data is small),
                  each sorted by length, longest first; the longest sample's megabatch goes first (to
                  run out of memory early). Accelerate deals the batches round-robin to the ranks.
                  Padded to each micro-batch's longest; the same fixed batch size as Standard.
  packed          Padding-free packing (Hugging Face `DataCollatorWithFlattening`; Kundu et al.,
                  "Enhancing training efficiency using packing with flash attention", 2024): the
                  same samples per optimizer step and rank as Standard, concatenated into rows with
                  cu_seqlens (attention restricted per sequence), a new row whenever the next sample
                  would pass the budget. Ranks are not balanced: each packs its own share.
  bucketing       lhotse `DynamicBucketingSampler` (`max_duration`, `num_buckets`, `sync_buckets`):
                  bucket boundaries with equal total tokens per bucket (lhotse's duration bins),
                  every rank's samples in its own buckets; at each micro-step the ranks draw the
                  same bucket from a shared random stream (sync_buckets) and each takes a batch from
                  it, as many as fit the padded budget. The optimizer batch (a token-budget sampler
                  has none) is a window of the same loss tokens as odb's: micro-steps accumulate
                  until the job's tokens pass the next multiple of the window. At the end, what is
                  left in partial buckets is batched per rank; a rank with fewer batches runs IDLE
                  micro-steps.
  kk_balanced     verl `seqlen_balancing` (`get_seqlen_balanced_partitions`, `rearrange_micro_batches`,
                  the trainer's `_balance_batch`; Megatron-Core's per-global-batch rebalancing is the
                  same idea): Standard's global batch (the same samples per optimizer step) split
                  over the ranks into equal-size parts by Karmarkar-Karp's largest differencing
                  method on the workload estimate a*s + s^2 (verl: a = 24576 = 6 x hidden for a
                  7B model; here a = 6 x d_model), then each rank's part into the same number of
                  micro-batches (the maximum over the ranks, verl's all-reduce MAX), the fewest
                  under the token cap, again by Karmarkar-Karp on tokens. Packed rows (verl's
                  `use_remove_padding`), the cap in real tokens.
"""
from __future__ import annotations

import heapq
import math
from typing import List, Sequence

import numpy as np
import torch

Plan = List[List[List[List[int]]]]  # [optimizer step][rank][micro-batch] -> sample ids

PADDED_METHODS = ("length_grouped", "bucketing")
PACKED_METHODS = ("packed", "kk_balanced")


def epoch_permutation(ids: Sequence[int], seed: int, epoch: int) -> List[int]:
    """The epoch's random order of `ids`, Standard's (train_demo.ShardSampler: torch.randperm seeded
    with seed + epoch, every rank the same), so that rank r's share order[r::W] and the global batch
    order[k*G:(k+1)*G] hold the samples Standard trains there."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return [ids[i] for i in torch.randperm(len(ids), generator=g).tolist()]


def rank_shares(order: Sequence[int], world: int) -> List[List[int]]:
    """Each rank's share of an epoch order: rank r takes positions r, r + W, ... (DistributedSampler)."""
    return [list(order[r::world]) for r in range(world)]


def chunks(items: Sequence[int], size: int) -> List[List[int]]:
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def padded_fits(group_lengths: Sequence[int], budget: int) -> bool:
    return len(group_lengths) * max(group_lengths) <= budget


def fill_rows(ids: Sequence[int], lengths: Sequence[int], budget: int) -> List[List[int]]:
    """Consecutive ids into packed rows of at most `budget` real tokens, in order (a sample longer
    than the budget gets a row of its own)."""
    rows: List[List[int]] = []
    used = 0
    for i in ids:
        if rows and used + lengths[i] <= budget:
            rows[-1].append(i)
            used += lengths[i]
        else:
            rows.append([i])
            used = lengths[i]
    return rows


# ----- Hugging Face group_by_length ------------------------------------------------------------
def length_grouped_order(ids: Sequence[int], lengths: Sequence[int], group_batch: int, seed: int,
                         epoch: int) -> List[int]:
    """`get_length_grouped_indices` as described in the transformers docs: megabatches of
    min(len // (4 x group_batch), 50) x group_batch samples of a random permutation, each sorted by
    length in decreasing order, the megabatch holding the longest sample swapped to the front."""
    order = epoch_permutation(ids, seed, epoch)
    mult = min(len(order) // (4 * group_batch), 50) or 1
    mega = [sorted(c, key=lambda i: -lengths[i]) for c in chunks(order, mult * group_batch)]
    if mega:
        longest = max(range(len(mega)), key=lambda k: lengths[mega[k][0]])
        mega[0][0], mega[longest][0] = mega[longest][0], mega[0][0]
    return [i for m in mega for i in m]


def length_grouped_plan(ids, lengths, world: int, batch: int, accumulate: int, seed: int, epoch: int) -> Plan:
    """Micro-batches of `batch` consecutive ids of the length-grouped order dealt round-robin to
    the ranks (batch k to rank k mod W), `accumulate` micro-batches per rank and optimizer step."""
    order = length_grouped_order(ids, lengths, batch * accumulate, seed, epoch)
    micro = chunks(order, batch)
    per_rank = [micro[r::world] for r in range(world)]
    steps = max(math.ceil(len(m) / accumulate) for m in per_rank)
    return [[m[k * accumulate:(k + 1) * accumulate] for m in per_rank] for k in range(steps)]


# ----- padding-free packing at Standard's steps --------------------------------------------------
def packed_plan(ids, lengths, world: int, per_rank_step: int, budget: int, seed: int, epoch: int) -> Plan:
    """Each rank's share of the epoch cut into optimizer steps of `per_rank_step` samples (Standard's
    micro-batch x accumulation), each packed into rows of at most `budget` tokens."""
    shares = rank_shares(epoch_permutation(ids, seed, epoch), world)
    steps = max(math.ceil(len(s) / per_rank_step) for s in shares)
    return [[fill_rows(s[k * per_rank_step:(k + 1) * per_rank_step], lengths, budget) for s in shares]
            for k in range(steps)]


# ----- lhotse DynamicBucketingSampler, synchronised buckets --------------------------------------
def bucket_boundaries(lengths: Sequence[int], buckets: int) -> List[int]:
    """Upper length bounds of `buckets` buckets holding about equal total tokens each (lhotse's
    duration bins): the lengths sorted, a new bucket each time 1/buckets of the total is passed."""
    xs = sorted(lengths)
    total, per, acc, bounds = float(sum(xs)), float(sum(xs)) / buckets, 0.0, []
    for x in xs:
        acc += x
        if acc >= per * (len(bounds) + 1) and len(bounds) < buckets - 1:
            bounds.append(x)
    bounds.append(max(xs))
    return sorted(set(bounds))


def bucketing_plan(ids, lengths, world: int, budget: int, window_tokens: int, buckets: int, seed: int,
                   epoch: int) -> Plan:
    bounds = bucket_boundaries([lengths[i] for i in ids], buckets)
    shares = rank_shares(epoch_permutation(ids, seed, epoch), world)
    queues = [[[] for _ in bounds] for _ in range(world)]
    for r, share in enumerate(shares):
        for i in share:
            queues[r][int(np.searchsorted(bounds, lengths[i]))].append(i)
    rng = np.random.default_rng([seed, epoch, 0xB0C7])  # the same on every rank (sync_buckets)

    def take(queue: List[int]) -> List[int]:
        batch: List[int] = []
        while queue and padded_fits([lengths[i] for i in batch + queue[:1]], budget):
            batch.append(queue.pop(0))
        return batch or [queue.pop(0)]

    micro: List[List[List[int]]] = []  # [micro-step][rank]
    while True:
        ready = [b for b in range(len(bounds)) if all(queues[r][b] for r in range(world))]
        if not ready:
            break
        b = ready[int(rng.integers(len(ready)))]
        micro.append([take(queues[r][b]) for r in range(world)])
    # The rest (buckets empty on some rank): each rank batches what it has left, longest first.
    tails = []
    for r in range(world):
        left = sorted((i for q in queues[r] for i in q), key=lambda i: -lengths[i])
        rows: List[List[int]] = []
        while left:
            rows.append(take(left))
        tails.append(rows)
    for k in range(max(len(t) for t in tails)):
        micro.append([t[k] if k < len(t) else [] for t in tails])  # []: an IDLE micro-step
    return window_steps(micro, lengths, world, window_tokens)


def window_steps(micro: List[List[List[int]]], lengths, world: int, window_tokens: int) -> Plan:
    """Micro-steps (each [rank] -> ids, run by every rank together) grouped into optimizer steps of
    about `window_tokens` loss tokens: a step closes after the micro-step in whose first half the
    next multiple of the window falls (the job's tokens stay within half a micro-step of k windows)."""
    plan: Plan = []
    current: List[List[List[int]]] = [[] for _ in range(world)]
    done = 0.0
    for parts in micro:
        tokens = sum(lengths[i] for p in parts for i in p)
        for r, p in enumerate(parts):
            current[r].append(p)
        boundary = (len(plan) + 1) * window_tokens
        if done + tokens / 2 >= boundary or not window_tokens:
            plan.append(current)
            current = [[] for _ in range(world)]
        done += tokens
    if current[0]:
        plan.append(current)
    return plan


# ----- verl seqlen_balancing: Karmarkar-Karp -------------------------------------------------------
def karmarkar_karp(values: Sequence[float], k: int, equal_size: bool) -> List[List[int]]:
    """Indices of `values` in k parts of nearly equal sums: the largest differencing method
    (Karmarkar and Karp 1982, k-way as in Korf's "multi-way number partitioning"). Every item
    starts as a partial solution of k subsets (the item in one, the others empty); the two partial
    solutions whose largest and smallest subset sums differ the most are merged, the first's
    largest subset with the second's smallest and so on, until one is left. equal_size: the items,
    sorted, start in groups of k (one per subset), so that every merge keeps the subsets the same
    size (len(values) must then be a multiple of k)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    if equal_size:
        if len(order) % k:
            raise ValueError(f"equal_size: {len(order)} items do not split into {k} equal parts")
        starts = [order[g:g + k] for g in range(0, len(order), k)]
    else:
        starts = [[i] for i in order]
    heap = []
    for n, group in enumerate(starts):
        subsets = [([i], float(values[i])) for i in group] + [([], 0.0)] * (k - len(group))
        subsets.sort(key=lambda s: -s[1])
        heapq.heappush(heap, (-(subsets[0][1] - subsets[-1][1]), n, subsets))
    serial = len(starts)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]) for j in range(k)]
        merged.sort(key=lambda s: -s[1])
        heapq.heappush(heap, (-(merged[0][1] - merged[-1][1]), serial, merged))
        serial += 1
    return [sorted(s[0]) for s in heap[0][2]] if heap else [[] for _ in range(k)]


def kk_workload(length: int, linear: float) -> float:
    """verl's workload estimate of a sequence of `length` tokens: linear x s + s^2 (the linear
    layers' FLOPs per token over the attention's per token pair)."""
    return linear * length + float(length) * length


def kk_balanced_plan(ids, lengths, world: int, global_batch: int, budget: int, linear: float, seed: int,
                     epoch: int) -> Plan:
    order = epoch_permutation(ids, seed, epoch)
    plan: Plan = []
    for group in chunks(order, global_batch):
        work = [kk_workload(lengths[i], linear) for i in group]
        parts = karmarkar_karp(work, world, equal_size=len(group) % world == 0)
        shares = [[group[j] for j in p] for p in parts]
        # The fewest micro-batches under the cap, the same number on every rank (verl: all-reduce MAX).
        n = max(max(1, math.ceil(sum(lengths[i] for i in s) / budget)) for s in shares)
        while True:
            micro = []
            for s in shares:
                split = karmarkar_karp([lengths[i] for i in s], min(n, len(s)), equal_size=False) if s else []
                micro.append([[s[j] for j in m] for m in split if m])
            if all(sum(lengths[i] for i in m) <= budget or len(m) == 1 for rows in micro for m in rows):
                break
            n += 1
        plan.append(micro)
    return plan


def plan_epoch(method: str, ids, lengths, world: int, *, batch: int, accumulate: int, budget: int,
               window_tokens: int, linear: float, buckets: int, seed: int, epoch: int) -> Plan:
    """The epoch's plan of one of the peer methods (module docstring)."""
    if method == "length_grouped":
        return length_grouped_plan(ids, lengths, world, batch, accumulate, seed, epoch)
    if method == "packed":
        return packed_plan(ids, lengths, world, batch * accumulate, budget, seed, epoch)
    if method == "bucketing":
        return bucketing_plan(ids, lengths, world, budget, window_tokens, buckets, seed, epoch)
    if method == "kk_balanced":
        return kk_balanced_plan(ids, lengths, world, batch * accumulate * world, budget, linear, seed, epoch)
    raise ValueError(f"unknown peer method {method!r}")
