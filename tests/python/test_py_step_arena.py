"""The step arena (daemon -> trainer over shared memory, docs/shm.md) with real odbd processes.

* Every byte of every sample arrives intact through the step arena; each batch tensor is a view
  into the arena mapping (zero copy) at a 64-byte aligned address.
* Blocks go back to the daemon when the step's tensors are released: an epoch of ~6x the
  arena's capacity runs through it (without returns the daemon would fail naming the full arena).
* A trainer that keeps every step: the daemon fails with an error naming the cause, never hangs.
* A trainer killed while it holds steps: the next trainer session gets a new arena, the old one is
  unmapped by the daemon (its blocks reclaimed), and every byte of the next epoch arrives.
* Frames over ZeroMQ when the daemon (shm.trainer_data_plane: zmq) or the trainer (data_plane
  "zmq") turns the arena off.

Synchronisation is by the daemon's metrics, pipes to the trainer process and the steps themselves:
no sleeps stand in for an event.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

import odb
from odb._native import native
from test_py_shm import Metrics  # the metrics scraper of the producer-arena tests

CTX = mp.get_context("fork")
TOKENS = 64
CONFIG: Dict[str, Any] = {
    "metrics_endpoint": "tcp://127.0.0.1:*",
    "bad_input": "skip_and_report",
    # 8 samples of 64 tokens per step: steps of 8 x (payload + 512 B of ids + mask).
    "grouping": {"max_tokens": 8 * TOKENS, "window": 64},
    "alignment": {"planner": "local"},
    "collate": {"fields": [{"name": "input_ids", "rule": "pad", "pad_value": 0},
                           {"name": "pixels", "rule": "concat"}]},
}


def _tensors(sample_id: int, pixel_bytes: int) -> List[Tuple[str, int, List[int], np.ndarray]]:
    rng = np.random.default_rng(sample_id)
    ids = rng.integers(0, 1 << 40, size=TOKENS, dtype=np.int64)
    pixels = rng.integers(0, 256, size=pixel_bytes, dtype=np.uint8)
    dt = native().DTYPES
    return [("input_ids", dt["int64"], [TOKENS], ids), ("pixels", dt["uint8"], [pixel_bytes], pixels)]


def _produce(endpoint: str, plan: List[Tuple[int, int]], epoch: int = 0) -> None:
    p = native().Producer(endpoint, f"producer-{epoch}-{os.getpid()}", send_timeout_ms=60000)
    for sid, size in plan:
        p.send(sid, epoch, TOKENS, tensors=_tensors(sid, size))
    p.end_stream(epoch)


def _start_producer(endpoint: str, plan: List[Tuple[int, int]], epoch: int = 0) -> Any:
    proc = CTX.Process(target=_produce, args=(endpoint, plan, epoch))
    proc.start()
    return proc


def _arena_ranges(pid: int) -> List[Tuple[int, int]]:
    """Address ranges of the step arena mappings of process `pid` (a memfd named odb-step-arena)."""
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if "odb-step-arena" in line:
            lo, hi = line.split()[0].split("-")
            out.append((int(lo, 16), int(hi, 16)))
    return out


def _check_step(d: Any, expect: Dict[int, int], seen: Dict[int, int], arena: List[Tuple[int, int]]) -> None:
    """Every byte of the step's samples, and (with `arena`) that every tensor is an aligned view into it."""
    ids, pixels, offsets = d.array("input_ids"), d.array("pixels"), d.array("pixels_offsets")
    for row, sid in enumerate(d.step.sample_ids):
        assert sid in expect and sid not in seen, f"sample {sid} unexpected or twice"
        want = _tensors(sid, expect[sid])
        assert np.array_equal(ids[row, :TOKENS], want[0][3]), f"sample {sid}: input_ids differ"
        got = pixels[int(offsets[row]):int(offsets[row + 1])]
        assert np.array_equal(got, want[1][3]), f"sample {sid}: pixels differ"
        seen[sid] = 1
    if arena:
        for name in d.tensor_names():
            address = d.frame_address(name)
            assert address % 64 == 0, f"tensor {name} at {address:#x} is not 64-byte aligned"
            assert d.array(name).ctypes.data == address  # the array is the view, not a copy
            assert any(lo <= address and address + d.frame_bytes(name) <= hi for lo, hi in arena), (
                f"tensor {name} at {address:#x} is not in the step arena mapping {arena}")


