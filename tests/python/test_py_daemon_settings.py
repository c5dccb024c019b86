"""Each setting said once: the daemon tells the trainer client its job settings at session start
(SessionAck.settings, docs/protocol.md "Job settings"), and the loader takes them or refuses an argument
that disagrees (odb.daemon_settings, docs/python.md "Settings the daemon tells the loader"). Real odbd."""
from __future__ import annotations

import pytest

import odb
import tiny_lm
from odb._native import native
from odb.daemon_settings import reconcile

TARGET = 300  # optimizer.tokens_per_step of the daemon under test


def _loader(daemon: odb.DaemonProcess, **args) -> odb.OdbDataLoader:
    corpus = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(40, seed=3, max_len=48), vocab=64)
    return odb.OdbDataLoader(corpus, num_workers=0, rank=0, ingest_endpoint=daemon.ingest,
                             trainer_endpoint=daemon.trainer, timeout_s=90, **args)


def test_the_daemon_tells_its_settings_before_any_epoch(run_dir, job_id) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id,
                              config={"optimizer": {"tokens_per_step": TARGET}, "collate": {"packed": True}})
    try:
        consumer = native().Consumer(daemon.trainer, 20000)
        assert consumer.job_settings() == {"tokens_per_step": TARGET, "packed": True, "trainer_data_plane": "auto",
                                           "length_field": "input_ids", "ignore_index": -100}
        consumer.close()
    finally:
        daemon.stop()


def test_the_loader_takes_the_window_target_and_refuses_an_argument_that_disagrees(run_dir, job_id) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id,
                              config={"grouping": {"window": 16}, "optimizer": {"tokens_per_step": TARGET}})
    try:
        loader = _loader(daemon)  # tokens_per_optimizer_step=None, packed=None
        assert loader.tokens_per_optimizer_step is None
        # Before the first epoch (a schedule's length): the daemon's target, not "pass it yourself".
        assert loader.optimizer_steps_per_epoch() >= 1
        assert (loader.tokens_per_optimizer_step, loader.packed) == (TARGET, False)
        loader.set_epoch(0)
        steps = list(loader)
        assert steps and all(s.window_target == TARGET for s in steps)
        assert "cu_seqlens" not in steps[-1].batch  # padded, as the daemon said
        loader.close()

        wrong = _loader(daemon, tokens_per_optimizer_step=2 * TARGET)
        wrong.set_epoch(1)
        with pytest.raises(ValueError) as refused:
            next(iter(wrong))
        text = str(refused.value)
        for part in (f"tokens_per_optimizer_step={2 * TARGET}", f"optimizer.tokens_per_step: {TARGET}",
                     daemon.trainer):
            assert part in text, text
        packed = _loader(daemon, packed=True)
        with pytest.raises(ValueError, match=r"OdbDataLoader\(packed=True\) .* collate.packed: False"):
            packed.optimizer_steps_per_epoch()
    finally:
        daemon.stop()


def test_reconcile_fills_what_is_left_out_and_names_both_sides_of_a_disagreement() -> None:
    daemon = {"tokens_per_step": 512, "packed": True, "trainer_data_plane": "shm", "length_field": "input_ids",
              "ignore_index": None}
    assert reconcile(daemon, "ipc://d", tokens_per_optimizer_step=None, packed=None, data_plane="auto",
                     ignore_index=-100) == {"tokens_per_optimizer_step": 512, "packed": True, "data_plane": "auto",
                                            "ignore_index": -100}  # no labels collated: nothing to agree with
    assert reconcile(None, "ipc://d", tokens_per_optimizer_step=None, packed=False) == {
        "tokens_per_optimizer_step": None, "packed": False}  # a daemon older than the settings
    with pytest.raises(ValueError, match=r"data_plane='zmq'.* shm.trainer_data_plane: 'shm'"):
        reconcile(daemon, "ipc://d", data_plane="zmq")
    with pytest.raises(ValueError, match=r"OdbDataLoader\(ignore_index=-1\).* pad_value of labels\): -100"):
        reconcile(dict(daemon, ignore_index=-100), "ipc://d", ignore_index=-1)
    with pytest.raises(TypeError):
        reconcile(daemon, "ipc://d", window=3)


def test_the_loader_counts_loss_tokens_with_the_daemons_labels_pad_value(run_dir, job_id) -> None:
    """ignore_index left None: the pad value odbd gives labels (collate.fields) is the value that bears no loss."""
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id,
                              config={"collate": {"fields": [{"name": "labels", "pad_value": -1}]}})
    try:
        loader = _loader(daemon)
        assert loader.ignore_index is None
        loader.loss_tokens_per_epoch()  # before the first epoch: connects and asks the daemon
        assert loader.ignore_index == -1
        loader.close()
        wrong = _loader(daemon, ignore_index=-100)
        wrong.set_epoch(0)
        with pytest.raises(ValueError, match=r"OdbDataLoader\(ignore_index=-100\) .* pad_value of labels\): -1"):
            next(iter(wrong))
    finally:
        daemon.stop()


def test_the_loaders_workers_measure_the_daemons_length_field(run_dir, job_id) -> None:
    """collate.length_field said once: samples without input_ids, measured by the daemon's field."""
    import torch
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config={"collate": {"length_field": "ids"}})
    try:
        lengths = [3, 9, 5, 12, 7, 4]
        data = [{"ids": torch.arange(n, dtype=torch.int64)} for n in lengths]
        loader = odb.OdbDataLoader(data, num_workers=1, rank=0, ingest_endpoint=daemon.ingest,
                                   trainer_endpoint=daemon.trainer, timeout_s=90)
        assert loader.loss_tokens_per_epoch() == (sum(lengths), False)  # the probe measured "ids"
        assert loader.length_field == "ids"
        loader.set_epoch(0)
        steps = [s for s in loader if not s.idle]
        assert sorted(n for s in steps for n in s.lengths) == sorted(lengths)
        assert all("ids" in s.batch and "input_ids" not in s.batch for s in steps)
        loader.close()
    finally:
        daemon.stop()
