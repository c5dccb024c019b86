"""Exactly once by stream position, tried from outside by a producer that ignores the rules
(session 12): seqs past what the daemon granted, at the top of the integer range, repeated
with another id, a daemon_key set by a producer. Real odbd processes, the raw wire
(rawproducer.py), the verifying odb_synth consumer. Each hostile sample gets an error naming
it; every honest sample is trained exactly once; the daemon keeps serving."""
from __future__ import annotations

import struct

import zmq

from odbtest import Daemon, consume, epochs, finish
from rawproducer import RawProducer

import odb_pb2


def raw_sample(pid: str, sid: int, seq: int | None, tokens: int = 16, epoch: int = 0,
               daemon_key: int | None = None):
    m = odb_pb2.ProducerMessage(version=1)
    s = m.sample
    s.producer_id, s.sample_id, s.epoch, s.tokens = pid, sid, epoch, tokens
    if seq is not None:
        s.seq = seq
    if daemon_key is not None:
        s.daemon_key = daemon_key
    t = s.tensors.add(name="input_ids", dtype=odb_pb2.INT64, frame=1)
    t.shape.append(tokens)
    # The token values odb_synth consume verifies (TokenValue in odb_synth.cc).
    frames = [struct.pack(f"<{tokens}q", *[(sid * 1000003 + j * 7919) % 50257 for j in range(tokens)])]
    return m, frames


def test_a_deterministic_daemon_refuses_seqs_it_never_granted_and_trains_the_rest_once(tmp_path):
    """alignment.deterministic, window 8: a producer that ignores its seq limit sends seqs far
    past it (frontier + window, 2^32, 2^64 - 1), a seq twice under another id, and a
    daemon_key. Each is refused naming the sample and the seq (CREDIT_EXCEEDED,
    DUPLICATE_ID, MALFORMED_HEADER); they hold no buffer room, so the honest positions
    behind them still arrive and train exactly once, in a second stream after the first
    too (the daemon keeps serving)."""
    d = Daemon(tmp_path, config="grouping: {window: 8}\nalignment: {deterministic: true}\n"
                                "buffer: {max_samples: 64}\n")
    ctx = zmq.Context()
    try:
        d.wait_ready()
        c = consume(d.trainer, expected_producers=1)
        p = RawProducer(ctx, d.ingest)
        p.hello("p")
        sent = 0
        for seq in range(4):
            p.send(*raw_sample("p", 10 + seq, seq))
            sent += 1
        hostile = [(900, 12), (901, 1 << 32), (902, (1 << 64) - 1)]
        for sid, seq in hostile:
            p.send(*raw_sample("p", sid, seq))
            sent += 1
        p.send(*raw_sample("p", 903, 2))  # position 2 again, another id
        sent += 1
        for seq in range(4, 40):  # the honest rest, within each granted limit
            p.send(*raw_sample("p", 10 + seq, seq))
            sent += 1
        # A daemon's field, at the next position: refused, and (as any rejected sample's)
        # its place is taken.
        p.send(*raw_sample("p", 904, 40, daemon_key=77))
        sent += 1
        p.end_stream("p", sent)
        assert not p.rejections, p.rejections
        assert p.acks.get(0) == sent
        d.wait_log("sample 900 from producer 'p' has seq 12, past the seq limit 12 of epoch 0")
        d.wait_log(f"sample 902 from producer 'p' has seq {(1 << 64) - 1}, past the seq limit")
        d.wait_log("sample 903 from producer 'p' has seq 2, which another sample of epoch 0 already had")
        d.wait_log("sample 904 from producer 'p': sets daemon_key (77)")
        rc, out, err = finish(c)
        assert rc == 0, err
        [e] = epochs(out)
        assert e["unique_ids"] == 40 and e["duplicates"] == 0, e
        assert sorted(e["ids"]) == list(range(10, 50)), e
        assert sorted(map(tuple, e["rejection_codes"])) == [
            ("CREDIT_EXCEEDED", 900), ("CREDIT_EXCEEDED", 901), ("CREDIT_EXCEEDED", 902), ("DUPLICATE_ID", 903),
            ("MALFORMED_HEADER", 904)], e
        p.close()

        # The next epoch on the same daemon: served as if nothing had happened.
        c = consume(d.trainer, expected_producers=1, extra=["--first-epoch", "1"])
        q = RawProducer(ctx, d.ingest)
        q.hello("q")
        for seq in range(20):
            q.send(*raw_sample("q", 100 + seq, seq, epoch=1))
        q.end_stream("q", 20, epoch=1)
        rc, out, err = finish(c)
        assert rc == 0, err
        [e] = epochs(out)
        assert e["epoch"] == 1 and sorted(e["ids"]) == list(range(100, 120)) and not e["rejection_codes"], e
        q.close()
    finally:
        ctx.destroy(linger=0)
        d.stop()


