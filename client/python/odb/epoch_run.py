"""One epoch's iteration of an OdbDataLoader (what ``iter(loader)`` returns), as torch's DataLoader
hands its iteration to an iterator object: the loop that combines the loader's parts. It starts the
epoch (the order's indices, the workers' pump, the daemon's session, from the checkpoint's round for a
deterministic resume), then takes each delivery: a step is recorded, checked, logged in the consumed
log, counted by the job counters and yielded (a dummy step for an IDLE one); the epoch's summary ends
it; under the join policy the loop ends once this rank is done (:meth:`EpochRun.rank_done`) and the
trailing IDLE steps drain in the background."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterator, Optional

from ._native import native
from .delivery import check_window_target, record_step
from .encoding import _to_torch
from .progress import Progress
from .pump import start_pump
from .step import Step

if TYPE_CHECKING:
    from .loader import OdbDataLoader


class EpochRun:
    """One epoch of `loader`, and what its loop keeps between steps: the indices sent, the workers' pump,
    the first step a deterministic resume trains (`skip_below`: the steps before it were trained before
    the checkpoint), when the trainer last asked for a step, and for the join policy whether this rank
    is done."""

    def __init__(self, loader: "OdbDataLoader", epoch: int) -> None:
        self.loader, self.epoch = loader, epoch
        self.indices: Any = []
        self.pump: Any = None
        self.skip_below = 0
        self.progress: Optional[Progress] = None
        self.asked = 0.0  # when the trainer asked for the next step (a data stall: it waits there)
        self.steps = 0  # steps seen: the daemon's samples_may_move flag is known after the first
        self.samples_may_move = False
        self.back = 0  # this rank's samples seen back (emitted or rejected)

    def rank_done(self) -> bool:
        """Join policy: once every sample this rank sent came back, the remaining steps can only be IDLE:
        the loop ends so that DDP's join() shadows the other ranks, and the trailing IDLE steps are read
        in the background. Not when the daemon's planner moves samples between ranks (then this rank
        may still get real steps, and the loop runs to the epoch summary)."""
        return (self.loader.idle_policy == "join" and self.steps > 0 and not self.samples_may_move
                and self.pump.finished() and self.back >= self.pump.sent)

    def __iter__(self) -> Iterator[Step]:
        loader, epoch = self.loader, self.epoch
        if loader.budget_reached:  # the job's budget is trained: nothing more, on every rank alike
            return
        loader.wait_epoch_end()  # a join-mode drain of the previous epoch
        loader._counters.start_epoch(epoch)
        consumer = loader._connect()
        self.indices = loader._order.start_epoch()
        self.pump = pump = start_pump(
            loader.dataset, self.indices, epoch, loader.rank, loader.ingest_endpoint, lengths_fn=loader.lengths_fn,
            send_timeout_ms=loader.send_timeout_ms, progress_every=loader.progress_every,
            data_plane=loader.data_plane, loss_tokens_from=loader.loss_tokens_from, ignore_index=loader.ignore_index,
            length_field=loader.length_field,
            num_workers=loader.num_workers, multiprocessing_context=loader.multiprocessing_context,
            worker_init_fn=loader.worker_init_fn, seed=loader.seed)
        replay = loader._order.replaying()  # a deterministic resume: from the checkpoint's round
        if replay is not None:
            consumer.start_epoch(epoch, max(loader.num_workers, 1), first_round=replay.round,
                                 first_step=replay.first_step)
            self.skip_below = replay.next_step
        else:
            consumer.start_epoch(epoch, max(loader.num_workers, 1))
        loader.samples_sent, loader.last_summary, loader.dropped_trailing_idle = 0, None, 0
        loader._log.reset(epoch)
        if loader.progress:
            self.progress = Progress(loader.rank, epoch, len(self.indices), stream=loader.progress_stream)
        loader.data_wait_s = 0.0
        self.asked = time.monotonic()
        try:
            pump.start()
            # The token budget closes with a window: every rank stops at the same step.
            while not loader._budgets.tokens_reached(loader._counters):
                delivery = loader._next(consumer, pump, self.rank_done)
                loader.samples_sent = pump.sent
                if delivery is None:  # join: this rank is done, the rest is IDLE
                    loader._start_drain(consumer)
                    return
                if not delivery.is_step:
                    loader._finish_epoch(delivery.summary, 0)
                    pump.join(timeout=loader.timeout_s)
                    pump.raise_if_failed()
                    return
                step = self.take(consumer, delivery)
                if step is not None and not step.dummy:
                    delivery = None  # the step holds it (or page-locked copies: the memory goes back now)
                if step is not None:
                    yield step
                    self.asked = time.monotonic()
        finally:
            pump.close()
            if self.progress is not None:
                self.progress.close()

    def take(self, consumer: Any, delivery: Any) -> Optional[Step]:
        """A step delivered: recorded, checked, logged and counted. Returns the Step to yield (a dummy one
        for an IDLE step), or None for a step a deterministic resume replays."""
        loader, info = self.loader, delivery.step
        self.steps += 1
        waited = time.monotonic() - self.asked
        loader.data_wait_s += waited
        consumer.report_data_wait(waited)  # rides on the next credit: odb.top names a starved rank
        record_step(loader.summary_dir, loader.rank, self.epoch, info, waited)
        if self.progress is not None:
            self.progress.update(len(info["sample_ids"]), info["real_tokens"], info["padded_tokens"], info["idle"],
                                 waited, closes_window=bool(info["closes_window"]),
                                 windowed=int(info["window_target"]) > 0)
        self.samples_may_move = self.samples_may_move or bool(info.get("samples_may_move"))
        loader._check_rejections(info, f"step {info['step_index']}")
        check_window_target(loader.tokens_per_optimizer_step, info, loader.trainer_endpoint)
        self.back += sum(1 for r in info["rejections"] if r["sample_id"] is not None)
        # A replayed round of a deterministic resume: its steps before skip_below were trained before
        # the checkpoint (their samples are in the state).
        replayed = info["step_index"] < self.skip_below
        if replayed and not info["deterministic"]:
            raise native().OdbError(
                "odb: the loaded state resumes a reproducible epoch (alignment.deterministic) but "
                "the daemon does not run alignment.deterministic: start odbd with the config the "
                "checkpoint was taken with")
        loader._log.remember(info)
        if replayed:
            self.back += len(info["sample_ids"])
            return None
        if info["idle"]:
            # Both policies yield it: a rank still in its loop cannot tell a mid-epoch IDLE step from a
            # trailing one, and holding it back would hang the job (the peers' real step is a DDP
            # collective that needs this rank, and their daemons' queues fill while they wait). Join
            # drops only what arrives after this rank is done (the loop is left, the drain reads on).
            return loader._dummy_step(info, self.indices, loader._counters.count_step(info), delivery)
        self.back += len(info["sample_ids"])
        loader._log.add_step(info, loader.rank)
        batch = _to_torch(delivery)
        loader._check_layout(batch, info)
        if loader._pinning():
            # Page-locked copies (what torch's DataLoader does with pin_memory).
            batch = {k: v.pin_memory() for k, v in batch.items()}
            delivery = None
        return Step.from_header(info, batch, _delivery=delivery, window=loader._counters.count_step(info))
