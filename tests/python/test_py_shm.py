"""The shared-memory data plane end to end, with real odbd processes (docs/shm.md).

* Every byte of every sample arrives intact when producers of both data planes
  (an arena, ZeroMQ frames, and `auto`, which mixes them by size) feed one epoch.
* A producer SIGKILLed with samples buffered in the daemon (their bytes in its
  arena): the daemon keeps serving, those samples are collated from the mapping
  and arrive intact, then the arena is unmapped (its slots are gone with it).
* A full arena blocks the producer until the daemon returns blocks: nothing is
  lost, the arena's pages bound the producer's shared memory.
* A sample larger than the arena is a clear error naming it and the sizes
  (data_plane shm), or goes over the socket (auto).
* Crafted descriptors (out of range, over the arena's header, another
  producer's arena, no registration at all) are rejected naming the sample;
  the daemon keeps serving.
* Stale and foreign arena segments in run_dir are found at start: the stale
  one removed, the foreign one left alone and reported.
* OdbDataLoader's workers use the arena by default (loader.py passes no
  data-plane option: odb.Producer's default, auto, does it).

Synchronisation is by what the daemon reports (metrics, rejections, steps) and
by pipes to the producer processes: no sleeps stand in for an event.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pytest
import torch

import odb
from odb._native import native

CTX = mp.get_context("fork")
ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    "metrics_endpoint": "tcp://127.0.0.1:*",
    "bad_input": "skip_and_report",
    "grouping": {"max_tokens": 4096, "window": 64},
    "alignment": {"planner": "local"},
    "collate": {"fields": [{"name": "input_ids", "rule": "pad", "pad_value": 0},
                           {"name": "pixels", "rule": "concat"}]},
}


def _sample(sample_id: int, pixel_bytes: int) -> Tuple[int, List[Tuple[str, int, List[int], np.ndarray]]]:
    """Deterministic tensors of one sample: tokens and `pixel_bytes` bytes of pixels."""
    rng = np.random.default_rng(sample_id)
    tokens = int(rng.integers(1, 200))
    ids = rng.integers(0, 1 << 40, size=tokens, dtype=np.int64)
    pixels = rng.integers(0, 256, size=pixel_bytes, dtype=np.uint8)
    dt = native().DTYPES
    return tokens, [("input_ids", dt["int64"], [tokens], ids), ("pixels", dt["uint8"], [pixel_bytes], pixels)]


def _send(producer: Any, sample_id: int, pixel_bytes: int, epoch: int = 0) -> None:
    tokens, tensors = _sample(sample_id, pixel_bytes)
    producer.send(sample_id, epoch, tokens, tensors=tensors)


def _producer_main(endpoint: str, producer_id: str, plan: List[Tuple[int, int]], options: Dict[str, Any],
                   conn: Any, end: bool = True) -> None:
    """A data worker: sends `plan` [(id, pixel bytes)], ends its stream and reports its data plane, arena
    counters and peak RssShmem (or the error) through `conn`; then answers "stats" with its arena counters
    until told "exit" (a producer to be killed is never told)."""
    try:
        p = native().Producer(endpoint, producer_id, send_timeout_ms=60000, **options)
        peak_shmem = 0
        for sample_id, size in plan:
            _send(p, sample_id, size)
            peak_shmem = max(peak_shmem, _rss_shmem_kib(os.getpid()))
        if end:
            p.end_stream(0)
        conn.send(("ok", p.data_plane, p.arena_note, p.arena_stats(), peak_shmem))
        while conn.recv() == "stats":
            conn.send(p.arena_stats())
    except EOFError:
        pass
    except Exception as e:  # noqa: BLE001 - reported to the test
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def _start_producer(endpoint: str, producer_id: str, plan: List[Tuple[int, int]], **kw: Any
                    ) -> Tuple[Any, Any]:
    options = kw.pop("options", {})
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=_producer_main, args=(endpoint, producer_id, plan, options, child), kwargs=kw)
    proc.start()
    child.close()
    return proc, parent


def _report(proc: Any, conn: Any, timeout: float = 120) -> Tuple:
    assert conn.poll(timeout), f"producer {proc.pid} reported nothing within {timeout}s"
    return conn.recv()


def _final_stats(proc: Any, conn: Any) -> Optional[Dict[str, int]]:
    """The producer's arena counters now; then it exits."""
    conn.send("stats")
    stats = _report(proc, conn)
    conn.send("exit")
    proc.join(30)
    return stats


