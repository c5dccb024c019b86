"""The step header reaches Python as a typed class (odb's StepInfo and
Rejection), with attributes and docstrings; dict-style access still works."""
from __future__ import annotations

import numpy as np
import pytest

import odb
from odb._native import native


def test_step_header_is_a_typed_class(run_dir, job_id) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id)
    try:
        consumer = odb.Consumer(daemon.trainer, 20000)
        consumer.start_epoch(0, 1)
        producer = odb.Producer(daemon.ingest, "typed", 0)
        for sid, n in ((1, 4), (2, 6)):
            ids = np.arange(n, dtype=np.int64)
            producer.send(sid, 0, n, 0, 0, [("input_ids", native().DTYPES["int64"], (n,), ids)])
        bad = np.arange(3, dtype=np.int64)  # tokens 9 over 3 rows: TOKENS_MISMATCH
        producer.send(3, 0, 9, 0, 0, [("input_ids", native().DTYPES["int64"], (3,), bad)])
        producer.end_stream(0)
        seen, rejections = [], []
        while True:
            delivery = consumer.next()
            if not delivery.is_step:
                break
            info = delivery.step
            assert isinstance(info, native().StepInfo)
            assert info.step_index == info["step_index"]
            assert info.get("no_such_field", 5) == 5
            with pytest.raises(KeyError):
                info["no_such_field"]
            assert "identical on every rank" in native().StepInfo.step_index.__doc__
            seen += list(info.sample_ids)
            rejections += list(info.rejections)
        assert sorted(seen) == [1, 2]
        (r,) = rejections
        assert isinstance(r, native().Rejection)
        assert (r.code, r.sample_id, r["code"]) == ("TOKENS_MISMATCH", 3, "TOKENS_MISMATCH")
        assert "input_ids" in r.message
        del producer
    finally:
        daemon.stop()
