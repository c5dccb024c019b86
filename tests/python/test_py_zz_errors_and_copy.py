"""Zero copy, and failures that must raise a clear exception instead of hanging:
a wrong daemon address, a daemon dying mid-epoch, a worker raising in preprocessing."""
from __future__ import annotations

import gc
import signal
import time

import pytest
import torch

import odb
import tiny_lm


class SlowCorpus(tiny_lm.SyntheticCorpus):
    def __getitem__(self, i: int):
        time.sleep(0.02)
        return super().__getitem__(i)


def test_batch_tensors_are_views_of_the_received_frames(run_dir, job_id) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=tiny_lm.daemon_config(256))
    try:
        ds = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(40, seed=2, max_len=100))
        loader = odb.OdbDataLoader(ds, rank=0, world_size=1, run_dir=str(run_dir), timeout_s=20)
        kept, steps = [], 0
        for step in loader:
            steps += 1
            for name, t in step.batch.items():
                assert t.data_ptr() == step.frame_address(name), name  # same buffer: no copy
            kept.append((step.batch["input_ids"], step.sample_ids, step.lengths))
        assert steps >= 2
        del step
        gc.collect()
        # The frames outlive the Step: the tensors keep the delivery alive.
        for ids, sample_ids, lengths in kept:
            for row, (i, n) in enumerate(zip(sample_ids, lengths)):
                assert torch.equal(ids[row, :n], ds[i]["input_ids"])
    finally:
        daemon.stop()


def test_len_says_why_there_is_none(run_dir) -> None:
    loader = odb.OdbDataLoader(tiny_lm.SyntheticCorpus([5, 6]), rank=0, world_size=1, run_dir=str(run_dir))
    with pytest.raises(TypeError, match="no length before the epoch ran"):
        len(loader)
    assert len(loader.indices()) == 2  # what an LR schedule can count instead
    assert loader  # truthiness does not go through len()


def test_wrong_daemon_address_raises_at_once(run_dir) -> None:
    loader = odb.OdbDataLoader(tiny_lm.SyntheticCorpus([5, 6]), rank=0, world_size=1,
                               run_dir=str(run_dir / "nowhere"), timeout_s=5)
    start = time.monotonic()
    with pytest.raises(odb.OdbError, match="no odbd listens at"):
        next(iter(loader))
    assert time.monotonic() - start < 5  # a file check, not the 5 s step timeout after a connect


def test_missing_binary_says_to_build(run_dir) -> None:
    with pytest.raises(FileNotFoundError, match="build"):
        odb.spawn_daemon(0, 1, run_dir, odbd=run_dir / "no-odbd")


@pytest.mark.parametrize("registered", [False, True])
def test_daemon_dying_mid_epoch_raises(run_dir, job_id, registered) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=tiny_lm.daemon_config(128))
    if not registered:  # a daemon started by someone else: known by the pid in its socket's lock file
        odb.daemon._SPAWNED.pop(daemon.trainer)
    try:
        ds = SlowCorpus(tiny_lm.long_tail_lengths(400, seed=3, max_len=60))
        loader = odb.OdbDataLoader(ds, num_workers=1, rank=0, world_size=1, run_dir=str(run_dir), timeout_s=60)
        start = None
        with pytest.raises(odb.OdbError) as info:
            for i, step in enumerate(loader):
                if i == 1:
                    # A generous timeout until now (a loaded machine starts the worker slowly);
                    # from here the short one is what an unregistered daemon's death is found by.
                    loader.timeout_s = 8
                    daemon.proc.send_signal(signal.SIGKILL)
                    start = time.monotonic()
        assert start is not None, f"raised before the daemon was killed: {info.value!r}"
        assert time.monotonic() - start < 40
        if registered:
            assert "exited" in str(info.value)
        else:
            assert f"odbd (pid {daemon.pid}) serving" in str(info.value) and "is gone" in str(info.value)
    finally:
        daemon.stop()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_worker_exception_reaches_the_trainer(run_dir, job_id, num_workers) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=tiny_lm.daemon_config(256))
    try:
        ds = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(60, seed=4, max_len=60), fail_on=30)
        loader = odb.OdbDataLoader(ds, num_workers=num_workers, rank=0, world_size=1, run_dir=str(run_dir),
                                   timeout_s=60)
        with pytest.raises(odb.OdbWorkerError, match="corrupt record 30"):
            for _ in loader:
                pass
    finally:
        daemon.stop()


