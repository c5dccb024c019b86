"""Helpers: start W daemons and run one function per rank in its own process."""
from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import odb

CTX = mp.get_context("fork")


def start_daemons(run_dir: Path, world: int, job_id: str, config: Optional[dict] = None) -> List[odb.DaemonProcess]:
    daemons = [odb.spawn_daemon(r, world, run_dir, job_id=job_id, config=config, wait=False, log_level="warn")
               for r in range(world)]
    for d in daemons:
        d.wait_ready(30)
    return daemons


def stop_all(daemons: List[odb.DaemonProcess]) -> None:
    for d in daemons:
        d.stop(timeout=5)


def _rank_main(fn: Callable, rank: int, world: int, run_dir: str, args: Dict[str, Any], q: Any) -> None:
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
