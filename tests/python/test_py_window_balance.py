"""Balance over the window (docs/alignment.md, invariant 6), end to end: the main job's trainer in
reproducible mode, through two real daemons, records every rank's micro-steps; each window's
slowest rank must be close to the mean rank (padded tokens). Without the daemons' re-layout
this run's windows are 1.132 over the mean (16 IDLE rank-steps); with it 1.052 (9).
And bench/window_balance.py's figures on a hand-made record."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import window_balance  # noqa: E402


def test_figures_of_a_hand_made_record():
    # Two ranks, one window of two micro-steps: rank 0 runs samples of 4 + 4 tokens, then one of 2;
    # rank 1 one of 2 tokens, then an IDLE step.
    record = {
        "lengths": [4, 4, 2, 2],
        "methods": {"odb": [
            [[0, [0, 1], 8, False, False], [0, [2], 2, True, False]],
            [[0, [3], 2, False, False], [0, [], 0, True, True]],
        ]},
    }
    f = window_balance.window_balance(record, "odb")
    assert f["windows"] == 1 and f["micro_steps"] == 2 and f["idle_rank_steps"] == 1
    assert f["padded_tokens"] == 8 + 2 + 2
    assert f["window_max_over_mean"] == 10 / 6  # rank 0: 8 + 2, rank 1: 2; mean 6
    assert f["step_max_over_mean"] == (8 + 2) / 6
    assert f["window_max_over_bound"] == 10 / 6  # max(4, (4 + 4 + 2 + 2) / 2)


def test_main_job_windows_are_even_over_the_ranks(tmp_path):
    record = tmp_path / "steps.json"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               ODB_NATIVE_LIB=str(ROOT / ".build/client/python/_odb_native.so"),
               ODB_ODBD=str(ROOT / ".build/src/daemon/odbd"))
    out = subprocess.run(
        ["/usr/bin/python3", str(ROOT / "examples/train_demo.py"), "--methods", "odb", "--deterministic",
         "--global-batch", "16", "--samples", "600", "--json", "--quiet", "--record-steps", str(record)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    f = window_balance.window_balance(json.loads(record.read_text()), "odb")
    assert f["windows"] == 38, f
    assert f["window_max_over_mean"] < 1.09, f
    assert f["idle_rank_steps"] <= 12, f