def _units(n: int) -> int:
    return (n + 63) // 64 * 64


def _rss_shmem_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1])
    return 0


class Metrics:
    def __init__(self, daemon: odb.DaemonProcess) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"metrics endpoint tcp://([0-9.]+):(\d+)", daemon.log_path.read_text(errors="replace"))
            if m:
                self.url = f"http://{m.group(1)}:{m.group(2)}/metrics"
                return
            assert daemon.poll() is None, daemon.log_tail()
            time.sleep(0.02)  # polling the log for the port, not standing in for an event
        raise AssertionError("no metrics endpoint in the log: " + daemon.log_tail())

    def get(self) -> Dict[str, float]:
        with urllib.request.urlopen(self.url, timeout=10) as r:
            text = r.read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(odb_\w+)\{[^}]*\} (\S+)$", text, re.M)}

    def wait_for(self, what: str, pred: Callable[[Dict[str, float]], bool], timeout: float = 60) -> Dict[str, float]:
        deadline = time.monotonic() + timeout
        while True:
            m = self.get()
            if pred(m):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not reached within {timeout}s; metrics {m}")
            time.sleep(0.05)  # polling the daemon's own report


def _consume(consumer: Any, expect: Dict[int, int], epoch: int = 0, extra_check: Optional[Callable] = None
             ) -> Dict[str, Any]:
    """Receives epoch `epoch`, checking every byte of every sample in `expect` {id: pixel bytes}; returns the
    summary. Each sample must arrive exactly once."""
    seen: Dict[int, int] = {}
    while True:
        d = consumer.next()
        if not d.is_step:
            summary = d.summary
            assert summary["epoch"] == epoch
            break
        step = d.step
        if step.idle:
            continue
        ids = d.array("input_ids")
        pixels = d.array("pixels")
        offsets = d.array("pixels_offsets")
        for row, sid in enumerate(step.sample_ids):
            assert sid in expect, f"unexpected sample {sid}"
            assert sid not in seen, f"sample {sid} twice"
            tokens, tensors = _sample(sid, expect[sid])
            assert step.lengths[row] == tokens
            assert np.array_equal(ids[row, :tokens], tensors[0][3]), f"sample {sid}: input_ids differ"
            got = pixels[int(offsets[row]):int(offsets[row + 1])]
            assert np.array_equal(got, tensors[1][3]), f"sample {sid}: pixels differ"
            seen[sid] = 1
    missing = sorted(set(expect) - set(seen))
    assert not missing, f"samples never arrived: {missing[:20]} ({len(missing)})"
    return summary


@pytest.fixture
def daemon(run_dir: Path, job_id: str):
    d = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=CONFIG)
    yield d
    assert d.stop() == 0, d.log_tail(40)


