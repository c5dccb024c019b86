"""Loss weighting that makes odb's variable batches exact under DDP.

Each step carries w_r = W * t_r / T_tok (t_r: this rank's real tokens in the
step, T_tok: all ranks' real tokens, W: world size; IDLE steps have w = 0).
With ``loss_r = w_r * S_r / t_r`` (S_r: the sum of this rank's per-token
losses), DDP's gradient average gives

    (1/W) * sum_r w_r/t_r * grad S_r = grad (sum_r S_r) / T_tok,

the gradient of the mean per-token loss over every rank's tokens, as if all
samples had been one batch. With accumulation windows (optimizer.tokens_per_step)
t_r counts loss tokens and T_tok is the window's total over all its micro-steps
and ranks, so the gradient accumulated over the window is the mean over every
loss token of the window (:func:`window_loss`, :func:`window_sync`). The per-token loss must cover exactly the
sample's ``tokens`` positions (pre-shift labels in preprocessing so that every
input position has a target; padding positions contribute 0).
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional

import torch
import torch.nn.functional as F

from .encoding import IGNORE_INDEX


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
                           ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Token cross-entropy summed over positions (labels == ignore_index are
    skipped, e.g. padding), then weighted as in :func:`weighted_loss`.

    logits: [..., V]; labels: [...] with the same leading shape (already
    aligned with the logits: no shift is done here).
    """
    loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long(),
                               ignore_index=ignore_index, reduction="sum")
    return weighted_loss(loss_sum, weight, num_tokens)


def window_sync(model: torch.nn.Module, step: Any) -> ContextManager[Any]:
    """Gradient accumulation over odb's windows (``optimizer.tokens_per_step``).

    ``with odb.window_sync(ddp_model, step):`` around the micro-step's forward
    AND backward pass runs a micro-step that does not close its window under
    DDP's ``no_sync()`` (gradients accumulate locally, no all-reduce) and the
    closing one normally: one all-reduce per window. The forward must be inside:
    DDP decides in the forward pass whether the backward all-reduces, so a
    context around ``loss.backward()`` alone all-reduces every micro-step. Every rank gets the same ``closes_window`` at the
    same step index (IDLE and dummy steps too, under both idle policies), so the
    ranks all-reduce together. A model without ``no_sync`` (no DDP, FSDP with
    its own) is left alone. Call ``optimizer.step()`` after a step whose
    ``closes_window`` is true.
    """
    if getattr(step, "closes_window", True) or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()  # type: ignore[no-any-return, operator]


def window_loss(per_token_loss: torch.Tensor, step: Any, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """This micro-step's share of its window's loss: ``W * sum(per_token_loss[mask]) / window_loss_tokens``
    (``step.loss_weight`` over ``step.loss_tokens``). Summed over the window's micro-steps and averaged by DDP
    over the ranks, the gradient is the mean over every loss token of the window (label tokens, not input
    tokens: per_token_loss must be 0 where labels are ignored). 0, still on the graph, for IDLE steps."""
    tokens = int(getattr(step, "loss_tokens", 0) or step.real_tokens)
    return weighted_loss(per_token_loss, float(step.loss_weight), tokens, mask)
