"""The trainer socket tried from outside the job (session 12's connection tracking): floods of
unreadable and multi-frame messages, a third peer that keeps talking, connection churn. A real
odbd: every bad message is counted, the log stays readable (a flood is not one line per message),
memory and descriptors stay bounded, and the session's trainer still receives its whole epoch."""
from __future__ import annotations

import os
import time

import zmq

from odbtest import METRICS_CONFIG, Daemon, finish, metric, produce, raw_trainer_msg, raw_trainer_next, wait_metric


def _socket(ctx, d: Daemon) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 60000)
    s.setsockopt(zmq.SNDHWM, 0)  # the flood is queued here, never dropped on this side
    s.connect(d.trainer)
    return s


def _receive_epoch(t: zmq.Socket) -> list[int]:
    ids = []
    while True:
        m = raw_trainer_next(t)[1]
        if m.HasField("epoch_end"):
            return ids
        if m.HasField("step"):
            ids.extend(m.step.sample_ids)
            t.send(raw_trainer_msg(credit=1))


def _trainer_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "trainer peer" in line or "refusal not delivered" in line]


def test_a_flood_on_the_trainer_socket_is_counted_and_logged_in_bounded_lines(tmp_path):
    """10,000 unreadable and 3,000 multi-frame messages from the session's own peer, and 3,000
    credits from a third peer while a second one waits: each is counted (the metrics), the log
    has a bounded number of lines about them (it had one or two per message: 4.6 MB for 50,000),
    and the session's trainer gets its epoch whole."""
    ctx = zmq.Context()
    d = Daemon(tmp_path, config=METRICS_CONFIG)
    try:
        d.wait_ready()
        t1 = _socket(ctx, d)
        t1.send(raw_trainer_msg(start=0))
        d.wait_log("trainer started epoch 0")
        for _ in range(10000):
            t1.send(b"\xff\xfe not a protobuf")
        for _ in range(3000):
            t1.send_multipart([b"one", b"two"])
        t2 = _socket(ctx, d)  # waits as the contender (the session may be closing)
        t2.send(raw_trainer_msg(credit=1))
        t3 = _socket(ctx, d)  # a third peer: refused at every message; it never reads
        for _ in range(3000):
            t3.send(raw_trainer_msg(credit=1))
        wait_metric(d, "odb_bad_trainer_messages_total", 13000)
        refused = wait_metric(d, "odb_refused_trainers_total", 3000)
        assert refused <= 3001  # t3's messages, and t2 once its grace ends
        assert metric(d, "odb_bad_trainer_messages_total") == 13000
        lines = _trainer_lines(d.read_log())
        # 20 lines a minute per kind at most, plus the notes of how many were not logged.
        assert 3 <= len(lines) <= 200, f"{len(lines)} lines about the flood:\n" + "\n".join(lines[:10])
        assert any("unreadable message" in line for line in lines)
        assert any("one trainer per daemon" in line for line in lines)
        # The session is unharmed: its trainer receives every sample of the epoch.
        assert finish(produce(d.ingest, "p", 300, seed=3))[0] == 0
        assert sorted(_receive_epoch(t1)) == list(range(300))
        assert d.proc.poll() is None
    finally:
        ctx.destroy(linger=0)
        d.stop()


def test_connection_churn_between_epochs_keeps_descriptors_memory_and_log_bounded(tmp_path):
    """3,000 connections that each send a credit and close, between epochs (each may become the
    session and be replaced): the daemon's descriptors return to their idle count, its log does
    not grow by lines per connection, and a trainer that connects afterwards gets its epoch."""
    d = Daemon(tmp_path, config=METRICS_CONFIG)
    try:
        d.wait_ready()
        pid = d.proc.pid

        def descriptors() -> int:
            return len(os.listdir(f"/proc/{pid}/fd"))

        idle = descriptors()
        for _ in range(6):  # a context per 500 sockets: pyzmq closes sockets asynchronously
            ctx = zmq.Context()
            for _ in range(500):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 100)
                s.connect(d.trainer)
                s.send(raw_trainer_msg(credit=1))
                s.close()
            ctx.term()
        # Every churned connection's close is seen: the descriptors come back (polled with a deadline, not slept on).
        deadline = time.time() + 60
        while descriptors() > idle + 2 and time.time() < deadline:
            time.sleep(0.05)
        assert descriptors() <= idle + 2
        lines = [line for line in d.read_log().splitlines() if "trainer" in line]
        assert len(lines) <= 300, f"{len(lines)} trainer lines for 3,000 connections"
        ctx = zmq.Context()
        try:
            t = _socket(ctx, d)
            t.send(raw_trainer_msg(start=0))
            assert finish(produce(d.ingest, "p", 200, seed=4))[0] == 0
            assert sorted(_receive_epoch(t)) == list(range(200))
        finally:
            ctx.destroy(linger=0)
        assert d.proc.poll() is None
    finally:
        d.stop()
