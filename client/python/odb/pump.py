"""The data-worker side of OdbDataLoader: the stream each DataLoader worker runs (preprocess, send
to the daemon) and the pump thread that drives the DataLoader iterator so that a worker's exception or
death surfaces in the trainer as OdbWorkerError."""
from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import select
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from ._native import native
from .encoding import IGNORE_INDEX, LENGTH_FIELD, encode_sample, sample_loss_tokens


class OdbWorkerError(native().OdbError):  # type: ignore[misc]
    """A DataLoader worker failed (an exception in preprocessing, or it died)."""


class _ByValue:
    """A dataset pickled by value (plain pickle), for workers that are not forked.

    multiprocessing's pickler hands every tensor storage to a forkserver or spawn
    worker as a file descriptor, and a process start may pass only ~250 of them:
    an in-memory dataset of more tensors (a list of tensor dicts past ~128
    samples) failed every worker with a bare "ValueError: too many fds". By value,
    workers get the dataset the way they get a list of numpy arrays: a copy each,
    whatever its size. Pickled once per epoch, however many workers start."""

    def __init__(self, data: bytes) -> None:
        self.data = data


def _pickled_by_value(dataset: Any) -> Any:
    """`dataset` as a _ByValue, or the dataset itself when plain pickle cannot take it (an object
    only multiprocessing can share, e.g. a Lock): then multiprocessing's own pickler sends it."""
    try:
        return _ByValue(pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - any pickling failure: fall back to multiprocessing's pickler
        return dataset


class _SendStream(IterableDataset):
    """What the DataLoader iterates: each worker preprocesses its share of the
    indices and sends the samples to the daemon; it yields only small progress
    counts (the null-collated "batches")."""

    def __init__(self, dataset: Dataset, indices: Sequence[int], epoch: int, rank: int, endpoint: str,
                 lengths_fn: Optional[Callable], send_timeout_ms: int, progress_every: int,
                 stop: Any, data_plane: str = "auto", loss_tokens_from: Optional[str] = None,
                 ignore_index: int = IGNORE_INDEX, length_field: str = LENGTH_FIELD) -> None:
        self.loss_tokens_from = loss_tokens_from
        self.length_field = length_field
        self.ignore_index = ignore_index
        self.dataset = dataset
        self.indices = list(indices)
        self.epoch = epoch
        self.rank = rank
        self.endpoint = endpoint
        self.lengths_fn = lengths_fn
        self.send_timeout_ms = send_timeout_ms
        self.progress_every = max(1, progress_every)
        self.stop = stop
        self.data_plane = data_plane
        self._by_value: Any = None  # the dataset pickled by value, once (for workers not forked)

    def __getstate__(self) -> dict:
        # Only a worker that is not forked (forkserver, spawn) pickles the stream.
        if self._by_value is None:
            self._by_value = _pickled_by_value(self.dataset)
        state = dict(self.__dict__)
        state["dataset"], state["_by_value"] = self._by_value, None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if isinstance(self.dataset, _ByValue):
            self.dataset = pickle.loads(self.dataset.data)

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # A sample's seq is its position in this rank's list: a deterministic
        # daemon plans in that order, whichever worker delivers first.
        positions = range(worker, len(self.indices), workers)
        # Created here, in the worker process (after fork), never in the parent.
        producer = native().Producer(
            self.endpoint, f"rank{self.rank}-worker{worker}-epoch{self.epoch}-pid{os.getpid()}",
            self.rank, send_timeout_ms=self.send_timeout_ms, data_plane=self.data_plane)
        # The trainer signals `stop` when it leaves the epoch: a send blocked on
        # the daemon (no credit: nobody consumes) is cancelled and the worker
        # ends (no private DataLoader API needed to shut it down). In a worker
        # process `stop` is the read end of a pipe (a multiprocessing.Event
        # would hang the trainer's set() once a waiting worker has exited).
        stopped = threading.Event()
        live = {"producer": producer}  # emptied when the stream ends: nothing left to cancel

        def watch() -> None:
            if isinstance(self.stop, threading.Event):
                self.stop.wait()
            else:
                try:
                    self.stop.poll(None)
                except (EOFError, OSError):
                    pass
            stopped.set()
            p = live.get("producer")
            if p is not None:
                p.cancel()

        threading.Thread(target=watch, daemon=True, name="odb-stop-watch").start()
        pending = 0
        for position in positions:
            if stopped.is_set():
                return
            index = self.indices[position]
            sample = self.dataset[index]
            lengths, tensors = encode_sample(sample, self.lengths_fn, self.length_field)
            loss_tokens = sample_loss_tokens(sample, self.loss_tokens_from, self.ignore_index)
            try:
                producer.send(int(index), self.epoch, lengths[0], lengths[1], lengths[2], tensors, seq=position,
                              loss_tokens=loss_tokens)
            except native().OdbError:
                if stopped.is_set():
                    return
                raise
            pending += 1
            if pending >= self.progress_every:
                yield pending
                pending = 0
        producer.end_stream(self.epoch)
        live.clear()
        del producer  # closes the socket: everything is delivered before we report the end
        yield pending


def _null_collate(item: Any) -> Any:
    return item


class _Pump:
    """Drives the DataLoader iterator in a thread so that worker exceptions and
    worker deaths surface in the trainer (DataLoader re-raises them on next())."""

    def __init__(self, loader: DataLoader, stop: threading.Event, wake_workers: Any = None) -> None:
        self.loader = loader
        self.stop = stop
        self.wake_workers = wake_workers  # write end of the workers' stop pipe
        self.sent = 0
        self.error: Optional[BaseException] = None
        self.done = False
        self.iterator: Any = None
        self.thread = threading.Thread(target=self._run, name="odb-pump", daemon=True)

    def start(self) -> None:
        try:
            self.iterator = iter(self.loader)  # starts the workers
        except ValueError as e:
            if "too many fds" not in str(e):
                raise
            # The dataset could not be pickled by value (_ByValue), and multiprocessing's pickler
            # shares each tensor as a file descriptor: more than a process start can pass.
            raise OdbWorkerError(
                "odb: the DataLoader workers could not start: the dataset holds more tensors than "
                f"multiprocessing can hand a {self.loader.multiprocessing_context.get_start_method()!r} worker "
                "(one file descriptor each, ~250 at most), and plain pickle cannot copy it (it holds an object "
                "only multiprocessing can share). Make the dataset picklable, load samples lazily in "
                "__getitem__, or pass multiprocessing_context=\"fork\" (workers then inherit the dataset)"
            ) from e
        self.thread.start()

    def _run(self) -> None:
        try:
            for count in self.iterator:
                self.sent += int(count)
                if self.stop.is_set():
                    return
            self.done = True
        except BaseException as e:  # noqa: BLE001 - handed to the trainer thread
            if not self.stop.is_set():
                self.error = e

    def finished(self) -> bool:
        """True once every worker ended its stream (the iterator is exhausted)."""
        return self.done

    def raise_if_failed(self) -> None:
        if self.error is not None:
            e = self.error
            hint = ""
            context = self.loader.multiprocessing_context
            method = context.get_start_method() if context is not None else "fork"
            if "WRONG_EPOCH" in str(e) and "has already ended" in str(e):
                # A second loader (or a rerun of a script) on a daemon that already ran this epoch.
                hint = (" (the daemon already ran this epoch: an earlier OdbDataLoader or run used it, and "
                        "epochs on one daemon only go forward. close() the earlier loader (one trainer session "
                        "per daemon) and set_epoch(N) on this one with an epoch the daemon has not run, or start "
                        "a fresh daemon for a new job)")
            elif "exited unexpectedly" in str(e) and method != "fork":
                # The usual cause: a worker started by forkserver/spawn imports the
                # training script again, and an unguarded script re-runs its training
                # (init_process_group, ...) in the worker.
                hint = (f" (workers start with the {method!r} method, which imports the training script "
                        "again in each worker: put its entry point under `if __name__ == \"__main__\":`, "
                        "or pass multiprocessing_context=\"fork\"; the worker's own error is printed "
                        "above)")
            raise OdbWorkerError(f"odb data worker failed: {type(e).__name__}: {e}{hint}") from e

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def close(self) -> None:
        self.stop.set()
        if self.wake_workers is not None:  # the workers cancel their sends and end their streams
            try:
                self.wake_workers.send_bytes(b"stop")
                self.wake_workers.close()
            except OSError:
                pass
            self.wake_workers = None
        if self.thread.is_alive():
            # A pump thread still inside the DataLoader queue read while the next
            # epoch forks its workers can hand them a held lock; wait it out
            # (the read wakes at least every 5 s: MP_STATUS_CHECK_INTERVAL).
            self.thread.join(timeout=10.0)


def _send_worker_start(user_init: Optional[Callable[[int], None]], owner: int, worker_id: int) -> None:
    """A send worker's first call: the worker exits when `owner`, the rank process whose DataLoader
    started it, exits, however it dies. Torch's worker watchdog watches the worker's parent, which under
    forkserver (the default) is the rank's forkserver: that outlives a killed rank for as long as any of
    its children holds the fd it watches, so workers whose rank was killed lived on for good (with the
    forkserver and multiprocessing's resource tracker); and a worker blocked in a send notices nothing
    until `send_timeout_ms`."""
    try:
        owner_fd = os.pidfd_open(owner)  # readable once `owner` has exited (Linux >= 5.3)
    except ProcessLookupError:  # the rank is already gone
        os._exit(1)
    except (AttributeError, OSError):  # no pidfds here: torch's watchdog only
        owner_fd = None
    if owner_fd is not None:
        def watch() -> None:
            select.select([owner_fd], [], [])
            os._exit(1)

        threading.Thread(target=watch, name="odb-rank-watch", daemon=True).start()
    if user_init is not None:
        user_init(worker_id)


def start_pump(dataset: Any, indices: Any, epoch: int, rank: int, endpoint: str, *, lengths_fn: Any,
               send_timeout_ms: int, progress_every: int, data_plane: str, loss_tokens_from: Any, ignore_index: int,
               length_field: str, num_workers: int, multiprocessing_context: Any, worker_init_fn: Any, seed: int) -> "_Pump":
    """The epoch's send path, not yet started: `indices` of `dataset` preprocessed by a DataLoader's
    workers (``num_workers`` processes of `multiprocessing_context`, forkserver by default, or a thread
    when 0) and sent to the daemon at `endpoint`, driven by a pump thread. The workers see its stop
    flag as a pipe of their start method's context."""
    stop = threading.Event()
    wake_workers = None
    worker_stop: Any = stop
    if num_workers:
        context = multiprocessing_context or "forkserver"
        if isinstance(context, str):
            context = multiprocessing.get_context(context)
        worker_stop, wake_workers = context.Pipe(duplex=False)
        worker_init_fn = functools.partial(_send_worker_start, worker_init_fn, os.getpid())
    stream = _SendStream(dataset, indices, epoch, rank, endpoint, lengths_fn, send_timeout_ms, progress_every,
                         worker_stop, data_plane, loss_tokens_from, ignore_index, length_field)
    generator = torch.Generator()
    generator.manual_seed(seed * 1000003 + epoch)
    loader = DataLoader(stream, batch_size=None, num_workers=num_workers, collate_fn=_null_collate,
                        worker_init_fn=worker_init_fn, generator=generator,
                        multiprocessing_context=(multiprocessing_context or "forkserver") if num_workers else None)
    return _Pump(loader, stop, wake_workers)