def test_mixed_shm_and_zmq_producers_every_byte_intact(daemon: odb.DaemonProcess) -> None:
    metrics = Metrics(daemon)
    consumer = native().Consumer(daemon.trainer, 120000)
    consumer.start_epoch(0, 3)
    sizes = [0, 1, 1000, 16383, 16384, 65536 + 3, 300000, 1 << 20]
    plans = {
        "shm": [(1000 + i, sizes[i % len(sizes)]) for i in range(40)],
        "zmq": [(2000 + i, sizes[(i + 3) % len(sizes)]) for i in range(40)],
        "auto": [(3000 + i, sizes[(i + 5) % len(sizes)]) for i in range(40)],
    }
    procs = {name: _start_producer(daemon.ingest, f"p-{name}", plan, options={"data_plane": name})
             for name, plan in plans.items()}
    expect = {sid: size for plan in plans.values() for sid, size in plan}
    summary = _consume(consumer, expect)
    assert summary["received"] == 120 and summary["emitted"] == 120 and summary["rejected"] == 0
    reports = {name: _report(*pc) for name, pc in procs.items()}
    final = {name: _final_stats(*pc) for name, pc in procs.items()}  # after the epoch: every block returned
    assert reports["shm"][:2] == ("ok", "shm"), reports["shm"]
    assert reports["auto"][:2] == ("ok", "shm"), reports["auto"]
    assert reports["zmq"][:2] == ("ok", "zmq"), reports["zmq"]
    assert reports["zmq"][3] is None and reports["zmq"][2] == "data_plane zmq"
    # shm: every sample through the arena; auto: only those of 16 KiB of payload and more; all returned.
    assert reports["shm"][3]["allocations"] == 40
    assert reports["auto"][3]["allocations"] == sum(
        1 for sid, size in plans["auto"] if size + 8 * _sample(sid, 0)[0] >= 16384)
    assert 0 < reports["auto"][3]["allocations"] < 40
    for name in ("shm", "auto"):
        stats = final[name]
        assert stats["returns"] == stats["allocations"] and stats["outstanding_blocks"] == 0, (name, stats)
    m = metrics.get()
    assert m["odb_arena_registrations_total"] == 2 and m["odb_arena_refusals_total"] == 0
    assert m["odb_arena_held_bytes"] == 0


def test_producer_killed_with_buffered_samples_they_arrive_intact_and_its_arena_is_unmapped(
        daemon: odb.DaemonProcess) -> None:
    metrics = Metrics(daemon)
    victim_plan = [(i, 200000 + i) for i in range(12)]
    victim, conn = _start_producer(daemon.ingest, "victim", victim_plan, options={"data_plane": "shm"},
                                   end=False)
    status = _report(victim, conn)
    assert status[:2] == ("ok", "shm"), status
    # The trainer has not started the epoch: the samples wait in the buffer, their bytes in the victim's arena.
    m = metrics.wait_for("victim's samples buffered", lambda m: m["odb_buffer_samples"] == 12)
    # Blocks of whole 64-byte units per tensor (the producer places each tensor 64-byte aligned).
    assert m["odb_arena_held_bytes"] == sum(_units(size) + _units(8 * _sample(sid, 0)[0]) for sid, size in victim_plan)
    assert m["odb_producer_arenas"] == 1
    maps = Path(f"/proc/{daemon.pid}/maps")
    assert "odb-arena:victim" in maps.read_text()
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(30)
    assert victim.exitcode == -signal.SIGKILL

    # The daemon keeps serving: a surviving producer streams the epoch, the victim's samples collate from
    # the mapping the daemon kept.
    consumer = native().Consumer(daemon.trainer, 120000)
    consumer.start_epoch(0, 1)
    survivor_plan = [(100 + i, 70000) for i in range(20)]
    survivor = _start_producer(daemon.ingest, "survivor", survivor_plan)
    summary = _consume(consumer, dict(victim_plan + survivor_plan))
    assert summary["received"] == 32 and summary["rejected"] == 0
    assert _report(*survivor)[:2] == ("ok", "shm")
    _final_stats(*survivor)
    # Both producers are gone and nothing of theirs is buffered: both arenas are retired and unmapped.
    metrics.wait_for("arenas unmapped",
                     lambda m: m["odb_producer_arenas_mapped"] == 0 and m["odb_producer_arenas"] == 0)
    assert "odb-arena:" not in maps.read_text()
    assert "retired: its producer is gone" in daemon.log_path.read_text()
    # And the next epoch runs as usual.
    consumer.start_epoch(1, 1)
    p = native().Producer(daemon.ingest, "next", data_plane="shm")
    for i in range(5):
        _send(p, 500 + i, 40000, epoch=1)
    p.end_stream(1)
    assert _consume(consumer, {500 + i: 40000 for i in range(5)}, epoch=1)["received"] == 5


