"""The daemon tried as a hostile user would (issue 9): each test is one class of
bad input or misuse; after it, the daemon still serves and a valid epoch
arrives whole. Real odbd processes, real sockets."""
from __future__ import annotations

import re
import socket
import struct
import threading
import urllib.request

import zmq

from odbtest import Daemon, consume, epochs, finish, metric_value, produce, raw_trainer_msg, raw_trainer_next
from odbtest import scrape as scrape_metrics
from rawproducer import RawProducer

import odb_pb2


def vm_hwm_kib(pid: int) -> int:
    """Peak resident memory of a process as the OS sees it."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def sample(pid: str, sid: int, tokens: int, epoch: int = 0, extra: dict | None = None,
           shape: list[int] | None = None, frame: bytes | None = None):
    m = odb_pb2.ProducerMessage(version=1)
    s = m.sample
    s.producer_id, s.sample_id, s.epoch, s.tokens = pid, sid, epoch, tokens
    t = s.tensors.add(name="input_ids", dtype=odb_pb2.INT64, frame=1)
    t.shape.extend(shape if shape is not None else [tokens])
    frames = [frame if frame is not None else struct.pack(f"<{tokens}q", *[(sid * 1000003 + j * 7919) % 50257
                                                                           for j in range(tokens)])]
    for i, (name, data) in enumerate((extra or {}).items()):
        e = s.tensors.add(name=name, dtype=odb_pb2.UINT8, frame=2 + i)
        e.shape.append(len(data))
        frames.append(data)
    return m, frames


_RAMP = bytes(range(256)) * ((8 << 20) // 256 + 2)


def blob(sid: int, n: int) -> bytes:
    """odb_synth's payload pattern, so its verifying consumer checks the bytes."""
    return _RAMP[sid & 255:(sid & 255) + n]


def valid_epoch_after(d: Daemon, epoch: int, n: int = 200) -> None:
    """The daemon still serves: a fresh trainer session... here the same
    daemon gets one more epoch, checked id by id by the verifying consumer."""
    c = consume(d.trainer, expected_producers=1, extra=["--first-epoch", str(epoch)])
    p = produce(d.ingest, f"after{epoch}", n, seed=5, id_offset=900000, extra=["--epoch", str(epoch)])
    assert finish(p)[0] == 0
    rc, out, err = finish(c, timeout=120)
    assert rc == 0, err + d.read_log()
    (e,) = epochs(out)
    assert sorted(e["ids"]) == list(range(900000, 900000 + n)) and e["duplicates"] == 0


def metrics_address(d: Daemon) -> tuple[str, int]:
    d.wait_log("metrics endpoint tcp://")
    host, port = re.search(r"metrics endpoint tcp://([0-9.]+):(\d+)", d.read_log()).groups()
    return host, int(port)


def test_metrics_scrapes_of_every_kind_never_disturb_an_epoch(tmp_path):
    """Concurrent scrapes, clients that hang up early, partial requests and
    1 MiB of garbage on the metrics port during an epoch: odbd keeps serving,
    every sample arrives exactly once, and a clean scrape still answers."""
    d = Daemon(tmp_path, config='metrics_endpoint: "tcp://127.0.0.1:*"\n')
    try:
        d.wait_ready()
        host, port = metrics_address(d)
        stop = threading.Event()
        errors: list[str] = []
        served = [0]

        def scrape():
            while not stop.is_set():
                try:
                    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
                        assert r.status == 200 and metric_value(r.read().decode(), "odb_samples_received_total") >= 0  # whole and valid
                        served[0] += 1
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(repr(e))

        def abuse():
            while not stop.is_set():
                for kind in ("hangup", "partial", "garbage", "reset"):
                    s = socket.create_connection((host, port), timeout=10)
                    if kind == "hangup":
                        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                    elif kind == "partial":
                        s.sendall(b"GET /met")
                    elif kind == "garbage":
                        try:
                            s.sendall(bytes(range(256)) * 4096)
                        except OSError:
                            pass  # the server may close on us: that is its right
                    else:
                        s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.close()

        threads = [threading.Thread(target=scrape) for _ in range(3)] + [threading.Thread(target=abuse)]
        for t in threads:
            t.start()
        c = consume(d.trainer, expected_producers=2, extra=["--slow-ms", "2"])
        p1 = produce(d.ingest, "a", 3000, seed=1, extra=["--max-len", "64"])
        p2 = produce(d.ingest, "b", 3000, seed=2, id_offset=100000, extra=["--max-len", "64"])
        assert finish(p1)[0] == 0 and finish(p2)[0] == 0
        rc, out, err = finish(c, timeout=180)
        stop.set()
        for t in threads:
            t.join(60)
        assert rc == 0, err + d.read_log()
        (e,) = epochs(out)
        assert sorted(e["ids"]) == list(range(3000)) + list(range(100000, 103000))
        assert e["duplicates"] == 0
        assert d.proc.poll() is None, d.read_log()
        assert served[0] > 0 and not errors, errors[:3]
        assert metric_value(scrape_metrics(f"{host}:{port}"), "odb_samples_emitted_total") == 6000
        valid_epoch_after(d, 1)
    finally:
        d.stop()