def test_a_rejected_sample_naming_another_producer_neither_counts_in_its_stream_nor_takes_its_seq(tmp_path):
    """Producer p sends samples the decoder rejects (0 tokens) whose headers name producer q
    and q's next seqs. They are refused, but q's stream is q's own: all its samples are
    admitted at those seqs and its end_stream is acknowledged (before, each counted in q's
    stream, so q's honest end_stream was refused COUNT_MISMATCH, and under
    alignment.deterministic each took q's position)."""
    for deterministic in (False, True):
        run = tmp_path / ("det" if deterministic else "free")
        d = Daemon(run, config=f"alignment: {{deterministic: {str(deterministic).lower()}}}\n")
        ctx = zmq.Context()
        try:
            d.wait_ready()
            c = consume(d.trainer, expected_producers=1)
            p = RawProducer(ctx, d.ingest)
            p.hello("p")
            q = RawProducer(ctx, d.ingest)
            q.hello("q")
            for seq in range(3):
                p.send(*raw_sample("q", 900 + seq, seq, tokens=0))
            d.wait_log("sample 902 from producer 'q': token length is 0")
            for seq in range(10):
                q.send(*raw_sample("q", seq, seq))
            q.end_stream("q", 10)
            assert not q.rejections, q.rejections
            assert q.acks.get(0) == 10
            rc, out, err = finish(c)
            assert rc == 0, err
            [e] = epochs(out)
            assert sorted(e["ids"]) == list(range(10)), e
            assert sorted(map(tuple, e["rejection_codes"])) == [("ZERO_LENGTH", 900 + i) for i in range(3)], e
            p.close()
            q.close()
        finally:
            ctx.destroy(linger=0)
            d.stop()


def test_buffer_max_id_runs_caps_the_exactly_once_memory_with_a_clear_error(tmp_path):
    """buffer.max_id_runs from the configuration reaches the buffer: a producer spreading its
    seqs apart (0, 2, 4, ...) starts one run per sample; past 64 runs each further sample is
    refused TOO_LARGE naming its seq and the limit, the first 64 train exactly once, and the
    epoch ends (the daemon keeps serving)."""
    d = Daemon(tmp_path, config="grouping: {window: 8}\nbuffer: {max_samples: 64, max_id_runs: 64}\n")
    ctx = zmq.Context()
    try:
        d.wait_ready()
        c = consume(d.trainer, expected_producers=1)
        p = RawProducer(ctx, d.ingest)
        p.hello("p")
        for i in range(80):
            p.send(*raw_sample("p", 1000 + i, 2 * i))
        p.end_stream("p", 80)
        d.wait_log("sample 1064 from producer 'p' refused: its seq 128 is apart from every seq received in "
                   "epoch 0, and the daemon already keeps 64 such separate runs")
        rc, out, err = finish(c)
        assert rc == 0, err
        [e] = epochs(out)
        assert sorted(e["ids"]) == list(range(1000, 1064)) and e["duplicates"] == 0, e
        assert sorted(map(tuple, e["rejection_codes"])) == [("TOO_LARGE", 1064 + i) for i in range(16)], e
        p.close()
    finally:
        ctx.destroy(linger=0)
        d.stop()
