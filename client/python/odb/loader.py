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

This module keeps OdbDataLoader: its settings, and its parts combined (as
torchdata's StatefulDataLoader combines its sampler's and iterator's states),
each a module with its own state_dict where it has state (docs/architecture.md):
odb.epoch_order (the epoch's order, a custom sampler's plan, a loaded state
while its epoch resumes), odb.consumed_log (what the loop handed out: the
checkpoint's consumed set), odb.job_counters and odb.budgets (schedules and
budgets), odb.dummy (IDLE steps), odb.resume_state (the checkpoint, one
dataclass per version) and odb.epoch_run (one epoch's loop, combining them).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch.utils.data import Dataset, Sampler

from ._native import native
from .budgets import Budgets, optimizer_steps_for
from .consumed_log import ConsumedLog
from .daemon import check_reachable, endpoints, env_rank, env_world_size
from .daemon_settings import reconcile
from .delivery import TrailingIdleDrain, check_layout, check_rejections, next_delivery, record_step
from .dummy import DummyBatches
from .encoding import IGNORE_INDEX, LENGTH_FIELD
from .epoch_order import EpochOrder, OrderAttribute
from .epoch_run import EpochRun
from .job_counters import JobCounters
from .pump import _Pump
from .resume_state import write_state
from .stacks import check_caller_stack
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
        "input_ids" (1-D, its length = tokens; the daemon's
        ``collate.length_field`` when it names another) and optional extras (labels,
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
        ``position_ids`` [1, L], no attention mask). None: the daemon's, which
        it tells the loader when it connects (odb.daemon_settings); when
        given, it must agree with the daemon's (a clear error otherwise).
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
        ranks (accumulation windows). None: the daemon's
        ``optimizer.tokens_per_step``, told when the loader connects; when
        given, it must agree with it (a clear error otherwise).
      ignore_index: the label value that bears no loss (what the loader
        counts loss tokens with). None: the pad value of the daemon's padded
        ``labels`` (``collate.fields``; -100 by default), told when the loader
        connects (-100 with a daemon that does not say); when given, it must
        agree with it.
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
                 ignore_index: Optional[int] = None, stop_at_samples: Optional[int] = None,
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
        self.length_field = LENGTH_FIELD  # until the daemon tells its collate.length_field
        if idle_policy not in IDLE_POLICIES:
            raise ValueError(f"idle_policy must be one of {IDLE_POLICIES}, not {idle_policy!r}")
        if data_plane not in DATA_PLANES:
            raise ValueError(f"data_plane must be one of {DATA_PLANES}, not {data_plane!r}")
        self.data_plane = data_plane
        self.num_workers = num_workers
        self.idle_policy = idle_policy
        # The loader's stateful parts (each with its own state; state_dict() combines them): the epoch's
        # order (dataset, sampler, shuffle, seed, rank, world_size and epoch are its attributes), the
        # steps handed out in the epoch, and the job's counters (schedules, budgets).
        self._order = EpochOrder(dataset, sampler, shuffle, seed, env_rank() if rank is None else rank,
                                 env_world_size() if world_size is None else world_size, self._budgets)
        self._log = ConsumedLog()
        self._counters = JobCounters()
        eps = endpoints(self.rank, run_dir)
        self.ingest_endpoint: str = ingest_endpoint or eps.ingest
        self.trainer_endpoint: str = trainer_endpoint or eps.trainer
        self.lengths_fn: Optional[Callable[[Mapping[str, Any]], Tuple[int, ...]]] = lengths_fn
        self.worker_init_fn: Optional[Callable[[int], None]] = worker_init_fn
        self.multiprocessing_context: Any = multiprocessing_context
        self.timeout_s: float = timeout_s
        self.poll_ms = poll_ms
        self.send_timeout_ms: int = send_timeout_ms
        self.progress_every: int = progress_every
        self.pin_memory = pin_memory
        self._pin_warned = False
        if progress is None:
            import sys

            progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self.progress: bool = progress
        self.progress_stream: Any = None  # where the lines go (None: stderr, or tqdm)
        self.summary_dir = summary_dir
        self._dummy = DummyBatches(dataset, dummy_sample)
        self._drain = TrailingIdleDrain()  # join policy: the epoch's trailing IDLE steps
        self.packed = None if packed is None else bool(packed)
        self._packed_seen: Optional[bool] = None  # the layout of the real steps received so far
        self._consumer: Any = None
        self.last_summary: Optional[Dict[str, Any]] = None
        self.samples_sent: int = 0
        self.data_wait_s: float = 0.0  # this epoch's time the trainer spent in next(loader) waiting for steps
        self.late_for_closed_epoch = 0  # Non-Join: samples that arrived after their epoch closed
        self.dropped_trailing_idle: int = 0

    dataset = OrderAttribute[Dataset]()
    sampler = OrderAttribute[Optional[Sampler]]()
    shuffle = OrderAttribute[bool]()
    seed = OrderAttribute[int]()
    rank = OrderAttribute[int]()
    world_size = OrderAttribute[int]()
    epoch = OrderAttribute[int]()

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
        self._order.set_epoch(epoch)

    def indices(self) -> List[int]:
        """The sample indices this rank sends in the current epoch (after a
        resume: those no rank had consumed, split over the current ranks; with
        a custom sampler this rank's list less its consumed positions; a
        deterministic resume at the same world size keeps each rank's list of
        the uninterrupted run, less what the rounds before the checkpoint's
        round took)."""
        return self._order.indices()

    # ----- budgets and schedules (docs/python.md, "Schedules and budgets") ---------
    def samples_per_epoch(self) -> int:
        """The samples of one epoch over all ranks: len(dataset), or with a sampler its length x world size."""
        return self._order.samples_per_epoch()

    @property
    def budget_reached(self) -> bool:
        """True once the job's budget (stop_at_samples / stop_at_loss_tokens) is trained: iterating yields
        nothing, on every rank alike. Leave the epoch loop on it."""
        if self._budgets.tokens_reached(self._counters):
            return True
        limit = self._order.sample_limit(self.epoch)
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
        if self.ignore_index is None:
            self._connect()  # the daemon's labels pad value and length field (odb.daemon_settings)
        ignore_index = IGNORE_INDEX if self.ignore_index is None else self.ignore_index
        mean = self._budgets.loss_tokens_per_sample(self.dataset, probe, self.loss_tokens_from, ignore_index,
                                                    self.lengths_fn, self.length_field)
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
        step, as DDP checkpoints are taken), never tensors. See docs/resume.md.
        The parts' states combined: the order's, the consumed log's, the job counters'."""
        epoch = self.epoch if self._log.epoch is None else self._log.epoch
        complete = self.last_summary is not None and self.last_summary.get("epoch") == epoch
        return write_state(epoch=int(epoch), epoch_complete=bool(complete), **self._order.state_dict(),
                           **self._log.state_dict(self._order, epoch, complete), job=self.state_extras())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from state_dict(): the next iteration of that epoch sends
        only the samples no rank had consumed (also at another world size),
        so each is trained exactly once across the interruption. A state
        that is not one (corrupt, truncated, another version, another
        dataset or order) is an error, never a silent wrong resume
        (odb.resume_state checks every field before any part takes its own)."""
        loaded = self._order.read_state(state)
        self._counters.load_state_dict(loaded.job, loaded.epoch, loaded.epoch_complete)
        self._order.load_state_dict(loaded)
        self._log.load_state_dict(loaded)

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
        """The current epoch's steps (odb.epoch_run: the loop that combines the parts)."""
        check_caller_stack(self.idle_policy)  # refuses e.g. FSDP with idle_policy="join" (odb/stacks.py)
        return iter(EpochRun(self, self.epoch))

    def _pinning(self) -> bool:
        """Whether batches are pinned: pin_memory and a CUDA device (else a warning, once)."""
        if not self.pin_memory:
            return False
        if torch.cuda.is_available():
            return True
        if not self._pin_warned:
            self._pin_warned = True
            warnings.warn("OdbDataLoader(pin_memory=True) but no CUDA device is available: batches are not "
                          "pinned", stacklevel=4)  # the trainer's loop: _pinning <- take <- EpochRun
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
                settled = reconcile(
                    consumer.job_settings(int(self.timeout_s * 1000)), self.trainer_endpoint, packed=self.packed,
                    tokens_per_optimizer_step=self.tokens_per_optimizer_step, data_plane=self.data_plane,
                    ignore_index=self.ignore_index, length_field=None)
                self.length_field = settled.pop("length_field") or LENGTH_FIELD  # what the workers measure
                vars(self).update(settled)
                if self.ignore_index is None:  # a daemon that does not say (older, or it pads no labels)
                    self.ignore_index = IGNORE_INDEX
            except BaseException:
                consumer.close()  # a refused loader holds no session
                raise
            self._consumer = consumer
        return self._consumer

    def _check_layout(self, batch: Mapping[str, torch.Tensor], info: Any) -> None:
        self._packed_seen = "cu_seqlens" in batch
        check_layout(self.packed, self._packed_seen, info, self.trainer_endpoint)

    def _finish_epoch(self, summary: Dict[str, Any], dropped_idle: int) -> None:
        self.dropped_trailing_idle += dropped_idle
        self.last_summary = summary
        whole = self._order.sample_limit(int(self._counters.epoch or 0)) in (None, self.samples_per_epoch())
        self._counters.finish_epoch(summary.get("epoch"), whole)
        self._check_rejections(summary, "epoch summary")

    def _start_drain(self, consumer: Any) -> None:
        def on_step(header: Mapping[str, Any]) -> None:
            record_step(self.summary_dir, self.rank, header["epoch"], header)
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
