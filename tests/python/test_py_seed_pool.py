"""bench/seed_pool.py: several runs of train_demo --json pooled per method and seed.

The figures are checked against values worked out by hand on small summaries in both layouts
train_demo writes (several seeds with per_seed; one seed without), so a pooling that weighs runs
instead of seeds, or that mixes seeds in the run-to-run spread, fails.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import seed_pool  # noqa: E402


def _multi(path: Path, per_seed: dict) -> Path:
    """A --seeds N summary: {seed: {method: loss}}."""
    methods = sorted({m for v in per_seed.values() for m in v})
    doc = {"seeds": sorted(per_seed), "methods": methods,
           "per_seed": [{"seed": s, **{m: {"final_heldout_loss": l, "steps": 10} for m, l in v.items()}}
                        for s, v in sorted(per_seed.items())]}
    path.write_text(json.dumps(doc))
    return path


def _single(path: Path, seed: int, method: str, loss: float) -> Path:
    """A one-seed summary (no per_seed), as `--seed S` writes it."""
    path.write_text(json.dumps({"seeds": [seed], "methods": [method],
                                method: {"final_heldout_loss": loss, "steps": 10}}))
    return path


@pytest.fixture
def files(tmp_path: Path) -> list:
    return [_multi(tmp_path / "a.json", {0: {"standard": 0.60, "odb": 0.62}, 1: {"standard": 0.70, "odb": 0.70},
                                         2: {"standard": 0.65, "odb": 0.68}}),
            _single(tmp_path / "b.json", 0, "odb", 0.66)]


def test_seed_means_weigh_each_seed_once_and_the_run_spread_stays_within_seeds(files: list) -> None:
    runs = [r for f in files for r in seed_pool.runs_of(json.loads(f.read_text()))]
    res = seed_pool.pool(runs)
    odb, std = res["odb"], res["standard"]
    assert odb["runs"] == 4 and odb["seeds"] == [0, 1, 2]
    # seed 0 ran twice (0.62, 0.66): its mean 0.64 counts once; the runs' plain mean would be 0.665
    assert odb["mean"] == pytest.approx((0.64 + 0.70 + 0.68) / 3)
    assert odb["within_seed_sd"] == pytest.approx(math.sqrt(0.02 ** 2 + 0.02 ** 2))
    assert math.isnan(std["within_seed_sd"])  # every seed of Standard ran once
    assert std["mean"] == pytest.approx(0.65) and std["seed_sd"] == pytest.approx(0.05)
    assert odb["vs_reference"] == pytest.approx(odb["mean"] - 0.65)
    assert odb["vs_reference_se"] == pytest.approx(math.hypot(odb["seed_sd"] / math.sqrt(3), 0.05 / math.sqrt(3)))
    diffs = [0.64 - 0.60, 0.70 - 0.70, 0.68 - 0.65]
    assert odb["paired"] == pytest.approx(sum(diffs) / 3) and odb["paired_seeds"] == 3
    mean = sum(diffs) / 3
    assert odb["paired_se"] == pytest.approx(math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2 / 3))


def test_command_line_prints_every_method_and_names_a_bad_file(files: list, tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "bench/seed_pool.py")]
    out = subprocess.run(cmd + [str(f) for f in files] + ["--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout)) == {"odb", "standard"}
    bad = tmp_path / "bad.json"
    bad.write_text('{"seeds": [0, 1], "methods": ["odb"], "odb": {"final_heldout_loss": 1.0}}')
    out = subprocess.run(cmd + [str(files[0]), str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "bad.json" in out.stderr and "per_seed" in out.stderr