def test_producers_closing_under_back_pressure_lose_nothing(tmp_path):
    """Two producers push 1,500 samples of 16 KiB and end_stream as fast as they
    can into an 8 MiB buffer while the trainer takes 20 ms a step, and exit at
    once: with PUSH/PULL each lost its last sample and end_stream and the
    epoch hung; with credit every sample arrives and the epoch ends."""
    d = Daemon(tmp_path, config="buffer:\n  max_bytes: 8388608\n")
    try:
        d.wait_ready()
        c = consume(d.trainer, expected_producers=2, extra=["--slow-ms", "20"])
        extra = ["--payload-bytes", "16384", "--max-len", "512"]
        p1 = produce(d.ingest, "a", 1500, seed=1, extra=extra)
        p2 = produce(d.ingest, "b", 1500, seed=2, id_offset=10000, extra=extra)
        assert finish(p1, timeout=300)[0] == 0 and finish(p2, timeout=300)[0] == 0
        rc, out, err = finish(c, timeout=300)
        assert rc == 0, err + d.read_log()
        (e,) = epochs(out)
        assert sorted(e["ids"]) == list(range(1500)) + list(range(10000, 11500))
        assert e["summary_received"] == 3000 and e["summary_emitted"] == 3000
    finally:
        d.stop()


def test_crafted_shapes_and_token_counts_are_rejected_and_neighbours_survive(tmp_path):
    """[2^40, 0] with an empty frame (aborted odbd), [2^40, 2^40] with a 0-byte
    frame (wrapped to 0), tokens 1 over 2^17 rows (a 512 MiB step) and a sample
    whose tensor set differs from the others (its step failed collation and
    took 21 valid samples down): each is rejected at the door with its id; the
    valid samples of both producers arrive."""
    ctx = zmq.Context()
    d = Daemon(tmp_path)
    try:
        d.wait_ready()
        c = consume(d.trainer, expected_producers=2)
        good = RawProducer(ctx, d.ingest)
        good.hello("good")
        for sid in range(21):
            good.send(*sample("good", sid, 8))
        good.end_stream("good", 21)
        bad = RawProducer(ctx, d.ingest)
        bad.hello("bad")
        bad.send(*sample("bad", 1000, 1, shape=[1 << 40, 0], frame=b""))
        bad.send(*sample("bad", 1001, 1, shape=[1 << 40, 1 << 40], frame=b""))
        rows = 1 << 17
        bad.send(*sample("bad", 1002, 1, shape=[rows], frame=bytes(8 * rows)))
        bad.send(*sample("bad", 1003, 8, extra={"pixel_values": b"\x01" * 12}))
        bad.send(*sample("bad", 1004, 8))
        bad.end_stream("bad", 5)
        rc, out, err = finish(c, timeout=120)
        assert rc == 0, err + d.read_log()
        (e,) = epochs(out)
        assert sorted(e["ids"]) == list(range(21)) + [1004]
        codes = {(code, sid) for code, sid in e["rejection_codes"]}
        assert ("TOKENS_MISMATCH", 1000) in codes, codes
        assert ("SHAPE_SIZE_MISMATCH", 1001) in codes, codes
        assert ("TOKENS_MISMATCH", 1002) in codes, codes
        assert ("SCHEMA_MISMATCH", 1003) in codes, codes
        assert not any(code == "COLLATE_FAILED" for code, _ in codes)
        assert d.proc.poll() is None
        valid_epoch_after(d, 1)
    finally:
        ctx.destroy(linger=0)
        d.stop()


