"""A trainer whose connection blips right after it asked for an epoch still gets the epoch (a real odbd).

The daemon ignores a start_epoch it reads after the connection it came on closed (a late message from a
closed connection is no reconnect: docs/protocol.md), so the client re-sends its unanswered start_epoch
requests after a reconnect, and the daemon treats a repeated request for an epoch it already has as a
no-op. The blip is forced through the client's test seams: `_reconnect_for_test` drops the connection
and connects again (what ZeroMQ does by itself after a network blip), `_start_epoch_lost_for_test` records
a request as sent that the daemon never acts on (what it makes of one read after the close)."""
from __future__ import annotations

import time

import pytest
import torch

import odb
import tiny_lm

N = 40


def _send_epoch(daemon, epoch: int) -> None:
    from odb._native import native

    producer = odb.Producer(daemon.ingest, "p", 0)
    int64 = native().DTYPES["int64"]
    for sid in range(N):
        ids = torch.full((3 + sid % 5,), sid, dtype=torch.int64).numpy()
        producer.send(sid, epoch, int(ids.size), 0, 0, [("input_ids", int64, (int(ids.size),), ids)], seq=sid)
    producer.end_stream(epoch)
    del producer


def _receive_epoch(consumer, epoch: int) -> tuple:
    trained = []
    while True:
        delivery = consumer.next()
        if not delivery.is_step:
            return trained, delivery.summary
        assert delivery.step.epoch == epoch
        trained += list(delivery.step.sample_ids)


def _wait_log(daemon, text: str, times: int = 1, timeout: float = 30.0) -> None:
    """Waits until the daemon has logged `text` `times` times (an event, not a sleep, as synchronisation)."""
    deadline = time.monotonic() + timeout
    while daemon.log_text().count(text) < times:
        assert daemon.proc.poll() is None, daemon.log_tail()
        assert time.monotonic() < deadline, f"odbd did not log {text!r} {times} time(s):\n{daemon.log_tail()}"
        time.sleep(0.02)


@pytest.mark.parametrize("lost", [True, False], ids=["start_epoch_read_late", "start_epoch_read_in_time"])
def test_a_blip_after_start_epoch_still_gets_the_epoch_once(run_dir, job_id, lost) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=tiny_lm.daemon_config(max_tokens=64))
    try:
        consumer = odb.Consumer(daemon.trainer, 15000)
        # Epoch 0 as usual: the session is open and served.
        consumer.start_epoch(0, 1)
        _send_epoch(daemon, 0)
        trained, summary = _receive_epoch(consumer, 0)
        assert sorted(trained) == list(range(N)) and summary["emitted"] == N
        # Epoch 1: the request goes, and the connection drops before the daemon has answered it.
        if lost:
            consumer._start_epoch_lost_for_test(1, 1)
        else:
            consumer.start_epoch(1, 1)
        consumer._reconnect_for_test()
        _send_epoch(daemon, 1)
        trained, summary = _receive_epoch(consumer, 1)  # timed out after 15 s without the re-send
        assert consumer.reconnects >= 1
        # Once, whether the daemon had read the first request or not: a repeat starts nothing twice.
        assert sorted(trained) == list(range(N)), trained
        assert summary["epoch"] == 1 and summary["emitted"] == N and summary["received"] == N
        assert daemon.proc.poll() is None
    finally:
        daemon.stop()


def test_a_blip_while_the_epoch_ends_still_gets_the_epoch_once(run_dir, job_id) -> None:
    """The epoch ends on the daemon (all its steps and the summary sent) before the client has read any of
    it, and the connection blips: the client re-sends its request for the epoch (no answer has reached it),
    and the daemon must take that as the re-send it is, not as a new trainer asking for an ended epoch
    (WRONG_EPOCH). A race the suite once lost on a loaded machine, made certain here by waiting for the
    daemon's end-of-epoch line before the blip."""
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=tiny_lm.daemon_config(max_tokens=512))
    try:
        consumer = odb.Consumer(daemon.trainer, 15000)
        consumer.start_epoch(0, 1)
        _send_epoch(daemon, 0)
        _wait_log(daemon, "rank 0 epoch 0 done")
        consumer._reconnect_for_test()
        trained, summary = _receive_epoch(consumer, 0)
        assert consumer.reconnects >= 1
        assert sorted(trained) == list(range(N)), trained
        assert summary["epoch"] == 0 and summary["emitted"] == N
        # The daemon took the re-sent request for the ended epoch as one (it may read it after sending the rest).
        _wait_log(daemon, "which has ended; ignored")
        # A new trainer's request for the ended epoch (no re-send) is still refused, naming the next epoch.
        # (Once the daemon saw the old session go: until then a second trainer is a contender, refused
        # after the contender grace.)
        gone = daemon.log_text().count("disconnected")
        consumer.close()
        _wait_log(daemon, "disconnected", times=gone + 1)
        late = odb.Consumer(daemon.trainer, 15000)
        late.start_epoch(0, 1)
        with pytest.raises(odb.OdbError, match="WRONG_EPOCH.*start at epoch 1"):
            late.next()
        assert daemon.proc.poll() is None
    finally:
        daemon.stop()
