"""LR schedules that follow the loss tokens trained, not the optimizer step count.

With odb an epoch's optimizer steps (accumulation windows, or aligned steps
without them) are not known in advance and are not the same across recipes, so
a schedule written against step numbers drifts. :func:`lr_by_tokens` returns a
``LambdaLR`` lambda that reads the loader's job counter instead
(``loader.job_loss_tokens``: the loss tokens of every optimizer step handed out
so far, over all ranks and epochs; a global figure, the same on every rank).
The counter is in the loader's ``state_dict()``, so a resumed job continues the
schedule where it stopped; the lambda itself holds no state (LambdaLR does not
save plain functions, and nothing of the loader ends up in the scheduler's
checkpoint).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Union

SHAPES = ("cosine", "linear", "constant")


def lr_by_tokens(loader: Any, total_tokens: int, *, warmup_tokens: int = 0,
                 decay: Union[str, Callable[[float], float]] = "cosine",
                 final_ratio: float = 0.0) -> Callable[[int], float]:
    """A ``torch.optim.lr_scheduler.LambdaLR`` lambda driven by loss tokens trained.

    ``LambdaLR(opt, odb.lr_by_tokens(loader, total_tokens=...))``, then ``sched.step()`` after every
    ``optimizer.step()`` (as usual): the factor for the next optimizer step is a linear warmup over
    ``warmup_tokens``, then ``decay`` from 1 to ``final_ratio`` at ``total_tokens`` (held there after).

    Args:
      loader: the OdbDataLoader (its ``job_loss_tokens`` is read at each call).
      total_tokens: the job's loss tokens (all ranks), e.g. ``loader.loss_tokens_per_epoch()[0] * epochs``
        or the loader's ``stop_at_loss_tokens``.
      warmup_tokens: linear warmup from 0 (exclusive) to 1 over this many tokens.
      decay: "cosine", "linear", "constant", or a function of the progress p in [0, 1] (the tokens after
        warmup over those of the decay) returning the factor.
      final_ratio: the factor at the end (cosine and linear).
    """
    total = int(total_tokens)
    warm = int(warmup_tokens)
    if total < 1:
        raise ValueError(f"lr_by_tokens: total_tokens must be >= 1, got {total_tokens!r}")
    if warm < 0 or warm > total:
        raise ValueError(f"lr_by_tokens: warmup_tokens must be in [0, total_tokens={total}], got {warmup_tokens!r}")
    if not 0.0 <= float(final_ratio) <= 1.0:
        raise ValueError(f"lr_by_tokens: final_ratio must be in [0, 1], got {final_ratio!r}")
    if not callable(decay) and decay not in SHAPES:
        raise ValueError(f"lr_by_tokens: decay must be one of {SHAPES} or a function of the progress, got {decay!r}")
    if not hasattr(loader, "job_loss_tokens"):
        raise TypeError(f"lr_by_tokens: expected an odb.OdbDataLoader, got {type(loader).__name__}")
    low = float(final_ratio)

    def shape(p: float) -> float:
        if callable(decay):
            return float(decay(p))
        if decay == "constant":
            return 1.0
        if decay == "linear":
            return 1.0 + (low - 1.0) * p
        return low + (1.0 - low) * 0.5 * (1.0 + math.cos(math.pi * p))

    def factor(_step: int) -> float:  # LambdaLR's step count is ignored: tokens drive the schedule
        seen = int(loader.job_loss_tokens)
        if warm and seen < warm:
            return (seen + 1) / (warm + 1)  # never 0: the first optimizer step still moves
        span = total - warm
        p = 1.0 if span <= 0 else min(1.0, (seen - warm) / span)
        return shape(p)

    return factor

