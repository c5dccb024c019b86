"""Issue 31 (first contact, round 2): what a new user meets with the defaults. Real odbd processes.

Each test names the failure it guards against: workers and an in-memory dataset of tensors, a window
target below one sample, start-up errors quoting other runs' log lines, the progress line of a windows
run and of a tiny epoch.
"""
from __future__ import annotations

import io
import time

import pytest
import torch

import odb
import tiny_lm
from odb.progress import Progress


class TensorDicts(torch.utils.data.Dataset):
    """A list of tensor dicts, the style docs/python.md uses (no lengths_fn: input_ids sets the length)."""

    def __init__(self, n: int) -> None:
        self.items = [{"input_ids": torch.arange(4 + i % 29, dtype=torch.int64)} for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def test_workers_take_an_in_memory_dataset_of_10000_tensor_dicts(run_dir, job_id) -> None:
    """Workers start by forkserver (the default): each tensor storage went to them as a file
    descriptor, and past ~128 samples every worker failed with a bare 'ValueError: too many fds'."""
    n = 10_000
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id)
    try:
        loader = odb.OdbDataLoader(TensorDicts(n), rank=0, world_size=1, run_dir=str(run_dir), num_workers=2)
        seen = [i for step in loader for i in step.sample_ids]
    finally:
        daemon.stop()
    assert sorted(seen) == list(range(n)), "every sample exactly once"


def test_a_window_target_below_one_sample_is_refused_saying_what_was_meant(run_dir, job_id) -> None:
    """optimizer.tokens_per_step: 1 (or 16 meant as 16 samples) made every optimizer step one sample,
    silently (56 steps an epoch instead of 2)."""
    corpus = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(60, seed=2, min_len=20, max_len=100, median=40))
    message = _epoch_error(run_dir, job_id, corpus, tiny_lm.daemon_config(256, optimizer={"tokens_per_step": 16}))
    assert "optimizer.tokens_per_step 16 is less than one sample" in message, message
    assert "not samples" in message and "16 samples: " in message, message


def native_error() -> type:
    from odb._native import native

    return native().OdbError


def _epoch_error(run_dir, job_id, corpus, config: dict) -> str:
    """One epoch of `corpus` through a fresh daemon with `config`, which must fail: the error's text."""
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=config)
    try:
        loader = odb.OdbDataLoader(corpus, rank=0, world_size=1, run_dir=str(run_dir), timeout_s=60)
        with pytest.raises(native_error()) as e:
            for _ in loader:
                pass
    finally:
        daemon.stop()
    return str(e.value)


def test_a_start_up_error_quotes_this_run_only(run_dir, job_id) -> None:
    """odbd-<rank>.log is appended across runs: the error quoted older daemons' lines (an earlier
    config error first) before the real one."""
    (run_dir / "odbd-0.log").write_text("".join(f"[old run] line {i}: config error in an OLDER RUN\n"
                                                for i in range(40)))
    with pytest.raises(native_error()) as e:
        odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config={"grouping": {"max_tokens": 0}})
    message = str(e.value)
    assert "OLDER RUN" not in message, message
    assert "grouping.max_tokens" in message, message
    assert "OLDER RUN" in (run_dir / "odbd-0.log").read_text()  # the log itself keeps its history


def test_progress_counts_optimizer_steps_and_micro_steps_apart_in_a_windows_run(run_dir, job_id) -> None:
    """A windows run printed 'steps 9' for 8 optimizer steps (it counted micro-steps)."""
    corpus = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(80, seed=3, min_len=4, max_len=120, median=30))
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id,
                              config=tiny_lm.daemon_config(128, optimizer={"tokens_per_step": 600}))
    try:
        loader = odb.OdbDataLoader(corpus, rank=0, world_size=1, run_dir=str(run_dir), progress=True)
        loader.progress_stream = io.StringIO()
        steps = list(loader)
    finally:
        daemon.stop()
    windows = sum(1 for s in steps if s.closes_window)
    assert len(steps) > windows >= 2, (len(steps), windows)
    last = loader.progress_stream.getvalue().splitlines()[-1]
    assert f"optimizer steps {windows}, micro-steps {len(steps)} (idle 0)" in last, last


