"""A dead trainer and a dead data worker are detected within their timeouts."""
from __future__ import annotations

import time

from odbtest import Daemon, consume, finish, produce


def test_dead_trainer_mid_epoch_stops_the_daemon(tmp_path):
    d = Daemon(tmp_path, config="emit: {trainer_timeout_ms: 1000}\n")
    try:
        d.wait_ready()
        c = consume(d.trainer, expected_producers=1)
        p = produce(d.ingest, "p", 100000, seed=1, extra=["--no-end", "--max-len", "64"])
        d.wait_log("trainer started epoch 0")  # the epoch is open: a dead trainer is now fatal
        c.kill()
        c.wait()
        rc = d.proc.wait(timeout=20)
        assert rc == 1
        assert "trainer disconnected mid-epoch" in d.read_log()
        p.kill()
        p.wait()
    finally:
        d.stop()


def test_dead_producer_is_a_clear_error_for_the_trainer(tmp_path):
    d = Daemon(tmp_path, config="emit: {producer_timeout_ms: 1500}\n")
    try:
        d.wait_ready()
        # Both producers have sent everything before the trainer opens the epoch (its StartEpoch
        # restarts the producer clock), so the 1.5 s count with worker-7 already known by name.
        ok = produce(d.ingest, "healthy", 50, seed=1, extra=["--max-len", "64"])
        stuck = produce(d.ingest, "worker-7", 30, seed=2, id_offset=1000,
                        extra=["--no-end", "--max-len", "64"])  # never ends its stream
        assert finish(ok)[0] == 0
        assert finish(stuck)[0] == 0
        c = consume(d.trainer, expected_producers=2)
        start = time.time()
        rc, out, err = finish(c, timeout=60)
        assert rc != 0
        assert "PRODUCER_TIMEOUT" in err and "worker-7" in err, err
        assert time.time() - start < 20
    finally:
        d.stop()
