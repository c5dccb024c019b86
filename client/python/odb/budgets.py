"""Job-level budgets and the epoch estimates schedules need (docs/python.md, "Schedules and budgets"):
``stop_at_samples`` cuts the epoch that reaches it, ``stop_at_loss_tokens`` ends the iteration after the
window that reaches it; an epoch's loss tokens and optimizer steps, exact once an epoch was seen whole,
estimated from a fixed-seed probe of the dataset before. A part of OdbDataLoader; its counters are
odb.job_counters'."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy as np

from .encoding import LENGTH_FIELD, encode_sample, sample_loss_tokens
from .job_counters import JobCounters


def positive_budget(name: str, value: Any) -> Optional[int]:
    """A budget argument: None, or a positive int (ValueError naming it otherwise)."""
    if value is not None and (isinstance(value, bool) or int(value) != value or int(value) < 1):
        raise ValueError(f"{name} must be a positive int (a job-level budget over all ranks), got {value!r}")
    return None if value is None else int(value)


class Budgets:
    """The job's budgets and the per-epoch estimates, over `samples_per_epoch()` samples an epoch."""

    def __init__(self, stop_at_samples: Optional[int], stop_at_loss_tokens: Optional[int]) -> None:
        self.stop_at_samples = positive_budget("stop_at_samples", stop_at_samples)
        self.stop_at_loss_tokens = positive_budget("stop_at_loss_tokens", stop_at_loss_tokens)
        self._probe_cache: Optional[Tuple[Any, float]] = None

    def sample_limit(self, epoch: int, per_epoch: int) -> Optional[int]:
        """stop_at_samples: how many of `epoch`'s samples (its order's first) the job still trains."""
        if self.stop_at_samples is None:
            return None
        return int(min(per_epoch, max(0, self.stop_at_samples - epoch * per_epoch)))

    def tokens_reached(self, counters: JobCounters) -> bool:
        """stop_at_loss_tokens: the windows handed out reached it."""
        return self.stop_at_loss_tokens is not None and counters.loss_tokens >= self.stop_at_loss_tokens

    def loss_tokens_per_sample(self, dataset: Any, probe: int, loss_tokens_from: Optional[str], ignore_index: int,
                               lengths_fn: Optional[Callable[..., Any]], length_field: str = LENGTH_FIELD) -> float:
        """Mean loss tokens per sample of `probe` samples of the dataset, drawn with a fixed seed (the same
        on every rank, so that every rank estimates alike); preprocessed here, once."""
        n = len(dataset)
        key = (probe, n)
        if self._probe_cache is not None and self._probe_cache[0] == key:
            return self._probe_cache[1]
        if n == 0:
            raise ValueError("odb: the dataset is empty: no epoch to estimate")
        picks = np.random.default_rng(0x0DB5).choice(n, size=min(probe, n), replace=False)
        total = 0
        for i in picks.tolist():
            sample = dataset[int(i)]
            loss = sample_loss_tokens(sample, loss_tokens_from, ignore_index)
            total += loss if loss is not None else encode_sample(sample, lengths_fn, length_field)[0][0]
        mean = total / picks.size
        self._probe_cache = (key, mean)
        return mean


def optimizer_steps_for(tokens: int, target: Optional[int]) -> int:
    """An epoch's optimizer steps estimated from its loss tokens and the window target (windows average
    within 2% of it, the last one may be short); without windows a ValueError that says what to do."""
    if not target:
        raise ValueError(
            "odb: without accumulation windows (tokens_per_optimizer_step) every aligned step is an "
            "optimizer step, and how many an epoch has depends on how the daemons group the lengths: it is "
            "known after the first epoch. Pass tokens_per_optimizer_step=T (an epoch then has about "
            "loss_tokens_per_epoch() / T optimizer steps), or schedule by tokens: odb.lr_by_tokens(loader, ...)")
    return max(1, int(np.ceil(tokens / target - 0.5)))
