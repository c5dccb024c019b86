"""OdbDataLoader: a drop-in around a map-style Dataset that batches through odbd.

Data path: the DataLoader workers (``num_workers`` processes, or a thread when
0) run the user's ``dataset[i]`` preprocessing with a null collate; each worker
owns a Producer, created lazily inside the worker process (ZeroMQ contexts do
not survive fork), and sends every single sample to this rank's daemon. The
daemons group samples by real length under the token budget, align the step
count across ranks and stream steps back; the trainer iterates :class:`Step`
objects whose batch tensors are zero-copy views of the received frames.

Failure handling (never a hang): the trainer polls the daemon in short slices
and between them checks (1) the DataLoader iterator, run by a pump thread,
which re-raises a worker's preprocessing exception or its death; (2) a daemon
spawned by this process (:func:`odb.spawn_daemon`) exiting; (3) an overall
`timeout_s` without any step.

This module keeps OdbDataLoader (the epoch loop, checkpoint/resume, IDLE and
dummy batches). Its units are modules of their own: odb.step (Step),
odb.encoding (sample encoding, dtype codes), odb.pump (the workers' send
stream, the pump thread, OdbWorkerError), odb.progress (the progress line) and
odb.state_codec (the checkpoint state's format and consumed-set codec).
"""
from __future__ import annotations

import multiprocessing
import os
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ._native import native
from .daemon import check_reachable, daemon_pid, endpoints, env_rank, env_world_size, pid_alive, spawned_daemon
# The loader's units live in their own modules; every name is re-exported here (``X as X``), so that
# ``from odb.loader import X`` keeps working for each of them.
from .encoding import _LENGTH_KEYS as _LENGTH_KEYS
from .encoding import _dtype_codes as _dtype_codes
from .encoding import _to_torch as _to_torch
from .encoding import encode_sample as encode_sample
from .encoding import sample_loss_tokens as sample_loss_tokens
from .progress import Progress as Progress
from .pump import OdbWorkerError as OdbWorkerError
from .pump import _null_collate as _null_collate
from .pump import _Pump as _Pump
from .pump import _SendStream as _SendStream
from .stacks import check_caller_stack
from .state_codec import STATE_FORMAT as STATE_FORMAT
from .state_codec import STATE_VERSION as STATE_VERSION
from .state_codec import compress_ints as compress_ints
from .state_codec import decode_rank_positions, encode_rank_positions, list_fingerprint, take_positions
from .state_codec import compress_mask as compress_mask
from .state_codec import expand_ints as expand_ints
from .state_codec import is_int, packed_top
from .step import _MISSING as _MISSING
from .step import Step as Step

IDLE_POLICIES = ("zero_step", "join")
# How samples reach the daemon and steps the trainer (docs/shm.md): "auto"
# (shared memory with a local daemon, ZeroMQ frames otherwise), "shm" (shared
# memory or an error), "zmq" (frames always).
DATA_PLANES = ("auto", "shm", "zmq")


def _check_int(value: Any, name: str, minimum: Optional[int]) -> int:
    """A state field that must be an integer (at least `minimum`): its value, or ValueError naming it."""
    if not is_int(value):
        raise ValueError(f"odb loader state: {name} must be an integer, got {value!r}")
    if minimum is not None and int(value) < minimum:
        raise ValueError(f"odb loader state: {name} is {int(value)}, below {minimum}")
    return int(value)


def _step_seqs(info: Any, n: int) -> np.ndarray:
    """A step's per-sample seqs (Step.seqs) as int64, -1 for a sample whose seq the step does not give."""
    seqs = info.get("seqs")
    if seqs is None or len(seqs) != n:
        return np.full(n, -1, dtype=np.int64)
    try:
        return np.asarray(seqs, dtype=np.int64)
    except (TypeError, OverflowError):  # None among them (a sample without seq), or past int64
        return np.asarray([-1 if q is None or q >= 1 << 63 else q for q in seqs], dtype=np.int64)


def _distinct(ids: np.ndarray, n: int) -> np.ndarray:
    """The distinct values of `ids` (each in [0, n)), sorted, through a mask (O(n + len(ids)), no sort)."""
    mask = np.zeros(n, dtype=bool)
    mask[ids] = True
    return np.flatnonzero(mask)


class _SamplerPlan:
    """A custom sampler's list on this rank for one epoch: `full` (every index the sampler gave, in
    order: a position indexes it), `sent` (the positions sent, in order: their seqs are 0, 1, ...),
    `consumed_before` (the positions a loaded state counts as trained) and the list's fingerprint."""

    def __init__(self, epoch: int, full: np.ndarray, sent: np.ndarray, consumed_before: np.ndarray,
                 fingerprint: str) -> None:
        self.epoch = epoch
        self.full = full
        self.sent = sent
        self.consumed_before = consumed_before
        self.fingerprint = fingerprint
        self._free: Optional[Tuple[np.ndarray, np.ndarray]] = None

    def free(self) -> Tuple[np.ndarray, np.ndarray]:
        """(indices, positions) of the positions sent and not consumed before, sorted by (index,
        position): built once per epoch (O(list) and a sort), then every checkpoint of the epoch
        looks its trained samples up in it."""
        if self._free is None:
            mask = np.zeros(self.full.size, dtype=bool)
            mask[self.sent] = True
            mask[self.consumed_before] = False
            positions = np.flatnonzero(mask)
            ids = self.full[positions]
            order = np.argsort(ids, kind="stable")
            self._free = (ids[order], positions[order])
        return self._free


