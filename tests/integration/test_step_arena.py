"""The step arena with the C++ consumer (odb_synth consume): every byte of every sample through the daemon's
shared-memory step arena, and the same run as frames when the consumer declines it (docs/shm.md)."""
from __future__ import annotations

import pytest

from odbtest import Daemon, consume, epochs, finish, produce


@pytest.mark.parametrize("plane", ["shm", "zmq"])
def test_every_byte_through_the_step_arena_or_frames(tmp_path, plane):
    d = Daemon(tmp_path, config="grouping: {max_tokens: 4096, window: 128}\n")
    try:
        d.wait_ready()
        c = consume(d.trainer, expected_producers=2,
                    extra=["--max-tokens", "4096", "--verify-payload", "full", "--data-plane", plane])
        producers = [produce(d.ingest, f"p{i}", 300, seed=i, id_offset=i * 100000,
                             extra=["--max-len", "1024", "--payload-bytes", "70001"])
                     for i in range(2)]
        for p in producers:
            rc, _, err = finish(p)
            assert rc == 0, err
        rc, out, err = finish(c)
        assert rc == 0, err + d.read_log()
        (e,) = epochs(out)
        assert e["ids"] == sorted(i * 100000 + k for i in range(2) for k in range(300))
        assert e["duplicates"] == 0 and e["failures"] == 0
        assert e["summary_received"] == 600 and e["summary_rejected"] == 0
        assert e["data_plane"] == plane
    finally:
        assert d.stop() == 0