def _consume(consumer: Any, expect: Dict[int, int], epoch: int = 0, in_arena: bool = True,
             keep: List[Any] = None) -> Dict[str, Any]:
    seen: Dict[int, int] = {}
    steps = 0
    while True:
        d = consumer.next()
        if not d.is_step:
            assert d.summary["epoch"] == epoch
            break
        if d.step.idle:
            continue
        steps += 1
        _check_step(d, expect, seen, _arena_ranges(os.getpid()) if in_arena else [])
        if keep is not None:
            keep.append(d)
    missing = sorted(set(expect) - set(seen))
    assert not missing, f"samples never arrived: {missing[:20]} ({len(missing)})"
    summary = dict(d.summary)
    summary["real_steps"] = steps
    return summary


def _spawn(run_dir: Path, job_id: str, whole_epoch_rounds: bool = False, **shm: Any) -> odb.DaemonProcess:
    config = dict(CONFIG)
    if shm:
        config["shm"] = shm
    if whole_epoch_rounds:
        # A round waits for the producer's end of stream (fewer samples than the window), however slow the
        # producer is on a loaded machine: the step count is then a function of the samples alone.
        config["alignment"] = dict(config["alignment"], max_wait_ms=600000, start_wait_ms=600000)
    return odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=config)


def test_every_byte_through_the_step_arena_aligned_views(run_dir: Path, job_id: str) -> None:
    daemon = _spawn(run_dir, job_id)
    try:
        metrics = Metrics(daemon)
        consumer = native().Consumer(daemon.trainer, 120000, data_plane="shm")
        consumer.start_epoch(0, 1)
        sizes = [0, 1, 63, 64, 1000, 65536 + 3, 300000, 1 << 20]
        plan = [(i, sizes[i % len(sizes)]) for i in range(96)]
        proc = _start_producer(daemon.ingest, plan)
        summary = _consume(consumer, dict(plan))
        proc.join(60)
        assert summary["received"] == 96 and summary["emitted"] == 96 and summary["rejected"] == 0
        assert consumer.data_plane == "shm", consumer.arena_note
        stats = consumer.step_arena_stats()
        # Every real step came through the arena, and every block went back once its step was dropped.
        assert stats["held_steps"] == 0 and stats["returned_steps"] == summary["real_steps"], stats
        m = metrics.wait_for("every block returned", lambda m: m["odb_step_arena_held_steps"] == 0)
        assert m["odb_step_arena_steps_total"] == summary["real_steps"]
        assert m["odb_step_arena_frame_fallbacks_total"] == 0
    finally:
        assert daemon.stop() == 0, daemon.log_tail(40)


def test_blocks_return_when_released_an_epoch_many_times_the_arena(run_dir: Path, job_id: str) -> None:
    arena = 4 << 20
    # Without returns the arena is full after a few steps and the daemon fails after 10 s.
    daemon = _spawn(run_dir, job_id, step_arena_bytes=arena, step_arena_wait_ms=10000)
    try:
        metrics = Metrics(daemon)
        consumer = native().Consumer(daemon.trainer, 120000)
        consumer.start_epoch(0, 1)
        plan = [(i, 100000 + i) for i in range(256)]  # 25.7 MB of pixels, ~6x the arena; steps of ~0.8 MB
        proc = _start_producer(daemon.ingest, plan)
        summary = _consume(consumer, dict(plan))
        proc.join(60)
        assert summary["received"] == 256 and summary["rejected"] == 0
        assert sum(size for _, size in plan) > 6 * arena
        stats = consumer.step_arena_stats()
        assert stats["capacity_bytes"] == arena
        assert stats["returned_steps"] == summary["real_steps"] == 32 and stats["held_steps"] == 0, stats
        m = metrics.wait_for("every block returned", lambda m: m["odb_step_arena_held_steps"] == 0)
        assert m["odb_step_arena_steps_total"] == 32 and m["odb_step_arena_frame_fallbacks_total"] == 0
    finally:
        assert daemon.stop() == 0, daemon.log_tail(40)


def test_a_trainer_that_keeps_every_step_gets_an_error_naming_the_cause(run_dir: Path, job_id: str) -> None:
    daemon = _spawn(run_dir, job_id, step_arena_bytes=2 << 20, step_arena_wait_ms=1500)
    try:
        consumer = native().Consumer(daemon.trainer, 60000)
        consumer.start_epoch(0, 1)
        plan = [(i, 100000) for i in range(128)]  # steps of ~0.8 MB: two fit the arena
        proc = _start_producer(daemon.ingest, plan)
        kept: List[Any] = []
        with pytest.raises(native().OdbError) as e:
            while True:
                d = consumer.next()
                assert d.is_step, "the epoch ended although the trainer kept every step"
                kept.append(d)
        msg = str(e.value)
        assert "step arena" in msg and "trainer holds" in msg and "step_arena_bytes" in msg, msg
        assert consumer.step_arena_stats()["held_steps"] == len(kept) >= 2
        proc.kill()
        proc.join(30)
    finally:
        daemon.stop()  # it failed on purpose
    assert "has had no room for a step" in daemon.log_path.read_text()


