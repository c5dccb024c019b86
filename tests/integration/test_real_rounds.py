"""bench/real_rounds.py end to end at W = 2 and 4: real odbd daemons in network namespaces behind a
bridge with netem, and raw Gloo all-gathers over the same links; the harness measures, parses and fits.

Needs root (namespaces) and //bench:real_rounds_gloo (built by `bazel test //...`, or
`bazel build -c opt //bench:real_rounds_gloo`).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from odbtest import BIN, ROOT


def gloo_bin() -> str:
    candidates = [BIN / "bench/real_rounds_gloo"]
    found = subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=ROOT, capture_output=True, text=True)
    if found.returncode == 0:
        candidates.append(Path(found.stdout.strip()) / "bench/real_rounds_gloo")
    for path in candidates:
        if path.exists():
            return str(path)
    pytest.fail("bench/real_rounds_gloo is not built: bazel build -c opt //bench:real_rounds_gloo")


def test_four_daemons_measured_parsed_and_fitted(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("network namespaces need root (CI runs as root)")
    samples = 40
    done = subprocess.run(
        ["/usr/bin/python3", str(ROOT / "bench/real_rounds.py"), "--worlds", "2,4", "--samples", str(samples),
         "--iters", "5", "--delay-us", "50", "--rate-gbit", "0.2", "--prefix", "odbrrt", "--subnet", "10.219.9",
         "--gloo-bin", gloo_bin(), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "real_rounds.json").read_text())
    link = result["link"]
    assert link["one_way_delay_us"] == 50.0 and link["rate_gbit_s"] == 0.2
    assert link["delay"] in ("netem", "model")  # on the link where the kernel has netem, else in the model
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "odbrrt" not in left  # the namespaces are gone
    rows = result["rows"]
    assert [r["world"] for r in rows] == [2, 4]
    burst = link["tbf_burst_bytes"] or 0
    for r in rows:
        # Every sample of every rank was trained (verified by the consumers), over real rounds.
        assert r["samples_trained"] == r["world"] * samples
        assert r["rounds"] >= 1
        assert r["round_p50_us_max"] > 0 and r["raw_p50_us"]["msg"] > 0
        # The rate was on the links: in a ring all-gather each rank sends W - 1 blocks of 64 KiB through
        # its own shaped egress, which takes at least (bytes - bucket) / rate (0.2 Gbit/s = 200 bits/us).
        assert r["raw_p50_us"]["big"] >= ((r["world"] - 1) * 65536 - burst) * 8 / 200
        assert r["raw_p50_us"]["big_sizes_allgatherv"] >= ((r["world"] - 1) * 65536 - burst) * 8 / 200
        assert r["round_p50_us_min"] <= r["round_p50_us_median"] <= r["round_p50_us_max"]
        # Against the faster raw all-gather of the same bytes: Gloo's ring or Bruck's.
        assert r["raw_p50_us"]["msg_bruck"] > 0 and r["raw_p50_us"]["big_bruck"] > 0
        assert r["raw_p50_us"][r["raw_baseline"]] == min(r["raw_p50_us"]["msg"], r["raw_p50_us"]["msg_bruck"])
        assert r["round_over_raw"] == pytest.approx(r["round_p50_us_median"] / r["raw_p50_us"][r["raw_baseline"]])
        assert r["round_over_raw_ring"] == pytest.approx(r["round_p50_us_median"] / r["raw_p50_us"]["msg"])
        # The daemon's peer group: ceil(log2 W) hops (Bruck) from 3 ranks up, the ring's W - 1 below.
        assert r["hops"] == {2: 1, 4: 2}[r["world"]]
        # Every round traced by every daemon (round_trace), and timed from the last rank's entry: never
        # longer than the round each daemon measured from its own entry (the one that entered last
        # measures the same span), with its planner thread's CPU inside it.
        last = r["round_from_last_entry"]
        assert last["collectives"] >= r["rounds"]  # the metric was read before the daemons stopped
        assert 0 < last["p50_us_median"] <= r["round_p50_us_max"] * 1.05 + 50
        assert 0 < last["cpu_p50_us"] <= r["round_p50_us_max"] + 50
        assert last["skew_p50_us"] >= 0
        for variant in ("msg", "msg_bruck"):
            raw = r["raw_from_last_entry"][variant]
            assert raw["collectives"] == 5 and raw["p50_us_median"] > 0
        assert r["round_over_raw_from_last_entry"] == pytest.approx(
            last["p50_us_median"] / min(r["raw_from_last_entry"][v]["p50_us_median"] for v in ("msg", "msg_bruck")))
    model = result["model"]
    assert set(model) >= {"alpha_us_per_hop", "beta_us_per_byte_hop", "c0_us", "c1_us_per_hop"}
    extra = result["extrapolation"]
    assert extra["world"] == 2560 and extra["step_ms"]["gpu_7b_h100"] > 0
    for scenario in extra["scenarios"].values():
        # The round is at least its planner CPU, and its fraction of a step is what it says.
        assert scenario["round_ms"] >= extra["planner_decode_cpu_ms"]
        assert scenario["per_step"]["gpu_7b_h100"] == pytest.approx(
            scenario["round_ms"] / extra["step_ms"]["gpu_7b_h100"])
    md = (tmp_path / "real_rounds.md").read_text()
    assert "| 4 |" in md and "gpu_7b_h100" in md and "from the last entry" in md


def test_partitioned_daemons_against_the_raw_partitioned_sequence(tmp_path):
    """--partition-ranks: the daemons plan in blocks (W = 4, blocks of 2) and the baseline is the raw
    sequence of the round's three collectives; the extrapolation is the partitioned round's."""
    if os.geteuid() != 0:
        pytest.fail("network namespaces need root (CI runs as root)")
    samples = 30
    done = subprocess.run(
        ["/usr/bin/python3", str(ROOT / "bench/real_rounds.py"), "--worlds", "2,4", "--samples", str(samples),
         "--iters", "5", "--repeat", "3", "--partition-ranks", "2", "--local-world-size", "1", "--prefix", "odbrrp",
         "--subnet", "10.219.10", "--gloo-bin", gloo_bin(), "--out", str(tmp_path), "--name", "part"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "part.json").read_text())
    assert result["workload"]["partition_ranks"] == 2
    two, four = result["rows"]
    # W = 2 is one block (the daemon's unpartitioned round): the world-wide all-gather is its baseline.
    assert two["partition"] is None and two["raw_baseline"] in ("msg", "msg_bruck") and two["hops"] == 1
    assert four["partition"]["block"] == 2 and four["raw_baseline"] in ("partitioned", "partitioned_bruck")
    assert four["samples_trained"] == 4 * samples
    # The daemon: two world-wide log all-gathers (2 hops each) and one in the block (1 hop); the raw
    # rings: 3 hops each world-wide.
    assert four["hops"] == 2 * 2 + 1 and four["raw_ring_hops"] == 2 * 3 + 1 and four["raw_log_hops"] == 5
    for variant in ("partitioned", "partitioned_bruck"):
        parts = four["raw_p50_us"][variant + "_parts"]
        assert all(v > 0 for v in parts.values())
        assert four["raw_p50_us"][variant] >= max(parts.values())
    raw = four["raw_p50_us"]
    assert raw[four["raw_baseline"]] == min(raw["partitioned"], raw["partitioned_bruck"])
    assert four["round_over_raw"] == pytest.approx(four["round_p50_us_median"] / raw[four["raw_baseline"]])
    extra = result["extrapolation"]
    assert extra["partitioned"] and extra["world"] == 2560 and extra["block"] == 256
    names = [c["name"] for c in extra["collectives"]]
    assert names[:3] == ["summary all-gather", "block all-gather", "token totals all-gather"]
    assert [c["ranks"] for c in extra["collectives"][:3]] == [2560, 256, 2560]
    assert extra["bytes_sent_per_rank"] == sum(c["bytes"] for c in extra["collectives"])
    # Every rank sends its totals: nothing overflows the slots; odb's hops are Bruck's.
    assert not any("overflow" in c["name"] for c in extra["collectives"])
    assert [c["hops"] for c in extra["collectives"]] == [12, 8, 12]
    scenarios = extra["scenarios"]
    assert scenarios["own_cores_log_hops"]["hops"] < scenarios["own_cores_ring"]["hops"]
    for scenario in scenarios.values():
        assert scenario["round_ms"] >= extra["planner_decode_cpu_ms"]
        assert scenario["per_planned_step"]["gpu_7b_h100"] == pytest.approx(
            scenario["round_ms"] / extra["steps_per_round"] / extra["step_ms"]["gpu_7b_h100"])
    # Timed from the last rank's entry like the unpartitioned round: the daemons' round_trace against
    # the raw sequences' per-iteration entry and exit.
    last = four["raw_from_last_entry"]
    for variant in ("partitioned", "partitioned_bruck"):
        assert last[variant]["collectives"] == 5 and last[variant]["p50_us_median"] > 0
    assert four["round_over_raw_from_last_entry"] == pytest.approx(
        four["round_from_last_entry"]["p50_us_median"]
        / min(last["partitioned"]["p50_us_median"], last["partitioned_bruck"]["p50_us_median"]))
    # --repeat 3: each W measured three times (daemons, then raw); the row is the median repeat.
    for row in (two, four):
        ratios = [r["round_over_raw_from_last_entry"] for r in row["repeats"]]
        assert len(ratios) == 3 and ratios == sorted(ratios)
        assert row["round_over_raw_from_last_entry"] == ratios[1]
    md = (tmp_path / "part.md").read_text()
    assert "raw partitioned, Bruck" in md and "| 4 | 2 |" in md
    assert "raw Bruck, from the last entry" in md and "W = 4, 3 repeats" in md


def test_the_fit_never_gives_a_hop_or_a_byte_a_negative_cost():
    """A few worlds measured on shared cores can tilt the free least-squares line below zero in one term
    (a negative fixed cost); extrapolated to 2560 ranks that made a round cheaper than its own CPU
    (seen in a full suite run: 312 ms against 391 ms of CPU). The fit keeps both terms >= 0."""
    import importlib.util

    import numpy as np

    spec = importlib.util.spec_from_file_location("real_rounds", ROOT / "bench" / "real_rounds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = np.array([[1.0, 1.0], [1.0, 3.0], [1.0, 5.0]])
    a, b = module.nonneg_lstsq2(x, np.array([10.0, 5.0, 1.0]))  # the free fit has b < 0
    assert a >= 0 and b >= 0 and a == pytest.approx(16 / 3)
    a, b = module.nonneg_lstsq2(x, np.array([3.0, 5.0, 7.0]))  # a free fit that is already >= 0 is kept
    assert (a, b) == (pytest.approx(2.0), pytest.approx(1.0))


def test_rounds_are_timed_from_the_last_ranks_entry(tmp_path):
    """Each rank's exit minus the latest entry of the same collective: the wait for a late rank (the
    entry skew) is left out, and a trace out of order is refused."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("real_rounds", ROOT / "bench" / "real_rounds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Two ranks, three collectives (ns): rank 1 enters 5 ms late in the first, rank 0 2 ms late in the second.
    entries = [[0, 100_000_000, 200_000_000], [5_000_000, 98_000_000, 200_000_000]]
    exits = [[6_000_000, 101_000_000, 200_500_000], [6_000_000, 101_000_000, 201_000_000]]
    got = module.from_last_entry(entries, exits)
    # From the last entry: rank 0 [1, 1, 0.5] ms, rank 1 [1, 1, 1] ms; medians 1 and 1.
    assert got["p50_us_median"] == pytest.approx(1000.0)
    assert got["skew_p50_us"] == pytest.approx(2000.0)  # skews 5, 2, 0 ms
    assert got["collectives"] == 3
    trace = tmp_path / "rounds-0.txt"
    trace.write_text("0 10 20 5\n1 30 40 6\n")
    assert module.read_round_trace(trace) == ([10, 30], [20, 40], [5, 6])
    trace.write_text("0 10 20 5\n2 30 40 6\n")
    with pytest.raises(RuntimeError, match="line 2 is round 2"):
        module.read_round_trace(trace)
