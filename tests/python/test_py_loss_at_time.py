"""Loss at equal time (bench/loss_at_time.py): the demo's held-out curves.

Runs examples/train_demo.py tiny, with held-out evaluation every few steps, and checks
that both methods record a curve of finite held-out losses that goes down, that the
training clock leaves evaluation out, that the held-out samples are never trained
(and every training sample is, once per epoch), plus the pieces of the benchmark
that need no training: the held-out split, the rank shards, the target crossing.
No timing thresholds: the clock checks are identities between recorded values.
"""
from __future__ import annotations

import collections
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from odbtest_py import run_train_demo  # noqa: E402

SAMPLES, HELDOUT, EPOCHS, EVAL_EVERY = 80, 16, 2, 3


@pytest.fixture(scope="module")
def demo() -> dict:
    cmd = [sys.executable, str(ROOT / "examples/train_demo.py"), "--json", "--quiet", "--record-ids",
           "--samples", str(SAMPLES), "--heldout", str(HELDOUT), "--epochs", str(EPOCHS),
           "--eval-every", str(EVAL_EVERY), "--max-len", "64", "--max-tokens", "256", "--d-model", "32",
           "--layers", "1", "--vocab", "64", "--lr", "1e-2", "--warmup-steps", "2", "--workers", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=600)  # a hang guard, not a timing check
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the ranks, their daemons and workers with it
        proc.communicate()
        pytest.fail("the demo hung")
    assert proc.returncode == 0, f"demo failed (rc {proc.returncode}):\n{err[-4000:]}"
    return json.loads(out)