def test_full_arena_blocks_the_producer_until_blocks_return_nothing_lost(run_dir: Path, job_id: str) -> None:
    # Rounds wait for a window (64 samples; only 4 fit the arena) or a full buffer, never for time: the
    # daemon must see that the producer waits on its full arena to plan at all.
    config = dict(CONFIG, alignment={"planner": "local", "max_wait_ms": 600000})
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=config)
    try:
        _full_arena(daemon)
    finally:
        assert daemon.stop() == 0, daemon.log_tail(40)


def _full_arena(daemon: odb.DaemonProcess) -> None:
    metrics = Metrics(daemon)
    arena = 1 << 20
    plan = [(i, 250000) for i in range(160)]  # 40 MB through a 1 MiB arena: 4 samples fit at a time
    proc, conn = _start_producer(daemon.ingest, "small-arena", plan,
                                 options={"data_plane": "shm", "arena_bytes": arena})
    # No trainer yet, so nothing is collated and nothing returned: the producer fills its arena and waits.
    m = metrics.wait_for("the producer waits on its full arena",
                         lambda m: m["odb_arena_writers_waiting"] == 1 and m["odb_buffer_samples"] == 4)
    assert m["odb_arena_held_bytes"] <= arena
    consumer = native().Consumer(daemon.trainer, 120000)
    consumer.start_epoch(0, 1)
    summary = _consume(consumer, dict(plan))  # it resumes as the daemon returns blocks
    status = _report(proc, conn)
    assert status[0] == "ok", status
    stats, peak_shmem_kib = _final_stats(proc, conn), status[4]
    assert stats["capacity_bytes"] == arena
    assert stats["allocations"] == 160 and stats["returns"] == 160
    assert stats["waits"] > 0, stats
    assert summary["received"] == 160 and summary["rejected"] == 0
    # Its shared memory is the arena's pages at most (header and completion queue included), however much
    # went through it.
    assert peak_shmem_kib * 1024 <= arena + (1 << 20), peak_shmem_kib
    assert metrics.get()["odb_arena_held_bytes"] == 0


def test_sample_larger_than_the_arena(daemon: odb.DaemonProcess) -> None:
    consumer = native().Consumer(daemon.trainer, 120000)
    consumer.start_epoch(0, 1)
    forced = native().Producer(daemon.ingest, "forced", data_plane="shm", arena_bytes=1 << 20)
    with pytest.raises(native().OdbError) as e:
        _send(forced, 77, 2 << 20)
    msg = str(e.value)
    assert "sample 77" in msg and "2097" in msg and "1048576" in msg and "arena_bytes" in msg, msg
    del forced
    auto = native().Producer(daemon.ingest, "auto", arena_bytes=1 << 20)
    assert auto.data_plane == "shm"
    _send(auto, 78, 2 << 20)  # over the socket
    _send(auto, 79, 100000)   # through the arena
    auto.end_stream(0)
    assert auto.arena_stats()["allocations"] == 1
    assert _consume(consumer, {78: 2 << 20, 79: 100000})["received"] == 2


def _header(producer_id: str, sample_id: int, arena_id: int, offset: int, length: int,
            tensor_offset: Optional[int] = None) -> bytes:
    sys.path.insert(0, str(Path(os.environ.get("ODB_TEST_BIN", ROOT / ".build")) / "proto"))
    import odb_pb2  # generated by //proto:odb_proto_py_gen

    m = odb_pb2.ProducerMessage(version=1)
    s = m.sample
    s.producer_id, s.sample_id, s.epoch, s.tokens = producer_id, sample_id, 0, 8
    t = s.tensors.add(name="input_ids", dtype=odb_pb2.INT64, shape=[8])
    t.offset = offset if tensor_offset is None else tensor_offset
    t.length = 64
    s.arena.arena_id, s.arena.offset, s.arena.length = arena_id, offset, length
    return m.SerializeToString()


