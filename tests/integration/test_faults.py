"""A dead trainer and a dead data worker are detected within their timeouts; a stopped peer
daemon gets true error messages on both sides."""
from __future__ import annotations

import re
import signal
import time
import uuid

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


def test_a_stopped_peer_is_named_and_says_it_was_stopped_when_resumed(tmp_path):
    """One of two daemons is stopped (SIGSTOP) mid-epoch past alignment.collective_timeout_ms, then
    continued. The errors are true, not "network": rank 0 names rank 1 as not answering within
    the timeout; rank 1, once resumed, says its own process did not run and its peer timed out
    waiting for it. Both trainers get the same text."""
    job = f"job-{uuid.uuid4().hex[:8]}"
    # The local planner: a stopped peer is met in the collective (no payload exchange to time out first).
    config = "alignment: {collective_timeout_ms: 1500, planner: local}\ngrouping: {window: 32}\n"
    daemons = [Daemon(tmp_path, rank=r, world=2, config=config, job_id=job) for r in range(2)]
    consumers, producers = [], []
    try:
        for d in daemons:
            d.wait_ready()
        consumers = [consume(d.trainer, expected_producers=1) for d in daemons]
        producers = [produce(d.ingest, f"r{d.rank}", 10**6, seed=d.rank, id_offset=d.rank * 10**7,
                             extra=["--no-end", "--max-len", "256"]) for d in daemons]
        for d in daemons:  # the epoch is open on both: rounds (collectives) run at a steady pace
            d.wait_log("trainer started epoch 0")
        stopped_at = time.monotonic()
        daemons[1].proc.send_signal(signal.SIGSTOP)
        try:
            daemons[0].wait_log("[error]", timeout=30)  # the timeout plus the report window
        finally:
            stopped_for = time.monotonic() - stopped_at
            daemons[1].proc.send_signal(signal.SIGCONT)
        daemons[1].wait_log("[error]", timeout=30)
        trainer_errors = []
        for c in consumers:
            rc, _, err = finish(c, timeout=60)
            assert rc != 0, err
            trainer_errors.append(err)
        first_error = [next(l for l in d.read_log().splitlines() if "[error]" in l) for d in daemons]
    finally:
        for p in producers + consumers:
            if p.poll() is None:
                p.kill()
            p.wait()
        for d in daemons:
            d.stop()
    waited, resumed = first_error
    assert "timed out waiting for rank 1: it did not answer within collective_timeout_ms = 1500" in waited, waited
    assert "alive but unresponsive" in waited, waited
    assert "(stopped or suspended?" in resumed, resumed
    assert "peers timed out waiting for rank 1 (rank 0 reported no answer within collective_timeout_ms = 1500)" \
        in resumed, resumed
    m = re.search(r"this process did not run for ([\d.]+) s", resumed)
    assert m, resumed
    # It was stopped at least the timeout (rank 0 gave up first), and no longer than the test held it.
    assert 1.5 <= float(m.group(1)) <= stopped_for + 2.0, (m.group(1), stopped_for)
    for line in first_error:
        assert "network" not in line, line
    assert "timed out waiting for rank 1" in trainer_errors[0], trainer_errors[0]
    assert "this process did not run for" in trainer_errors[1], trainer_errors[1]


def test_every_rank_reports_the_first_cause_of_the_jobs_failure(tmp_path):
    """Rank 0 fails the job (a producer of its went silent: PRODUCER_TIMEOUT). Rank 1 used to say
    only "lost peer rank 0 (... left no failure report)"; now both trainers read rank 0's cause."""
    job = f"job-{uuid.uuid4().hex[:8]}"
    config = "emit: {producer_timeout_ms: 1500}\ngrouping: {window: 32}\n"
    daemons = [Daemon(tmp_path, rank=r, world=2, config=config, job_id=job) for r in range(2)]
    try:
        for d in daemons:
            d.wait_ready()
        # Everything is sent before the trainers open the epoch (their StartEpoch restarts the
        # producer clock): worker-7 on rank 0 never ends its stream.
        ok = produce(daemons[1].ingest, "healthy", 50, seed=1, id_offset=5000, extra=["--max-len", "64"])
        stuck = produce(daemons[0].ingest, "worker-7", 30, seed=2, extra=["--no-end", "--max-len", "64"])
        assert finish(ok)[0] == 0
        assert finish(stuck)[0] == 0
        consumers = [consume(d.trainer, expected_producers=1) for d in daemons]
        errors = []
        for c in consumers:
            rc, _, err = finish(c, timeout=90)
            assert rc != 0, err
            errors.append(err)
    finally:
        for d in daemons:
            d.stop()
    assert "PRODUCER_TIMEOUT" in errors[0] and "worker-7" in errors[0], errors[0]
    assert "rank 0 failed the job: PRODUCER_TIMEOUT" in errors[1] and "worker-7" in errors[1], errors[1]
    assert "left no failure report" not in errors[1], errors[1]
