"""Data stalls (issue 23 item 7): the trainer's wait in next(loader) per step is measured, shown in the
progress line, written to the step records (summary_dir) and reported to the daemon on the step credits,
which exports it (odb_trainer_data_wait_microseconds_total, read here through the Prometheus parser)."""
from __future__ import annotations

import io
import json
import re
import time
import urllib.request

import odb
import tiny_lm
from odbtest import parse_metrics

WAIT = "odb_trainer_data_wait_microseconds_total"

N, PREPROCESS_S = 30, 0.02


class SlowCorpus(tiny_lm.SyntheticCorpus):
    """Preprocessing that takes PREPROCESS_S per sample: a trainer that does nothing waits on it."""

    def __getitem__(self, i):
        time.sleep(PREPROCESS_S)  # the stall being measured, not a synchronisation
        return super().__getitem__(i)


def _metrics_url(daemon: odb.DaemonProcess) -> str:
    deadline = time.monotonic() + 30
    while True:
        m = re.search(r"metrics endpoint tcp://([0-9.]+:\d+)", daemon.log_path.read_text(errors="replace"))
        if m:
            return f"http://{m.group(1)}/metrics"
        assert daemon.poll() is None and time.monotonic() < deadline, daemon.log_tail()
        time.sleep(0.02)  # polling the log for the port, not standing in for an event


def _wait_metric(url: str, at_least: float, rank: int = 0) -> float:
    """The daemon's data-wait counter once it reaches `at_least` (the last credit is in flight when the
    loader returns), through the Prometheus text parser."""
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(url, timeout=10) as r:
            value = parse_metrics(r.read().decode())[(WAIT, (("rank", str(rank)),))]
        if value >= at_least or time.monotonic() > deadline:
            return value
        time.sleep(0.05)  # polling the daemon's own report


def test_the_trainers_wait_for_data_is_measured_shown_and_recorded(run_dir, job_id, tmp_path) -> None:
    config = dict(tiny_lm.daemon_config(256), metrics_endpoint="tcp://127.0.0.1:*")
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=config)
    try:
        url = _metrics_url(daemon)
        corpus = SlowCorpus(tiny_lm.long_tail_lengths(N, seed=4, min_len=4, max_len=100, median=20))
        loader = odb.OdbDataLoader(corpus, rank=0, world_size=1, run_dir=str(run_dir), progress=True,
                                   summary_dir=str(tmp_path), dummy_sample=tiny_lm.SyntheticCorpus([4])[0])
        loader.progress_stream = io.StringIO()
        steps = sum(1 for _ in loader)  # a trainer with no work: all of the epoch is waiting on data
        # The daemon got every step's wait on the credits (whole microseconds per step).
        reported = _wait_metric(url, loader.data_wait_s * 1e6 - steps)
    finally:
        daemon.stop()
    assert abs(reported - loader.data_wait_s * 1e6) <= steps + 1, (reported, loader.data_wait_s, steps)
    # Every sample's preprocessing ran while the trainer waited (one worker thread): a lower bound.
    assert loader.data_wait_s >= N * PREPROCESS_S, loader.data_wait_s
    records = [json.loads(line) for line in (tmp_path / "rank0-epoch0.jsonl").read_text().splitlines()]
    assert len(records) == steps and all(r["wait_ms"] >= 0 for r in records)
    assert abs(sum(r["wait_ms"] for r in records) / 1000.0 - loader.data_wait_s) < 1e-3 * steps
    last = loader.progress_stream.getvalue().splitlines()[-1]
    assert "data wait " in last and f"{loader.data_wait_s:.1f}s" in last, last


def test_the_epoch_report_names_the_rank_that_waited_on_data(tmp_path) -> None:
    from odb.epoch_report import data_wait_by_rank, load_records

    for rank, waits in ((0, [5.0, 5.0]), (1, [400.0, 900.0])):
        with open(tmp_path / f"rank{rank}-epoch0.jsonl", "w") as f:
            for step, w in enumerate(waits):
                f.write(json.dumps({"epoch": 0, "rank": rank, "step": step, "idle": False, "real": 10, "padded": 12,
                                    "lengths": [10], "wait_ms": w}) + "\n")
    assert data_wait_by_rank(load_records(tmp_path)[0]) == {0: 0.01, 1: 1.3}
    (png,) = odb.report(tmp_path)
    assert png.stat().st_size > 1000


def test_odb_top_names_the_rank_whose_trainer_waits_on_data(run_dir, job_id) -> None:
    """Two real daemons (W = 2); each rank's trainer reports a known wait per step on its credits (rank 1
    starved: 40 ms a step, rank 0: 1 ms). Each daemon exports exactly its trainer's sum, and odb.top shows
    both and names rank 1."""
    import struct
    import subprocess
    import sys
    import threading

    from odb._native import native

    per_step_us = {0: 1000, 1: 40000}
    config = {"grouping": {"max_tokens": 64}, "metrics_endpoint": "tcp://127.0.0.1:*"}
    daemons = [odb.spawn_daemon(r, 2, run_dir, job_id=job_id, config=config, wait=False) for r in range(2)]
    steps = {0: 0, 1: 0}
    errors = []

    def produce(rank: int) -> None:
        try:
            p = odb.Producer(daemons[rank].ingest, f"p{rank}", rank)
            p.start_epoch(0)
            int64 = native().DTYPES["int64"]
            for k in range(30 + 20 * rank):
                n = 1 + (k * 7) % 13
                p.send(rank * 1000 + k, 0, n, 0, 0, [("input_ids", int64, (n,), struct.pack(f"<{n}q", *range(n)))])
            p.end_stream(0)
        except Exception as e:  # reported below
            errors.append(repr(e))

    def train(rank: int) -> None:
        try:
            c = odb.Consumer(daemons[rank].trainer, 60000)
            c.start_epoch(0, 1)
            while c.next().is_step:
                steps[rank] += 1
                c.report_data_wait(per_step_us[rank] / 1e6)  # sent on the next credit
        except Exception as e:  # reported below
            errors.append(repr(e))

    try:
        for d in daemons:
            d.wait_ready(60)  # the two rendezvous: started together, then waited for
        urls = [_metrics_url(d) for d in daemons]
        threads = [threading.Thread(target=f, args=(r,)) for r in range(2) for f in (produce, train)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [] and steps[0] == steps[1] > 0, (errors, steps)
        reported = {r: _wait_metric(urls[r], steps[r] * per_step_us[r], r) for r in range(2)}
        assert reported == {r: steps[r] * per_step_us[r] for r in range(2)}, (reported, steps)
        top = subprocess.run([sys.executable, "-m", "odb.top", "--once", *urls], capture_output=True, text=True,
                             timeout=60, cwd=str(odb.__file__).rsplit("/odb/", 1)[0])
    finally:
        for d in daemons:
            d.stop()
    assert top.returncode == 0, top.stdout + top.stderr
    lines = top.stdout.splitlines()
    header = lines[0].replace("rt p50", "rt_p50").replace("rt p99", "rt_p99").replace("wait s", "wait_s").split()
    rows = {int(line.split()[0]): line.split() for line in lines[1:] if line[:4].strip().isdigit()}
    for r in range(2):
        assert float(rows[r][header.index("wait_s")]) == round(steps[r] * per_step_us[r] / 1e6, 3), top.stdout
    assert f"data wait: rank 1's trainer waits most on data: {steps[1] * 0.04:.3f} s" in top.stdout, top.stdout