def test_crafted_descriptors_are_rejected_naming_the_sample_and_the_daemon_keeps_serving(
        daemon: odb.DaemonProcess) -> None:
    consumer = native().Consumer(daemon.trainer, 120000)
    consumer.start_epoch(0, 1)
    good = native().Producer(daemon.ingest, "good", data_plane="shm")
    evil = native().Producer(daemon.ingest, "evil", data_plane="shm")
    plain = native().Producer(daemon.ingest, "plain", data_plane="zmq")
    assert good.arena_id and evil.arena_id and good.arena_id != evil.arena_id and plain.arena_id == 0
    capacity = 256 << 20
    crafted = {
        901: _header("evil", 901, evil.arena_id, capacity * 4, 64),      # past the end
        902: _header("evil", 902, evil.arena_id, 0, 4096),                                   # the header
        903: _header("evil", 903, evil.arena_id, (1 << 64) - 64, 64),                        # wraps
        904: _header("evil", 904, evil.arena_id, (8 << 20) + 8, 64),                         # misaligned
        905: _header("evil", 905, good.arena_id, 8 << 20, 64),                               # not its arena
        906: _header("plain", 906, 4242, 8 << 20, 64),                                       # never registered
        907: _header("evil", 907, evil.arena_id, 8 << 20, 64, tensor_offset=(8 << 20) + 128),  # tensor outside
    }
    for sid, header in crafted.items():
        (plain if sid == 906 else evil).send_raw_frames([header])
    # All of them judged before the good producer's stream (another connection) can end the epoch.
    Metrics(daemon).wait_for("crafted samples rejected", lambda m: m["odb_samples_rejected_total"] == len(crafted))
    for i in range(6):
        _send(good, 10 + i, 50000)
    good.end_stream(0)
    summary = _consume(consumer, {10 + i: 50000 for i in range(6)})
    rejected = {r["sample_id"]: r for r in summary["rejections"]}
    assert set(rejected) == set(crafted), summary["rejections"]
    for sid, r in rejected.items():
        assert r["code"] == "INVALID_ARENA_BLOCK", r
        assert f"sample {sid} from producer" in r["message"], r
    message = {sid: r["message"] for sid, r in rejected.items()}
    assert "outside the data region" in message[901]
    assert "outside the data region" in message[902]
    assert "64-byte aligned" in message[904]
    assert "registered by producer 'good', not by this connection's producer 'evil'" in message[905]
    assert "arena 4242 is not registered" in message[906]
    assert "lies outside its arena block" in message[907]
    # Serving goes on: the next epoch through the same producer's arena.
    consumer.start_epoch(1, 1)
    for i in range(3):
        _send(good, 20 + i, 30000, epoch=1)
    good.end_stream(1)
    assert _consume(consumer, {20 + i: 30000 for i in range(3)}, epoch=1)["rejected"] == 0


def test_stale_and_foreign_segments_in_run_dir_are_found_at_start(run_dir: Path, job_id: str) -> None:
    # A creator that is gone (a process that ran and was reaped).
    dead = subprocess.Popen(["true"])
    dead.wait()
    uid = os.getuid()
    stale = run_dir / f"odb-shm-{uid}-{dead.pid}-00000000deadbeef"
    foreign = run_dir / f"odb-shm-{uid}-{dead.pid}-00000000feedface"
    other = run_dir / "not-an-arena"
    for path, mode in ((stale, 0o600), (foreign, 0o644), (other, 0o600)):
        path.write_bytes(b"\0" * 8192)  # never initialised: the creator died between open and publishing
        os.chmod(path, mode)
    d = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=CONFIG)
    try:
        Metrics(d)  # the log has reached the metrics endpoint line, logged after the sweep
        log = d.log_path.read_text()
        assert not stale.exists(), log
        assert f"removed stale arena segment {stale}" in log
        assert foreign.exists() and other.exists()
        assert f"arena-named file {foreign} left in place, not used: " in log and "0644" in log
        # The daemon serves, with producers' arenas as usual.
        consumer = native().Consumer(d.trainer, 120000)
        consumer.start_epoch(0, 1)
        p = native().Producer(d.ingest, "p", data_plane="shm")
        _send(p, 1, 100000)
        p.end_stream(0)
        assert _consume(consumer, {1: 100000})["received"] == 1
    finally:
        assert d.stop() == 0


