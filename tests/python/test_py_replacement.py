"""Samplers with replacement (torch RandomSampler(replacement=True), WeightedRandomSampler,
oversampling a small dataset): the same dataset index at several positions of a rank's list.
Exactly-once is by position (the sample's seq), not by dataset index: the trainer gets every
position the sampler chose, no DUPLICATE_ID, with samples moving between ranks (the global
planner: a repeated index keyed apart on its owner travels through the payload exchange) and
in reproducible mode (alignment.deterministic).

Real daemons, real DataLoader worker processes."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

import odb
import tiny_lm
from odbtest_py import run_ranks, start_daemons, stop_all

N_DATASET = 9      # a small dataset, oversampled: every index comes back many times
PER_RANK = 70


def _sampled(rank: int) -> list:
    """What this rank's sampler chose: indices with replacement, weighted towards a few."""
    weights = torch.tensor([8.0, 1, 1, 4, 1, 1, 1, 2, 1])
    g = torch.Generator().manual_seed(1234 + rank)
    return [int(i) for i in torch.utils.data.WeightedRandomSampler(weights, PER_RANK, replacement=True,
                                                                      generator=g)]


def _rank(rank: int, world: int, run_dir: str) -> dict:
    lengths = tiny_lm.long_tail_lengths(N_DATASET, seed=3, min_len=4, max_len=60, median=20)
    loader = odb.OdbDataLoader(tiny_lm.SyntheticCorpus(lengths, vocab=64), sampler=_sampled(rank), num_workers=2,
                               idle_policy="zero_step", timeout_s=90)
    trained, real = [], 0
    for step in loader:
        trained += [int(i) for i in step.sample_ids]
        real += int(step.real_tokens)
    return {"trained": trained, "real_tokens": real, "summary": loader.last_summary}


@pytest.mark.parametrize("deterministic", [False, True])
def test_sampler_with_replacement_trains_every_position(run_dir, job_id, deterministic) -> None:
    config = tiny_lm.daemon_config(max_tokens=128, grouping={"window": 12},
                                   alignment={"planner": "global", "deterministic": deterministic})
    daemons = start_daemons(run_dir, 2, job_id, config)
    try:
        r0, r1 = run_ranks(_rank, 2, run_dir, timeout=240)
    finally:
        stop_all(daemons)
    chosen = Counter(_sampled(0) + _sampled(1))
    assert max(chosen.values()) > 10, "the sampler was meant to repeat indices"
    trained = Counter(r0["trained"] + r1["trained"])
    assert trained == chosen, f"trained {sorted(trained.items())} != sampled {sorted(chosen.items())}"
    for r in (r0, r1):
        s = r["summary"]
        assert s["rejected"] == 0, s.get("rejections")
        assert s["received"] == PER_RANK
        assert not s.get("not_emitted_ids")
    lengths = tiny_lm.long_tail_lengths(N_DATASET, seed=3, min_len=4, max_len=60, median=20)
    assert r0["real_tokens"] + r1["real_tokens"] == sum(lengths[i] * n for i, n in chosen.items())