def _doomed_trainer(endpoint: str, conn: Any) -> None:
    """Receives epoch 0 and keeps every step (their blocks held), reports, then waits to be killed."""
    consumer = native().Consumer(endpoint, 120000, data_plane="shm")
    consumer.start_epoch(0, 1)
    kept = []
    while True:
        d = consumer.next()
        if not d.is_step:
            break
        kept.append(d)
    conn.send((consumer.step_arena_stats(), len(kept)))
    conn.recv()  # never answered: killed here


def test_trainer_killed_holding_steps_next_session_gets_a_fresh_arena(run_dir: Path, job_id: str) -> None:
    daemon = _spawn(run_dir, job_id, whole_epoch_rounds=True, step_arena_bytes=16 << 20)
    try:
        metrics = Metrics(daemon)
        parent, child = CTX.Pipe()
        trainer = CTX.Process(target=_doomed_trainer, args=(daemon.trainer, child))
        trainer.start()
        plan0 = [(i, 200000) for i in range(24)]
        producer = _start_producer(daemon.ingest, plan0)
        assert parent.poll(120), "the first trainer reported nothing"
        stats0, kept = parent.recv()
        producer.join(60)
        assert kept == 3 and stats0["held_steps"] == 3, (stats0, kept)
        m = metrics.get()
        assert m["odb_step_arena_held_steps"] == 3 and m["odb_step_arena_steps_total"] == 3
        assert len(_arena_ranges(daemon.pid)) == 1
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.join(30)
        metrics.wait_for("the session's disconnect", lambda m: m["odb_trainer_disconnects_total"] == 1)

        consumer = native().Consumer(daemon.trainer, 120000, data_plane="shm")
        consumer.start_epoch(1, 1)
        plan1 = [(100 + i, 150000 + i) for i in range(40)]
        producer = _start_producer(daemon.ingest, plan1, epoch=1)
        summary = _consume(consumer, dict(plan1), epoch=1)
        producer.join(60)
        assert summary["received"] == 40 and summary["rejected"] == 0
        stats1 = consumer.step_arena_stats()
        assert stats1["generation"] != stats0["generation"]
        assert stats1["returned_steps"] == summary["real_steps"] == 5 and stats1["held_steps"] == 0
        # The dead trainer's arena is gone from the daemon (its 3 blocks with it); the new one holds nothing.
        assert len(_arena_ranges(daemon.pid)) == 1
        m = metrics.wait_for("every block returned", lambda m: m["odb_step_arena_held_steps"] == 0)
        assert m["odb_step_arena_steps_total"] == 8
    finally:
        assert daemon.stop() == 0, daemon.log_tail(40)


@pytest.mark.parametrize("side", ["daemon", "trainer"])
def test_frames_when_the_arena_is_turned_off(run_dir: Path, job_id: str, side: str) -> None:
    daemon = _spawn(run_dir, job_id, trainer_data_plane="zmq") if side == "daemon" else _spawn(run_dir, job_id)
    try:
        metrics = Metrics(daemon)
        mapped_before = _arena_ranges(os.getpid())  # earlier tests' deliveries may still be alive
        consumer = native().Consumer(daemon.trainer, 120000, data_plane="zmq" if side == "trainer" else "auto")
        consumer.start_epoch(0, 1)
        plan = [(i, 70000 + i) for i in range(32)]
        producer = _start_producer(daemon.ingest, plan)
        summary = _consume(consumer, dict(plan), in_arena=False)
        producer.join(60)
        assert summary["received"] == 32 and summary["rejected"] == 0
        assert consumer.data_plane == "zmq" and consumer.step_arena_stats() is None
        # No arena mapped by this run; an earlier test's mapping may be released meanwhile (its last step freed).
        assert set(_arena_ranges(os.getpid())) <= set(mapped_before) and _arena_ranges(daemon.pid) == []
        assert metrics.get()["odb_step_arena_steps_total"] == 0
        if side == "trainer":
            assert consumer.arena_note == "the trainer's data_plane is zmq"
            assert "did not map the step arena: the trainer's data_plane is zmq" in daemon.log_path.read_text()
    finally:
        assert daemon.stop() == 0, daemon.log_tail(40)
