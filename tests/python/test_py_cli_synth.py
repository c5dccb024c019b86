"""`odbctl produce` / `odbctl consume`: the pip-only stand-ins for odb_synth in README's hand-run example.
The consumer's check is real: a sample whose bytes differ from what `produce` would send fails it (exit 1),
naming the sample."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import odb
from odb._native import native
from odb.cli import _token

ROOT = Path(__file__).resolve().parents[2]


def _odbctl(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "odb.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT / "client/python")


def _summary(proc: subprocess.Popen) -> tuple:
    out, err = proc.communicate(timeout=120)
    (line,) = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return proc.returncode, line, err


def test_produce_then_consume_verifies_every_sample(run_dir, job_id) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config={"grouping": {"max_tokens": 256}})
    try:
        consumer = _odbctl("consume", "--endpoint", daemon.trainer, "--expected-producers", "1", "--epochs", "2")
        producer = _odbctl("produce", "--endpoint", daemon.ingest, "--producer-id", "p0", "--count", "120",
                           "--max-len", "60", "--epochs", "2")
        out, err = consumer.communicate(timeout=120)
        assert producer.wait(60) == 0 and consumer.returncode == 0, err
    finally:
        daemon.stop()
    epochs = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert [e["epoch"] for e in epochs] == [0, 1]
    for e in epochs:
        assert e["verified"] and e["samples"] == e["emitted"] == e["received"] == 120 and e["steps"] >= 2, e


def test_consume_fails_on_a_wrong_byte_naming_the_sample(run_dir, job_id) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config={"grouping": {"max_tokens": 256}})
    try:
        consumer = _odbctl("consume", "--endpoint", daemon.trainer, "--expected-producers", "1")
        p = odb.Producer(daemon.ingest, "p0", 0)
        p.start_epoch(0)
        int64 = native().DTYPES["int64"]
        for sid in range(20):
            n = 5 + sid
            tokens = [_token(sid, j) for j in range(n)]
            if sid == 13:
                tokens[n - 1] += 1  # one token of one sample off by one
            p.send(sid, 0, n, 0, 0, [("input_ids", int64, (n,), struct.pack(f"<{n}q", *tokens))])
        p.end_stream(0)
        rc, summary, err = _summary(consumer)
    finally:
        daemon.stop()
    assert rc == 1, (summary, err)
    assert not summary["verified"] and summary["samples"] == 20, summary
    assert len(summary["problems"]) == 1 and "sample 13 " in summary["problems"][0], summary
