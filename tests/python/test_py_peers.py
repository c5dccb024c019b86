"""The peers at the same recipe (examples/peers.py, train_demo.py --methods all; issue 33).

The plans of the four peer methods (length_grouped, packed, bucketing, kk_balanced) are checked
without training: every training sample once per epoch, every micro-batch within the memory
budget in its layout, Standard's samples per optimizer step where the method keeps them, the
Karmarkar-Karp split balanced, the buckets synchronised. Then a short `--methods all` run: every
method trains the same number of optimizer steps and the same loss tokens per optimizer step, each
within 2%, and every sample once. The progress line never shows a loss for an IDLE micro-step.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import peers  # noqa: E402
import tiny_lm  # noqa: E402
from odbtest_py import run_train_demo  # noqa: E402

WORLD, BATCH, ACCUMULATE, BUDGET = 2, 2, 4, 512
LENGTHS = tiny_lm.long_tail_lengths(1300, seed=5, max_len=256)
IDS = list(range(1200))  # 100 held out
WINDOW = round(BATCH * ACCUMULATE * WORLD * sum(LENGTHS[i] for i in IDS) / len(IDS))


def plan(method: str, epoch: int = 0) -> peers.Plan:
    return peers.plan_epoch(method, IDS, LENGTHS, WORLD, batch=BATCH, accumulate=ACCUMULATE, budget=BUDGET,
                            window_tokens=WINDOW, linear=384.0, buckets=30, seed=3, epoch=epoch)


def cost(method: str, ids) -> int:
    return sum(LENGTHS[i] for i in ids) if method in peers.PACKED_METHODS else len(ids) * max(LENGTHS[i] for i in ids)


@pytest.mark.parametrize("method", ["length_grouped", "packed", "bucketing", "kk_balanced"])
def test_every_sample_once_within_the_budget(method) -> None:
    for epoch in (0, 1):
        p = plan(method, epoch)
        flat = [i for step in p for rank in step for mb in rank for i in mb]
        assert sorted(flat) == IDS, f"{method}: not every sample exactly once"
        assert all(len(step) == WORLD for step in p)
        assert all(cost(method, mb) <= BUDGET for step in p for rank in step for mb in rank if mb)
    assert plan(method, 0) != plan(method, 1), "the same order in two epochs"
    assert plan(method, 0) == plan(method, 0), "not seeded"


@pytest.mark.parametrize("method", ["length_grouped", "packed", "kk_balanced"])
def test_standard_samples_per_optimizer_step(method) -> None:
    """Standard's optimizer step k holds BATCH x ACCUMULATE x WORLD samples: these methods keep the count
    (and packed and kk_balanced the very samples: Standard's order, train_demo.ShardSampler)."""
    import train_demo

    p = plan(method)
    per_step = BATCH * ACCUMULATE * WORLD
    assert [sum(len(mb) for rank in step for mb in rank) for step in p[:-1]] == [per_step] * (len(p) - 1)
    if method == "length_grouped":
        return
    shares = [list(train_demo.ShardSampler(IDS, r, WORLD, seed=3, pad=False)) for r in range(WORLD)]
    k = BATCH * ACCUMULATE
    for n, step in enumerate(p):
        standard = {i for s in shares for i in s[n * k:(n + 1) * k]}
        assert {i for rank in step for mb in rank for i in mb} == standard
        if method == "packed":  # each rank its own share, in order
            assert [[i for mb in rank for i in mb] for rank in step] == [s[n * k:(n + 1) * k] for s in shares]


def test_length_grouped_micro_batches_are_sorted_megabatches() -> None:
    order = peers.length_grouped_order(IDS, LENGTHS, BATCH * ACCUMULATE, seed=3, epoch=0)
    assert sorted(order) == IDS
    assert LENGTHS[order[0]] == max(LENGTHS[i] for i in IDS)  # the longest first (out of memory early)
    mega = min(len(IDS) // (4 * BATCH * ACCUMULATE), 50) * BATCH * ACCUMULATE
    for start in range(0, len(order), mega):  # every megabatch sorted, longest first (but the swapped heads)
        chunk = [LENGTHS[i] for i in order[start + 1:start + mega]]
        assert chunk == sorted(chunk, reverse=True)
    padded = sum(cost("length_grouped", mb) for step in plan("length_grouped") for rank in step for mb in rank)
    random_padded = sum(BATCH * max(LENGTHS[i] for i in IDS[k:k + BATCH]) for k in range(0, len(IDS), BATCH))
    assert padded < 0.8 * random_padded, "grouping by length removed little padding"


def test_karmarkar_karp_balances_and_keeps_sizes() -> None:
    values = [LENGTHS[i] * 384.0 + LENGTHS[i] ** 2 for i in IDS[:64]]
    parts = peers.karmarkar_karp(values, 4, equal_size=True)
    assert sorted(i for p in parts for i in p) == list(range(64)) and [len(p) for p in parts] == [16] * 4
    sums = [sum(values[i] for i in p) for p in parts]
    naive = [sum(values[i] for i in range(r, 64, 4)) for r in range(4)]
    assert max(sums) - min(sums) < 0.25 * (max(naive) - min(naive)), (sums, naive)
    assert max(sums) <= 1.02 * sum(values) / 4
    free = peers.karmarkar_karp([10, 9, 8, 7, 6, 5, 4], 3, equal_size=False)
    assert sorted(sum([10, 9, 8, 7, 6, 5, 4][i] for i in p) for p in free) == [16, 16, 17]
    with pytest.raises(ValueError):
        peers.karmarkar_karp([1, 2, 3], 2, equal_size=True)


def test_kk_balanced_ranks_get_equal_counts_and_micro_steps() -> None:
    for step in plan("kk_balanced"):
        assert len({sum(len(mb) for mb in rank) for rank in step}) == 1  # equal_size
        assert len({len(rank) for rank in step}) == 1  # the same micro-batches on every rank


def test_bucketing_draws_the_same_bucket_on_every_rank() -> None:
    bounds = peers.bucket_boundaries([LENGTHS[i] for i in IDS], 30)
    assert 10 <= len(bounds) <= 30 and bounds == sorted(bounds)
    micro = [parts for step in plan("bucketing") for parts in zip(*step)]
    same = [all(parts) and len({int(peers.np.searchsorted(bounds, LENGTHS[i])) for mb in parts for i in mb}) == 1
            for parts in micro]
    # every rank's micro-batch from one bucket, the same on every rank, until the buckets run dry on
    # some rank; then a tail of what partial buckets held
    synced = same.index(False) if False in same else len(same)
    assert synced >= 0.8 * len(micro) and not any(same[synced:]), same
    # token windows: the optimizer steps hold about WINDOW loss tokens each
    p = plan("bucketing")
    tokens = sum(LENGTHS[i] for i in IDS)
    assert abs(len(p) - tokens / WINDOW) <= 1


def test_progress_line_shows_no_loss_for_an_idle_micro_step() -> None:
    """Issue 31, item 8: the progress printed `loss 0.0000` on IDLE steps, and one step counter."""
    import train_demo

    idle = train_demo.progress_line("odb", 0, 12, 40, 3, True, 0.0, 0, 1234.0)
    assert "IDLE" in idle and "0.0000" not in idle and "loss" not in idle and "CE" not in idle
    assert "opt step   12" in idle and "micro-step    40" in idle and "(3 idle)" in idle
    busy = train_demo.progress_line("odb", 0, 12, 41, 3, False, 2.5 * 100, 100, 1234.0)
    assert "train CE  2.5000" in busy and "IDLE" not in busy


@pytest.fixture(scope="module")
def all_methods() -> dict:
    return run_train_demo(["--record-ids", "--methods", "all", "--samples", "480", "--heldout", "8",
                           "--global-batch", "8", "--eval-every", "0", "--max-len", "32", "--max-tokens", "64",
                           "--d-model", "16", "--layers", "1", "--vocab", "32", "--workers", "1", "--buckets",
                           "10"], timeout=1200)


def test_every_method_trains_the_same_recipe(all_methods) -> None:
    out = all_methods
    assert out["methods"] == ["standard", "length_grouped", "packed", "bucketing", "kk_balanced", "odb",
                              "odb_packed"]
    ref = out["standard"]
    for m in out["methods"]:
        run = out[m]
        assert abs(run["optimizer_steps"] / ref["optimizer_steps"] - 1) <= 0.02, (m, run["optimizer_steps"])
        per_step = run["real_tokens"] / run["optimizer_steps"]
        assert abs(per_step / (ref["real_tokens"] / ref["optimizer_steps"]) - 1) <= 0.02, (m, per_step)
        assert run["loss_tokens_per_optimizer_step"] == pytest.approx(per_step)
        trained = run["trained_ids"]
        if m != "standard":  # Standard's sampler repeats a sample to even the ranks out
            assert len(trained) == len(set(trained)) == 480, m
        assert not set(trained) & set(out["heldout_ids"])
        assert run["real_tokens_per_s"] > 0 and run["final_heldout_loss"] is not None
        busy = run["busy_seconds"]
        assert len(busy) == 2 and all(b > 0 for b in busy) and run["busy_max_over_mean"] >= 1.0
        assert len(run["busy_cpu_seconds"]) == 2 and all(b > 0 for b in run["busy_cpu_seconds"]), m
    # every method trains in rank processes of its own (train_demo's default)
    assert len({out[m]["trainer_pid"] for m in out["methods"]}) == len(out["methods"])
    for m in peers.PACKED_METHODS + ("odb_packed",):
        assert out[m]["padding_fraction"] == pytest.approx(0.0, abs=1e-9), m
    assert out["best_odb_mode"] in ("odb", "odb_packed") and out["best_peer"] not in ("odb", "odb_packed")


def test_peers_rounds_reports_each_round_and_the_cpu_view(all_methods) -> None:
    """bench/peers_rounds.py over two rounds of the short run: the per-round ratio of odb's best mode to
    that round's best peer, by the training clock and by busy CPU time (the load-robust view)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import peers_rounds

    second = {**all_methods, "odb": {**all_methods["odb"], "real_tokens_per_s": 1e9}}
    text = peers_rounds.table([all_methods, second])
    wall = [line for line in text.splitlines() if line.startswith("Per round") and "CPU" not in line]
    cpu = [line for line in text.splitlines() if line.startswith("Per round") and "CPU" in line]
    assert len(wall) == 1 and len(cpu) == 1

    def ratios(line: str) -> list:
        return [float(x.lstrip("x")) for x in line.rstrip(".").split(": ")[1].split(", ")]

    # a fast odb in the second round only changes that round's training-clock ratio, not the CPU view
    assert len(ratios(wall[0])) == 2 and ratios(wall[0])[1] > 1e3 > ratios(wall[0])[0] > 0
    first, again = ratios(cpu[0])
    assert first == again > 0
    for m in all_methods["methods"]:
        assert f"| {peers_rounds.LABELS[m]} | " in text.split("busy CPU, busiest rank")[1]


def test_recorded_steps_of_methods_in_their_own_processes(tmp_path) -> None:
    """--record-steps with a process per method: one record holding every method's micro-steps with
    their thread CPU seconds, which bench/peers_steps.py fits one cost model to."""
    record = tmp_path / "steps.json"
    out = run_train_demo(["--methods", "packed,odb_packed", "--samples", "160", "--heldout", "8",
                          "--global-batch", "8", "--eval-every", "0", "--max-len", "32", "--max-tokens", "64",
                          "--d-model", "16", "--layers", "1", "--vocab", "32", "--workers", "1",
                          "--record-steps", str(record)], timeout=600)
    assert out["packed"]["trainer_pid"] != out["odb_packed"]["trainer_pid"]
    rec = json.loads(record.read_text())
    assert sorted(rec["methods"]) == ["odb_packed", "packed"]
    assert not list(tmp_path.glob("steps.json.*"))  # the per-method parts are merged and removed
    for m in ("packed", "odb_packed"):
        ranks = rec["methods"][m]
        assert len(ranks) == 2 and all(ranks), m
        assert all(len(e) == 6 and e[5] >= 0 for log in ranks for e in log), m
        ids = sorted(i for log in ranks for e in log for i in e[1])
        assert ids == sorted(set(ids)) and len(ids) == 160, m
    fit = subprocess.run([sys.executable, str(ROOT / "bench/peers_steps.py"), str(record)], capture_output=True,
                         text=True, timeout=120)
    assert fit.returncode == 0, fit.stderr
    assert "shared fit" in fit.stdout and "\npacked " in fit.stdout and "\nodb_packed " in fit.stdout