def test_each_step_says_which_planning_round_made_it(run_dir, job_id) -> None:
    """odb.Step carries the header's round / round_first_step / round_steps (an example read them from the
    loader's private log): the rounds tile the epoch's steps in order."""
    corpus = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(120, seed=5, min_len=4, max_len=120, median=30))
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=tiny_lm.daemon_config(128))
    try:
        steps = list(odb.OdbDataLoader(corpus, rank=0, world_size=1, run_dir=str(run_dir)))
    finally:
        daemon.stop()
    rounds = {}
    for s in steps:
        assert s.round_steps >= 1 and s.round_first_step <= s.step_index < s.round_first_step + s.round_steps, s
        rounds.setdefault(s.round, set()).add((s.round_first_step, s.round_steps))
    assert all(len(v) == 1 for v in rounds.values()), rounds
    spans = sorted(next(iter(v)) for v in rounds.values())
    assert spans[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in zip(spans, spans[1:])), spans
    assert spans[-1][0] + spans[-1][1] == len(steps), (spans, len(steps))


def test_progress_gives_no_data_wait_share_for_a_tiny_epoch() -> None:
    """'data wait 99% (0.0s)': on an epoch of a fraction of a second the share says nothing."""
    tiny = Progress(0, 0, 10, stream=io.StringIO())
    tiny.start = time.monotonic() - 0.05  # an epoch of ~50 ms
    tiny.update(10, 100, 100, False, wait_s=0.049)
    assert "%" not in tiny.text().split("data wait")[1], tiny.text()
    assert "data wait 0.0s" in tiny.text(), tiny.text()
    long = Progress(0, 0, 10, stream=io.StringIO())
    long.start = time.monotonic() - 10.0
    long.update(10, 100, 100, False, wait_s=5.0)
    assert "data wait 50% (5.0s)" in long.text(), long.text()


def test_a_length_field_no_sample_carries_fails_the_job_at_the_first_sample(run_dir, job_id) -> None:
    """collate.length_field naming a tensor the samples do not have. Before: the daemon rejected every
    sample of the epoch one by one, and the trainer learnt it from the epoch's summary. Now the loader's
    workers measure the field the daemon names (odb.daemon_settings), so the first sample fails in its
    worker, naming the field and the config key, and nothing is sent."""
    corpus = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(2000, seed=2))
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config={"collate": {"length_field": "lengths"}})
    try:
        loader = odb.OdbDataLoader(corpus, rank=0, world_size=1, run_dir=str(run_dir), timeout_s=60)
        with pytest.raises(Exception) as e:
            for _ in loader:
                pass
    finally:
        daemon.stop()
    message = str(e.value)
    assert "needs 'lengths' (odbd's collate.length_field)" in message, message
    assert "epoch summary" not in message, message


def test_a_second_loader_on_a_daemon_that_ran_the_epoch_is_told_how_to_go_on(run_dir, job_id) -> None:
    """A second OdbDataLoader on the same daemon, starting at epoch 0 again, failed with a bare
    WRONG_EPOCH from a worker after its whole epoch was sent. Decision (docs/python.md): epochs on a
    daemon only go forward; the error says so and how to go on, and the way it names works."""
    corpus = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(30, seed=2))
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id)
    try:
        first = odb.OdbDataLoader(corpus, rank=0, world_size=1, run_dir=str(run_dir), timeout_s=60)
        assert sorted(i for s in first for i in s.sample_ids) == list(range(30))
        first.close()  # the session ends now (a closed loader's consumer is closed, not just dropped)
        after = odb.OdbDataLoader(corpus, rank=0, world_size=1, run_dir=str(run_dir), timeout_s=60)
        after.set_epoch(1)
        assert sorted(i for s in after for i in s.sample_ids) == list(range(30))
        after.close()
        again = odb.OdbDataLoader(corpus, rank=0, world_size=1, run_dir=str(run_dir), timeout_s=60)
        with pytest.raises(native_error()) as e:
            for _ in again:
                pass
    finally:
        daemon.stop()
    message = str(e.value)
    # The daemon's refusal of the epoch, or (when a worker's end of stream is refused first) the
    # worker's error with the loader's hint: both say what happened and what to do.
    assert "WRONG_EPOCH" in message and "already" in message and "set_epoch(" in message, message
