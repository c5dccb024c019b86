"""An outside process that attacks every TCP port it is given, until a stop file
appears: ZeroMQ clients that send garbage and forged but well-formed sample
payloads (claiming to be rank 1), raw garbage bytes, and a flood of silent
connections held open. Run it in another network namespace than the target
("another host"). Prints one JSON line of what it did.

usage: netattack.py STOP_FILE HOST:PORT...
"""
from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(os.environ["ODB_PROTO_DIR"])))
import odb_pb2  # noqa: E402


def forged_sample(rank: int, sid: int) -> list[bytes]:
    """A sample message in the producer wire format, as a peer daemon sends
    one, for an id `rank` really owns, with bytes that are not the sample's."""
    m = odb_pb2.ProducerMessage(version=1)
    s = m.sample
    s.producer_id, s.sample_id, s.epoch, s.tokens = f"r{rank}", sid, 0, 8
    t = s.tensors.add(name="input_ids", dtype=odb_pb2.INT64, frame=1)
    t.shape.append(8)
    return [m.SerializeToString(), struct.pack("<8q", *([666] * 8))]


def main() -> int:
    stop = Path(sys.argv[1])
    targets = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in sys.argv[2:]]
    ctx = zmq.Context()
    held: list[socket.socket] = []
    done = {"zmq_garbage": 0, "forged": 0, "raw_garbage": 0, "flood": 0, "refused": 0}
    rounds = 0
    while not stop.exists() and rounds < 10000:
        rounds += 1
        for host, port in targets:
            # ZeroMQ DEALERs claiming to be rank 1 and rank 0: garbage, then
            # forged payloads of that rank's samples (ids rank * 1e6 + k).
            for claimed in (b"1", b"0"):
                d = ctx.socket(zmq.DEALER)
                d.setsockopt(zmq.LINGER, 500)  # closing flushes what the handshake lets through
                d.setsockopt(zmq.ROUTING_ID, claimed)
                d.connect(f"tcp://{host}:{port}")
                try:
                    for i in range(20):
                        d.send_multipart([b"garbage %d" % i, os.urandom(64)], flags=zmq.NOBLOCK)
                        done["zmq_garbage"] += 1
                    for k in range(20):
                        rank = int(claimed)
                        d.send_multipart(forged_sample(rank, rank * 1_000_000 + k), flags=zmq.NOBLOCK)
                        done["forged"] += 1
                except zmq.Again:
                    pass
                d.close()
            # Raw bytes, and connections held open saying nothing.
            try:
                s = socket.create_connection((host, port), timeout=2)
                s.sendall(os.urandom(4096))
                s.close()
                done["raw_garbage"] += 1
            except OSError:
                done["refused"] += 1
            if len(held) < 100 * len(targets):
                for _ in range(25):
                    try:
                        held.append(socket.create_connection((host, port), timeout=2))
                        done["flood"] += 1
                    except OSError:
                        done["refused"] += 1
        time.sleep(0.05)  # the attacker's pace
    for s in held:
        s.close()
    ctx.destroy(linger=0)
    print(json.dumps(done), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
