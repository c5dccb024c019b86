"""The loader's job counters (schedules, budgets, optimizer_steps_per_epoch): optimizer steps (windows)
closed and their loss tokens over all ranks, in the job and in the current epoch, and the window index of
a resumed epoch. They grow when a step that closes its window is handed out, from the step header's
global fields, so every rank counts the same. A part of OdbDataLoader with its own state
(``state_dict()["job"]`` of the loader's checkpoint)."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

from .state_codec import flag, integer, optional, read_fields, state_field


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
        """Restores the counters of a loader state's "job" entry (a :class:`JobState`, or what
        state_dict() wrote: read_job checks it; absent before state version 3: zeros);
        `epoch`/`epoch_complete`: the state's."""
        state = job if isinstance(job, JobState) else read_job(job, "job")
        self.optimizer_steps, self.loss_tokens = state.optimizer_steps, state.loss_tokens
        self.completed_epoch = None if state.completed_epoch is None else dataclasses.asdict(state.completed_epoch)
        self.epoch, self.epoch_windows, self.epoch_window_tokens = None, 0, 0
        self.epoch_from_start, self.resumed = False, False
        if not epoch_complete and state.epoch == epoch:
            # The epoch resumes: its windows so far count on (the window index continues after them).
            self.epoch = epoch
            self.epoch_windows = state.epoch_optimizer_steps
            self.epoch_window_tokens = state.epoch_loss_tokens
            self.epoch_from_start = state.epoch_from_start
            self.resumed = True


@dataclasses.dataclass(frozen=True)
class CompletedEpoch:
    """The last epoch seen whole (``job.completed_epoch`` of a state)."""

    epoch: int = state_field(integer(0))
    optimizer_steps: int = state_field(integer(0))
    loss_tokens: int = state_field(integer(0))


@dataclasses.dataclass(frozen=True)
class JobState:
    """A state's "job" entry (state version 3 on; :meth:`JobCounters.state_dict` writes it). A counter
    it lacks is 0."""

    optimizer_steps: int = state_field(integer(), 0)
    loss_tokens: int = state_field(integer(), 0)
    epoch: Optional[int] = state_field(optional(integer(0)), None)  # the epoch the epoch_* counters are of
    epoch_optimizer_steps: int = state_field(integer(), 0)
    epoch_loss_tokens: int = state_field(integer(), 0)
    epoch_from_start: bool = state_field(flag, False)
    completed_epoch: Optional[CompletedEpoch] = state_field(
        optional(lambda value, name: read_fields(CompletedEpoch, value, name + ".")), None)


def read_job(job: Any, name: str) -> JobState:
    """A state's "job" entry checked (null or absent: zeros); ValueError naming the field otherwise."""
    try:
        state = read_fields(JobState, job or {}, name + ".")
    except (ValueError, TypeError) as e:
        raise ValueError(f"odb loader state: malformed job counters ({e!r})") from None
    counters = {k: getattr(state, k) for k in ("optimizer_steps", "loss_tokens", "epoch_optimizer_steps",
                                              "epoch_loss_tokens")}
    if min(counters.values()) < 0:
        raise ValueError(f"odb loader state: negative job counters {counters}")
    return state
