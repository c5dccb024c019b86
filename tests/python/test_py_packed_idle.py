"""Packed mode with IDLE steps through real daemons (issue 23): rank 1 feeds a fifth of
the samples and the local planner keeps them home, so rank 1 gets dummy IDLE steps
while rank 0 still trains. A packed model reads cu_seqlens and position_ids on
every step, IDLE or not; the dummy batch must be one packed sequence, so the model
runs (and its DDP collectives match) on every rank. Rank 0 tells the loader
packed=True; rank 1 lets it learn the layout from its first real step."""
from __future__ import annotations

from typing import Dict, List

import torch
import torch.nn as nn

import odb
import tiny_lm
from odbtest_py import check_step_invariants, run_ranks, start_daemons, step_record, stop_all

VOCAB = 32


class BlockSumLM(nn.Module):
    """A packed model in miniature: each token sees the mean embedding of its own
    sequence (segments from cu_seqlens) plus its position embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.pos = nn.Embedding(128, 8)
        self.head = nn.Linear(8, VOCAB)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        assert input_ids.shape[0] == 1 and int(cu_seqlens[-1]) == input_ids.shape[1], "cu_seqlens do not cover the row"
        x = self.emb(input_ids[0])
        segments = [seg.mean(0, keepdim=True).expand_as(seg)
                    for seg in torch.split(x, torch.diff(cu_seqlens).tolist())]
        return self.head(torch.cat(segments) + self.pos(position_ids[0])).unsqueeze(0)


def _rank(rank: int, world: int, run_dir: str, lengths: List[int]) -> Dict[str, int]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ddp = DDP(BlockSumLM())
    dataset = tiny_lm.SyntheticCorpus(lengths, vocab=VOCAB)
    mine = [i for i in range(len(lengths)) if (i % 5 == 0) == (rank == 1)]
    loader = odb.OdbDataLoader(dataset, sampler=mine, num_workers=1, idle_policy="zero_step", timeout_s=60,
                               packed=True if rank == 0 else None)
    idle, real, records = 0, 0, []
    for step in loader:
        records.append(step_record(step))
        b = step.batch
        cu, pos = b["cu_seqlens"], b["position_ids"]  # a padded dummy batch has neither: KeyError
        assert "attention_mask" not in b and pos.shape == b["input_ids"].shape
        assert pos[0].tolist() == [p for a, c in zip(cu[:-1].tolist(), cu[1:].tolist()) for p in range(c - a)]
        logits = ddp(b["input_ids"], pos, cu)
        odb.weighted_cross_entropy(logits, b["labels"], step.loss_weight, step.real_tokens).backward()
        idle += step.idle
        real += not step.idle
    return {"idle": idle, "real": real, "records": records, "emitted": loader.last_summary["emitted"]}


def test_packed_dummy_batches_on_idle_steps(run_dir, job_id) -> None:
    lengths = tiny_lm.long_tail_lengths(40, seed=3, min_len=2, max_len=40, median=10)
    config = tiny_lm.daemon_config(max_tokens=64, collate={"packed": True}, alignment={"planner": "local"})
    daemons = start_daemons(run_dir, 2, job_id, config)
    try:
        results = run_ranks(_rank, 2, run_dir, timeout=300, lengths=lengths)
    finally:
        stop_all(daemons)
    check_step_invariants([r["records"] for r in results], 2)
    assert results[1]["idle"] > 0, "the skew gave rank 1 no IDLE step: the test tests nothing"
    assert results[1]["real"] > 0  # rank 1 learned the packed layout from a real step
    assert sum(r["emitted"] for r in results) == len(lengths)
