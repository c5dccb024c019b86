"""DDP with idle_policy="join" on packed steps (docs/python.md, "Stacks": the DDP, join x packed
cell). W = 2, gloo on CPU; rank 1 feeds a fifth of the samples and the local planner keeps them
home, so rank 1 is done early and joins (`with ddp.join():`) while rank 0 still trains its packed
steps. The epoch ends on both ranks (no hang), every sample is trained exactly once, every step
yielded is packed, and the trailing IDLE steps are drained by the loader (wait_epoch_end()).

Not forced here: an IDLE step yielded to the joining rank before its last sample (in this run it
joins first; such a step is the same packed dummy batch zero_step yields, which
test_py_packed_idle.py exercises through DDP).
"""
from __future__ import annotations

from typing import Any, Dict, List

import torch

import odb
import tiny_lm
from odbtest_py import run_ranks, start_daemons, step_record, stop_all
from test_py_packed_idle import VOCAB, BlockSumLM


def _rank(rank: int, world: int, run_dir: str, lengths: List[int]) -> Dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ddp = DDP(BlockSumLM())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    mine = [i for i in range(len(lengths)) if (i % 5 == 0) == (rank == 1)]
    loader = odb.OdbDataLoader(tiny_lm.SyntheticCorpus(lengths, vocab=VOCAB), sampler=mine, num_workers=1,
                               idle_policy="join", packed=True, timeout_s=60)
    records, trained, yielded_idle = [], [], 0
    with ddp.join():
        for step in loader:
            records.append(step_record(step))
            trained.extend(step.sample_ids)
            b = step.batch
            cu, pos = b["cu_seqlens"], b["position_ids"]  # a padded dummy batch has neither: KeyError
            assert "attention_mask" not in b and pos.shape == b["input_ids"].shape
            opt.zero_grad()
            odb.weighted_cross_entropy(ddp(b["input_ids"], pos, cu), b["labels"], step.loss_weight,
                                       step.real_tokens).backward()
            opt.step()
            yielded_idle += step.idle
    summary = loader.wait_epoch_end()
    return {"records": records, "trained": trained, "yielded_idle": yielded_idle, "summary": summary,
            "steps": len(records)}


def test_join_on_packed_steps_trains_every_sample_once_without_a_hang(run_dir, job_id) -> None:
    lengths = tiny_lm.long_tail_lengths(40, seed=3, min_len=2, max_len=40, median=10)
    config = tiny_lm.daemon_config(max_tokens=64, collate={"packed": True}, alignment={"planner": "local"})
    daemons = start_daemons(run_dir, 2, job_id, config)
    try:
        results = run_ranks(_rank, 2, run_dir, timeout=300, lengths=lengths)
    finally:
        stop_all(daemons)
    assert sorted(i for r in results for i in r["trained"]) == list(range(len(lengths)))
    assert results[1]["steps"] < results[0]["steps"], "rank 1 did not finish early: join was not exercised"
    assert all(r["summary"] is not None for r in results)
    assert sum(r["summary"]["emitted"] for r in results) == len(lengths)
    assert sum(r["summary"]["idle_steps"] for r in results) > 0, [r["summary"] for r in results]
