"""Per-phase plans through real daemons: W = 2, multimodal samples (text + images).

Every rank's step header says which samples it encodes and where each encoder
output goes; the test checks, across both ranks and every step, that the routes
are a bijection onto the LLM layout, that the encoder batch carries exactly the
images of the samples it names (bytes checked), and that the LLM batch carries
no encoder field.
"""
from __future__ import annotations

import struct
import uuid

import numpy as np
import zmq

from odbtest import Daemon, StepRecord, check_step_invariants, raw_trainer_next
from rawproducer import RawProducer

import odb_pb2

W = 2
IMG = (3, 4, 4)


def _send_samples(ctx, d: Daemon, rank: int, n: int, rng) -> dict:
    sock = RawProducer(ctx, d.ingest)
    pid = f"mm{rank}"
    sock.hello(pid)
    images = {}
    for k in range(n):
        sid = rank * 100000 + k
        tokens = int(rng.integers(4, 60))
        nimg = int(rng.integers(0, 4)) if rank == 0 else int(rng.integers(0, 2))  # rank 0 image-heavy
        images[sid] = nimg
        m = odb_pb2.ProducerMessage(version=1)
        s = m.sample
        s.producer_id, s.sample_id, s.tokens, s.vision_patches = pid, sid, tokens, nimg * 16
        t = s.tensors.add(name="input_ids", dtype=odb_pb2.INT64, frame=1)
        t.shape.append(tokens)
        p = s.tensors.add(name="pixel_values", dtype=odb_pb2.FLOAT32, frame=2)
        p.shape.extend([nimg, *IMG])
        pixels = np.concatenate([np.full((1, *IMG), sid * 10 + j, np.float32) for j in range(nimg)]) \
            if nimg else np.zeros((0, *IMG), np.float32)
        sock.send(m, [np.arange(tokens, dtype=np.int64).tobytes(), pixels.tobytes()])
    sock.end_stream(pid, n)
    sock.close()
    return images


def _consume(ctx, d: Daemon) -> list[tuple[odb_pb2.Step, dict]]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 60000)
    sock.connect(d.trainer)
    start = odb_pb2.TrainerMessage(version=1)
    start.start_epoch.epoch, start.start_epoch.expected_producers = 0, 1
    sock.send(start.SerializeToString())
    steps = []
    while True:
        frames, msg = raw_trainer_next(sock)
        assert not msg.HasField("fatal"), msg.fatal.message
        if msg.HasField("epoch_end"):
            return steps
        tensors = {t.name: (t, frames[t.frame]) for t in msg.step.tensors}
        steps.append((msg.step, tensors))
        credit = odb_pb2.TrainerMessage(version=1)
        credit.credit.steps = 1
        sock.send(credit.SerializeToString())


def test_phase_plans_route_encoder_outputs_to_the_llm_layout(tmp_path):
    job = f"job-{uuid.uuid4().hex[:8]}"
    config = ("alignment: {planner: global, phase_plans: true}\n"
              "grouping: {window: 32, max_tokens: 512, max_vision_patches: 128}\n"
              "collate: {encoder_fields: [pixel_values], fields: [{name: pixel_values, rule: concat}]}\n")
    daemons = [Daemon(tmp_path, rank=r, world=W, config=config, job_id=job) for r in range(W)]
    ctx = zmq.Context()
    rng = np.random.default_rng(5)
    try:
        for d in daemons:
            d.wait_ready(timeout=60)
        images = {}
        for r, d in enumerate(daemons):
            images.update(_send_samples(ctx, d, r, 150, rng))
        import threading
        results = [None] * W
        threads = [threading.Thread(target=lambda r=r: results.__setitem__(r, _consume(ctx, daemons[r])))
                   for r in range(W)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert all(r is not None for r in results), [d.read_log() for d in daemons]
    finally:
        ctx.destroy(linger=0)
        for d in daemons:
            d.stop()
    assert len(results[0]) == len(results[1])
    check_step_invariants([[StepRecord(index=st.step_index, idle=st.idle, weight=st.loss_weight,
                                       real_tokens=st.real_tokens, global_real_tokens=st.global_real_tokens,
                                       lengths=list(st.lengths), epoch=st.epoch) for st, _ in steps]
                           for steps in results], W)
    emitted, encoded, moved_encoders = [], [], 0
    for k in range(len(results[0])):
        step = [results[r][k][0] for r in range(W)]
        tens = [results[r][k][1] for r in range(W)]
        for r in range(W):
            st = step[r]
            emitted.extend(st.sample_ids)
            encoded.extend(st.enc_sample_ids)
            assert "pixel_values" not in tens[r]          # LLM batch: no encoder field
            assert len(st.llm_src_rank) == len(st.sample_ids)
            if st.enc_sample_ids:  # only ranks with LLM work in the step encode
                assert not st.idle and len(st.sample_ids) > 0
            # Route: encoder sample i lands at (dest rank, index) naming the same sample,
            # whose llm_src_rank points back here.
            for i, sid in enumerate(st.enc_sample_ids):
                dest, idx = st.enc_dest_rank[i], st.enc_dest_index[i]
                assert step[dest].sample_ids[idx] == sid
                assert step[dest].llm_src_rank[idx] == r
                moved_encoders += dest != r
            # Encoder batch: exactly the images of the encoder samples, in order.
            if st.enc_sample_ids:
                desc, raw = tens[r]["enc.pixel_values"]
                _, off_raw = tens[r]["enc.pixel_values_offsets"]
                pixels = np.frombuffer(raw, np.float32).reshape(-1, *IMG)
                offsets = np.frombuffer(off_raw, np.int64)
                for i, sid in enumerate(st.enc_sample_ids):
                    lo, hi = int(offsets[i]), int(offsets[i + 1])
                    assert hi - lo == images[sid]
                    for j in range(lo, hi):
                        assert np.all(pixels[j] == sid * 10 + (j - lo))
    assert sorted(emitted) == sorted(images)   # every sample trained exactly once
    assert sorted(encoded) == sorted(images)   # and encoded exactly once
    assert moved_encoders > 0                  # the encoder phase was balanced separately
