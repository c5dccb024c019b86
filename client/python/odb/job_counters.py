"""The loader's job counters (schedules, budgets, optimizer_steps_per_epoch): optimizer steps (windows)
closed and their loss tokens over all ranks, in the job and in the current epoch, and the window index of
a resumed epoch. They grow when a step that closes its window is handed out, from the step header's
global fields, so every rank counts the same. A part of OdbDataLoader with its own state
(``state_dict()["job"]`` of the loader's checkpoint)."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import numpy as np

from .state_codec import check_int


class JobCounters:
    """Windows closed and their loss tokens, in the job and in the epoch being counted."""

    def __init__(self) -> None:
        self.optimizer_steps = 0
        self.loss_tokens = 0
        self.epoch: Optional[int] = None  # the epoch the epoch_* counters are of
        self.epoch_windows = 0
        self.epoch_window_tokens = 0
        self.epoch_from_start = False  # the epoch counters cover the epoch since its first step
        # The last epoch seen to its end from its start: {"epoch", "optimizer_steps", "loss_tokens"}.
        self.completed_epoch: Optional[Dict[str, int]] = None
        # Window index of the uninterrupted run minus the daemon's, for a resumed epoch (new daemons count
        # their windows from 0): set at the first step after a resume.
        self.window_offset: Optional[int] = 0
        self.resumed = False  # load_state_dict restored the current epoch's counters

    def start_epoch(self, epoch: int) -> None:
        """An epoch's iteration begins: a resumed epoch counts on, any other from 0."""
        if self.resumed:
            self.resumed = False
            self.window_offset = None  # set at the first step: the daemons count windows from 0 again
        else:
            self.epoch, self.epoch_windows, self.epoch_window_tokens = epoch, 0, 0
            self.epoch_from_start, self.window_offset = True, 0

    def count_step(self, info: Mapping[str, Any]) -> int:
        """Counts a step handed out (or drained); returns its window index in the uninterrupted run."""
        if self.window_offset is None:  # the first step after a resume: windows before it were closed
            self.window_offset = self.epoch_windows - int(info["window"])
        window = int(info["window"]) + self.window_offset
        if info["closes_window"]:
            tokens = int(info["window_loss_tokens"])
            self.optimizer_steps += 1
            self.loss_tokens += tokens
            self.epoch_windows += 1
            self.epoch_window_tokens += tokens
        return window

    def finish_epoch(self, summary_epoch: Optional[int], whole: bool) -> None:
        """The epoch's summary came: an epoch counted from its start over all its samples (`whole`: no
        sample budget cut it) is what the next epochs will train: optimizer_steps_per_epoch knows it."""
        counted = self.epoch
        if self.epoch_from_start and whole and counted == (counted if summary_epoch is None else summary_epoch):
            self.completed_epoch = {"epoch": int(counted or 0), "optimizer_steps": int(self.epoch_windows),
                                    "loss_tokens": int(self.epoch_window_tokens)}

    def state_dict(self) -> Dict[str, Any]:
        """What a checkpoint carries (``state_dict()["job"]`` of the loader)."""
        return {"optimizer_steps": int(self.optimizer_steps), "loss_tokens": int(self.loss_tokens),
                "epoch": None if self.epoch is None else int(self.epoch),
                "epoch_optimizer_steps": int(self.epoch_windows),
                "epoch_loss_tokens": int(self.epoch_window_tokens), "epoch_from_start": bool(self.epoch_from_start),
                "completed_epoch": None if self.completed_epoch is None else dict(self.completed_epoch)}

    def load_state_dict(self, job: Any, epoch: int, epoch_complete: bool) -> None:
        """Restores the counters of a loader state's "job" entry (absent before state version 3: zeros);
        `epoch`/`epoch_complete`: the state's. ValueError naming the field on anything malformed."""
        job = job or {}
        try:
            if not isinstance(job, Mapping):
                raise TypeError(f"a mapping, got {type(job).__name__}")
            counters = {k: check_int(job.get(k, 0), f"job.{k}", None)
                        for k in ("optimizer_steps", "loss_tokens", "epoch_optimizer_steps", "epoch_loss_tokens")}
            job_epoch = None if job.get("epoch") is None else check_int(job["epoch"], "job.epoch", 0)
            if not isinstance(job.get("epoch_from_start", False), (bool, np.bool_)):
                raise TypeError(f"job.epoch_from_start must be true or false, got {job['epoch_from_start']!r}")
            completed = job.get("completed_epoch")
            if completed is not None and not isinstance(completed, Mapping):
                raise TypeError(f"job.completed_epoch must be a mapping or null, got {completed!r}")
            if completed is not None:
                completed = {k: check_int(completed[k], f"job.completed_epoch.{k}", 0)
                             for k in ("epoch", "optimizer_steps", "loss_tokens")}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"odb loader state: malformed job counters ({e!r})") from None
        if min(counters.values()) < 0:
            raise ValueError(f"odb loader state: negative job counters {counters}")
        self.optimizer_steps = counters["optimizer_steps"]
        self.loss_tokens = counters["loss_tokens"]
        self.completed_epoch = completed
        self.epoch, self.epoch_windows, self.epoch_window_tokens = None, 0, 0
        self.epoch_from_start, self.resumed = False, False
        if not epoch_complete and job_epoch == epoch:
            # The epoch resumes: its windows so far count on (the window index continues after them).
            self.epoch = epoch
            self.epoch_windows = counters["epoch_optimizer_steps"]
            self.epoch_window_tokens = counters["epoch_loss_tokens"]
            self.epoch_from_start = bool(job.get("epoch_from_start", False))
            self.resumed = True