class _PixelDataset:
    """Samples with a 100 KB image each: over the arena threshold, so the loader's workers use the arena."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> Dict[str, Any]:
        tokens, tensors = _sample(i, 100000)
        return {"input_ids": tensors[0][3], "pixels": tensors[1][3]}


def test_the_dataloader_drop_in_uses_the_arena_by_default(run_dir: Path, job_id: str) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=CONFIG)
    try:
        metrics = Metrics(daemon)
        loader = odb.OdbDataLoader(_PixelDataset(), rank=0, world_size=1, run_dir=str(run_dir), num_workers=2)
        seen = set()
        for step in loader:
            if step.idle:
                continue
            pixels, offsets = step.batch["pixels"].numpy(), step.batch["pixels_offsets"].numpy()
            for row, sid in enumerate(step.sample_ids):
                expected = _sample(sid, 100000)[1][1][3]
                assert np.array_equal(pixels[int(offsets[row]):int(offsets[row + 1])], expected), sid
                seen.add(sid)
        assert seen == set(range(48))
        # One arena per worker (each worker's Producer registered one); nothing refused.
        m = metrics.get()
        assert m["odb_arena_registrations_total"] == 2 and m["odb_arena_refusals_total"] == 0, m
    finally:
        assert daemon.stop() == 0, daemon.log_tail(40)


@pytest.mark.parametrize("plane", ["zmq", "shm"])
def test_the_dataloader_takes_a_data_plane_and_says_which_one_the_trainer_got(
        run_dir: Path, job_id: str, plane: str) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=CONFIG)
    try:
        metrics = Metrics(daemon)
        with pytest.raises(ValueError, match="data_plane must be one of .* not 'tcp'"):
            odb.OdbDataLoader(_PixelDataset(), rank=0, world_size=1, run_dir=str(run_dir), data_plane="tcp")
        loader = odb.OdbDataLoader(_PixelDataset(), rank=0, world_size=1, run_dir=str(run_dir), num_workers=2,
                                   data_plane=plane, pin_memory=True)
        assert loader.data_plane_in_use is None
        seen = set()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in loader:
                if step.idle:
                    continue
                pixels, offsets = step.batch["pixels"].numpy(), step.batch["pixels_offsets"].numpy()
                for row, sid in enumerate(step.sample_ids):
                    assert np.array_equal(pixels[int(offsets[row]):int(offsets[row + 1])],
                                          _sample(sid, 100000)[1][1][3]), sid
                    seen.add(sid)
        assert seen == set(range(48))
        assert loader.data_plane_in_use == plane
        m = metrics.get()
        # zmq: the workers registered no arena and the daemon placed no step in a step arena.
        assert m["odb_arena_registrations_total"] == (2 if plane == "shm" else 0), m
        assert (m["odb_step_arena_steps_total"] > 0) == (plane == "shm"), m
        pinning = [w for w in caught if "pin_memory" in str(w.message)]
        if torch.cuda.is_available():
            assert not pinning
        else:  # said once, not per step
            assert len(pinning) == 1 and "no CUDA device" in str(pinning[0].message)
    finally:
        assert daemon.stop() == 0, daemon.log_tail(40)
