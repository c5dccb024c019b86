"""The demo model's packed rows attend per sequence (examples/tiny_lm.py per_sequence_attention, what a
variable-length attention kernel does): its outputs and gradients equal those of the dense whole-row
attention with the block-diagonal causal mask and of the same sequences padded (float64, 1e-12)."""
from __future__ import annotations

from typing import Dict, List

import torch

import tiny_lm


def _grads(model: torch.nn.Module, out: torch.Tensor, weight: torch.Tensor) -> Dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    (out * weight).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_per_sequence_attention_equals_the_dense_mask_and_padding() -> None:
    torch.manual_seed(0)
    model = tiny_lm.TinyCausalLM(d_model=32, layers=2, heads=4).double()
    lengths: List[int] = [7, 30, 1, 18, 12]
    seqs = [torch.randint(0, 256, (n,)) for n in lengths]
    ids = torch.cat(seqs).unsqueeze(0)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    weight = torch.randn(1, sum(lengths), 256, dtype=torch.float64)

    per_sequence = model(ids, None, positions, cu)
    g_per = _grads(model, per_sequence, weight)
    model.dense_packed_attention = True
    dense = model(ids, None, positions, cu)
    g_dense = _grads(model, dense, weight)
    model.dense_packed_attention = False

    padded_ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(padded_ids)
    for r, s in enumerate(seqs):
        padded_ids[r, :len(s)] = s
        mask[r, :len(s)] = 1
    padded = model(padded_ids, mask)
    unpadded = torch.cat([padded[r, :n] for r, n in enumerate(lengths)]).unsqueeze(0)
    g_pad = _grads(model, unpadded, weight)

    assert (per_sequence - dense).abs().max().item() < 1e-12
    assert (per_sequence - unpadded).abs().max().item() < 1e-12
    for name, g in g_per.items():
        assert (g - g_dense[name]).abs().max().item() < 1e-12, name
        assert (g - g_pad[name]).abs().max().item() < 1e-12, name