class OdbDataLoader:
    """Drop-in for ``torch.utils.data.DataLoader`` that batches through odbd.

    Args:
      dataset: map-style dataset; ``dataset[i]`` returns a sample dict with
        "input_ids" (1-D, its length = tokens) and optional extras (labels,
        pixel_values, int vision_patches / audio_frames, ...). ``i`` becomes
        the sample id; an index may repeat (a sampler with replacement): each
        position of the rank's list is trained once.
      sampler: indices this rank feeds, in order. Default: all of
        ``range(len(dataset))``, shuffled with ``seed + epoch`` when `shuffle`,
        then this rank's share ``[rank::world_size]`` (no padding: ranks may get
        different counts, odb aligns the steps).
      num_workers: DataLoader worker processes (0: a thread of this process).
      idle_policy: "zero_step" (IDLE steps come as dummy steps with weight 0:
        run forward/backward so collectives match) or "join" (use DDP's
        ``model.join()``: once every sample this rank sent has come back, the
        loop ends and the epoch's remaining IDLE steps are dropped; IDLE steps
        before that still come as dummy steps, since the other ranks' real
        steps need this rank. With a planner that moves samples between ranks
        a rank is never done before the epoch ends, so join drops nothing).
      dummy_sample: the sample used to build dummy batches; default
        ``dataset[first index]`` (computed once, in this process).
      packed: whether odbd packs steps (``collate.packed``). Dummy batches
        then have the packed layout (one sequence: ``cu_seqlens`` [0, L],
        ``position_ids`` [1, L], no attention mask). None: learned from the
        first real step (IDLE steps before it come padded); when given, a
        real step of the other layout is an error.
      rank, run_dir, ingest_endpoint, trainer_endpoint: where the daemon is
        (default: torch.distributed / $RANK and $ODB_RUN_DIR, see
        :func:`odb.endpoints`).
      timeout_s: no step for this long is an error (OdbTimeout).
      poll_ms: slice of each wait; between slices workers and daemon are checked.
      pin_memory: with a CUDA device, each batch's tensors are page-locked
        copies (``Tensor.pin_memory()``, as torch's DataLoader does), so
        ``.to(device, non_blocking=True)`` overlaps the copy with compute;
        the step's received memory goes back to the daemon at once. Without
        CUDA: a warning, and batches stay as received.
      data_plane: "auto" (default: the workers' samples go through
        shared-memory arenas and steps through the daemon's step arena when
        the daemon runs on this host; ZeroMQ frames otherwise), "shm" (shared
        memory or an error), "zmq" (frames always). See docs/shm.md;
        ``data_plane_in_use`` says what the trainer got.
      summary_dir: when set, one JSON line per step of this rank is appended to
        ``<summary_dir>/rank<r>-epoch<e>.jsonl`` (step, idle, real and padded
        tokens, lengths) for :func:`odb.report` (PNG plots after the epoch).
      progress: a progress line per epoch (samples, steps, idle, tokens/s,
        padding, ETA by samples; tqdm when installed). Default: on when
        stderr is a terminal, off otherwise (batch jobs, CI).
      tokens_per_optimizer_step: the optimizer batch in loss tokens over all
        ranks (accumulation windows); the daemon must run the same
        ``optimizer.tokens_per_step``. None: whatever the daemon runs.
      stop_at_samples: a job-level budget: training ends once this many
        samples (all ranks, counted over the epochs from epoch 0) are trained:
        the epoch that reaches it sends only its first samples of the epoch's
        order (so exactly that many are trained; its last window may be short)
        and later epochs are empty on every rank (``budget_reached``).
      stop_at_loss_tokens: a job-level budget in loss tokens (all ranks): the
        iteration ends on every rank after the optimizer step (window) that
        reaches it, the same step everywhere (the count is a global figure),
        so it ends at most one optimizer step past it; later epochs are empty.
        Both budgets resume with the loader's state (docs/python.md,
        "Schedules and budgets").
    """

    def __init__(self, dataset: Dataset, *, sampler: Optional[Sampler] = None, shuffle: bool = False,
                 num_workers: int = 0, seed: int = 0, idle_policy: str = "zero_step",
                 dummy_sample: Optional[Mapping[str, Any]] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, run_dir: Optional[str] = None,
                 ingest_endpoint: Optional[str] = None, trainer_endpoint: Optional[str] = None,
                 lengths_fn: Optional[Callable[[Mapping[str, Any]], Tuple[int, ...]]] = None,
                 worker_init_fn: Optional[Callable[[int], None]] = None,
                 multiprocessing_context: Any = None, timeout_s: float = 120.0, poll_ms: int = 200,
                 send_timeout_ms: int = 120000, progress_every: int = 16,
                 pin_memory: bool = False, progress: Optional[bool] = None,
                 summary_dir: Optional[str] = None, data_plane: str = "auto",
                 tokens_per_optimizer_step: Optional[int] = None, loss_tokens_from: Optional[str] = None,
                 ignore_index: int = -100, stop_at_samples: Optional[int] = None,
                 stop_at_loss_tokens: Optional[int] = None, packed: Optional[bool] = None) -> None:
        for name, value in (("stop_at_samples", stop_at_samples), ("stop_at_loss_tokens", stop_at_loss_tokens)):
            if value is not None and (isinstance(value, bool) or int(value) != value or int(value) < 1):
                raise ValueError(f"{name} must be a positive int (a job-level budget over all ranks), got {value!r}")
        self.stop_at_samples = None if stop_at_samples is None else int(stop_at_samples)
        self.stop_at_loss_tokens = None if stop_at_loss_tokens is None else int(stop_at_loss_tokens)
        if tokens_per_optimizer_step is not None and int(tokens_per_optimizer_step) < 0:
            raise ValueError(f"tokens_per_optimizer_step must be >= 0, got {tokens_per_optimizer_step}")
        # The optimizer batch in loss tokens over all ranks: the daemons cut the steps into windows of it
        # (optimizer.tokens_per_step in odbd's config, the same on every rank); the loader checks that
        # the daemon runs this target. None: whatever the daemon runs.
        self.tokens_per_optimizer_step = None if tokens_per_optimizer_step is None else int(tokens_per_optimizer_step)
        self.loss_tokens_from = loss_tokens_from
        self.ignore_index = ignore_index
        if idle_policy not in IDLE_POLICIES:
            raise ValueError(f"idle_policy must be one of {IDLE_POLICIES}, not {idle_policy!r}")
        if data_plane not in DATA_PLANES:
            raise ValueError(f"data_plane must be one of {DATA_PLANES}, not {data_plane!r}")
        self.data_plane = data_plane
        self.dataset = dataset
        self.sampler = sampler
        self.shuffle = shuffle
        self.num_workers = num_workers
        self.seed = seed
        self.idle_policy = idle_policy
        self.rank = env_rank() if rank is None else rank
        self.world_size = env_world_size() if world_size is None else world_size
        eps = endpoints(self.rank, run_dir)
        self.ingest_endpoint = ingest_endpoint or eps.ingest
        self.trainer_endpoint = trainer_endpoint or eps.trainer
        self.lengths_fn = lengths_fn
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.timeout_s = timeout_s
        self.poll_ms = poll_ms
        self.send_timeout_ms = send_timeout_ms
        self.progress_every = progress_every
        self.pin_memory = pin_memory
        self._pin_warned = False
        if progress is None:
            import sys

            progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self.progress = progress
        self.progress_stream: Any = None  # where the lines go (None: stderr, or tqdm)
        self.summary_dir = summary_dir
        self.epoch = 0
        self._dummy_sample = dummy_sample
        self._dummy_batch: Optional[Dict[str, torch.Tensor]] = None
        self.packed = None if packed is None else bool(packed)
        self._packed_seen: Optional[bool] = None  # the layout of the real steps received so far
        self._consumer: Any = None
        self.last_summary: Optional[Dict[str, Any]] = None
        self.samples_sent = 0
        self.data_wait_s = 0.0  # this epoch's time the trainer spent in next(loader) waiting for steps
        self.late_for_closed_epoch = 0  # Non-Join: samples that arrived after their epoch closed
        self.dropped_trailing_idle = 0
        # Resume (docs/resume.md): sample ids of the current epoch's steps
        # yielded so far, and what a loaded state says was consumed before
        # (keys: positions in the epoch's order; with a custom sampler
        # (rank, position) pairs of the ranks' lists, or ids from an older state).
        self._consumed_ids: List[Any] = []  # per step: an int64 array of its sample ids
        self._consumed_owners: List[Any] = []  # per step: the rank whose list each of its samples came from
        # per step: each sample's seq (its index among the positions its owner rank sent), -1 where the
        # step did not say (a daemon older than Step.seqs, or a sample sent without seq)
        self._consumed_seqs: List[Any] = []
        self._consumed_steps: List[int] = []  # the step index of each _consumed_ids entry
        # The loaded state's key: "position", "id" (a custom sampler's state from odb < state version 4:
        # dataset indices, every position of one consumed) or "rank_position" (_resume_keys then holds
        # encode_rank_positions codes of _resume_lists ranks' lists, _resume_ids their dataset indices
        # for a resume at another world size, _resume_fingerprints each list's fingerprint or None).
        self._resume_key = "position"
        self._resume_lists = 0
        self._resume_ids: np.ndarray = np.zeros(0, dtype=np.int64)
        self._resume_fingerprints: Optional[List[Optional[str]]] = None
        # Custom sampler: this rank's list of the epoch being iterated and what of it was sent
        # (_SamplerPlan), and the (index, position)-sorted free positions for state_dict (built once).
        self._plan: Optional[_SamplerPlan] = None
        self._consumed_epoch: Optional[int] = None
        # The last step yielded (any kind): (step_index, round, round_first_step,
        # round_steps, deterministic), for a deterministic checkpoint.
        self._last_step: Optional[Tuple[int, int, int, int, bool]] = None
        # A loaded deterministic state: where the resumed epoch replays from.
        self._replay: Optional[Dict[str, Any]] = None
        self._position_cache: Optional[Tuple[int, np.ndarray]] = None  # (epoch, id -> position)
        self._resume_epoch: Optional[int] = None
        self._resume_keys: np.ndarray = np.zeros(0, dtype=np.int64)
        # Job counters (schedules, budgets, optimizer_steps_per_epoch): optimizer steps (windows) closed and
        # their loss tokens over all ranks, in the job and in the current epoch. They grow when a step that
        # closes its window is handed out, from global header fields, so every rank counts the same.
        self.job_optimizer_steps = 0
        self.job_loss_tokens = 0
        self._epoch_windows = 0
        self._epoch_window_tokens = 0
        self._epoch_counted: Optional[int] = None  # the epoch the _epoch_* counters are of
        self._epoch_from_start = False  # those counters cover the epoch since its first step
        # The last epoch seen to its end from its start: {"epoch", "optimizer_steps", "loss_tokens"}.
        self._completed_epoch: Optional[Dict[str, Any]] = None
        # Window index of the uninterrupted run minus the daemon's, for a resumed epoch (new daemons count
        # their windows from 0): set at the first step after a resume.
        self._window_offset: Optional[int] = 0
        self._probe_cache: Optional[Tuple[Any, float]] = None
        self._counters_resumed = False  # load_state_dict restored the current epoch's counters

    # ----- epoch and indices -------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch (and the sampler's, when it has set_epoch)."""
        self.epoch = int(epoch)
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)  # type: ignore[attr-defined]

    def _global_order(self) -> np.ndarray:
        """Every index of the epoch in its (seeded) order, before the rank split."""
        n = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            return torch.randperm(n, generator=g).numpy().astype(np.int64)
        return np.arange(n, dtype=np.int64)

    def _replaying(self) -> bool:
        """A deterministic state is loaded for this epoch at the same world size:
        the epoch resumes at the round of its checkpoint, step for step."""
        return (self._resume_epoch == self.epoch and self._replay is not None
                and int(self._replay["world_size"]) == self.world_size
                and (self._resume_key != "rank_position" or self._resume_lists == self.world_size))

    def indices(self) -> List[int]:
        """The sample indices this rank sends in the current epoch (after a
        resume: those no rank had consumed, split over the current ranks; with
        a custom sampler this rank's list less its consumed positions; a
        deterministic resume at the same world size keeps each rank's list of
        the uninterrupted run, less what the rounds before the checkpoint's
        round took)."""
        if self.sampler is not None:
            plan = self._sampler_plan()
            return plan.full[plan.sent].tolist()
        resuming = self._resume_epoch == self.epoch
        limit = self._epoch_sample_limit(self.epoch)  # stop_at_samples: the epoch's first `limit` samples
        if self._replaying():
            assert self._replay is not None
            done = self._replay["before_round"]  # keys consumed in rounds before the replayed one
            order = self._global_order()
            positions = np.arange(order.size, dtype=np.int64)[self.rank::self.world_size]
            if limit is not None:
                positions = positions[positions < limit]
            gone = np.zeros(order.size, dtype=bool)
            gone[done[done < order.size]] = True
            return order[positions[~gone[positions]]].tolist()
        order = self._global_order()
        if limit is not None:
            order = order[:limit]
        if resuming:
            keep = np.ones(order.size, dtype=bool)
            keep[self._resume_keys[self._resume_keys < order.size]] = False
            order = order[keep]
        return order[self.rank::self.world_size].tolist()

    def _sampler_plan(self) -> "_SamplerPlan":
        """This rank's custom-sampler list for the epoch (one draw of the sampler) and the positions of it
        that are sent: all of them, less those a loaded state counts as trained (a deterministic resume at
        the same world size: less those of the rounds before the replayed one), within the share of a
        sample budget."""
        full = np.asarray([int(i) for i in self.sampler], dtype=np.int64)  # type: ignore[union-attr]
        limit = self._epoch_sample_limit(self.epoch)
        send = full.size if limit is None else min(full.size, self._rank_share(limit))
        fingerprint = list_fingerprint(full)
        consumed = np.zeros(0, dtype=np.int64)
        dropped = consumed
        if self._resume_epoch == self.epoch:
            consumed = self._consumed_positions(full, self._resume_keys, fingerprint)
            dropped = consumed
            if self._replaying():
                assert self._replay is not None
                dropped = self._consumed_positions(full, self._replay["before_round"], fingerprint)
        keep = np.ones(send, dtype=bool)
        keep[dropped[dropped < send]] = False
        return _SamplerPlan(self.epoch, full, np.flatnonzero(keep), consumed, fingerprint)

    def _consumed_positions(self, full: np.ndarray, keys: np.ndarray, fingerprint: str) -> np.ndarray:
        """The positions of this rank's list `full` that loaded keys name: its own (rank, position) pairs
        when the state's lists are of this world size; otherwise (another world size, or a state of
        odb < 4 keyed by dataset index) every position of an index the state names as consumed."""
        if self._resume_key == "rank_position" and self._resume_lists == self.world_size:
            known = (self._resume_fingerprints or [None] * self.world_size)[self.rank]
            if known is not None and known != fingerprint:
                raise ValueError(
                    f"odb: the loaded state's positions are of another list: rank {self.rank}'s sampler gives "
                    f"epoch {self.epoch} a different list ({full.size} indices, fingerprint {fingerprint}) than "
                    f"when the checkpoint was taken ({known}), so its positions would name other samples. Resume "
                    f"with the same sampler, seeded the same way (a torch.Generator with a fixed seed, or "
                    f"set_epoch), at the same world size")
            positions = decode_rank_positions(keys, self._resume_lists, self.rank)
            if positions.size and int(positions[-1]) >= full.size:
                raise ValueError(f"odb loader state names position {int(positions[-1])} of rank {self.rank}'s "
                                 f"list, which holds {full.size} indices: resume with the sampler it was taken with")
            return positions
        ids = keys if self._resume_key == "id" else self._resume_ids
        return np.flatnonzero(np.isin(full, ids))

    def _rank_share(self, limit: int) -> int:
        """With a sample budget, this rank's share of the epoch's first `limit` samples (every rank's
        sampler is taken to give as many: DistributedSampler does)."""
        return limit // self.world_size + (1 if self.rank < limit % self.world_size else 0)

    # ----- budgets and schedules (docs/python.md, "Schedules and budgets") ---------
    def samples_per_epoch(self) -> int:
        """The samples of one epoch over all ranks: len(dataset), or with a sampler its length x world size."""
        if self.sampler is None:
            return len(self.dataset)  # type: ignore[arg-type]
        try:
            n = len(self.sampler)  # type: ignore[arg-type]
        except TypeError:
            n = sum(1 for _ in self.sampler)
        return int(n) * self.world_size

    def _epoch_sample_limit(self, epoch: int) -> Optional[int]:
        """stop_at_samples: how many of the epoch's samples (its order's first) the job still trains."""
        if self.stop_at_samples is None:
            return None
        n = self.samples_per_epoch()
        return int(min(n, max(0, self.stop_at_samples - epoch * n)))

    @property
    def budget_reached(self) -> bool:
        """True once the job's budget (stop_at_samples / stop_at_loss_tokens) is trained: iterating yields
        nothing, on every rank alike. Leave the epoch loop on it."""
        if self.stop_at_loss_tokens is not None and self.job_loss_tokens >= self.stop_at_loss_tokens:
            return True
        limit = self._epoch_sample_limit(self.epoch)
        if limit is None:
            return False
        ended = self.last_summary is not None and self.last_summary.get("epoch") == self.epoch
        return limit == 0 or (ended and limit < self.samples_per_epoch())  # the cut epoch has ended

    def _probe_loss_tokens_per_sample(self, probe: int) -> float:
        """Mean loss tokens per sample of `probe` samples of the dataset, drawn with a fixed seed (the same
        on every rank, so that every rank estimates alike); preprocessed here, once."""
        key = (probe, len(self.dataset))  # type: ignore[arg-type]
        if self._probe_cache is not None and self._probe_cache[0] == key:
            return self._probe_cache[1]
        n = len(self.dataset)  # type: ignore[arg-type]
        if n == 0:
            raise ValueError("odb: the dataset is empty: no epoch to estimate")
        picks = np.random.default_rng(0x0DB5).choice(n, size=min(probe, n), replace=False)
        total = 0
        for i in picks.tolist():
            sample = self.dataset[int(i)]
            loss = sample_loss_tokens(sample, self.loss_tokens_from, self.ignore_index)
            total += loss if loss is not None else encode_sample(sample, self.lengths_fn)[0][0]
        mean = total / picks.size
        self._probe_cache = (key, mean)
        return mean

    def loss_tokens_per_epoch(self, probe: int = 256) -> Tuple[int, bool]:
        """(loss tokens of one epoch over all ranks, exact): exact once an epoch was seen from its start to
        its end (every epoch trains the same samples); before that an estimate: the epoch's sample count x
        the mean of `probe` samples drawn with a fixed seed (preprocessed in this process, once)."""
        done = self._completed_epoch
        if done is not None:
            return int(done["loss_tokens"]), True
        return int(round(self.samples_per_epoch() * self._probe_loss_tokens_per_sample(probe))), False

    def optimizer_steps_per_epoch(self, probe: int = 256) -> int:
        """Optimizer steps (accumulation windows; without windows, aligned steps) in one epoch, the same
        figure on every rank: what a step-based LR schedule needs (``len(loader)`` stays a TypeError: the
        aligned micro-steps are not optimizer steps and are not known in advance).

        After an epoch seen from its start to its end: that epoch's count (the next epochs train the same
        loss tokens, in windows of the same target; exact for a replay of that epoch in reproducible mode,
        ``alignment.deterministic``). Before: with ``tokens_per_optimizer_step`` T, the estimated epoch loss
        tokens / T (:meth:`loss_tokens_per_epoch`; windows average within 2% of T and the last one may be
        short); without windows, the epoch's steps are known only once one ran (ValueError before).
        Measured error: docs/python.md, "Schedules and budgets"."""
        done = self._completed_epoch
        if done is not None:
            return int(done["optimizer_steps"])
        target = self.tokens_per_optimizer_step
        if not target:
            raise ValueError(
                "odb: without accumulation windows (tokens_per_optimizer_step) every aligned step is an "
                "optimizer step, and how many an epoch has depends on how the daemons group the lengths: it is "
                "known after the first epoch. Pass tokens_per_optimizer_step=T (an epoch then has about "
                "loss_tokens_per_epoch() / T optimizer steps), or schedule by tokens: odb.lr_by_tokens(loader, ...)")
        tokens, _ = self.loss_tokens_per_epoch(probe)
        return max(1, int(np.ceil(tokens / target - 0.5)))

    def state_extras(self) -> Dict[str, Any]:
        """The job counters a checkpoint carries (inside state_dict()["job"])."""
        return {"optimizer_steps": int(self.job_optimizer_steps), "loss_tokens": int(self.job_loss_tokens),
                "epoch": None if self._epoch_counted is None else int(self._epoch_counted),
                "epoch_optimizer_steps": int(self._epoch_windows),
                "epoch_loss_tokens": int(self._epoch_window_tokens), "epoch_from_start": bool(self._epoch_from_start),
                "completed_epoch": None if self._completed_epoch is None else dict(self._completed_epoch)}

    def _count_step(self, info: Any) -> int:
        """Job and epoch counters, and the window index, of a step handed out (or drained)."""
        if self._window_offset is None:  # the first step after a resume: windows before it were closed
            self._window_offset = self._epoch_windows - int(info["window"])
        window = int(info["window"]) + self._window_offset
        if info["closes_window"]:
            tokens = int(info["window_loss_tokens"])
            self.job_optimizer_steps += 1
            self.job_loss_tokens += tokens
            self._epoch_windows += 1
            self._epoch_window_tokens += tokens
        return window

    # ----- checkpoint state (torch.utils.data Stateful protocol) ---------------
    def state_dict(self) -> Dict[str, Any]:
        """What a checkpoint needs to resume this epoch without replaying it:
        the samples of every step yielded so far (all ranks', when
        torch.distributed is initialized: call it on every rank at the same
        step, as DDP checkpoints are taken), never tensors. See docs/resume.md."""
        epoch = self.epoch if self._consumed_epoch is None else self._consumed_epoch
        ids = (np.concatenate([np.asarray(c, dtype=np.int64) for c in self._consumed_ids])
               if self._consumed_ids else np.zeros(0, dtype=np.int64))
        steps = np.repeat(np.asarray(self._consumed_steps, dtype=np.int64),
                          [len(c) for c in self._consumed_ids]).astype(np.int64)
        # Deterministic epochs replay from the round of the last step: the keys
        # of that round's steps so far are kept apart (they are trained, and
        # the resumed daemons plan them again into the same steps, skipped).
        replay: Optional[Dict[str, Any]] = None
        first: Optional[int] = None  # the replayed round's first step, when the checkpoint is inside it
        last = self._last_step if self._consumed_epoch == epoch else None
        if last is not None and last[4]:
            step, rnd, first_step, count, _ = last
            if step + 1 >= first_step + count:  # the round is complete: resume at the next one
                replay = {"round": rnd + 1, "first_step": step + 1, "next_step": step + 1}
            else:
                replay = {"round": rnd, "first_step": first_step, "next_step": step + 1}
                first = first_step
        loaded = self._replay
        # The loaded state's round goes on only when this run replayed it (same world size): a resume at
        # another world size numbers its rounds from 0 again, and its round R is not the state's.
        loaded_in_round = (first is not None and replay is not None and loaded is not None and epoch == self.epoch
                           and self._replaying() and int(loaded["round"]) == replay["round"])
        in_round = steps >= first if first is not None else np.zeros(ids.size, dtype=bool)
        world = self.world_size
        gathering = world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
        scope = "all_ranks" if gathering or world == 1 else "this_rank"
        complete = self.last_summary is not None and self.last_summary.get("epoch") == epoch
        extra: Dict[str, Any] = {}
        if self.sampler is None:
            if epoch != self.epoch:
                raise RuntimeError("odb: state_dict() after set_epoch() moved to another epoch; take it "
                                   "before set_epoch()")
            if self._position_cache is None or self._position_cache[0] != epoch:
                order = self._global_order()
                position = np.empty(order.size, dtype=np.int64)
                position[order] = np.arange(order.size, dtype=np.int64)
                self._position_cache = (epoch, position)  # one O(n) pass per epoch, reused by later checkpoints
            keys = self._position_cache[1][ids] if ids.size else ids
            round_keys = keys[in_round]
            if loaded_in_round:
                assert loaded is not None
                round_keys = np.concatenate([round_keys, loaded["in_round"]])  # skipped at the resume
            if self._resume_epoch == epoch:
                keys = np.concatenate([keys, self._resume_keys])
            if gathering:
                gathered: List[Any] = [None] * torch.distributed.get_world_size()
                torch.distributed.all_gather_object(gathered, (keys, round_keys))
                keys = np.concatenate([np.asarray(g[0], dtype=np.int64) for g in gathered])
                round_keys = np.concatenate([np.asarray(g[1], dtype=np.int64) for g in gathered])
            mask = np.zeros(len(self.dataset), dtype=bool)  # type: ignore[arg-type]
            mask[keys] = True
            consumed: Any = compress_mask(mask)
            round_consumed: Any = compress_ints(round_keys)
            key = "position"
        else:
            key, consumed, round_consumed, extra, exact_replay = self._sampler_consumed(
                epoch, ids, in_round, loaded_in_round, replay is not None, gathering)
            if not exact_replay:
                replay = None  # the resume is the ordinary exactly-once one (docs/resume.md)
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "epoch": int(epoch),
                "epoch_complete": bool(complete), "seed": int(self.seed), "shuffle": bool(self.shuffle),
                "custom_sampler": self.sampler is not None, "dataset_len": len(self.dataset),  # type: ignore[arg-type]
                "world_size": int(world), "scope": scope, "consumed": consumed, "key": key, **extra,
                "replay": (None if replay is None or complete else
                           dict(replay, world_size=int(world), round_consumed=round_consumed)),
                "job": self.state_extras()}

    def _sampler_consumed(self, epoch: int, ids: np.ndarray, in_round: np.ndarray,
                          loaded_in_round: bool, replaying: bool,
                          gathering: bool) -> Tuple[str, Any, Any, Dict[str, Any], bool]:
        """A custom sampler's consumed samples as positions in each rank's list ("rank_position"):
        (key, consumed, the replayed round's consumed, the extra state keys, whether a replay is exact).

        A step names each sample's seq (Step.seqs: the sample's index among the positions its owner rank
        sent), so a rank maps the trained samples of its own list to their positions exactly:
        plan.sent[seq]. Only when a step does not give a seq (a daemon older than the field) are the
        trained copies of an index mapped to its first free positions in list order (take_positions), and
        a replay is then exact only where no other copy of the index was free. With samples moving between
        ranks (global planner) a rank's samples may be trained by another rank: the first all_gather hands
        every rank all trained samples, their owners and seqs, the second each rank's positions."""
        plan = self._plan if self._plan is not None and self._plan.epoch == epoch else None
        world = self.world_size
        if plan is None:
            # Not iterated in this epoch since the state was loaded (or at all): nothing was trained
            # here, the state is the loaded one as it is (its lists may be of another world size).
            if self._resume_epoch != epoch:
                empty = [compress_ints([])] * world
                return ("rank_position", empty, list(empty),
                        {"consumed_ids": compress_ints([]), "lists": [None] * world}, False)
            if self._resume_key == "id":  # an older state's, still with its meaning
                return "id", compress_ints(self._resume_keys), compress_ints([]), {}, False
            lists = self._resume_lists
            per_rank = [compress_ints(decode_rank_positions(self._resume_keys, lists, r)) for r in range(lists)]
            return ("rank_position", per_rank, [compress_ints([])] * lists,
                    {"consumed_ids": compress_ints(self._resume_ids),
                     "lists": list(self._resume_fingerprints or [None] * lists)}, False)
        owners = (np.concatenate([np.asarray(c, dtype=np.int64) for c in self._consumed_owners])
                  if self._consumed_owners else np.zeros(0, dtype=np.int64))
        seqs = (np.concatenate([np.asarray(c, dtype=np.int64) for c in self._consumed_seqs])
                if self._consumed_seqs else np.zeros(0, dtype=np.int64))
        if seqs.size != ids.size:  # steps recorded without seqs (a test double): every seq unknown
            seqs = np.full(ids.size, -1, dtype=np.int64)
        if gathering:
            gathered: List[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, (ids, owners, in_round, seqs))
            ids = np.concatenate([np.asarray(g[0], dtype=np.int64) for g in gathered])
            owners = np.concatenate([np.asarray(g[1], dtype=np.int64) for g in gathered])
            in_round = np.concatenate([np.asarray(g[2], dtype=bool) for g in gathered])
            seqs = np.concatenate([np.asarray(g[3], dtype=np.int64) for g in gathered])
        if owners.size and (owners.min() < 0 or owners.max() >= world):
            raise RuntimeError(f"odb: a step named owner rank {int(owners.max())} in a world of {world}")
        n = len(self.dataset)  # type: ignore[arg-type]
        mine = owners == self.rank
        if not (seqs[mine] < 0).any():
            return self._sampler_consumed_by_seq(plan, epoch, ids, mine, in_round, seqs, loaded_in_round, gathering)
        # Copies trained in the rounds before the replayed one come first in training order, so they
        # take an index's first free positions, the replayed round's copies the next ones.
        before = np.bincount(ids[mine & ~in_round], minlength=n)
        free_ids, free_positions = plan.free()
        try:
            positions = take_positions(free_ids, free_positions, before)
            round_positions = (take_positions(free_ids, free_positions, np.bincount(ids[mine & in_round], minlength=n),
                                              skip=before) if in_round.any() else np.zeros(0, dtype=np.int64))
        except ValueError as e:
            raise RuntimeError(f"odb: rank {self.rank}, epoch {epoch}: {e}: did the sampler's list change "
                               f"while the epoch ran?") from None
        taken = np.zeros(plan.full.size, dtype=bool)  # O(list), no sort
        for p in (plan.consumed_before, positions, round_positions):
            taken[p] = True
        consumed = np.flatnonzero(taken)
        if loaded_in_round:
            assert self._replay is not None
            round_positions = np.concatenate(
                [round_positions, self._consumed_positions(plan.full, self._replay["in_round"], plan.fingerprint)])
        # A replay resends each rank's list less what the rounds before the replayed one took; which copy
        # of an index those took is a guess (the steps do not say), exact only when no other copy of the
        # index is free. Otherwise the resume must be the ordinary one, or the replayed round could differ.
        exact = True
        if replaying:
            index = np.flatnonzero(before)
            free = np.searchsorted(free_ids, index, side="right") - np.searchsorted(free_ids, index, side="left")
            exact = bool(np.all(free == before[index]))
        mine_state = (consumed, round_positions, _distinct(plan.full[consumed], n), plan.fingerprint, exact)
        return self._rank_position_state(mine_state, gathering)

    def _sampler_consumed_by_seq(self, plan: "_SamplerPlan", epoch: int, ids: np.ndarray, mine: np.ndarray,
                                 in_round: np.ndarray, seqs: np.ndarray, loaded_in_round: bool,
                                 gathering: bool) -> Tuple[str, Any, Any, Dict[str, Any], bool]:
        """_sampler_consumed when every trained sample of this rank's list came with its seq: its position
        is plan.sent[seq], exactly (no per-index sort, no guess), so a replay is always exact."""
        n = len(self.dataset)  # type: ignore[arg-type]
        own = seqs[mine]
        if own.size and int(own.max()) >= plan.sent.size:
            raise RuntimeError(f"odb: rank {self.rank}, epoch {epoch}: a step names seq {int(own.max())} of this "
                               f"rank's list, which sent {plan.sent.size} samples: did the daemon or the sampler "
                               f"change while the epoch ran?")
        positions = plan.sent[own]
        if own.size and not np.array_equal(plan.full[positions], ids[mine]):
            k = int(np.argmax(plan.full[positions] != ids[mine]))
            raise RuntimeError(f"odb: rank {self.rank}, epoch {epoch}: a step names sample {int(ids[mine][k])} at "
                               f"seq {int(own[k])}, where this rank's list holds {int(plan.full[positions[k]])}: did "
                               f"the sampler's list change while the epoch ran?")
        round_positions = plan.sent[seqs[mine & in_round]]
        taken = np.zeros(plan.full.size, dtype=bool)  # O(list), no sort
        taken[plan.consumed_before] = True
        taken[positions] = True
        consumed = np.flatnonzero(taken)
        if consumed.size != plan.consumed_before.size + positions.size:
            raise RuntimeError(f"odb: rank {self.rank}, epoch {epoch}: a position of this rank's list was trained "
                               f"twice (the steps name {positions.size} samples of it, "
                               f"{consumed.size - plan.consumed_before.size} distinct new positions)")
        if loaded_in_round:
            assert self._replay is not None
            round_positions = np.concatenate(
                [round_positions, self._consumed_positions(plan.full, self._replay["in_round"], plan.fingerprint)])
        mine_state = (consumed, round_positions, _distinct(plan.full[consumed], n), plan.fingerprint, True)
        return self._rank_position_state(mine_state, gathering)

    def _rank_position_state(self, mine_state: Tuple[Any, ...],
                             gathering: bool) -> Tuple[str, Any, Any, Dict[str, Any], bool]:
        """Every rank's (consumed, round positions, consumed ids, fingerprint, exact) as the state's
        "rank_position" entries (an all_gather when torch.distributed is initialized)."""
        world = self.world_size
        n = len(self.dataset)  # type: ignore[arg-type]
        if gathering:
            states: List[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(states, mine_state)
        else:  # one rank (or scope this_rank: refused at load, the other ranks' lists stay empty)
            states = [mine_state if r == self.rank else (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                                          np.zeros(0, dtype=np.int64), None, True)
                      for r in range(world)]
        consumed_ids = np.zeros(n, dtype=bool)  # a mask over the dataset: O(n), no sort (as for "position")
        for s in states:
            consumed_ids[np.asarray(s[2], dtype=np.int64)] = True
        return ("rank_position", [compress_ints(s[0]) for s in states], [compress_ints(s[1]) for s in states],
                {"consumed_ids": compress_mask(consumed_ids), "lists": [s[3] for s in states]},
                all(bool(s[4]) for s in states))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from state_dict(): the next iteration of that epoch sends
        only the samples no rank had consumed (also at another world size),
        so each is trained exactly once across the interruption. A state
        that is not one (corrupt, truncated, another version, another
        dataset or order) is an error, never a silent wrong resume."""
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not an odb loader state (format {state.get('format') if isinstance(state, Mapping) else type(state).__name__!r}, "
                             f"expected {STATE_FORMAT!r})")
        if not is_int(state.get("version")) or state.get("version") not in range(1, STATE_VERSION + 1):
            raise ValueError(f"odb loader state version {state.get('version')!r} is not supported by this odb "
                             f"(it reads versions 1 to {STATE_VERSION}); resume with the odb that wrote it")
        required = ("epoch", "epoch_complete", "seed", "shuffle", "custom_sampler", "dataset_len", "world_size",
                    "scope", "consumed", "key")
        missing = [k for k in required if k not in state]
        if missing:
            raise ValueError(f"odb loader state is truncated: missing {missing}")
        # Every field of the type state_dict() writes: int() or bool() of something else (a float, a
        # string "false") would load a silently different state.
        for name, minimum in (("epoch", 0), ("seed", None), ("dataset_len", 0), ("world_size", 1)):
            _check_int(state[name], name, minimum)
        for name in ("epoch_complete", "shuffle", "custom_sampler"):
            if not isinstance(state[name], (bool, np.bool_)):
                raise ValueError(f"odb loader state: {name} must be true or false, got {state[name]!r}")
        for name in ("scope", "key"):
            if not isinstance(state[name], str):
                raise ValueError(f"odb loader state: {name} must be a string, got {state[name]!r}")
        n = len(self.dataset)  # type: ignore[arg-type]
        if int(state["dataset_len"]) != n:
            raise ValueError(f"odb loader state is for a dataset of {state['dataset_len']} samples, this one has {n}")
        if bool(state["custom_sampler"]) != (self.sampler is not None):
            raise ValueError("odb loader state was taken with" + ("" if state["custom_sampler"] else "out") +
                             " a custom sampler; resume with the same kind of sampler")
        if self.sampler is None and (int(state["seed"]) != self.seed or bool(state["shuffle"]) != self.shuffle):
            raise ValueError(f"odb loader state has seed={state['seed']} shuffle={state['shuffle']}, this loader "
                             f"seed={self.seed} shuffle={self.shuffle}: the epoch's order would differ")
        if state["scope"] != "all_ranks":
            raise ValueError("odb loader state holds one rank's samples only (torch.distributed was not "
                             "initialized when it was taken): it cannot say what the other ranks consumed")
        key = state["key"]
        # A custom sampler's state: "rank_position" (version 4), or "id" (versions 1 to 3, loaded with
        # their meaning: every position of a consumed index counts as consumed).
        keys_for = ("id", "rank_position") if self.sampler is not None else ("position",)
        if key not in keys_for or (key == "rank_position" and int(state["version"]) < 4):
            raise ValueError(f"odb loader state key {key!r} (version {state['version']}) does not go with a loader "
                             f"{'with' if self.sampler is not None else 'without'} a custom sampler (expected one "
                             f"of {keys_for}): resume with the loader the state was taken with")
        lists = 0
        resume_ids = np.zeros(0, dtype=np.int64)
        fingerprints: Optional[List[Optional[str]]] = None
        if key == "rank_position":
            missing = [k for k in ("consumed_ids", "lists") if k not in state]
            if missing:
                raise ValueError(f"odb loader state is truncated: missing {missing}")
            lists, keys = self._rank_positions(state["consumed"], "consumed", state.get("lists"))
            resume_ids = expand_ints(state["consumed_ids"], "consumed_ids", n, "dataset index")
            fingerprints = state["lists"]
            if (not isinstance(fingerprints, (list, tuple)) or len(fingerprints) != lists
                    or not all(f is None or isinstance(f, str) for f in fingerprints)):
                raise ValueError(f"odb loader state: malformed lists (one fingerprint or null per rank list, "
                                 f"{lists} of them): {fingerprints!r}")
            fingerprints = list(fingerprints)
        else:
            keys = expand_ints(state["consumed"], "consumed", n, "position" if key == "position" else "dataset index")
        if key == "position" and keys.size and int(keys.max()) >= n:
            raise ValueError(f"odb loader state names position {int(keys.max())} in an epoch of {n} samples")
        named = keys if key == "id" else resume_ids  # dataset indices
        if named.size and int(named.max()) >= n:
            raise ValueError(f"odb loader state names dataset index {int(named.max())} in a dataset of {n} samples")
        replay = state.get("replay")
        loaded_replay: Optional[Dict[str, Any]] = None
        if replay is not None:
            try:
                if not isinstance(replay, Mapping):
                    raise TypeError(f"a mapping or null, got {type(replay).__name__}")
                loaded_replay = {k: _check_int(replay[k], f"replay.{k}", 0)
                                 for k in ("round", "first_step", "next_step", "world_size")}
                if key == "rank_position":
                    round_lists, in_round = self._rank_positions(replay["round_consumed"], "replay.round_consumed",
                                                                 state.get("lists"))
                    if round_lists != lists:
                        raise ValueError(f"{round_lists} rank lists, the consumed set has {lists}")
                else:
                    in_round = expand_ints(replay["round_consumed"], "replay.round_consumed", n)
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"odb loader state: malformed replay entry ({e!r})") from None
            if (min(loaded_replay.values()) < 0 or loaded_replay["next_step"] < loaded_replay["first_step"]
                    or loaded_replay["world_size"] < 1):
                raise ValueError(f"odb loader state: replay entry out of range {loaded_replay}")
            consumed_set = np.zeros(0, dtype=np.int64) if not keys.size else np.unique(keys)
            if in_round.size and not np.isin(in_round, consumed_set).all():
                raise ValueError("odb loader state: the replayed round's samples are not all in the consumed set")
            loaded_replay["in_round"] = in_round
            loaded_replay["before_round"] = np.setdiff1d(consumed_set, in_round)
        job = state.get("job") or {}  # version 3: budgets' and schedules' counters
        try:
            if not isinstance(job, Mapping):
                raise TypeError(f"a mapping, got {type(job).__name__}")
            counters = {k: _check_int(job.get(k, 0), f"job.{k}", None)
                        for k in ("optimizer_steps", "loss_tokens", "epoch_optimizer_steps", "epoch_loss_tokens")}
            job_epoch = None if job.get("epoch") is None else _check_int(job["epoch"], "job.epoch", 0)
            if not isinstance(job.get("epoch_from_start", False), (bool, np.bool_)):
                raise TypeError(f"job.epoch_from_start must be true or false, got {job['epoch_from_start']!r}")
            completed = job.get("completed_epoch")
            if completed is not None and not isinstance(completed, Mapping):
                raise TypeError(f"job.completed_epoch must be a mapping or null, got {completed!r}")
            if completed is not None:
                completed = {k: _check_int(completed[k], f"job.completed_epoch.{k}", 0)
                             for k in ("epoch", "optimizer_steps", "loss_tokens")}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"odb loader state: malformed job counters ({e!r})") from None
        if min(counters.values()) < 0:
            raise ValueError(f"odb loader state: negative job counters {counters}")
        epoch = int(state["epoch"])
        self.job_optimizer_steps = counters["optimizer_steps"]
        self.job_loss_tokens = counters["loss_tokens"]
        self._completed_epoch = completed
        self._epoch_counted, self._epoch_windows, self._epoch_window_tokens = None, 0, 0
        self._epoch_from_start, self._counters_resumed = False, False
        if not bool(state["epoch_complete"]) and job_epoch == epoch:
            # The epoch resumes: its windows so far count on (the window index continues after them).
            self._epoch_counted = epoch
            self._epoch_windows = counters["epoch_optimizer_steps"]
            self._epoch_window_tokens = counters["epoch_loss_tokens"]
            self._epoch_from_start = bool(job.get("epoch_from_start", False))
            self._counters_resumed = True
        self._resume_key, self._resume_lists = key, lists
        self._resume_ids, self._resume_fingerprints = resume_ids, fingerprints
        if bool(state["epoch_complete"]):
            self.set_epoch(epoch + 1)
            self._resume_epoch = None
            self._resume_keys = np.zeros(0, dtype=np.int64)
            self._replay = None
        else:
            self.set_epoch(epoch)
            self._resume_epoch = epoch
            self._resume_keys = keys
            self._replay = loaded_replay
        self._consumed_ids = []
        self._consumed_owners = []
        self._consumed_seqs = []
        self._consumed_steps = []
        self._consumed_epoch = None
        self._plan = None
        self._last_step = None

    @staticmethod
    def _rank_positions(value: Any, name: str, fingerprints: Any = None) -> Tuple[int, np.ndarray]:
        """A "rank_position" state's per-rank packed positions: (the number of rank lists, their
        encode_rank_positions codes); ValueError naming `name` when malformed, or when a rank's positions
        go past its list's length (the fingerprint "<len>:<hex>" says it; checked again against the
        list the sampler draws)."""
        if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, Mapping) for v in value):
            raise ValueError(f"odb loader state: malformed {name} (a list of one {{cursor, extra}} per rank list, "
                             f"got {type(value).__name__})")
        limit = (1 << 62) // len(value)
        per_rank = []
        for r, v in enumerate(value):
            known = fingerprints[r] if isinstance(fingerprints, (list, tuple)) and len(fingerprints) == len(value) \
                else None
            length = known.partition(":")[0] if isinstance(known, str) else ""
            top = packed_top(v)  # checked before expanding: a hostile cursor must not become a huge array
            if top is not None and top > limit:
                raise ValueError(f"odb loader state: {name} names a position past any list ({limit} or more)")
            if top is not None and length.isdigit() and top > int(length):
                raise ValueError(f"odb loader state: {name}[{r}] names position {top - 1} of rank {r}'s list, "
                                 f"which held {int(length)} indices when the state was taken (its lists "
                                 f"fingerprint): a corrupt state")
            per_rank.append(expand_ints(v, f"{name}[{r}]", limit, f"rank {r}'s list position"))
        return len(per_rank), encode_rank_positions(per_rank)

    # ----- iteration -----------------------------------------------------------
    def __len__(self) -> int:
        # A fixed-batch DataLoader knows its length; odb's step count depends
        # on the samples' lengths and on the other ranks. Say so, instead of
        # Python's bare "object has no len()".
        raise TypeError(
            "OdbDataLoader has no length before the epoch ran: the number of steps depends on the "
            "samples' lengths (token budget) and is agreed across ranks while the epoch runs. For an LR "
            "schedule: loader.optimizer_steps_per_epoch() (an estimate before the first epoch, then the count "
            "of the epoch seen), or odb.lr_by_tokens(loader, total_tokens) (by loss tokens trained).")

    def __bool__(self) -> bool:  # truthiness must not go through __len__
        return True

    def __iter__(self) -> Iterator[Step]:
        check_caller_stack(self.idle_policy)  # refuses e.g. FSDP with idle_policy="join" (odb/stacks.py)
        return self._epoch(self.epoch)

    def _pinning(self) -> bool:
        """Whether batches are pinned: pin_memory and a CUDA device (else a warning, once)."""
        if not self.pin_memory:
            return False
        if torch.cuda.is_available():
            return True
        if not self._pin_warned:
            self._pin_warned = True
            warnings.warn("OdbDataLoader(pin_memory=True) but no CUDA device is available: batches are not "
                          "pinned", stacklevel=3)
        return False

    @property
    def data_plane_in_use(self) -> Optional[str]:
        """How steps reach this trainer: "shm" (the daemon's step arena) or "zmq"
        (frames); None before the first epoch connects."""
        return None if self._consumer is None else self._consumer.data_plane

    def _connect(self) -> Any:
        check_reachable(self.ingest_endpoint)
        check_reachable(self.trainer_endpoint)
        if self._consumer is None:
            self._consumer = native().Consumer(self.trainer_endpoint, self.poll_ms, self.data_plane)
        return self._consumer

    def _epoch(self, epoch: int) -> Iterator[Step]:
        if self.budget_reached:  # the job's budget is trained: nothing more, on every rank alike
            return
        self.wait_epoch_end()  # a join-mode drain of the previous epoch
        if getattr(self, "_counters_resumed", False):
            self._counters_resumed = False
            self._window_offset = None  # set at the first step: the daemons count windows from 0 again
        else:
            self._epoch_counted, self._epoch_windows, self._epoch_window_tokens = epoch, 0, 0
            self._epoch_from_start, self._window_offset = True, 0
        consumer = self._connect()
        if self.sampler is not None:
            # One draw of the sampler for the epoch: what is sent, and what state_dict maps positions in.
            self._plan = self._sampler_plan()
            indices = self._plan.full[self._plan.sent].tolist()
        else:
            self._plan = None
            indices = self.indices()
        # Workers see the stop flag too: an Event of their start method's context
        # (handed to them with the dataset when they start).
        stop = threading.Event()
        wake_workers = None
        worker_stop: Any = stop
        if self.num_workers:
            context = self.multiprocessing_context or "forkserver"
            if isinstance(context, str):
                context = multiprocessing.get_context(context)
            worker_stop, wake_workers = context.Pipe(duplex=False)
        stream = _SendStream(self.dataset, indices, epoch, self.rank, self.ingest_endpoint, self.lengths_fn,
                             self.send_timeout_ms, self.progress_every, worker_stop, self.data_plane,
                             self.loss_tokens_from, self.ignore_index)
        generator = torch.Generator()
        generator.manual_seed(self.seed * 1000003 + epoch)
        loader = DataLoader(stream, batch_size=None, num_workers=self.num_workers, collate_fn=_null_collate,
                            worker_init_fn=self.worker_init_fn, generator=generator,
                            multiprocessing_context=(self.multiprocessing_context or "forkserver") if self.num_workers else None)
        replay = self._replay if self._replaying() else None
        if replay is not None:
            consumer.start_epoch(epoch, max(self.num_workers, 1), first_round=int(replay["round"]),
                                 first_step=int(replay["first_step"]))
        else:
            consumer.start_epoch(epoch, max(self.num_workers, 1))
        skip_below = int(replay["next_step"]) if replay is not None else 0  # trained before the checkpoint
        pump = _Pump(loader, stop, wake_workers)
        self.samples_sent = 0
        self.last_summary = None
        self.dropped_trailing_idle = 0
        self._consumed_ids = []
        self._consumed_owners = []
        self._consumed_seqs = []
        self._consumed_steps = []
        self._consumed_epoch = epoch
        self._last_step = None

        def remember(info: Any) -> None:
            self._last_step = (int(info["step_index"]), int(info["round"]), int(info["round_first_step"]),
                               int(info["round_steps"]), bool(info["deterministic"]))

        accounted = [0]  # this rank's samples seen back (emitted or rejected)
        progress = Progress(self.rank, epoch, len(indices), stream=self.progress_stream) if self.progress else None

        samples_may_move = [False]
        steps_seen = [0]  # the daemon's samples_may_move flag is known after the first step

        def rank_done() -> bool:
            # Join policy: once every sample this rank sent came back, the
            # remaining steps can only be IDLE: leave the loop now so DDP's
            # join() shadows the other ranks, and drain the trailing IDLE steps
            # in the background. Not when the daemon's planner moves samples
            # between ranks (then this rank may still get real steps, and the
            # loop runs to the epoch summary).
            return (self.idle_policy == "join" and steps_seen[0] > 0 and not samples_may_move[0]
                    and pump.finished() and accounted[0] >= pump.sent)

        self.data_wait_s = 0.0
        asked = time.monotonic()  # when the trainer asked for the next step (a data stall: it waits here)
        try:
            pump.start()
            while True:
                if self.stop_at_loss_tokens is not None and self.job_loss_tokens >= self.stop_at_loss_tokens:
                    return  # the token budget closed with the last window: every rank stops at this step
                delivery = self._next(consumer, pump, rank_done)
                self.samples_sent = pump.sent
                if delivery is None:  # join: this rank is done, the rest is IDLE
                    self._start_drain(consumer)
                    return
                if not delivery.is_step:
                    self._finish_epoch(delivery.summary, 0)
                    break
                info = delivery.step
                steps_seen[0] += 1
                waited = time.monotonic() - asked
                self.data_wait_s += waited
                consumer.report_data_wait(waited)  # rides on the next credit: odb.top names a starved rank
                self._record(epoch, info, waited)
                if progress is not None:
                    progress.update(len(info["sample_ids"]), info["real_tokens"], info["padded_tokens"], info["idle"],
                                    waited, closes_window=bool(info["closes_window"]),
                                    windowed=int(info["window_target"]) > 0)
                samples_may_move[0] = samples_may_move[0] or bool(info.get("samples_may_move"))
                self._check_rejections(info, f"step {info['step_index']}")
                self._check_window_target(info)
                accounted[0] += sum(1 for r in info["rejections"] if r["sample_id"] is not None)
                if info["step_index"] < skip_below:
                    # Replayed round of a deterministic resume: this step was
                    # trained before the checkpoint (its samples are in the state).
                    if not info["deterministic"]:
                        raise native().OdbError(
                            "odb: the loaded state resumes a reproducible epoch (alignment.deterministic) but "
                            "the daemon does not run alignment.deterministic: start odbd with the config the "
                            "checkpoint was taken with")
                    accounted[0] += len(info["sample_ids"])
                    remember(info)
                    continue
                if info["idle"]:
                    # Both policies yield it: a rank still in its loop cannot tell a
                    # mid-epoch IDLE step from a trailing one, and holding it back
                    # would hang the job (the peers' real step is a DDP collective
                    # that needs this rank, and their daemons' queues fill while
                    # they wait). Join drops only what arrives after this rank is
                    # done (rank_done: the loop is left, the drain thread reads on).
                    remember(info)
                    window = self._count_step(info)
                    yield self._dummy_step(info, indices, window, delivery)
                    asked = time.monotonic()
                    continue
                accounted[0] += len(info["sample_ids"])
                ids = np.asarray(info["sample_ids"], dtype=np.int64)
                owners = np.asarray(info["owner_ranks"], dtype=np.int64)
                self._consumed_ids.append(ids)
                self._consumed_owners.append(owners if owners.size == ids.size else np.full(ids.size, self.rank))
                self._consumed_seqs.append(_step_seqs(info, ids.size))
                self._consumed_steps.append(int(info["step_index"]))
                remember(info)
                batch = _to_torch(delivery)
                self._check_layout(batch, info)
                if self._pinning():
                    # Page-locked copies (what torch's DataLoader does with
                    # pin_memory): the received step's memory goes back now.
                    batch = {k: v.pin_memory() for k, v in batch.items()}
                    delivery = None
                window = self._count_step(info)
                yield Step.from_header(info, batch, _delivery=delivery, window=window)
                asked = time.monotonic()
            pump.join(timeout=self.timeout_s)
            pump.raise_if_failed()
        finally:
            pump.close()
            if progress is not None:
                progress.close()

    def _check_layout(self, batch: Mapping[str, torch.Tensor], info: Any) -> None:
        packed = "cu_seqlens" in batch
        self._packed_seen = packed
        if self.packed is None or self.packed == packed:
            return
        raise native().OdbError(
            f"odb: OdbDataLoader(packed={self.packed}) but step {info['step_index']} from the daemon at "
            f"{self.trainer_endpoint} is {'packed' if packed else 'padded'}: pass packed={packed}, or start odbd "
            f"with collate: {{packed: {str(self.packed).lower()}}} on every rank")

    def _check_window_target(self, info: Any) -> None:
        want = self.tokens_per_optimizer_step
        if want is None or int(info["window_target"]) == want:
            return
        raise native().OdbError(
            f"odb: OdbDataLoader(tokens_per_optimizer_step={want}) but the daemon at {self.trainer_endpoint} runs "
            f"optimizer.tokens_per_step: {int(info['window_target'])}: start odbd with optimizer: "
            f"{{tokens_per_step: {want}}} on every rank (odb.spawn_daemon(config={{'optimizer': "
            f"{{'tokens_per_step': {want}}}}}))")

    def _record(self, epoch: int, info: Any, wait_s: Optional[float] = None) -> None:
        """One step record for odb.report (summary_dir set); wait_ms: the trainer's wait in next(loader)
        for this step (absent for the steps a joined rank drains)."""
        if self.summary_dir is None:
            return
        import json

        os.makedirs(self.summary_dir, exist_ok=True)
        record = {"epoch": epoch, "rank": self.rank, "step": int(info["step_index"]), "idle": bool(info["idle"]),
                  "real": int(info["real_tokens"]), "padded": int(info["padded_tokens"]),
                  "lengths": [int(n) for n in info["lengths"]]}
        if wait_s is not None:
            record["wait_ms"] = round(wait_s * 1000.0, 3)
        with open(os.path.join(self.summary_dir, f"rank{self.rank}-epoch{epoch}.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")

    def _finish_epoch(self, summary: Dict[str, Any], dropped_idle: int) -> None:
        self.dropped_trailing_idle += dropped_idle
        self.last_summary = summary
        whole = self._epoch_sample_limit(int(self._epoch_counted or 0)) in (None, self.samples_per_epoch())
        if self._epoch_from_start and whole and self._epoch_counted == summary.get("epoch", self._epoch_counted):
            self._completed_epoch = {"epoch": int(self._epoch_counted), "optimizer_steps": int(self._epoch_windows),
                                     "loss_tokens": int(self._epoch_window_tokens)}
        self._check_rejections(summary, "epoch summary")

    def _start_drain(self, consumer: Any) -> None:
        def drain() -> None:
            try:
                dropped = 0
                while True:
                    delivery = self._next(consumer, None, None)
                    if not delivery.is_step:
                        self._finish_epoch(delivery.summary, dropped)
                        return
                    self._record(delivery.step["epoch"], delivery.step)
                    self._count_step(delivery.step)  # its window closes on every rank: count it here too
                    if not delivery.step["idle"]:
                        raise native().OdbError(
                            f"rank {self.rank}: a real step {delivery.step['step_index']} arrived after every "
                            f"sample of this rank came back (samples moved between ranks?): use "
                            f"idle_policy='zero_step'")
                    dropped += 1
            except BaseException as e:  # noqa: BLE001 - raised by wait_epoch_end
                self._drain_error = e

        self._drain_error: Optional[BaseException] = None
        self._drain_thread = threading.Thread(target=drain, name="odb-drain", daemon=True)
        self._drain_thread.start()

    def wait_epoch_end(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """Join policy: waits for the trailing IDLE steps to drain and returns
        the epoch summary (also in ``last_summary``). No-op otherwise."""
        thread = getattr(self, "_drain_thread", None)
        if thread is not None:
            thread.join(self.timeout_s + 5 if timeout is None else timeout)
            if thread.is_alive():
                raise native().OdbTimeout(f"rank {self.rank}: the epoch did not end (trailing IDLE steps)")
            self._drain_thread = None
            if self._drain_error is not None:
                raise self._drain_error
        return self.last_summary

    def _next(self, consumer: Any, pump: Optional["_Pump"], done: Optional[Callable[[], bool]]) -> Any:
        """The next delivery, polling in slices; raises instead of hanging.
        Returns None when `done()` turns true while waiting."""
        start = time.monotonic()
        daemon = spawned_daemon(self.trainer_endpoint)
        # A daemon another process started (odb.launch, systemd): its pid from
        # the endpoint's lock file, so its death is seen within poll_ms too.
        other_pid = daemon_pid(self.trainer_endpoint) if daemon is None else None
        while True:
            if pump is not None:
                pump.raise_if_failed()
            if done is not None and done():
                return None
            try:
                return consumer.next()
            except native().OdbTimeout:
                pass
            if pump is not None:
                pump.raise_if_failed()
            if daemon is not None and daemon.poll() is not None:
                raise native().OdbError(
                    f"odbd rank {daemon.rank} (pid {daemon.pid}) exited (code {daemon.poll()}) during "
                    f"epoch {self.epoch}; log {daemon.log_path}:\n{daemon.log_tail()}")
            if other_pid is not None and not pid_alive(other_pid):
                raise native().OdbError(
                    f"odbd (pid {other_pid}) serving {self.trainer_endpoint} is gone (exited or killed) during "
                    f"epoch {self.epoch} (rank {self.rank}): see its log (odb.launch: $ODB_RUN_DIR/odbd-<rank>.log)")
            if time.monotonic() - start > self.timeout_s:
                sent = pump.sent if pump is not None else self.samples_sent
                raise native().OdbTimeout(
                    f"no step from odbd at {self.trainer_endpoint} for {self.timeout_s:.0f}s (rank {self.rank}, "
                    f"epoch {self.epoch}, {sent} samples sent): is the daemon alive, and are all ranks' "
                    f"producers sending?")

    def _check_rejections(self, info: Mapping[str, Any], where: str) -> None:
        rejections = info.get("rejections") or []
        late = [r for r in rejections if r["code"] == "LATE_FOR_CLOSED_EPOCH"]
        if late:  # Non-Join quota closure: reported, never an error
            self.late_for_closed_epoch += len(late)
            rejections = [r for r in rejections if r["code"] != "LATE_FOR_CLOSED_EPOCH"]
        if not rejections:
            return
        text = "; ".join(f"{r['code']} sample {r['sample_id']} from {r['producer_id']}: {r['message']}"
                         for r in rejections)
        if info.get("rejections_are_errors", True):
            raise native().OdbError(f"odbd rejected input ({where}): {text}")
        import warnings

        warnings.warn(f"odbd skipped input ({where}): {text}")

    # ----- dummy steps ---------------------------------------------------------
    def _dummy_step(self, info: Mapping[str, Any], indices: Sequence[int], window: Optional[int] = None,
                    delivery: Any = None) -> Step:
        extra: Dict[str, Any] = {} if window is None else {"window": window}
        batch = self.dummy_batch(indices)
        if delivery is not None and (list(info.get("enc_sample_ids", [])) or list(info.get("audio_sample_ids", []))):
            # Encoder work in a step with no LLM samples for this rank (per-phase
            # plans): other ranks' routes count on its outputs, so the enc.* and
            # audio.* tensors and the header's plan stay with the dummy LLM batch.
            batch = dict(batch)
            enc = {k: v for k, v in _to_torch(delivery).items() if k.startswith(("enc.", "audio."))}
            if self._pinning():  # as for real steps: page-locked copies, the received memory goes back
                enc = {k: v.pin_memory() for k, v in enc.items()}
            else:
                extra["_delivery"] = delivery
            batch.update(enc)
        return Step.from_header(info, batch, loss_weight=0.0, idle=True, dummy=True,
                                sample_ids=[], lengths=[], real_tokens=0, padded_tokens=0, loss_tokens=0,
                                rejections=[], **extra)

    def dummy_batch(self, indices: Optional[Sequence[int]] = None) -> Dict[str, torch.Tensor]:
        """A one-sample batch for IDLE steps (same field names as real batches),
        in the packed layout when the daemon packs (``packed``, or learned)."""
        packed = self.packed if self.packed is not None else bool(self._packed_seen)
        batch = self._padded_dummy_batch(indices)
        if not packed:
            return batch
        # One packed sequence: the padded one-row batch without its mask, and the
        # index tensors the daemon's packed steps carry (dtypes as collate writes them).
        n = int(batch["input_ids"].shape[1]) if batch["input_ids"].dim() >= 2 else 0
        out = {k: v for k, v in batch.items() if k != "attention_mask"}
        out["cu_seqlens"] = torch.tensor([0, n], dtype=torch.int32)
        out["position_ids"] = torch.arange(n, dtype=torch.int64).unsqueeze(0)
        return out

    def _padded_dummy_batch(self, indices: Optional[Sequence[int]] = None) -> Dict[str, torch.Tensor]:
        if self._dummy_batch is None:
            sample = self._dummy_sample
            if sample is None:
                index = (indices[0] if indices else 0) if indices is not None else 0
                sample = self.dataset[index]
            batch: Dict[str, torch.Tensor] = {}
            for name, value in sample.items():
                if name in _LENGTH_KEYS and isinstance(value, (int, np.integer)):
                    continue
                t = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
                batch[name] = t.unsqueeze(0).clone()
            if "attention_mask" not in batch and batch["input_ids"].dim() >= 2:
                batch["attention_mask"] = torch.ones(batch["input_ids"].shape[:2], dtype=torch.int64)
            self._dummy_batch = batch
        return self._dummy_batch

    def close(self) -> None:
        """Drops the trainer connection (reconnects on the next epoch)."""
        self._consumer = None
