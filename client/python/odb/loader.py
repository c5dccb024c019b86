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

This module keeps OdbDataLoader: its settings, the epoch loop that combines
its parts, and the checkpoint state that combines theirs. The parts are modules
of their own, each with its own state where it has one: odb.epoch_order (which
samples a rank sends: the seeded order, a custom sampler's list), odb.consumed_log
(what the loop handed out, for the checkpoint), odb.job_counters (optimizer steps
and loss tokens for schedules and budgets), odb.resume_state (a loaded state,
checked per version), odb.consumed_state (the state's consumed set),
odb.dummy (IDLE steps' batches), odb.step (Step), odb.encoding (sample encoding),
odb.pump (the workers' send stream, the pump thread, OdbWorkerError),
odb.progress (the progress line) and odb.state_codec (the state's format and
consumed-set codec).
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from ._native import native
from .budgets import Budgets, optimizer_steps_for
from .consumed_log import ConsumedLog
from .daemon import check_reachable, endpoints, env_rank, env_world_size
from .daemon_settings import reconcile
from .delivery import (TrailingIdleDrain, check_layout, check_rejections, check_window_target, next_delivery,
                       record_step)
from .dummy import DummyBatches
from .encoding import IGNORE_INDEX, _to_torch
from .epoch_order import SamplerPlan, global_order, rank_indices, sampler_plan
from .job_counters import JobCounters
from .progress import Progress
from .pump import _Pump, start_pump
from .resume_state import LoadedState, parse_state
from .consumed_state import Trained, position_consumed, sampler_consumed
from .stacks import check_caller_stack
from .state_codec import STATE_FORMAT, STATE_VERSION
from .step import Step

# Names other code imports from here (``from odb.loader import X``), kept working since the loader's
# units moved to modules of their own.
from .encoding import encode_sample, sample_loss_tokens  # noqa: E402,F401  isort: skip
from .pump import OdbWorkerError  # noqa: E402,F401  isort: skip
from .state_codec import compress_ints, expand_ints  # noqa: E402,F401  isort: skip

IDLE_POLICIES = ("zero_step", "join")
# How samples reach the daemon and steps the trainer (docs/shm.md): "auto"
# (shared memory with a local daemon, ZeroMQ frames otherwise), "shm" (shared
# memory or an error), "zmq" (frames always).
DATA_PLANES = ("auto", "shm", "zmq")


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
                 ignore_index: int = IGNORE_INDEX, stop_at_samples: Optional[int] = None,
                 stop_at_loss_tokens: Optional[int] = None, packed: Optional[bool] = None) -> None:
        self._budgets = Budgets(stop_at_samples, stop_at_loss_tokens)
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
        self._dummy = DummyBatches(dataset, dummy_sample)
        self._drain = TrailingIdleDrain()  # join policy: the epoch's trailing IDLE steps
        self.packed = None if packed is None else bool(packed)
        self._packed_seen: Optional[bool] = None  # the layout of the real steps received so far
        self._consumer: Any = None
        self.last_summary: Optional[Dict[str, Any]] = None
        self.samples_sent = 0
        self.data_wait_s = 0.0  # this epoch's time the trainer spent in next(loader) waiting for steps
        self.late_for_closed_epoch = 0  # Non-Join: samples that arrived after their epoch closed
        self.dropped_trailing_idle = 0
        # The loader's stateful parts (each with its own state; state_dict() combines them):
        self._log = ConsumedLog()  # the current epoch's steps handed out
        self._counters = JobCounters()  # optimizer steps and loss tokens (schedules, budgets)
        # A loaded state whose epoch resumes (None: none, or its epoch had ended): what it counts as
        # consumed, and for a reproducible epoch where it replays from.
        self._resume: Optional[LoadedState] = None
        # Custom sampler: this rank's list of the epoch being iterated and what of it was sent.
        self._plan: Optional[SamplerPlan] = None
        self._position_cache: Optional[Tuple[int, np.ndarray]] = None  # (epoch, id -> position)

    @property
    def stop_at_samples(self) -> Optional[int]:
        return self._budgets.stop_at_samples

    @property
    def stop_at_loss_tokens(self) -> Optional[int]:
        return self._budgets.stop_at_loss_tokens

    @property
    def job_optimizer_steps(self) -> int:
        """Optimizer steps (windows) handed out in the job, on every rank alike."""
        return self._counters.optimizer_steps

    @property
    def job_loss_tokens(self) -> int:
        """Loss tokens (all ranks) of the optimizer steps handed out in the job: what odb.lr_by_tokens reads."""
        return self._counters.loss_tokens

    # ----- epoch and indices (odb.epoch_order) -------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch (and the sampler's, when it has set_epoch)."""
        self.epoch = int(epoch)
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)  # type: ignore[attr-defined]

    def _global_order(self) -> np.ndarray:
        """Every index of the epoch in its (seeded) order, before the rank split."""
        return global_order(len(self.dataset), self.shuffle, self.seed, self.epoch)  # type: ignore[arg-type]

    def _resuming(self, epoch: int) -> Optional[LoadedState]:
        """The loaded state when `epoch` is the one it resumes."""
        return self._resume if self._resume is not None and self._resume.epoch == epoch else None

    def _replaying(self) -> bool:
        """A deterministic state is loaded for this epoch at the same world size:
        the epoch resumes at the round of its checkpoint, step for step."""
        loaded = self._resuming(self.epoch)
        return (loaded is not None and loaded.replay is not None
                and int(loaded.replay["world_size"]) == self.world_size
                and (loaded.key != "rank_position" or loaded.lists == self.world_size))

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
        return rank_indices(self._global_order(), self.rank, self.world_size, self._epoch_sample_limit(self.epoch),
                            self._resuming(self.epoch), self._replaying()).tolist()

    def _sampler_plan(self) -> SamplerPlan:
        """This rank's custom-sampler list for the epoch (one draw of the sampler) and what of it is sent."""
        full = np.asarray([int(i) for i in self.sampler], dtype=np.int64)  # type: ignore[union-attr]
        return sampler_plan(full, self.epoch, self.rank, self.world_size, self._epoch_sample_limit(self.epoch),
                            self._resuming(self.epoch), self._replaying())

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
        return self._budgets.sample_limit(epoch, self.samples_per_epoch()) if self.stop_at_samples else None

    @property
    def budget_reached(self) -> bool:
        """True once the job's budget (stop_at_samples / stop_at_loss_tokens) is trained: iterating yields
        nothing, on every rank alike. Leave the epoch loop on it."""
        if self._budgets.tokens_reached(self._counters):
            return True
        limit = self._epoch_sample_limit(self.epoch)
        if limit is None:
            return False
        ended = self.last_summary is not None and self.last_summary.get("epoch") == self.epoch
        return limit == 0 or (ended and limit < self.samples_per_epoch())  # the cut epoch has ended

    def loss_tokens_per_epoch(self, probe: int = 256) -> Tuple[int, bool]:
        """(loss tokens of one epoch over all ranks, exact): exact once an epoch was seen from its start to
        its end (every epoch trains the same samples); before that an estimate: the epoch's sample count x
        the mean of `probe` samples drawn with a fixed seed (preprocessed in this process, once)."""
        done = self._counters.completed_epoch
        if done is not None:
            return int(done["loss_tokens"]), True
        mean = self._budgets.loss_tokens_per_sample(self.dataset, probe, self.loss_tokens_from, self.ignore_index,
                                                    self.lengths_fn)
        return int(round(self.samples_per_epoch() * mean)), False

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
        done = self._counters.completed_epoch
        if done is not None:
            return int(done["optimizer_steps"])
        if self.tokens_per_optimizer_step is None:
            self._connect()  # the daemon's optimizer.tokens_per_step (odb.daemon_settings)
        if not self.tokens_per_optimizer_step:
            return optimizer_steps_for(0, None)  # raises, saying what to do
        return optimizer_steps_for(self.loss_tokens_per_epoch(probe)[0], self.tokens_per_optimizer_step)

    def state_extras(self) -> Dict[str, Any]:
        """The job counters a checkpoint carries (inside state_dict()["job"])."""
        return self._counters.state_dict()

    # ----- checkpoint state (torch.utils.data Stateful protocol) ---------------
    def state_dict(self) -> Dict[str, Any]:
        """What a checkpoint needs to resume this epoch without replaying it:
        the samples of every step yielded so far (all ranks', when
        torch.distributed is initialized: call it on every rank at the same
        step, as DDP checkpoints are taken), never tensors. See docs/resume.md."""
        log = self._log
        epoch = self.epoch if log.epoch is None else log.epoch
        ids, owners, seqs, steps = log.arrays()
        replay, first = log.replay_point(epoch)
        loaded = self._resuming(epoch)
        # The loaded state's round goes on only when this run replayed it (same world size): a resume at
        # another world size numbers its rounds from 0 again, and its round R is not the state's.
        loaded_in_round = (first is not None and replay is not None and loaded is not None and epoch == self.epoch
                           and self._replaying() and int(loaded.replay["round"]) == replay["round"])
        in_round = steps >= first if first is not None else np.zeros(ids.size, dtype=bool)
        world = self.world_size
        gathering = world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
        scope = "all_ranks" if gathering or world == 1 else "this_rank"
        complete = self.last_summary is not None and self.last_summary.get("epoch") == epoch
        trained = Trained(ids, owners, seqs, in_round, self.rank, world, len(self.dataset), epoch)  # type: ignore[arg-type]
        if self.sampler is None:
            if epoch != self.epoch:
                raise RuntimeError("odb: state_dict() after set_epoch() moved to another epoch; take it "
                                   "before set_epoch()")
            if self._position_cache is None or self._position_cache[0] != epoch:
                order = self._global_order()
                position = np.empty(order.size, dtype=np.int64)
                position[order] = np.arange(order.size, dtype=np.int64)
                self._position_cache = (epoch, position)  # one O(n) pass per epoch, reused by later checkpoints
            key, consumed, round_consumed, extra, _ = position_consumed(self._position_cache[1], trained, loaded,
                                                                        loaded_in_round, gathering)
        else:
            plan = self._plan if self._plan is not None and self._plan.epoch == epoch else None
            key, consumed, round_consumed, extra, exact_replay = sampler_consumed(
                plan, trained, loaded, loaded_in_round, replay is not None, gathering)
            if not exact_replay:
                replay = None  # the resume is the ordinary exactly-once one (docs/resume.md)
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "epoch": int(epoch),
                "epoch_complete": bool(complete), "seed": int(self.seed), "shuffle": bool(self.shuffle),
                "custom_sampler": self.sampler is not None, "dataset_len": len(self.dataset),  # type: ignore[arg-type]
                "world_size": int(world), "scope": scope, "consumed": consumed, "key": key, **extra,
                "replay": (None if replay is None or complete else
                           dict(replay, world_size=int(world), round_consumed=round_consumed)),
                "job": self.state_extras()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from state_dict(): the next iteration of that epoch sends
        only the samples no rank had consumed (also at another world size),
        so each is trained exactly once across the interruption. A state
        that is not one (corrupt, truncated, another version, another
        dataset or order) is an error, never a silent wrong resume
        (odb.resume_state checks it)."""
        loaded = parse_state(state, dataset_len=len(self.dataset),  # type: ignore[arg-type]
                             custom_sampler=self.sampler is not None, seed=self.seed, shuffle=self.shuffle)
        self._counters.load_state_dict(loaded.job, loaded.epoch, loaded.epoch_complete)
        if loaded.epoch_complete:
            self.set_epoch(loaded.epoch + 1)
            self._resume = None
        else:
            self.set_epoch(loaded.epoch)
            self._resume = loaded
        self._log.reset(None)
        self._plan = None

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
            consumer = native().Consumer(self.trainer_endpoint, self.poll_ms, self.data_plane)
            try:  # the daemon's settings fill arguments left None (odb.daemon_settings)
                vars(self).update(reconcile(
                    consumer.job_settings(int(self.timeout_s * 1000)), self.trainer_endpoint, packed=self.packed,
                    tokens_per_optimizer_step=self.tokens_per_optimizer_step, data_plane=self.data_plane,
                    ignore_index=self.ignore_index))
            except BaseException:
                consumer.close()  # a refused loader holds no session
                raise
            self._consumer = consumer
        return self._consumer

    def _epoch(self, epoch: int) -> Iterator[Step]:
        if self.budget_reached:  # the job's budget is trained: nothing more, on every rank alike
            return
        self.wait_epoch_end()  # a join-mode drain of the previous epoch
        self._counters.start_epoch(epoch)
        consumer = self._connect()
        if self.sampler is not None:
            # One draw of the sampler for the epoch: what is sent, and what state_dict maps positions in.
            self._plan = self._sampler_plan()
            indices = self._plan.full[self._plan.sent].tolist()
        else:
            self._plan = None
            indices = self.indices()
        pump = start_pump(self.dataset, indices, epoch, self.rank, self.ingest_endpoint, lengths_fn=self.lengths_fn,
                          send_timeout_ms=self.send_timeout_ms, progress_every=self.progress_every,
                          data_plane=self.data_plane, loss_tokens_from=self.loss_tokens_from,
                          ignore_index=self.ignore_index, num_workers=self.num_workers,
                          multiprocessing_context=self.multiprocessing_context, worker_init_fn=self.worker_init_fn,
                          seed=self.seed)
        loaded = self._resuming(epoch)
        replay = loaded.replay if loaded is not None and self._replaying() else None
        if replay is not None:
            consumer.start_epoch(epoch, max(self.num_workers, 1), first_round=int(replay["round"]),
                                 first_step=int(replay["first_step"]))
        else:
            consumer.start_epoch(epoch, max(self.num_workers, 1))
        skip_below = int(replay["next_step"]) if replay is not None else 0  # trained before the checkpoint
        self.samples_sent = 0
        self.last_summary = None
        self.dropped_trailing_idle = 0
        self._log.reset(epoch)
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
                if self._budgets.tokens_reached(self._counters):
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
                check_window_target(self.tokens_per_optimizer_step, info, self.trainer_endpoint)
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
                    self._log.remember(info)
                    continue
                if info["idle"]:
                    # Both policies yield it: a rank still in its loop cannot tell a
                    # mid-epoch IDLE step from a trailing one, and holding it back
                    # would hang the job (the peers' real step is a DDP collective
                    # that needs this rank, and their daemons' queues fill while
                    # they wait). Join drops only what arrives after this rank is
                    # done (rank_done: the loop is left, the drain thread reads on).
                    self._log.remember(info)
                    window = self._counters.count_step(info)
                    yield self._dummy_step(info, indices, window, delivery)
                    asked = time.monotonic()
                    continue
                accounted[0] += len(info["sample_ids"])
                self._log.add_step(info, self.rank)
                self._log.remember(info)
                batch = _to_torch(delivery)
                self._check_layout(batch, info)
                if self._pinning():
                    # Page-locked copies (what torch's DataLoader does with
                    # pin_memory): the received step's memory goes back now.
                    batch = {k: v.pin_memory() for k, v in batch.items()}
                    delivery = None
                window = self._counters.count_step(info)
                yield Step.from_header(info, batch, _delivery=delivery, window=window)
                asked = time.monotonic()
            pump.join(timeout=self.timeout_s)
            pump.raise_if_failed()
        finally:
            pump.close()
            if progress is not None:
                progress.close()

    def _check_layout(self, batch: Mapping[str, torch.Tensor], info: Any) -> None:
        self._packed_seen = "cu_seqlens" in batch
        check_layout(self.packed, self._packed_seen, info, self.trainer_endpoint)

    def _record(self, epoch: int, info: Any, wait_s: Optional[float] = None) -> None:
        record_step(self.summary_dir, self.rank, epoch, info, wait_s)

    def _finish_epoch(self, summary: Dict[str, Any], dropped_idle: int) -> None:
        self.dropped_trailing_idle += dropped_idle
        self.last_summary = summary
        whole = self._epoch_sample_limit(int(self._counters.epoch or 0)) in (None, self.samples_per_epoch())
        self._counters.finish_epoch(summary.get("epoch"), whole)
        self._check_rejections(summary, "epoch summary")

    def _start_drain(self, consumer: Any) -> None:
        def on_step(header: Mapping[str, Any]) -> None:
            self._record(header["epoch"], header)
            self._counters.count_step(header)  # its window closes on every rank: count it here too

        self._drain.start(lambda: self._next(consumer, None, None), on_step, self._finish_epoch, self.rank)

    def wait_epoch_end(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """Join policy: waits for the trailing IDLE steps to drain and returns
        the epoch summary (also in ``last_summary``). No-op otherwise."""
        self._drain.wait(self.timeout_s + 5 if timeout is None else timeout, self.rank)
        return self.last_summary

    def _next(self, consumer: Any, pump: Optional["_Pump"], done: Optional[Callable[[], bool]]) -> Any:
        return next_delivery(consumer, pump, done, endpoint=self.trainer_endpoint, rank=self.rank, epoch=self.epoch,
                             timeout_s=self.timeout_s, samples_sent=self.samples_sent)

    def _check_rejections(self, info: Mapping[str, Any], where: str) -> None:
        self.late_for_closed_epoch += check_rejections(info, where)

    # ----- dummy steps (odb.dummy) ---------------------------------------------
    def _dummy_step(self, info: Mapping[str, Any], indices: Sequence[int], window: Optional[int] = None,
                    delivery: Any = None) -> Step:
        return self._dummy.step(info, self.dummy_batch(indices), window, delivery, self._pinning)

    def dummy_batch(self, indices: Optional[Sequence[int]] = None) -> Dict[str, torch.Tensor]:
        """A one-sample batch for IDLE steps (same field names as real batches),
        in the packed layout when the daemon packs (``packed``, or learned)."""
        return self._dummy.batch(self.packed if self.packed is not None else bool(self._packed_seen), indices)

    def close(self) -> None:
        """Closes the trainer connection now, ending this loader's session on the daemon (a daemon serves
        one trainer session: another loader may then connect); reconnects on the next epoch."""
        if self._consumer is not None and not self._drain.alive():
            # A traceback may still hold the object: close it, not just drop it. (Not under the
            # join policy's drain thread, which reads it until the epoch's end.)
            self._consumer.close()
        self._consumer = None
