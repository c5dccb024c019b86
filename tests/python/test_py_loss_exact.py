"""Exact loss weights: odb's weighted per-token loss, after DDP's gradient
averaging over 2 ranks, equals one reference batch over all of the step's
samples (loss and gradients, float64)."""
from __future__ import annotations

import copy

import pytest
import torch

import odb
import tiny_lm
from odbtest_py import check_step_invariants, run_ranks, start_daemons, step_record, stop_all


def test_weighted_loss_formula_matches_mean_over_all_tokens() -> None:
    # Pure arithmetic, no daemon: 2 "ranks" with 3 and 7 tokens.
    torch.manual_seed(0)
    x = torch.randn(10, dtype=torch.float64, requires_grad=True)
    per_token = x ** 2
    t = [3, 7]
    total = sum(t)
    w = [2 * t[0] / total, 2 * t[1] / total]
    l0 = odb.weighted_loss(per_token[:3], w[0], t[0])
    l1 = odb.weighted_loss(per_token[3:], w[1], t[1])
    averaged = (l0 + l1) / 2  # what DDP's gradient averaging computes
    reference = per_token.mean()
    assert torch.allclose(averaged, reference, rtol=0, atol=1e-12)
    assert odb.weighted_loss(per_token, 0.0, 0).item() == 0.0


def _rank(rank: int, world: int, run_dir: str, lengths: list) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = tiny_lm.TinyCausalLM(vocab=64, d_model=32, layers=1, heads=2, max_len=128).double()
    reference_model = copy.deepcopy(model)
    ddp = DDP(model)
    dataset = tiny_lm.SyntheticCorpus(lengths, vocab=64)
    loader = odb.OdbDataLoader(dataset, num_workers=1, shuffle=True, seed=3, idle_policy="zero_step",
                               timeout_s=60)
    checked, max_grad_err, max_loss_err, weight_sums, records = 0, 0.0, 0.0, [], []
    for step in loader:
        records.append(step_record(step))
        ddp.zero_grad(set_to_none=False)
        b = step.batch
        logits = ddp(b["input_ids"], b["attention_mask"])
        loss = odb.weighted_cross_entropy(logits, b["labels"], step.loss_weight, step.real_tokens)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        # Every rank's samples of this step, and the summed weights / losses.
        all_ids = [None] * world
        dist.all_gather_object(all_ids, step.sample_ids)
        stats = torch.tensor([step.loss_weight, loss.item()], dtype=torch.float64)
        dist.all_reduce(stats)
        weight_sums.append(stats[0].item())
        ids = [i for part in all_ids for i in part]
        assert len(ids) == len(set(ids)), "a sample in two ranks' part of one step"
        # Reference: one padded batch over all of them, mean per-token loss.
        ref = tiny_lm.pad_collate([dataset[i] for i in ids])
        reference_model.zero_grad(set_to_none=False)
        ref_logits = reference_model(ref["input_ids"], ref["attention_mask"])
        ref_loss = torch.nn.functional.cross_entropy(ref_logits.reshape(-1, 64), ref["labels"].reshape(-1),
                                                     ignore_index=-100, reduction="mean")
        ref_loss.backward()
        for g, p in zip(grads, reference_model.parameters()):
            max_grad_err = max(max_grad_err, (g - p.grad).abs().max().item())
        # DDP averages gradients, so the matching loss is the mean of the ranks' losses.
        max_loss_err = max(max_loss_err, abs(stats[1].item() / world - ref_loss.item()))
        checked += 1
    return {"records": records, "steps": checked, "grad_err": max_grad_err, "loss_err": max_loss_err, "weight_sums": weight_sums,
            "summary": loader.last_summary}


def test_ddp_two_ranks_equals_one_reference_batch(run_dir, job_id) -> None:
    lengths = tiny_lm.long_tail_lengths(48, seed=5, min_len=2, max_len=100, median=20)
    daemons = start_daemons(run_dir, 2, job_id, tiny_lm.daemon_config(max_tokens=256))
    try:
        results = run_ranks(_rank, 2, run_dir, timeout=300, lengths=lengths)
    finally:
        stop_all(daemons)
    assert results[0]["steps"] == results[1]["steps"] >= 3
    check_step_invariants([r["records"] for r in results], 2)
    for r in results:
        assert r["grad_err"] < 1e-10, r
        assert r["loss_err"] < 1e-10, r
        assert all(abs(s - 2.0) < 1e-9 for s in r["weight_sums"]), r["weight_sums"]
    assert sum(r["summary"]["emitted"] for r in results) == len(lengths)
