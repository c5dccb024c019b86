"""The producers' side of the daemon tried as a hostile user would (issue 18): epochs
admitted relative to what the trainer asked for, credit that idle producers cannot pin,
stalls that name their cause, oversized samples and unusable configs. Each test is one
class of fault; real odbd processes, real sockets."""
from __future__ import annotations

import struct
import subprocess
import time

import zmq

from odbtest import SYNTH, Daemon, consume, epochs, finish, produce
from rawproducer import RawProducer

import odb_pb2


def raw_sample(pid: str, sid: int, tokens: int, epoch: int = 0, blob: bytes | None = None):
    m = odb_pb2.ProducerMessage(version=1)
    s = m.sample
    s.producer_id, s.sample_id, s.epoch, s.tokens = pid, sid, epoch, tokens
    t = s.tensors.add(name="input_ids", dtype=odb_pb2.INT64, frame=1)
    t.shape.append(tokens)
    # The token values odb_synth consume verifies (TokenValue in odb_synth.cc).
    frames = [struct.pack(f"<{tokens}q", *[(sid * 1000003 + j * 7919) % 50257 for j in range(tokens)])]
    if blob is not None:
        b = s.tensors.add(name="blob", dtype=odb_pb2.UINT8, frame=2)
        b.shape.append(len(blob))
        frames.append(blob)
    return m, frames


def rejection_codes(epoch: dict) -> set[str]:
    return {code for code, _ in epoch["rejection_codes"]}


# ----------------------------------------------------------------- finding 1: epochs


def test_a_fresh_daemon_trains_the_epoch_a_resumed_trainer_asks_for(tmp_path):
    """A job resumed in epoch 7 on a fresh daemon: its samples are the trainer's epoch, not
    'more than 4 epochs after epoch 0'. Both orders: trainer first, and producer first
    (DataLoader workers may start before the trainer's StartEpoch reaches the daemon)."""
    d = Daemon(tmp_path)
    try:
        d.wait_ready()
        c = consume(d.trainer, expected_producers=1, extra=["--first-epoch", "7"])
        d.wait_log("trainer started epoch 7")
        p = produce(d.ingest, "p", 100, seed=1, extra=["--epoch", "7", "--max-len", "64"])
        rc, _, err = finish(p)
        assert rc == 0, err
        rc, out, err = finish(c)
        assert rc == 0, err
        [e] = epochs(out)
        assert e["epoch"] == 7 and e["unique_ids"] == 100 and e["summary_rejected"] == 0, e

        # The producer first: epoch 8 starts arriving before the trainer asks for it.
        p = produce(d.ingest, "q", 60, seed=2, id_offset=1000, extra=["--epoch", "8", "--max-len", "64"])
        rc, _, err = finish(p)
        assert rc == 0, err
        c = consume(d.trainer, expected_producers=1, extra=["--first-epoch", "8"])
        rc, out, err = finish(c)
        assert rc == 0, err
        [e] = epochs(out)
        assert e["epoch"] == 8 and e["unique_ids"] == 60 and e["summary_rejected"] == 0, e
    finally:
        d.stop()


def test_samples_of_an_epoch_the_trainer_does_not_train_are_refused_with_the_true_cause(tmp_path):
    """The trainer trains epoch 7, a producer sends epoch 0: every sample is refused naming both
    epochs, the trainer's epoch reports them (never a silently empty epoch), and the producer's
    end of stream is refused for that reason, not as a misleading COUNT_MISMATCH."""
    d = Daemon(tmp_path, config="emit: {producer_timeout_ms: 1500}\n")
    try:
        d.wait_ready()
        c = consume(d.trainer, expected_producers=1, extra=["--first-epoch", "7"])
        d.wait_log("trainer started epoch 7")
        p = produce(d.ingest, "old", 30, seed=1, extra=["--epoch", "0", "--max-len", "64"])
        rc, _, err = finish(p)
        assert rc != 0
        assert "WRONG_EPOCH" in err and "COUNT_MISMATCH" not in err, err
        assert "epoch 0 is before epoch 7" in err and "30 of its 30 samples" in err, err
        # The trainer's epoch cannot end (its producer never sends it): a PRODUCER_TIMEOUT that
        # says input of another epoch was refused.
        rc, out, err = finish(c)
        assert rc != 0
        assert "PRODUCER_TIMEOUT" in err and "rejected" in err, err
    finally:
        d.stop()


