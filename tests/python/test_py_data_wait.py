"""Data stalls (issue 23 item 7, the loader's part): the trainer's wait in next(loader) per step is
measured, shown in the progress line and written to the step records (summary_dir)."""
from __future__ import annotations

import io
import json
import time

import odb
import tiny_lm

N, PREPROCESS_S = 30, 0.02


class SlowCorpus(tiny_lm.SyntheticCorpus):
    """Preprocessing that takes PREPROCESS_S per sample: a trainer that does nothing waits on it."""

    def __getitem__(self, i):
        time.sleep(PREPROCESS_S)  # the stall being measured, not a synchronisation
        return super().__getitem__(i)


def test_the_trainers_wait_for_data_is_measured_shown_and_recorded(run_dir, job_id, tmp_path) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=tiny_lm.daemon_config(256))
    try:
        corpus = SlowCorpus(tiny_lm.long_tail_lengths(N, seed=4, min_len=4, max_len=100, median=20))
        loader = odb.OdbDataLoader(corpus, rank=0, world_size=1, run_dir=str(run_dir), progress=True,
                                   summary_dir=str(tmp_path), dummy_sample=tiny_lm.SyntheticCorpus([4])[0])
        loader.progress_stream = io.StringIO()
        steps = sum(1 for _ in loader)  # a trainer with no work: all of the epoch is waiting on data
    finally:
        daemon.stop()
    # Every sample's preprocessing ran while the trainer waited (one worker thread): a lower bound.
    assert loader.data_wait_s >= N * PREPROCESS_S, loader.data_wait_s
    records = [json.loads(line) for line in (tmp_path / "rank0-epoch0.jsonl").read_text().splitlines()]
    assert len(records) == steps and all(r["wait_ms"] >= 0 for r in records)
    assert abs(sum(r["wait_ms"] for r in records) / 1000.0 - loader.data_wait_s) < 1e-3 * steps
    last = loader.progress_stream.getvalue().splitlines()[-1]
    assert "data wait " in last and f"({loader.data_wait_s:.1f}s)" in last, last


def test_the_epoch_report_names_the_rank_that_waited_on_data(tmp_path) -> None:
    from odb.epoch_report import data_wait_by_rank, load_records

    for rank, waits in ((0, [5.0, 5.0]), (1, [400.0, 900.0])):
        with open(tmp_path / f"rank{rank}-epoch0.jsonl", "w") as f:
            for step, w in enumerate(waits):
                f.write(json.dumps({"epoch": 0, "rank": rank, "step": step, "idle": False, "real": 10, "padded": 12,
                                    "lengths": [10], "wait_ms": w}) + "\n")
    assert data_wait_by_rank(load_records(tmp_path)[0]) == {0: 0.01, 1: 1.3}
    (png,) = odb.report(tmp_path)
    assert png.stat().st_size > 1000