def _trainer(ctx, d: Daemon, identity: bytes | None = None) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 60000)
    if identity:
        s.setsockopt(zmq.ROUTING_ID, identity)
    s.connect(d.trainer)
    return s


def _next(s: zmq.Socket) -> odb_pb2.DaemonMessage:
    return raw_trainer_next(s)[1]


def test_malformed_trainer_messages_are_ignored_and_a_second_trainer_is_refused(tmp_path):
    """A multi-frame trainer message froze the daemon; a second trainer took
    every other step. Now the first is ignored (logged), the second gets
    SESSION_REFUSED, and the first trainer receives the whole epoch."""
    ctx = zmq.Context()
    d = Daemon(tmp_path)
    try:
        d.wait_ready()
        t1 = _trainer(ctx, d)
        t1.send_multipart([b"one", b"two", b"three"])
        t1.send(b"\xff\xfe not a protobuf")
        t1.send(raw_trainer_msg(start=0))
        d.wait_log("trainer started epoch 0")
        t2 = _trainer(ctx, d)
        t2.send(raw_trainer_msg(credit=0))
        refused = _next(t2)
        assert refused.fatal.code == odb_pb2.SESSION_REFUSED, refused
        assert "one trainer per daemon" in refused.fatal.message
        assert finish(produce(d.ingest, "p", 300, seed=3))[0] == 0
        ids = []
        while True:
            m = _next(t1)
            if m.HasField("epoch_end"):
                break
            ids.extend(m.step.sample_ids)
            t1.send(raw_trainer_msg(credit=1))
        assert sorted(ids) == list(range(300))
        assert "a message of 3 frames" in d.read_log()
        assert d.proc.poll() is None
    finally:
        ctx.destroy(linger=0)
        d.stop()


def test_a_reconnecting_session_gets_its_unacknowledged_steps_again(tmp_path):
    """The same session (routing id) on a new connection is re-sent what it
    had not acknowledged; with duplicates dropped by step index, the epoch
    arrives exactly once (113 samples were lost this way before)."""
    ctx = zmq.Context()
    d = Daemon(tmp_path)
    try:
        d.wait_ready()
        t = _trainer(ctx, d, identity=b"trainer-session-1")
        t.send(raw_trainer_msg(start=0))
        assert finish(produce(d.ingest, "p", 400, seed=4))[0] == 0
        got: dict[int, list[int]] = {}
        for _ in range(2):  # two steps received, never acknowledged
            m = _next(t)
            got[m.step.step_index] = list(m.step.sample_ids)
        t.close()
        d.wait_log("trainer session trainer-session-1 disconnected")
        t = _trainer(ctx, d, identity=b"trainer-session-1")
        t.send(raw_trainer_msg(credit=0))
        while True:
            m = _next(t)
            if m.HasField("epoch_end"):
                summary = m.epoch_end
                break
            if m.step.step_index not in got:
                got[m.step.step_index] = list(m.step.sample_ids)
                t.send(raw_trainer_msg(credit=1))
        ids = sorted(i for step in got.values() for i in step)
        assert ids == list(range(400))
        assert summary.emitted == 400
        assert "re-sending" in d.read_log()
    finally:
        ctx.destroy(linger=0)
        d.stop()


def test_a_new_trainer_mid_epoch_is_told_the_epoch_is_lost(tmp_path):
    """A restarted client that sends start_epoch again was ignored and hung.
    Now it gets EPOCH_LOST, and the daemon stops with the same clear error."""
    ctx = zmq.Context()
    d = Daemon(tmp_path)
    try:
        d.wait_ready()
        t = _trainer(ctx, d)
        t.send(raw_trainer_msg(start=0))
        assert finish(produce(d.ingest, "p", 400, seed=4))[0] == 0
        _next(t)
        t.close()
        d.wait_log("disconnected")
        t2 = _trainer(ctx, d)
        t2.send(raw_trainer_msg(start=0))
        m = _next(t2)
        assert m.fatal.code == odb_pb2.EPOCH_LOST, m
        assert "restart the job" in m.fatal.message
        assert d.proc.wait(30) == 1
        assert "previous trainer session that disconnected" in d.read_log()
    finally:
        ctx.destroy(linger=0)
        d.stop()


