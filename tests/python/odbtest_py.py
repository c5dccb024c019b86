"""Helpers: start W daemons and run one function per rank in its own process."""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import odb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from odbtest import StepRecord, check_step_invariants  # noqa: E402,F401 - one helper for every multi-rank test

CTX = mp.get_context("fork")


def step_record(step: "odb.Step") -> StepRecord:
    """The header fields of one step the loader yielded (a dummy IDLE step included)."""
    return StepRecord(index=step.step_index, idle=step.idle, weight=step.loss_weight, real_tokens=step.real_tokens,
                      global_real_tokens=step.global_real_tokens, lengths=list(step.lengths), epoch=step.epoch,
                      window=step.window, window_steps=step.window_steps, window_loss_tokens=step.window_loss_tokens,
                      closes_window=step.closes_window, loss_tokens=step.loss_tokens)


def with_dropped_idle(records: List[StepRecord], loader: "odb.OdbDataLoader") -> List[StepRecord]:
    """records plus the trailing IDLE steps that the "join" policy drained without yielding them
    (loader.dropped_trailing_idle, known after wait_epoch_end; the loader raises if a drained step
    was not IDLE). They follow the last yielded step, so their indices continue from it."""
    epoch = records[-1].epoch if records else loader.epoch
    n, first = loader.dropped_trailing_idle, records[-1].index + 1 if records else 0
    return records + [StepRecord(index=first + i, idle=True, weight=0.0, real_tokens=0, global_real_tokens=None,
                                 lengths=[], epoch=epoch) for i in range(n)]


def start_daemons(run_dir: Path, world: int, job_id: str, config: Optional[dict] = None) -> List[odb.DaemonProcess]:
    daemons = [odb.spawn_daemon(r, world, run_dir, job_id=job_id, config=config, wait=False, log_level="warn")
               for r in range(world)]
    for d in daemons:
        d.wait_ready(30)
    return daemons


def stop_all(daemons: List[odb.DaemonProcess]) -> None:
    for d in daemons:
        d.stop(timeout=5)


def _forget_parent_forkserver() -> None:
    """A forked rank inherits the parent's multiprocessing forkserver state
    (when an earlier test in this pytest process started one), but that server
    is not its child: DataLoader workers would fail with ChildProcessError.
    The rank starts its own instead."""
    import multiprocessing.forkserver as forkserver

    server = forkserver._forkserver  # noqa: SLF001 - test helper, stdlib state after fork
    server._forkserver_pid = None
    server._forkserver_address = None
    server._forkserver_alive_fd = None


def _rank_main(fn: Callable, rank: int, world: int, run_dir: str, args: Dict[str, Any], q: Any) -> None:
    # A process group of its own: a rank that is SIGKILLed as a preempted job (kill_rank) takes
    # its forkserver, resource tracker and DataLoader workers with it. Killing the rank alone
    # left them running (each ~120 MB with torch imported): 100 kill points filled the memory.
    os.setpgrp()
    _forget_parent_forkserver()
    global _REPORTS, _RANK
    _REPORTS, _RANK = q, rank
    hang_after = args.pop("_dump_stacks_after", None)
    if hang_after:  # a rank still running then is hung: its threads' stacks go to the test's output
        import faulthandler

        faulthandler.dump_traceback_later(hang_after, exit=False)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), ODB_RUN_DIR=run_dir)
        if world > 1:
            dist.init_process_group("gloo", init_method=f"file://{run_dir}/pg-init", rank=rank, world_size=world)
        q.put((rank, "ok", fn(rank, world, run_dir, **args)))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        q.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


_REPORTS: Any = None  # the test's queue, in a rank started by _rank_main
_RANK = -1


def report(what: str) -> None:
    """Tells the test that this rank reached a point (run_until_preempted waits for them)."""
    if _REPORTS is not None:
        _REPORTS.put((_RANK, what, None))


def kill_rank() -> None:
    """This rank is preempted here: nothing it does after this point is kept. Under
    run_until_preempted it reports and waits; the test SIGKILLs every rank's process group
    (trainer, DataLoader workers, forkserver) and the daemons together once every rank has
    saved its checkpoint and one has reached its kill point. A rank that killed itself alone
    would break whatever collective a peer was still in with it (gloo aborts the peer, raises,
    or leaves it waiting), and that race is not what the kill-point tests are about. Elsewhere
    it SIGKILLs its own process group at once."""
    import signal
    import threading

    if _REPORTS is None:
        os.killpg(0, signal.SIGKILL)
    report("preempted")
    threading.Event().wait()  # until the test's SIGKILL


def run_until_preempted(fn: Callable, world: int, run_dir: Path, timeout: float, **args: Any) -> None:
    """Runs fn in `world` ranks (as run_ranks) that each call report("checkpointed") once their
    checkpoint is written and kill_rank() at their kill point; SIGKILLs every rank's process
    group once all have checkpointed and one is preempted. A rank that fails, exits or is still
    short of that after `timeout` s fails the test (its threads' stacks are in the captured
    stderr: faulthandler, 15 s before the timeout)."""
    import queue
    import signal
    import time

    q = CTX.Queue()
    args = dict(args, _dump_stacks_after=max(5.0, timeout - 15))
    procs = [CTX.Process(target=_rank_main, args=(fn, r, world, str(run_dir), args, q)) for r in range(world)]
    for p in procs:
        p.start()
    checkpointed: set = set()
    preempted: set = set()
    deadline = time.monotonic() + timeout
    try:
        while not (len(checkpointed) == world and preempted):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"hang: after {timeout:.0f}s ranks {sorted(checkpointed)} checkpointed and "
                                     f"{sorted(preempted)} reached their kill point, of {world} (stacks in stderr)")
            try:
                rank, what, value = q.get(timeout=min(left, 1.0))
            except queue.Empty:  # between events: a rank that died without a word is an error
                for rank, p in enumerate(procs):
                    if not p.is_alive():
                        raise AssertionError(f"rank {rank} exited with {p.exitcode} before its kill point")
                continue
            if what == "checkpointed":
                checkpointed.add(rank)
            elif what == "preempted":
                preempted.add(rank)
            else:
                raise AssertionError(f"rank {rank} {what} instead of reaching its kill point: {value}")
    finally:
        for p in procs:  # the preemption: each rank with everything it started
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.join(30)


def run_ranks(fn: Callable, world: int, run_dir: Path, timeout: float = 60.0, **args: Any) -> List[Any]:
    """Runs fn(rank, world, run_dir, **args) in `world` processes (DDP-ready,
    gloo); returns the per-rank results, raising on error or on a hang."""
    q = CTX.Queue()
    procs = [CTX.Process(target=_rank_main, args=(fn, r, world, str(run_dir), args, q)) for r in range(world)]
    for p in procs:
        p.start()
    results: Dict[int, Any] = {}
    errors: List[str] = []
    import queue
    import time

    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"ranks did not finish within {timeout}s (hang); done: {sorted(results)}")
            try:
                rank, status, value = q.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if status == "ok":
                results[rank] = value
            else:
                errors.append(f"rank {rank}: {value}")
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]


def run_train_demo(args: List[str], timeout: float) -> Dict[str, Any]:
    """examples/train_demo.py --json --quiet `args` in a session of its own (one thread per process); its
    JSON summary. A hang (past `timeout`: a guard, not a timing check) kills the whole session and fails."""
    import json
    import signal
    import subprocess

    import pytest

    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, str(root / "examples/train_demo.py"), "--json", "--quiet", *args]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the demo hung")
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out)
