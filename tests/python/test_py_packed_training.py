"""Packed training is exact (issue 23, item 2): a model that attends within each packed
sequence (block-diagonal causal attention from the step's cu_seqlens, positions from its
position_ids), trained on odb's packed steps at W = 2 with the global planner under DDP,
has the loss and the gradients of the same samples run one by one, unpacked (float64,
1e-10). The ranks feed 4:1 skewed shares; the global planner moves samples so that both
get packed rows (a dummy IDLE batch, should one come, is one sequence)."""
from __future__ import annotations

import copy
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import odb
import tiny_lm
from odbtest_py import check_step_invariants, run_ranks, start_daemons, step_record, stop_all

VOCAB = 64


class PackedAttentionLM(nn.Module):
    """Embeddings (token + position), one causal self-attention block and an MLP, written out
    so that the attention mask is explicit: token i attends to token j only when both lie in
    the same sequence of the row (cu_seqlens) and j <= i."""

    def __init__(self, d_model: int = 16, heads: int = 2, max_len: int = 256) -> None:
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))
        self.head = nn.Linear(d_model, VOCAB)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """input_ids, position_ids: [1, T]; cu_seqlens: [n + 1] with cu_seqlens[-1] = T."""
        t = input_ids.shape[1]
        segment = torch.bucketize(torch.arange(t), cu_seqlens[1:].long(), right=True)  # the sequence of each token
        same = segment.unsqueeze(0) == segment.unsqueeze(1)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        allowed = same & causal
        x = self.tok(input_ids.long()) + self.pos(position_ids.long())
        h = self.norm1(x)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        split = lambda z: z.view(1, t, self.heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5)
        scores = scores.masked_fill(~allowed, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ v
        x = x + self.out(attn.transpose(1, 2).reshape(1, t, -1))
        x = x + self.mlp(self.norm2(x))
        return self.head(x)


def _packed_inputs(batch: Dict[str, torch.Tensor]) -> tuple:
    ids = batch["input_ids"]
    if "cu_seqlens" in batch:
        return ids, batch["position_ids"], batch["cu_seqlens"]
    # A dummy (IDLE) batch is one sample in the padded layout: one sequence.
    n = ids.shape[1]
    return ids, torch.arange(n).unsqueeze(0), torch.tensor([0, n], dtype=torch.int32)


def _rank(rank: int, world: int, run_dir: str, lengths: List[int]) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = PackedAttentionLM().double()
    reference = copy.deepcopy(model)
    ddp = DDP(model)
    dataset = tiny_lm.SyntheticCorpus(lengths, vocab=VOCAB)
    # Rank 1 feeds a quarter of what rank 0 feeds: skewed ranks, IDLE steps.
    mine = [i for i in range(len(lengths)) if (i % 5 == 0) == (rank == 1)]
    loader = odb.OdbDataLoader(dataset, sampler=mine, num_workers=1, idle_policy="zero_step", timeout_s=60)
    checked, idle, packed_rows, grad_err, loss_err, records = 0, 0, 0, 0.0, 0.0, []
    for step in loader:
        records.append(step_record(step))
        b = step.batch
        ids, positions, cu = _packed_inputs(b)
        if not step.idle:
            assert ids.shape[0] == 1 and "attention_mask" not in b, "not a packed step"
            assert cu.tolist() == [0] + list(torch.tensor(step.lengths).cumsum(0).tolist())
            assert positions[0].tolist() == [p for n in step.lengths for p in range(n)]
            packed_rows += len(step.lengths) > 1
        else:
            idle += 1
        ddp.zero_grad(set_to_none=False)
        loss = odb.weighted_cross_entropy(ddp(ids, positions, cu), b["labels"], step.loss_weight, step.real_tokens)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        all_ids: List[Optional[List[int]]] = [None] * world
        dist.all_gather_object(all_ids, list(step.sample_ids))
        total = torch.tensor([loss.item()], dtype=torch.float64)
        dist.all_reduce(total)
        step_ids = [i for part in all_ids for i in part]  # type: ignore[union-attr]
        # Reference: every sample of the step on its own (no packing), mean loss per token.
        reference.zero_grad(set_to_none=False)
        ref_sum, tokens = torch.zeros((), dtype=torch.float64), 0
        for i in step_ids:
            s = dataset[i]
            n = s["input_ids"].numel()
            logits = reference(s["input_ids"].unsqueeze(0), torch.arange(n).unsqueeze(0),
                               torch.tensor([0, n], dtype=torch.int32))
            ref_sum = ref_sum + F.cross_entropy(logits.reshape(-1, VOCAB), s["labels"], reduction="sum")
            tokens += n
        ref_loss = ref_sum / tokens
        ref_loss.backward()
        for g, p in zip(grads, reference.parameters()):
            grad_err = max(grad_err, (g - p.grad).abs().max().item())
        loss_err = max(loss_err, abs(total.item() / world - ref_loss.item()))  # DDP averages the ranks
        checked += 1
    return {"records": records, "steps": checked, "idle": idle, "packed_rows": packed_rows, "grad_err": grad_err,
            "loss_err": loss_err, "summary": loader.last_summary}


def test_packed_steps_train_exactly_like_the_samples_unpacked(run_dir, job_id) -> None:
    lengths = tiny_lm.long_tail_lengths(40, seed=11, min_len=2, max_len=60, median=12)
    config = tiny_lm.daemon_config(max_tokens=128, collate={"packed": True},
                                   alignment={"planner": "global"})
    daemons = start_daemons(run_dir, 2, job_id, config)
    try:
        results = run_ranks(_rank, 2, run_dir, timeout=300, lengths=lengths)
    finally:
        stop_all(daemons)
    check_step_invariants([r["records"] for r in results], 2)
    assert results[0]["steps"] == results[1]["steps"] >= 3
    assert sum(r["packed_rows"] for r in results) > 0, "no step packed two sequences into one row"
    for r in results:
        assert r["grad_err"] < 1e-10, r
        assert r["loss_err"] < 1e-10, r
    assert sum(r["summary"]["emitted"] for r in results) == len(lengths)
