"""The loader's progress line: off by default when stderr is not a terminal
(CI, batch jobs); when on, it reports samples of the epoch's share, steps,
idle steps, tokens/s, padding and an ETA."""
from __future__ import annotations

import io

import pytest

import odb
import tiny_lm


def test_progress_reports_the_epoch_and_is_off_in_batch_runs(run_dir, job_id) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=tiny_lm.daemon_config(256))
    try:
        corpus = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(60, seed=2, min_len=4, max_len=100, median=20))
        quiet = odb.OdbDataLoader(corpus, rank=0, world_size=1, run_dir=str(run_dir))
        assert quiet.progress is False  # pytest's stderr is not a terminal
        loader = odb.OdbDataLoader(corpus, rank=0, world_size=1, run_dir=str(run_dir), progress=True)
        loader.progress_stream = io.StringIO()
        steps = sum(1 for _ in loader)
        lines = loader.progress_stream.getvalue().splitlines()
        assert lines, "no progress line"
        last = lines[-1]
        assert "[odb rank 0 epoch 0] samples 60/60" in last, last
        assert f"steps {steps} (idle 0)" in last and "padding" in last and "ETA 0s" in last, last
        assert last.endswith("(epoch done)")
    finally:
        daemon.stop()


def test_step_records_and_the_epoch_report(run_dir, job_id, tmp_path) -> None:
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=tiny_lm.daemon_config(256))
    try:
        corpus = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(80, seed=3, min_len=4, max_len=120, median=25))
        summary_dir = tmp_path / "summary"
        loader = odb.OdbDataLoader(corpus, rank=0, world_size=1, run_dir=str(run_dir), summary_dir=str(summary_dir))
        steps = [s.step_index for s in loader]
    finally:
        daemon.stop()
    from odb.epoch_report import load_records

    records = load_records(summary_dir)[0]
    assert sorted(r["step"] for r in records) == sorted(steps)
    assert sorted(n for r in records for n in r["lengths"]) == sorted(corpus.lengths)
    (png,) = odb.report(summary_dir)
    assert png.name == "odb-epoch0.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_two_ranks_shows_their_imbalance(tmp_path) -> None:
    import json

    for rank, padded in ((0, [100, 100]), (1, [300, 0])):
        with open(tmp_path / f"rank{rank}-epoch2.jsonl", "w") as f:
            for step, p in enumerate(padded):
                f.write(json.dumps({"epoch": 2, "rank": rank, "step": step, "idle": p == 0, "real": p // 2,
                                    "padded": p, "lengths": [p // 2] if p else []}) + "\n")
    (png,) = odb.report(tmp_path, tmp_path / "out")
    assert png == tmp_path / "out" / "odb-epoch2.png" and png.stat().st_size > 1000
    with pytest.raises(FileNotFoundError, match="no step records"):
        odb.report(tmp_path / "out")
