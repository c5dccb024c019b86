"""ZeroRedundancyOptimizer on packed steps (docs/python.md, "Stacks": the ZeRO x packed cell).

W = 2, gloo on CPU, skewed ranks (2 samples on rank 1, 48 on rank 0) with the local planner, so rank 1
gets IDLE steps, which come as packed dummy batches (OdbDataLoader(packed=True)). The model
attends within each packed sequence (cu_seqlens; test_py_packed_training.PackedAttentionLM).
In the same loop a second DDP replica trains with the unsharded optimizer: the sharded run's
parameters equal it after every step (float64, 1e-10), both ranks end equal, every sample is
trained once, and an IDLE step's loss is exactly 0 in the packed layout too.
"""
from __future__ import annotations

import copy
from typing import List

import torch

import odb
import tiny_lm
from odbtest_py import check_step_invariants, run_ranks, start_daemons, step_record, stop_all
from test_py_packed_training import VOCAB, PackedAttentionLM, _packed_inputs


def _train(rank: int, world: int, run_dir: str, lengths: List[int]) -> dict:
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    sharded_model = PackedAttentionLM().double()
    plain_model = copy.deepcopy(sharded_model)
    sharded, plain = DDP(sharded_model), DDP(plain_model)
    zero = ZeroRedundancyOptimizer(sharded.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    adam = torch.optim.Adam(plain.parameters(), lr=0.01)
    assert len(zero.optim.param_groups[0]["params"]) < len(list(sharded.parameters())), "not sharded"
    mine = [i for i in range(len(lengths)) if (i % 25 == 0) == (rank == 1)]  # rank 1: 2 samples
    loader = odb.OdbDataLoader(tiny_lm.SyntheticCorpus(lengths, vocab=VOCAB), sampler=mine, num_workers=1,
                               idle_policy="zero_step", packed=True, timeout_s=60)
    records, trained, idle, packed_rows, worst = [], [], 0, 0, 0.0
    for step in loader:
        records.append(step_record(step))
        trained.extend(step.sample_ids)
        b = step.batch
        assert "cu_seqlens" in b and "attention_mask" not in b, f"step {step.step_index} is not packed"
        packed_rows += len(step.lengths) > 1
        ids, positions, cu = _packed_inputs(b)
        for model, opt in ((sharded, zero), (plain, adam)):
            opt.zero_grad(set_to_none=False)
            loss = odb.weighted_cross_entropy(model(ids, positions, cu), b["labels"], step.loss_weight,
                                              step.real_tokens)
            if step.idle:
                assert loss.item() == 0.0, "an IDLE step's loss must be exactly 0"
            loss.backward()
            opt.step()
        idle += step.idle
        worst = max(worst, max((a - p).abs().max().item()
                               for a, p in zip(sharded_model.parameters(), plain_model.parameters())))
    flat = torch.cat([p.detach().reshape(-1) for p in sharded_model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    return {"records": records, "trained": trained, "idle": idle, "packed_rows": packed_rows, "worst": worst,
            "ranks_differ": (gathered[0] - gathered[1]).abs().max().item()}


def test_zero_on_packed_steps_with_idle_steps_equals_the_unsharded_run(run_dir, job_id) -> None:
    lengths = tiny_lm.long_tail_lengths(50, seed=4, min_len=3, max_len=40, median=10)
    config = tiny_lm.daemon_config(max_tokens=96, collate={"packed": True}, alignment={"planner": "local"})
    daemons = start_daemons(run_dir, 2, job_id, config)
    try:
        results = run_ranks(_train, 2, run_dir, timeout=300, lengths=lengths)
    finally:
        stop_all(daemons)
    check_step_invariants([r["records"] for r in results], 2)
    assert results[1]["idle"] > 0, "the small rank had no IDLE step: nothing was tested"
    assert sum(r["packed_rows"] for r in results) > 0, "no step packed two sequences into one row"
    for r in results:
        assert r["worst"] < 1e-10, r["worst"]
        assert r["ranks_differ"] < 1e-10, r["ranks_differ"]
    assert sorted(i for r in results for i in r["trained"]) == list(range(len(lengths)))
