"""A producer written against the wire protocol only (pyzmq + odb_pb2), for
tests that send hand-made or malformed messages.

Ingest is DEALER -> ROUTER with credit: a sample (a message of more than one
frame) may be sent only while the daemon has granted room for it. `send`
waits for that credit unless `force=True` (tests of producers that ignore
flow control).
"""
from __future__ import annotations

import time

import zmq

import odb_pb2


class RawProducer:
    def __init__(self, ctx: zmq.Context, endpoint: str, linger_ms: int = 10000):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, linger_ms)
        self.sock.connect(endpoint)
        self.credit_samples = 0
        self.credit_bytes = 0
        self.max_sample_bytes = 0
        self.acks: dict[int, int] = {}
        self.rejections: list[odb_pb2.Rejection] = []

    def _pump(self, timeout_ms: int) -> None:
        if not self.sock.poll(timeout_ms):
            return
        while True:
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            reply = odb_pb2.IngestReply()
            reply.ParseFromString(frame)
            if reply.HasField("credit"):
                self.credit_samples += reply.credit.samples
                self.credit_bytes += reply.credit.bytes
                self.max_sample_bytes = reply.credit.max_sample_bytes or self.max_sample_bytes
            elif reply.HasField("stream_ack"):
                self.acks[reply.stream_ack.epoch] = reply.stream_ack.samples_received
            elif reply.HasField("rejection"):
                self.rejections.append(reply.rejection)

    def send(self, header: odb_pb2.ProducerMessage | bytes, frames: list[bytes], force: bool = False,
             timeout: float = 60.0) -> None:
        head = header if isinstance(header, bytes) else header.SerializeToString()
        # Charged as the daemon does: payload plus 512 bytes of bookkeeping per
        # tensor (wire::kBookkeepingBytesPerTensor).
        size = sum(len(f) + 512 for f in frames)
        if frames and not force:
            deadline = time.monotonic() + timeout
            while self.credit_samples < 1 or self.credit_bytes < size:
                if self.max_sample_bytes and self.credit_bytes < size:
                    req = odb_pb2.ProducerMessage(version=1)
                    req.credit_request.bytes = size
                    self.sock.send(req.SerializeToString())
                assert time.monotonic() < deadline, "no credit from the daemon"
                self._pump(100)
            self.credit_samples -= 1
            self.credit_bytes -= size
        self.sock.send_multipart([head] + frames)

    def hello(self, producer_id: str) -> None:
        m = odb_pb2.ProducerMessage(version=1)
        m.hello.producer_id = producer_id
        self.send(m, [])

    def end_stream(self, producer_id: str, sent: int, epoch: int = 0, wait: bool = True,
                   timeout: float = 60.0) -> None:
        m = odb_pb2.ProducerMessage(version=1)
        m.end_stream.producer_id, m.end_stream.epoch, m.end_stream.samples_sent = producer_id, epoch, sent
        self.send(m, [])
        if wait:
            deadline = time.monotonic() + timeout
            while epoch not in self.acks and not self.rejections:
                assert time.monotonic() < deadline, "end_stream not acknowledged"
                self._pump(100)

    def close(self) -> None:
        self.sock.close()
