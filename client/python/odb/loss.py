"""Loss weighting that makes odb's variable batches exact under DDP.

Each step carries w_r = W * t_r / T_tok (t_r: this rank's real tokens in the
step, T_tok: all ranks' real tokens, W: world size; IDLE steps have w = 0).
With ``loss_r = w_r * S_r / t_r`` (S_r: the sum of this rank's per-token
losses), DDP's gradient average gives

    (1/W) * sum_r w_r/t_r * grad S_r = grad (sum_r S_r) / T_tok,

the gradient of the mean per-token loss over every rank's tokens, as if all
samples had been one batch. The per-token loss must cover exactly the
sample's ``tokens`` positions (pre-shift labels in preprocessing so that every
input position has a target; padding positions contribute 0).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def weighted_loss(per_token_loss: torch.Tensor, weight: float, num_tokens: int,
                  mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``weight * sum(per_token_loss[mask]) / num_tokens``.

    Args:
      per_token_loss: per-token losses of any shape, or their sum (a scalar).
        Padding positions must be 0 or excluded by `mask`.
      weight: the step's loss weight (``Step.loss_weight``).
      num_tokens: this rank's real tokens in the step (``Step.real_tokens``).
      mask: optional, 1 where a position is a real token.

    Returns a scalar; 0 (still connected to the graph, so DDP's all-reduce
    runs) for an IDLE/dummy step with ``num_tokens == 0`` or ``weight == 0``.
    """
    if mask is not None:
        per_token_loss = per_token_loss * mask.to(per_token_loss.dtype)
    total = per_token_loss.sum()
    if num_tokens <= 0 or weight == 0.0:
        return total * 0.0
    return total * (float(weight) / float(num_tokens))


def weighted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, weight: float, num_tokens: int,
                           ignore_index: int = -100) -> torch.Tensor:
    """Token cross-entropy summed over positions (labels == ignore_index are
    skipped, e.g. padding), then weighted as in :func:`weighted_loss`.

    logits: [..., V]; labels: [...] with the same leading shape (already
    aligned with the logits: no shift is done here).
    """
    loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long(),
                               ignore_index=ignore_index, reduction="sum")
    return weighted_loss(loss_sum, weight, num_tokens)
