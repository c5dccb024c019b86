"""A small causal transformer and a variable-length synthetic corpus, shared by
the demo (examples/train_demo.py) and the tests (tests/python/)."""
from __future__ import annotations

import math
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.nn as nn


class TinyCausalLM(nn.Module):
    """Token + position embeddings, `layers` pre-norm transformer blocks with a
    causal mask and a key-padding mask, tied-free LM head."""

    def __init__(self, vocab: int = 256, d_model: int = 128, layers: int = 2, heads: int = 4,
                 max_len: int = 1024) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        block = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        # Packed rows: attention per sequence (False) or dense over the row with a block mask (True).
        self.dense_packed_attention = False

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None,
                cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Padded layout: input_ids [B, L] and attention_mask [B, L] (1: real token).
        Packed layout (padding-free rows, odb's `collate.packed`): input_ids [1, T], position_ids
        [1, T] (restarting at 0 in each sequence) and cu_seqlens [n + 1]; a token attends only to
        earlier tokens of its own sequence (block-diagonal causal mask), so the row trains exactly
        like its sequences one by one (tests/python/test_py_packed_training.py). The attention is
        computed per sequence (what a variable-length attention kernel does on a GPU, e.g.
        flash-attn's varlen functions): a packed row pays the sum of its sequences' squared lengths,
        not the square of the row's length; `dense_packed_attention` restores the whole-row mask."""
        b, n = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(n, device=input_ids.device).unsqueeze(0).expand(b, n)
        x = self.tok(input_ids.long()) + self.pos(position_ids.long())
        causal = torch.triu(torch.full((n, n), float("-inf"), dtype=x.dtype, device=x.device), diagonal=1)
        if cu_seqlens is not None and not self.dense_packed_attention:
            bounds = [int(v) for v in cu_seqlens.tolist()]
            for layer in self.blocks.layers:  # pre-norm blocks, dropout 0: TransformerEncoderLayer's forward
                x = x + per_sequence_attention(layer.self_attn, layer.norm1(x), bounds, causal)
                x = x + layer.linear2(layer.activation(layer.linear1(layer.norm2(x))))
        elif cu_seqlens is not None:
            segment = torch.bucketize(torch.arange(n, device=x.device), cu_seqlens[1:].to(x.device).long(),
                                      right=True)  # each token's sequence
            causal = causal.masked_fill(segment.unsqueeze(0) != segment.unsqueeze(1), float("-inf"))
            x = self.blocks(x, mask=causal)
        else:
            x = self.blocks(x, mask=causal, src_key_padding_mask=attention_mask == 0)
        return self.head(self.norm(x))


def per_sequence_attention(attn: nn.MultiheadAttention, h: torch.Tensor, bounds: List[int],
                           causal: torch.Tensor) -> torch.Tensor:
    """`attn` (batch_first) over a packed row h [1, T, d], each sequence [bounds[i], bounds[i+1])
    attending causally to itself only: nn.MultiheadAttention's projections and scaling, the score
    matrices per sequence (n_i x n_i) instead of one T x T with a block-diagonal mask."""
    d = h.shape[-1]
    heads = attn.num_heads
    q, k, v = torch.nn.functional.linear(h[0], attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
    q = q * (d // heads) ** -0.5
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        n = b - a
        qs, ks, vs = (t[a:b].reshape(n, heads, d // heads).transpose(0, 1) for t in (q, k, v))
        weights = torch.softmax(torch.baddbmm(causal[:n, :n], qs, ks.transpose(1, 2)), dim=-1)
        out.append(torch.bmm(weights, vs).transpose(0, 1).reshape(n, d))
    return torch.nn.functional.linear(torch.cat(out), attn.out_proj.weight, attn.out_proj.bias).unsqueeze(0)


def long_tail_lengths(n: int, seed: int, min_len: int = 8, max_len: int = 512, median: float = 48.0,
                      sigma: float = 0.9) -> List[int]:
    """Log-normal lengths clipped to [min_len, max_len] (a long tail, like chat data)."""
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(math.log(median), sigma, size=n)
    return [int(x) for x in np.clip(raw, min_len, max_len)]


class SyntheticCorpus(torch.utils.data.Dataset):
    """Sample i: an arithmetic token sequence (learnable) of length lengths[i] + 1,
    pre-shifted so every input position has a target: input_ids = seq[:-1],
    labels = seq[1:] (tokens = len(input_ids))."""

    def __init__(self, lengths: List[int], vocab: int = 256, fail_on: int = -1) -> None:
        self.lengths = lengths
        self.vocab = vocab
        self.fail_on = fail_on

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        if i == self.fail_on:
            raise ValueError(f"corrupt record {i} (deliberate preprocessing failure)")
        n = self.lengths[i]
        start, stride = (i * 7919) % self.vocab, 1 + (i % 5)
        seq = (start + stride * torch.arange(n + 1, dtype=torch.int64)) % self.vocab
        return {"input_ids": seq[:-1].clone(), "labels": seq[1:].clone()}


def pad_collate(samples: List[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """The "Standard" collate: right-pad to the batch's longest sample."""
    n = max(s["input_ids"].numel() for s in samples)
    ids = torch.zeros(len(samples), n, dtype=torch.int64)
    labels = torch.full((len(samples), n), -100, dtype=torch.int64)
    mask = torch.zeros(len(samples), n, dtype=torch.int64)
    for r, s in enumerate(samples):
        k = s["input_ids"].numel()
        ids[r, :k] = s["input_ids"]
        labels[r, :k] = s["labels"]
        mask[r, :k] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def packed_collate(samples: List[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """Padding-free collate (the layout of odb's `collate.packed` and of Hugging Face's
    DataCollatorWithFlattening): the samples concatenated into one row, input_ids / labels
    [1, T], position_ids [1, T] restarting at 0 per sample, cu_seqlens int32 [n + 1]."""
    lengths = [s["input_ids"].numel() for s in samples]
    cu = torch.zeros(len(samples) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return {"input_ids": torch.cat([s["input_ids"] for s in samples]).unsqueeze(0),
            "labels": torch.cat([s["labels"] for s in samples]).unsqueeze(0),
            "position_ids": torch.cat([torch.arange(k, dtype=torch.int64) for k in lengths]).unsqueeze(0),
            "cu_seqlens": cu}


def model_inputs(batch: Dict[str, torch.Tensor]) -> tuple:
    """The positional arguments of TinyCausalLM.forward for a padded or a packed batch."""
    if "cu_seqlens" in batch:
        return batch["input_ids"], None, batch["position_ids"], batch["cu_seqlens"]
    return batch["input_ids"], batch["attention_mask"]


# The daemon config the demo and the tests use: labels padded with -100 so
# padding never contributes to the loss.
def daemon_config(max_tokens: int, seed: int = 1, **extra) -> dict:
    config = {
        "grouping": {"max_tokens": max_tokens},
        "alignment": {"seed": seed},
        "collate": {"fields": [{"name": "labels", "pad_value": -100}]},
    }
    for key, value in extra.items():
        config.setdefault(key, {}).update(value) if isinstance(value, dict) else config.__setitem__(key, value)
    return config

def die_with_parent(parent: int) -> None:
    """This rank process gets SIGTERM when the job's main process `parent` dies, however it dies (SIGTERM,
    SIGKILL, a closed terminal), and with it its odbd daemons (odb.spawn_daemon's PR_SET_PDEATHSIG) and
    send workers (odb's pump). Without it a rank of a killed job trained on: nothing tells a spawned
    process that its parent is gone (a rank that happened to start a DataLoader's workers then died of
    the broken resource tracker; one in the middle of its steps did not). Call it first in the rank."""
    import os
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl: nobody would stop us
        os._exit(1)


def exit_rank() -> None:
    """A DDP rank process that finished leaves without the interpreter's finalization: torch 1.13 can hang
    there (the garbage collector at exit destroys a DDP Reducer, whose ProcessGroupGloo joins a thread that
    waits for the GIL: a test's rank hung so after writing its results). Call it last, once everything the
    rank writes is written and its daemons are stopped."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