def test_a_buffer_full_of_a_future_epoch_does_not_starve_the_current_one(tmp_path):
    """A producer that runs ahead (epoch 1) while epoch 0 is incomplete used to
    fill the buffer: ingest stopped, epoch 0 got nothing, the timeout never
    fired. Ahead producers get credit from half of the buffer at most."""
    ctx = zmq.Context()
    d = Daemon(tmp_path, config="buffer:\n  max_bytes: 2097152\n")
    try:
        d.wait_ready()
        ahead = RawProducer(ctx, d.ingest)
        ahead.hello("ahead")
        sent_ahead = [0]

        def run_ahead():
            for sid in range(64):  # 4 MiB of epoch 1: twice the buffer
                try:
                    ahead.send(*sample("ahead", 500000 + sid, 8, epoch=1, extra={"blob": blob(sid, 64 << 10)}),
                               timeout=5)
                    sent_ahead[0] += 1
                except AssertionError:
                    return  # no more credit: held back, as it should be

        t = threading.Thread(target=run_ahead)
        t.start()
        t.join(60)
        assert 0 < sent_ahead[0] < 64  # held back at part of the buffer
        c = consume(d.trainer, expected_producers=1, extra=["--epochs", "1"])
        p = produce(d.ingest, "now", 300, seed=6, extra=["--payload-bytes", "4096"])
        assert finish(p, timeout=120)[0] == 0
        rc, out, err = finish(c, timeout=120)
        assert rc == 0, err + d.read_log()
        assert sorted(epochs(out)[0]["ids"]) == list(range(300))
    finally:
        ctx.destroy(linger=0)
        d.stop()


def test_memory_stays_bounded_by_the_config_under_hostile_input(tmp_path):
    """VmHWM measured from outside. (b) 4 MiB samples into a 16 MiB buffer with
    a slow trainer reached 847 MiB (the receive queue was bounded in messages);
    (c) 20,000 rejections with a 4 KiB producer id peaked at 750 MB. Now both
    stay within the documented bound (docs/memory.md): baseline + buffer +
    the collated steps in flight."""
    ctx = zmq.Context()
    buffer_bytes = 16 << 20
    d = Daemon(tmp_path, config=f"buffer:\n  max_bytes: {buffer_bytes}\nemit:\n  queue_steps: 4\n")
    try:
        d.wait_ready()
        baseline = vm_hwm_kib(d.proc.pid)
        # (b) 4 MiB samples as fast as the producer may.
        c = consume(d.trainer, expected_producers=1, extra=["--slow-ms", "30"])
        big = RawProducer(ctx, d.ingest)
        big.hello("big")
        for sid in range(40):
            big.send(*sample("big", sid, 8, extra={"blob": blob(sid, 4 << 20)}))
        big.end_stream("big", 40)
        rc, out, err = finish(c, timeout=180)
        assert rc == 0, err + d.read_log()
        assert sorted(epochs(out)[0]["ids"]) == list(range(40))
        # (c) A flood of rejections with 4 KiB producer ids, and a 10 MB one.
        c = consume(d.trainer, expected_producers=1, extra=["--first-epoch", "1"])
        flood = RawProducer(ctx, d.ingest)
        flood.hello("flood")
        long_id = "x" * 4096
        for sid in range(20000):
            flood.send(*sample(long_id, sid, 4, epoch=1))
        huge = RawProducer(ctx, d.ingest)
        try:
            huge.hello("y" * (10 << 20))
        finally:
            huge.close()
        flood.end_stream("flood", 0, epoch=1)
        rc, out, err = finish(c, timeout=180)
        # Every sample of the epoch was rejected: the consumer says so and exits 5 (nothing consumed).
        assert rc == 5 and "every sample the daemon received was rejected" in err, err + d.read_log()
        (e,) = epochs(out)
        assert e["summary_rejected"] == 20000  # every one counted ...
        peak = vm_hwm_kib(d.proc.pid)
        # ... in bounded memory: 4 MiB steps, at most queue_steps + D of them
        # besides the 16 MiB buffer; 160 MiB is far under the 847 MiB seen before.
        assert peak - baseline < 160 * 1024, (baseline, peak)
        assert d.proc.poll() is None
        valid_epoch_after(d, 2)
    finally:
        ctx.destroy(linger=0)
        d.stop()