def test_epochs_far_apart_are_refused_before_the_trainer_asks_and_streams_stay_countable(tmp_path):
    """Before the trainer asks for an epoch, producers may send any epoch, but not epochs more
    than 4 apart (bounded bookkeeping); the far one is refused with its reason, its end of
    stream says so, and the near one trains whole."""
    d = Daemon(tmp_path)
    try:
        d.wait_ready()
        ok = produce(d.ingest, "near", 40, seed=1, extra=["--epoch", "3", "--max-len", "64"])
        assert finish(ok)[0] == 0
        far = produce(d.ingest, "far", 10, seed=2, id_offset=500, extra=["--epoch", "9", "--max-len", "64"])
        rc, _, err = finish(far)
        assert rc != 0 and "WRONG_EPOCH" in err and "more than 4 epochs away from epoch 3" in err, err
        c = consume(d.trainer, expected_producers=1, extra=["--first-epoch", "3"])
        rc, out, err = finish(c)
        assert rc == 0, err
        [e] = epochs(out)
        assert e["unique_ids"] == 40, e
    finally:
        d.stop()


# ----------------------------------------------------------------- finding 5: stalls


def _metric(host: str, port: int, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def test_a_producer_that_dies_with_a_full_buffer_is_named_within_its_timeout(tmp_path):
    """The trainer is alive but takes no steps, so the buffer fills and the producer holds no
    credit; then the producer dies. The daemon holding producers back must not hide that: it
    ends in PRODUCER_TIMEOUT naming the producer, with a log line that it left mid-stream,
    instead of waiting for ever."""
    import re

    ctx = zmq.Context()
    d = Daemon(tmp_path, config='metrics_endpoint: "tcp://127.0.0.1:*"\n'
                                "emit: {producer_timeout_ms: 1500, queue_steps: 2}\n"
                                "buffer: {max_samples: 32}\ngrouping: {window: 8, max_tokens: 64}\n")
    try:
        d.wait_ready()
        d.wait_log("metrics endpoint tcp://")
        host, port = re.search(r"metrics endpoint tcp://([0-9.]+):(\d+)", d.read_log()).groups()
        trainer = ctx.socket(zmq.DEALER)
        trainer.setsockopt(zmq.LINGER, 0)
        trainer.connect(d.trainer)
        m = odb_pb2.TrainerMessage(version=1)
        m.start_epoch.epoch, m.start_epoch.expected_producers = 0, 1
        trainer.send(m.SerializeToString())  # and never a credit: no step leaves the daemon
        p = produce(d.ingest, "doomed", 100000, seed=1, extra=["--no-end", "--min-len", "16", "--max-len", "16"])
        deadline = time.monotonic() + 60
        # Full for good: the step queue is full (no round runs), the buffer has no room for
        # another grant and the producer holds no sample credit.
        while _metric(host, int(port), "odb_queued_steps") < 2 or \
                _metric(host, int(port), "odb_buffer_samples") < 24 or \
                _metric(host, int(port), "odb_ingest_credit_samples") > 0:
            assert time.monotonic() < deadline, d.read_log()
            time.sleep(0.05)
        p.kill()
        p.wait()
        rc = d.proc.wait(timeout=60)
        assert rc != 0
        log = d.read_log()
        assert "PRODUCER_TIMEOUT" in log or "no message from any producer" in log, log
        assert "doomed" in log.split("no message from any producer")[-1], log
        assert "left without ending its stream" in log, log
    finally:
        ctx.destroy(linger=0)
        d.stop()


# ----------------------------------------------------------------- finding 7: oversized samples


def test_an_oversized_sample_is_refused_by_id_and_counted_in_its_stream(tmp_path):
    """A producer that ignores max_sample_bytes sends one sample over it between good ones: the
    rejection names its id, the trainer's summary lists it, and the producer's honest end of
    stream (which counts it) is acknowledged, not refused as COUNT_MISMATCH."""
    ctx = zmq.Context()
    d = Daemon(tmp_path, config="buffer: {max_bytes: 200000}\n")  # largest sample: 100000 bytes
    try:
        d.wait_ready()
        c = consume(d.trainer, expected_producers=1)
        p = RawProducer(ctx, d.ingest)
        p.hello("big")
        for sid in range(5):
            p.send(*raw_sample("big", sid, 8))
        # Sent while it holds a sample of credit, which the daemon charges it (with all of its
        # bytes: the sample is larger than any grant), as a client that checks would.
        deadline = time.monotonic() + 60
        while p.credit_samples < 1:
            assert time.monotonic() < deadline, "no credit"
            p._pump(100)
        p.send(*raw_sample("big", 77, 8, blob=b"\x01" * 150000), force=True)
        p.credit_samples, p.credit_bytes = p.credit_samples - 1, 0
        for sid in range(5, 10):
            p.send(*raw_sample("big", sid, 8))
        p.end_stream("big", 11)
        assert 0 in p.acks and not p.rejections, [r.message for r in p.rejections]
        rc, out, err = finish(c)
        assert rc == 0, err
        [e] = epochs(out)
        assert e["unique_ids"] == 10, e
        assert ["TOO_LARGE", 77] in e["rejection_codes"], e
        assert "sample 77 of" in d.read_log()
        p.close()
    finally:
        ctx.destroy(linger=0)
        d.stop()


def test_a_fatal_error_names_its_rank_once(tmp_path):
    """The rank is named in one place: the log pattern ([odbd N]) and the fatal message's rank
    field; neither the log line nor the trainer's text repeats "rank 0: rank 0: ..."."""
    import re

    ctx = zmq.Context()
    d = Daemon(tmp_path)
    try:
        d.wait_ready()
        t = ctx.socket(zmq.DEALER)
        t.setsockopt(zmq.LINGER, 0)
        t.setsockopt(zmq.RCVTIMEO, 60000)
        t.connect(d.trainer)
        start = odb_pb2.TrainerMessage(version=1)
        start.start_epoch.epoch, start.start_epoch.expected_producers = 0, 1
        t.send(start.SerializeToString())
        assert finish(produce(d.ingest, "p", 400, seed=4))[0] == 0
        from odbtest import raw_trainer_next

        raw_trainer_next(t)  # a step of the epoch was delivered to this session
        t.close()
        d.wait_log("disconnected")
        t2 = ctx.socket(zmq.DEALER)
        t2.setsockopt(zmq.LINGER, 0)
        t2.setsockopt(zmq.RCVTIMEO, 60000)
        t2.connect(d.trainer)
        t2.send(start.SerializeToString())
        m = raw_trainer_next(t2)[1]
        assert m.fatal.code == odb_pb2.EPOCH_LOST and m.fatal.rank == 0, m
        assert not m.fatal.message.startswith("rank "), m.fatal.message
        assert d.proc.wait(30) == 1
        log = d.read_log()
        assert "a new trainer connected" in log
        assert not re.search(r"\] rank 0: ", log), log
    finally:
        ctx.destroy(linger=0)
        d.stop()


# ----------------------------------------------------------------- finding 4: credit


def test_idle_producers_cannot_pin_the_credit_of_busy_ones(tmp_path):
    """Four producers say hello and never send (they never even read the daemon's replies);
    four others send 20 samples each. With buffer.max_samples 4096 the idle ones used to hold
    1024 samples of credit each, and the busy ones waited for ever: now every sample arrives."""
    ctx = zmq.Context()
    d = Daemon(tmp_path, config="buffer: {max_samples: 4096}\n")
    try:
        d.wait_ready()
        idle = [RawProducer(ctx, d.ingest, linger_ms=0) for _ in range(4)]
        for i, p in enumerate(idle):
            # One at a time, each until its first credit: every idle producer is lent what the
            # daemon lends one that has not sent (the earliest ones alone, the most).
            p.hello(f"idle-{i}")
            deadline = time.monotonic() + 60
            while p.credit_samples < 1:
                assert time.monotonic() < deadline, "no credit for an idle producer"
                p._pump(100)
        c = consume(d.trainer, expected_producers=4)
        busy = [produce(d.ingest, f"busy-{i}", 20, seed=i, id_offset=1000 * i, extra=["--max-len", "64"])
                for i in range(4)]
        for p in busy:
            rc, _, err = finish(p, timeout=60)
            assert rc == 0, err
        rc, out, err = finish(c)
        assert rc == 0, err
        [e] = epochs(out)
        assert sorted(e["ids"]) == sorted(1000 * i + k for i in range(4) for k in range(20)), e
        for p in idle:
            p.close()
    finally:
        ctx.destroy(linger=0)
        d.stop()