def test_native_producer_rejects_bad_buffers(run_dir, job_id) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id)
    try:
        p = odb.Producer(daemon.ingest, "p-bad", 0)
        x = torch.arange(10, dtype=torch.int64).numpy()
        with pytest.raises(ValueError, match="bytes"):
            p.send(1, 0, 10, 0, 0, [("input_ids", 5, (11,), x)])
        with pytest.raises(ValueError, match="contiguous"):
            p.send(1, 0, 5, 0, 0, [("input_ids", 5, (5,), x[::2])])
        del p
    finally:
        daemon.stop()


def test_leaving_an_epoch_early_stops_the_workers_blocked_on_the_daemon(run_dir, job_id) -> None:
    """A trainer that leaves its loop (an exception, a break) while the data workers wait for
    credit (the buffer is full: nobody consumes) must not leave them blocked: the loader cancels
    their sends (Producer.cancel) instead of calling DataLoader's private _shutdown_workers."""
    import multiprocessing

    config = tiny_lm.daemon_config(256, buffer={"max_bytes": 65536})
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=config)
    try:
        ds = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(2000, seed=4, max_len=60))
        loader = odb.OdbDataLoader(ds, num_workers=2, rank=0, world_size=1, run_dir=str(run_dir), timeout_s=60)
        before = {p.pid for p in multiprocessing.active_children()}  # earlier tests' leftovers
        for count, _ in enumerate(loader):
            if count == 2:
                workers = [p for p in multiprocessing.active_children() if p.pid not in before]
                break
        assert len(workers) == 2
        gc.collect()
        for w in workers:
            w.join(30)  # well below the workers' send timeout (120 s)
        # Ended on their own (exit code 0), not terminated by DataLoader's teardown (-SIGTERM).
        assert [w.exitcode for w in workers] == [0, 0], "data workers were still blocked when the trainer left"
    finally:
        daemon.stop()


def _drop_inherited_clients(loader, consumer, producer, q) -> None:
    """In a fork of a trainer: the loader, Consumer and Producer are copies of the parent's."""
    import gc

    errors = []
    for what, call in (("Consumer.next", consumer.next), ("Consumer.start_epoch", lambda: consumer.start_epoch(1)),
                       ("Producer.end_stream", lambda: producer.end_stream(0))):
        try:
            call()
            errors.append(f"{what} worked in a fork")
        except odb.OdbError as e:
            if "fork" not in str(e):
                errors.append(f"{what}: {e}")
    del loader, consumer, producer
    gc.collect()  # the parent's Consumer inside the loader is freed here, in the child
    q.put(errors)


def test_a_forked_child_of_a_trainer_drops_its_inherited_clients_without_hanging(run_dir, job_id) -> None:
    """ZeroMQ contexts do not survive fork: a Consumer freed in a forked child (a fork-context
    DataLoader worker, a forked rank garbage-collecting an earlier test's loader) spun forever in
    zmq_ctx_term. The copy refuses every call naming fork, and freeing it returns at once."""
    import multiprocessing

    import zmq

    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=tiny_lm.daemon_config(256))
    other = zmq.Context().socket(zmq.ROUTER)  # where the extra clients connect (not the daemon)
    try:
        other.bind(f"ipc://{run_dir}/other.sock")
        corpus = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(64, seed=1, max_len=64), vocab=64)
        loader = odb.OdbDataLoader(corpus, num_workers=1, rank=0, world_size=1, run_dir=str(run_dir), timeout_s=30)
        it = iter(loader)
        next(it)  # the loader's Consumer is connected and its ZeroMQ threads run
        consumer = odb.Consumer(f"ipc://{run_dir}/other.sock", 1000)
        producer = odb.Producer(f"ipc://{run_dir}/other.sock", "forked-copy", 0)
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        child = ctx.Process(target=_drop_inherited_clients, args=(loader, consumer, producer, q))
        child.start()
        child.join(30)
        if child.is_alive():
            child.kill()
            pytest.fail("the forked child hung freeing its copies of the trainer's odb clients")
        assert child.exitcode == 0
        assert q.get(timeout=5) == []
        for _ in it:  # the parent's loader is untouched
            pass
    finally:
        other.close(0)
        daemon.stop()