@pytest.mark.parametrize("method", ["standard", "odb"])
def test_curve_has_finite_decreasing_heldout_loss(demo, method) -> None:
    run = demo[method]
    curve = run["curve"]
    assert len(curve) >= 4, curve
    losses = [c["heldout_loss"] for c in curve]
    assert all(x is not None and math.isfinite(x) for x in losses), losses
    first = curve[0]
    assert first["steps"] == 0 and first["tokens"] == 0 and first["train_loss"] is None
    # Both methods start from the same initialisation: the same held-out loss before any step.
    assert math.isclose(first["heldout_loss"], demo["odb" if method == "standard" else "standard"]["curve"][0]
                        ["heldout_loss"], rel_tol=1e-6)
    assert math.isclose(first["heldout_loss"], math.log(64), rel_tol=0.2)  # untrained: about uniform
    for key in ("seconds", "tokens", "steps", "samples"):
        values = [c[key] for c in curve]
        assert values == sorted(values), (key, values)
    # Points every EVAL_EVERY optimizer steps, at the start and at the end.
    steps = run["steps"]
    expected = list(range(0, steps + 1, EVAL_EVERY)) + ([steps] if steps % EVAL_EVERY else [])
    assert [c["steps"] for c in curve] == expected
    last = curve[-1]
    assert last["tokens"] == run["real_tokens"] and last["samples"] == run["samples"] == SAMPLES * EPOCHS
    assert math.isclose(last["epoch"], EPOCHS)
    assert run["final_heldout_loss"] == last["heldout_loss"]
    # Decreasing-ish: training lowers the held-out loss clearly, and the second half of the
    # curve is below the first point everywhere.
    assert last["heldout_loss"] < 0.9 * first["heldout_loss"], losses
    assert max(losses[len(losses) // 2:]) < first["heldout_loss"], losses
    assert all(c["train_loss"] is not None and math.isfinite(c["train_loss"]) for c in curve[1:])


@pytest.mark.parametrize("method", ["standard", "odb"])
def test_training_clock_excludes_evaluation(demo, method) -> None:
    run = demo[method]
    assert run["eval_seconds"] > 0
    # The clock the curve and tokens/s use stops at the end of training; evaluation is
    # on the wall clock only: train + eval fits in the wall time (would not if the
    # training clock had counted the evaluation).
    assert run["curve"][-1]["seconds"] == run["seconds"]
    assert run["seconds"] < run["wall_seconds"]
    assert run["seconds"] + run["eval_seconds"] <= run["wall_seconds"] + 1e-6
    assert math.isclose(run["real_tokens_per_s"], run["real_tokens"] / run["seconds"])


@pytest.mark.parametrize("method", ["standard", "odb"])
def test_heldout_samples_are_never_trained(demo, method) -> None:
    held = demo["heldout_ids"]
    assert len(held) == len(set(held)) == HELDOUT
    assert all(0 <= i < SAMPLES + HELDOUT for i in held)
    trained = collections.Counter(demo[method]["trained_ids"])
    assert not set(trained) & set(held), f"{method} trained held-out samples {sorted(set(trained) & set(held))}"
    # Every other sample is trained once per epoch.
    assert set(trained) | set(held) == set(range(SAMPLES + HELDOUT))
    assert set(trained.values()) == {EPOCHS}


def test_split_and_shards() -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    import train_demo

    train, held = train_demo.split_ids(100, 20, seed=3)
    assert len(held) == 20 and not set(train) & set(held) and sorted(train + held) == list(range(120))
    assert train_demo.split_ids(100, 20, seed=3) == (train, held)  # seeded
    assert train_demo.split_ids(100, 20, seed=4)[1] != held
    # odb's shards: disjoint, every id once; Standard's: padded to the same count per rank.
    odd = train[:-1]
    shards = [list(train_demo.ShardSampler(odd, r, 2, seed=0, pad=False)) for r in range(2)]
    assert sorted(shards[0] + shards[1]) == sorted(odd)
    padded = [list(train_demo.ShardSampler(odd, r, 2, seed=0, pad=True)) for r in range(2)]
    assert len(padded[0]) == len(padded[1]) and set(padded[0] + padded[1]) == set(odd)
    ranks = [train_demo.ShardSampler(train, r, 2, seed=0, pad=False) for r in range(2)]
    first = [list(s) for s in ranks]
    for s in ranks:
        s.set_epoch(1)
    second = [list(s) for s in ranks]
    assert second != first and sorted(second[0] + second[1]) == sorted(train)  # reshuffled, same ids


def test_time_to_target_crossing() -> None:
    import loss_at_time

    curve = [{"heldout_loss": 4.0, "seconds": 0.0, "tokens": 0}, {"heldout_loss": 3.0, "seconds": 10.0, "tokens": 100},
             {"heldout_loss": 1.0, "seconds": 20.0, "tokens": 300}, {"heldout_loss": 1.5, "seconds": 30.0, "tokens": 400},
             {"heldout_loss": 0.5, "seconds": 40.0, "tokens": 500}]
    assert loss_at_time.crossing(curve, 2.0, "seconds") == pytest.approx(15.0)  # halfway from 3.0 to 1.0
    assert loss_at_time.crossing(curve, 2.0, "tokens") == pytest.approx(200.0)
    assert loss_at_time.crossing(curve, 1.2, "seconds") == pytest.approx(19.0)  # the first crossing counts
    assert loss_at_time.crossing(curve, 5.0, "seconds") == 0.0
    assert loss_at_time.crossing(curve, 0.4, "seconds") is None


def test_target_rule_and_best_lr() -> None:
    import loss_at_time

    def run(final: float, tps: float) -> dict:
        curve = [{"heldout_loss": 5.0, "seconds": 0.0, "tokens": 0, "steps": 0},
                 {"heldout_loss": final, "seconds": 10.0, "tokens": 1000, "steps": 10}]
        return {"final_heldout_loss": final, "curve": curve, "real_tokens_per_s": tps, "samples_per_s": 1.0,
                "seconds": 10.0, "steps": 10, "real_tokens": 1000, "padding_fraction": 0.0}

    runs = {"1e-3": {"standard": run(1.0, 100.0), "odb": run(3.0, 200.0)},
            "1e-2": {"standard": run(2.0, 100.0), "odb": run(2.0, 200.0)}}
    a = loss_at_time.analyse(runs, margin=0.1)
    assert a["best_lr"] == {"standard": 1e-3, "odb": 1e-2}
    assert a["target"] == pytest.approx(2.2)  # 1.1 x the worse method's best final loss (odb's 2.0)
    for key in ("standard", "odb"):
        assert a["methods"][key]["seconds_to_target"] is not None  # both reach it by construction
    assert a["ratio_real_tokens_per_s"] == pytest.approx(2.0)


def test_stays_below_target() -> None:
    import loss_at_time

    curve = [{"heldout_loss": 4.0, "seconds": 0.0}, {"heldout_loss": 1.0, "seconds": 10.0},
             {"heldout_loss": 3.0, "seconds": 20.0}, {"heldout_loss": 1.0, "seconds": 30.0}]
    assert loss_at_time.crossing(curve, 2.0, "seconds") == pytest.approx(20.0 / 3)  # first reached
    assert loss_at_time.settled(curve, 2.0, "seconds") == pytest.approx(25.0)  # below for good from here
    assert loss_at_time.settled(curve, 0.5, "seconds") is None
    assert loss_at_time.settled(curve, 5.0, "seconds") == 0.0


def _run(final: float, tps: float, steps: int, real: int, reach_at: float) -> dict:
    """A run whose held-out loss falls linearly from 5.0 at 0 s to `final` at `reach_at` s."""
    curve = [{"heldout_loss": 5.0, "seconds": 0.0, "tokens": 0, "steps": 0},
             {"heldout_loss": final, "seconds": reach_at, "tokens": real, "steps": steps}]
    return {"final_heldout_loss": final, "curve": curve, "real_tokens_per_s": tps, "samples_per_s": 1.0,
            "seconds": reach_at, "steps": steps, "real_tokens": real, "padding_fraction": 0.0}


def test_budget_grid_best_config_and_matched_pairs() -> None:
    import loss_at_time

    # Main budget 512, joint runs: Standard 1000 steps (132 real tokens/step/rank), odb 250 (528).
    runs = {"1e-2": {"standard": _run(1.0, 100.0, 1000, 264000, 100.0), "odb": _run(1.5, 200.0, 250, 264000, 50.0)},
            "3e-2": {"standard": _run(2.0, 100.0, 1000, 264000, 100.0), "odb": _run(1.0, 200.0, 250, 264000, 40.0)}}
    budget_runs = {
        # Standard batch 8: 250 steps (528 real tokens/step/rank), its best LR 3e-2 reaches 2.0 at 30 s.
        "standard:2048": {"1e-2": _run(3.0, 300.0, 250, 264000, 30.0), "3e-2": _run(1.0, 300.0, 250, 264000, 30.0)},
        # odb budget 256: 500 steps (264), never below 3.0: does not reach the target.
        "odb:256": {"1e-2": _run(3.0, 150.0, 500, 264000, 60.0)},
    }
    a = loss_at_time.analyse(runs, margin=0.0)
    assert a["target"] == pytest.approx(1.0)
    b = loss_at_time.analyse_budgets(runs, budget_runs, 512, a["target"], world=2, max_len=256)
    c = b["configs"]
    assert set(c) == {"standard:512", "odb:512", "standard:2048", "odb:256"}
    assert c["standard:512"]["lr"] == 1e-2 and c["odb:512"]["lr"] == 3e-2 and c["standard:2048"]["lr"] == 3e-2
    assert c["standard:512"]["real_tokens_per_step_rank"] == pytest.approx(132.0)
    assert c["odb:256"]["real_tokens_per_step_rank"] == pytest.approx(264.0)
    assert c["odb:256"]["seconds_to_target"] is None
    assert c["standard:2048"]["label"] == "Standard, batch 8 (2048 tokens)"
    # Each method's fastest configuration to the target; Standard's bigger batch wins here, so odb loses.
    assert b["fastest"] == {"standard": "standard:2048", "odb": "odb:512"}
    assert b["best_vs_best_speedup"] == pytest.approx(30.0 / 40.0)
    assert b["best_vs_best_ratio_real_tokens_per_s"] == pytest.approx(200.0 / 300.0)
    # Matched granularity: batch 2 (132) pairs with odb 256 (264), batch 8 (528) with odb 512 (528).
    pairs = {m["standard"]: m for m in b["matched"]}
    assert pairs["standard:512"]["odb"] == "odb:256" and pairs["standard:512"]["speedup"] is None
    assert pairs["standard:2048"]["odb"] == "odb:512"
    assert pairs["standard:2048"]["granularity_ratio"] == pytest.approx(1.0)
    assert pairs["standard:2048"]["speedup"] == pytest.approx(0.75)
    assert b["grid_target"] is None  # no main reference loss given: no tighter target
    tight = loss_at_time.analyse_budgets(runs, budget_runs, 512, 1.1, world=2, max_len=256, main_worse=1.0)
    assert tight["grid_target"] == pytest.approx(1.1)  # 1.1 x max(best final: Standard 1.0, odb 1.0)
    assert tight["fastest_to_grid_target"] == {"standard": "standard:2048", "odb": "odb:512"}
    result = {"analysis": dict(a, budgets=b), "config": {"max_tokens": 512, "lrs": ["1e-2", "3e-2"],
                                                         "budget_lrs_list": ["1e-2"]}}
    text = "\n".join(loss_at_time.budget_markdown(result))
    assert "odb speed-up x0.75" in text and "not reached" in text


def test_demo_methods_option() -> None:
    bad = subprocess.run([sys.executable, str(ROOT / "examples/train_demo.py"), "--methods", "standard,bogus"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--methods" in bad.stderr
    summary = run_train_demo(["--methods", "odb", "--samples", "24", "--heldout", "4", "--epochs", "1",
                              "--eval-every", "0", "--max-len", "32", "--max-tokens", "64", "--d-model", "16",
                              "--layers", "1", "--vocab", "32", "--workers", "1"], timeout=600)
    assert summary["methods"] == ["odb"] and "standard" not in summary and "ratio_real_tokens_per_s" not in summary
    assert summary["odb"]["samples"] == 24 and len(summary["odb"]["curve"]) == 2


def test_equal_recipe_figures() -> None:
    """odb's share of its tokens/s ratio kept in time to target, and the figures at Standard's best LR."""
    import loss_at_time

    # Standard best at 1e-2 (reaches 2.2 at 100 s); odb best at 3e-2 (at 40 s); odb at 1e-2 at 50 s.
    runs = {"1e-2": {"standard": _run(2.0, 100.0, 100, 10000, 100.0), "odb": _run(2.0, 250.0, 100, 10000, 50.0)},
            "3e-2": {"standard": _run(3.0, 100.0, 100, 10000, 100.0), "odb": _run(1.5, 250.0, 100, 10000, 40.0)}}
    a = loss_at_time.analyse(runs, margin=0.0)
    assert a["best_lr"] == {"standard": 1e-2, "odb": 3e-2} and a["target"] == pytest.approx(2.0)
    assert a["time_to_target_speedup"] == pytest.approx(100.0 / (40.0 * 3.0 / 3.5))  # odb crosses 2.0 early
    assert a["speedup_over_rate_ratio"] == pytest.approx(a["time_to_target_speedup"] / 2.5)
    same = a["same_lr"]
    assert same["lr"] == 1e-2 and same["seconds_to_target"] == {"standard": 100.0, "odb": 50.0}
    assert same["speedup"] == pytest.approx(2.0) and same["ratio_real_tokens_per_s"] == pytest.approx(2.5)


def test_demo_seeds_and_token_schedule() -> None:
    """--seeds 2: each seed a job of its own, the summary's mean and spread are of those (run with the
    same recipe and the token-driven cosine schedule, odb.lr_by_tokens, for both methods)."""
    cmd = [sys.executable, str(ROOT / "examples/train_demo.py"), "--json", "--quiet", "--samples", "48",
           "--heldout", "8", "--seeds", "2", "--global-batch", "8", "--schedule", "cosine", "--eval-every", "0",
           "--max-len", "48", "--max-tokens", "192", "--d-model", "16", "--layers", "1", "--vocab", "64",
           "--warmup-steps", "1", "--workers", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["seeds"] == [0, 1] and [r["seed"] for r in out["per_seed"]] == [0, 1]
    for m in ("standard", "odb"):
        losses = [r[m]["final_heldout_loss"] for r in out["per_seed"]]
        mean, half = out["over_seeds"][m]["final_heldout_loss"]["mean"], out["over_seeds"][m]["final_heldout_loss"]["spread"]
        assert mean == pytest.approx(sum(losses) / 2) and half == pytest.approx(abs(losses[0] - losses[1]) / 2)
        assert out[m]["final_heldout_loss"] == losses[0]  # the table's figures are the first seed's


def test_every_method_of_the_joint_runs_against_one_target() -> None:
    """--peers: each method at its best LR, one target for all, odb's best mode against the fastest peer."""
    import loss_at_time

    runs = {"1e-2": {"methods": ["standard", "packed", "odb", "odb_packed"],
                     "standard": _run(2.0, 100.0, 100, 10000, 100.0), "packed": _run(2.2, 150.0, 100, 10000, 60.0),
                     "odb": _run(2.0, 200.0, 100, 10000, 50.0), "odb_packed": _run(2.0, 220.0, 100, 10000, 45.0)},
            "3e-2": {"methods": ["standard", "packed", "odb", "odb_packed"],
                     "standard": _run(3.0, 100.0, 100, 10000, 100.0), "packed": _run(2.1, 150.0, 100, 10000, 80.0),
                     "odb": _run(2.5, 200.0, 100, 10000, 50.0), "odb_packed": _run(2.5, 220.0, 100, 10000, 45.0)}}
    p = loss_at_time.analyse_peers(runs, margin=0.0)
    assert p["methods"]["packed"]["lr"] == 3e-2 and p["target"] == pytest.approx(2.1)  # packed's best is the worst
    assert p["methods"]["standard"]["seconds_to_target"] == pytest.approx(100.0 * 2.9 / 3.0)
    # packed reaches 2.1 at 80 s (its final point), before Standard (96.7 s); odb_packed at 43.5 s
    assert p["best_odb_mode"] == "odb_packed" and p["best_peer"] == "packed"
    assert p["time_to_target_speedup_vs_best_peer"] == pytest.approx(80.0 / (45.0 * 2.9 / 3.0))
    text = "\n".join(loss_at_time.peers_markdown({"analysis": {"peers": p}}))
    assert "odb_packed" in text and "fastest peer (packed)" in text
