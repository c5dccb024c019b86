"""The loader's progress line: off by default when stderr is not a terminal
(CI, batch jobs); when on, it reports samples of the epoch's share, steps,
idle steps, tokens/s, padding and an ETA."""
from __future__ import annotations

import io

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