def test_a_second_daemon_for_the_same_rank_and_run_dir_exits_naming_the_first(tmp_path):
    d = Daemon(tmp_path)
    try:
        d.wait_ready()
        second = Daemon(tmp_path)  # same run_dir, same rank
        assert second.proc.wait(30) == 3
        log = second.read_log()
        assert f"another odbd (pid {d.proc.pid})" in log, log
        second.stop()
        valid_epoch_after(d, 0)  # the first still owns its sockets
    finally:
        d.stop()


def test_producer_timeout_names_only_producers_open_in_this_epoch(tmp_path):
    """PRODUCER_TIMEOUT named a producer that had finished the previous epoch."""
    d = Daemon(tmp_path, config="emit:\n  producer_timeout_ms: 3000\n")  # >> a producer's start on a loaded machine
    try:
        d.wait_ready()
        c = consume(d.trainer, expected_producers=1, extra=["--epochs", "2"])
        assert finish(produce(d.ingest, "finished-in-epoch-0", 50, seed=1))[0] == 0
        d.wait_log("epoch 0 done")
        stuck = produce(d.ingest, "stuck", 10, seed=2, id_offset=1000, extra=["--epoch", "1", "--no-end"])
        assert finish(stuck)[0] == 0
        d.wait_log("no message from any producer")
        log = d.read_log()
        line = next(x for x in log.splitlines() if "no message from any producer" in x)
        assert "stuck" in line and "finished-in-epoch-0" not in line, line
        finish(c, timeout=60)
    finally:
        d.stop()


def test_a_producer_that_ignores_credit_is_rejected_in_bounded_memory(tmp_path):
    """A raw DEALER that blasts 200 samples of 4 MiB without waiting for credit (the
    odb clients never do this): every sample is rejected CREDIT_EXCEEDED and
    counted, the daemon's memory stays bounded (it reads and drops as fast as
    they come), and a well-behaved producer is served afterwards."""
    ctx = zmq.Context()
    d = Daemon(tmp_path, config=f"buffer:\n  max_bytes: {16 << 20}\n")
    try:
        d.wait_ready()
        baseline = vm_hwm_kib(d.proc.pid)
        flood = RawProducer(ctx, d.ingest)
        flood.sock.setsockopt(zmq.SNDHWM, 0)
        flood.hello("flood")
        payload = {"blob": blob(0, 4 << 20)}
        sent = 200  # 800 MiB: fifty times the 16 MiB buffer
        for sid in range(sent):
            flood.send(*sample("flood", sid, 8, epoch=3, extra=payload), force=True)  # not the checked epoch
        flood.close()
        d.wait_log("CREDIT_EXCEEDED")
        peak = vm_hwm_kib(d.proc.pid)
        assert peak - baseline < 160 * 1024, (baseline, peak, sent)
        assert d.proc.poll() is None
        valid_epoch_after(d, 0)
    finally:
        ctx.destroy(linger=0)
        d.stop()


def test_a_trainer_that_replaces_its_consumer_between_epochs_is_served(tmp_path):
    """A loader per epoch: the old consumer closes and the new one talks at
    once, while the daemon may not have seen the old connection close yet. The
    new one waits out that race (a short grace) and becomes the session; it is
    not refused."""
    ctx = zmq.Context()
    d = Daemon(tmp_path)
    try:
        d.wait_ready()
        for epoch in range(3):
            t = _trainer(ctx, d)
            t.send(raw_trainer_msg(credit=0))
            t.send(raw_trainer_msg(start=epoch))
            p = produce(d.ingest, f"p{epoch}", 50, seed=epoch, extra=["--epoch", str(epoch)])
            ids = []
            while True:
                m = _next(t)
                assert not m.HasField("fatal"), m.fatal.message + "\n" + d.read_log()
                if m.HasField("epoch_end"):
                    break
                ids.extend(m.step.sample_ids)
                t.send(raw_trainer_msg(credit=1))
            assert finish(p)[0] == 0
            assert sorted(ids) == list(range(50))
            t.close()  # and the next epoch's consumer connects right away
        assert d.proc.poll() is None
    finally:
        ctx.destroy(linger=0)
        d.stop()
