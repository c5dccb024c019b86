"""How the loader waits for what its daemon delivers, and checks it: the next delivery polled in slices
with the workers', the daemon's and the clock's failures raised instead of a hang; a step's layout and
window target against the loader's settings; the daemon's rejections; the per-step record for odb.report."""
from __future__ import annotations

import json
import os
import threading
import time
import warnings
from typing import Any, Callable, Mapping, Optional

from ._native import native
from .daemon import daemon_pid, pid_alive, spawned_daemon


def next_delivery(consumer: Any, pump: Any, done: Optional[Callable[[], bool]], *, endpoint: str, rank: int,
                  epoch: int, timeout_s: float, samples_sent: int) -> Any:
    """The next delivery, polling in slices; raises instead of hanging. None when `done()` turns true
    while waiting. `pump`: the workers' pump (its failure is raised), or None (a drain)."""
    start = time.monotonic()
    daemon = spawned_daemon(endpoint)
    # A daemon another process started (odb.launch, systemd): its pid from
    # the endpoint's lock file, so its death is seen within poll_ms too.
    other_pid = daemon_pid(endpoint) if daemon is None else None
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
                f"epoch {epoch}; log {daemon.log_path}:\n{daemon.log_tail()}")
        if other_pid is not None and not pid_alive(other_pid):
            raise native().OdbError(
                f"odbd (pid {other_pid}) serving {endpoint} is gone (exited or killed) during "
                f"epoch {epoch} (rank {rank}): see its log (odb.launch: $ODB_RUN_DIR/odbd-<rank>.log)")
        if time.monotonic() - start > timeout_s:
            sent = pump.sent if pump is not None else samples_sent
            raise native().OdbTimeout(
                f"no step from odbd at {endpoint} for {timeout_s:.0f}s (rank {rank}, epoch {epoch}, {sent} "
                f"samples sent): is the daemon alive, and are all ranks' producers sending?")


def check_rejections(info: Mapping[str, Any], where: str) -> int:
    """Raises (or warns, when the daemon skips bad input) on the rejections a step or summary reports;
    returns how many samples came too late for their closed epoch (Non-Join: reported, never an error)."""
    rejections = info.get("rejections") or []
    late = [r for r in rejections if r["code"] == "LATE_FOR_CLOSED_EPOCH"]
    rejections = [r for r in rejections if r["code"] != "LATE_FOR_CLOSED_EPOCH"]
    if rejections:
        text = "; ".join(f"{r['code']} sample {r['sample_id']} from {r['producer_id']}: {r['message']}"
                         for r in rejections)
        if info.get("rejections_are_errors", True):
            raise native().OdbError(f"odbd rejected input ({where}): {text}")
        warnings.warn(f"odbd skipped input ({where}): {text}")
    return len(late)


def check_layout(want: Optional[bool], packed: bool, info: Mapping[str, Any], endpoint: str) -> None:
    """A real step's layout (`packed`: it has cu_seqlens) against OdbDataLoader(packed=`want`)."""
    if want is None or want == packed:
        return
    raise native().OdbError(
        f"odb: OdbDataLoader(packed={want}) but step {info['step_index']} from the daemon at "
        f"{endpoint} is {'packed' if packed else 'padded'}: pass packed={packed}, or start odbd "
        f"with collate: {{packed: {str(want).lower()}}} on every rank")


def check_window_target(want: Optional[int], info: Mapping[str, Any], endpoint: str) -> None:
    """A step's window target against OdbDataLoader(tokens_per_optimizer_step=`want`)."""
    if want is None or int(info["window_target"]) == want:
        return
    raise native().OdbError(
        f"odb: OdbDataLoader(tokens_per_optimizer_step={want}) but the daemon at {endpoint} runs "
        f"optimizer.tokens_per_step: {int(info['window_target'])}: start odbd with optimizer: "
        f"{{tokens_per_step: {want}}} on every rank (odb.spawn_daemon(config={{'optimizer': "
        f"{{'tokens_per_step': {want}}}}}))")


def record_step(summary_dir: Optional[str], rank: int, epoch: int, info: Mapping[str, Any],
                wait_s: Optional[float] = None) -> None:
    """One step record for odb.report (when summary_dir is set); wait_ms: the trainer's wait in
    next(loader) for this step (absent for the steps a joined rank drains)."""
    if summary_dir is None:
        return
    os.makedirs(summary_dir, exist_ok=True)
    record = {"epoch": epoch, "rank": rank, "step": int(info["step_index"]), "idle": bool(info["idle"]),
              "real": int(info["real_tokens"]), "padded": int(info["padded_tokens"]),
              "lengths": [int(n) for n in info["lengths"]]}
    if wait_s is not None:
        record["wait_ms"] = round(wait_s * 1000.0, 3)
    with open(os.path.join(summary_dir, f"rank{rank}-epoch{epoch}.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


class TrailingIdleDrain:
    """Join policy: once every sample a rank sent came back, its loop ends and the epoch's remaining
    steps (IDLE ones: other ranks' real steps still run) are read in a background thread up to the
    epoch's summary; :meth:`wait` returns when they were, raising what the thread raised."""

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, fetch: Callable[[], Any], on_step: Callable[[Mapping[str, Any]], None],
              on_end: Callable[[Any, int], None], rank: int) -> None:
        """`fetch()`: the next delivery; `on_step(header)` for each drained step; `on_end(summary, dropped)`
        at the summary. A real step among them is an error (samples moved between ranks)."""
        def drain() -> None:
            try:
                dropped = 0
                while True:
                    delivery = fetch()
                    if not delivery.is_step:
                        on_end(delivery.summary, dropped)
                        return
                    on_step(delivery.step)
                    if not delivery.step["idle"]:
                        raise native().OdbError(
                            f"rank {rank}: a real step {delivery.step['step_index']} arrived after every "
                            f"sample of this rank came back (samples moved between ranks?): use "
                            f"idle_policy='zero_step'")
                    dropped += 1
            except BaseException as e:  # noqa: BLE001 - raised by wait()
                self._error = e

        self._error = None
        self._thread = threading.Thread(target=drain, name="odb-drain", daemon=True)
        self._thread.start()

    def wait(self, timeout: float, rank: int) -> None:
        """Waits for a started drain to reach the summary (no-op without one)."""
        if self._thread is None:
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise native().OdbTimeout(f"rank {rank}: the epoch did not end (trailing IDLE steps)")
        self._thread = None
        if self._error is not None:
            raise self._error
