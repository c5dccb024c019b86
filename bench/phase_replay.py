#!/usr/bin/env python3
"""Replays odbd's encoder phase plans on a multimodal run's recorded steps and prices them.

The multimodal example's odb per-phase runs record, per rank and step, the rank's LLM samples
(``samples``: [tokens, patches, frames] each). This writes those steps for ``bazel-bin/bench/
phase_replay`` (the daemon's own balance::EncoderStepPlanner), reads back the vision and audio
layouts it plans, and prices the run's actual layouts and the replayed ones with the run's fitted
costs: per phase the sum over steps of the bound max(largest item, mean) over the sum of the
slowest rank (examples/multimodal_train.py's modelled bound fraction), and the activation memory
of each rank's step (the fitted activation bytes), whose peak over the run is compared across ranks
(max / mean) as the example's ``actMB m/m`` does, and ``x llm``: the modelled synchronous step time
of the run's LLM-only method of the same LLM layout (``odb_llm_packed`` for ``odb_phases_packed``)
over the layouts' (``modelled_sync_time``). The LLM layout is the run's in both.

  /usr/bin/python3 bench/phase_replay.py RUN.json [RUN.json ...] [--method odb_phases_packed]
      [--variant NAME=FLAGS ...]   (FLAGS passed to phase_replay, e.g. "m10=--memory-cap-margin 0.1";
                                    --recorded-rounds: the run's own rounds, --round-lengths)
      [--rounds]     (print each run's recorded round lengths)
      [--per-step]   (also each step's activation MiB per rank and each encoder phase's slowest rank
                      over its bound, per layout: where the run's peaks and time go)
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))
import multimodal_train as mt  # noqa: E402

PHASES = ("vision", "audio")


def steps_of(per_rank: List[Dict[str, Any]]) -> List[List[int]]:
    """Per step, the world ranks with LLM samples (the step's active ranks, in rank order)."""
    n = max(len(r["records"]) for r in per_rank)
    return [[w for w, r in enumerate(per_rank) if k < len(r["records"]) and r["records"][k].get("samples")]
            for k in range(n)]


def write_steps(per_rank: List[Dict[str, Any]], path: str) -> List[List[int]]:
    """The phase_replay input; returns each step's active world ranks."""
    active = steps_of(per_rank)
    with open(path, "w") as f:
        f.write("# per step: active ranks' LLM samples (tokens,patches,frames), ranks separated by |\n")
        for k, ranks in enumerate(active):
            f.write(" | ".join(f"@{w} " + " ".join(",".join(str(v) for v in s)
                                                   for s in per_rank[w]["records"][k]["samples"])
                               for w in ranks) + "\n")
    return active


def recorded_rounds(per_rank: List[Dict[str, Any]]) -> List[int]:
    """The run's rounds as consecutive step counts: the records' ``round`` ([round, its first step,
    its steps], examples/multimodal_train.py since 2026-12-06), the same on every rank; a step without
    one (an older run) raises."""
    n = max(len(r["records"]) for r in per_rank)
    labels = []
    for k in range(n):
        seen = {tuple(r["records"][k]["round"]) for r in per_rank
                if k < len(r["records"]) and "round" in r["records"][k]}
        if len(seen) != 1:
            raise ValueError(f"step {k}: {'no recorded round' if not seen else f'ranks disagree: {sorted(seen)}'}"
                             " (--recorded-rounds needs a run that records its rounds)")
        labels.append(seen.pop()[0])
    lengths: List[int] = []
    for k, label in enumerate(labels):
        if k and label == labels[k - 1]:
            lengths[-1] += 1
        else:
            lengths.append(1)
    return lengths


def replay(binary: str, config: str, steps: str, flags: str,
           rounds: Any = None) -> List[List[Dict[str, List[int]]]]:
    """Per step, per active rank: {"vision": [...], "audio": [...]} as phase_replay planned them.
    A ``--recorded-rounds`` in `flags` becomes ``--round-lengths`` of `rounds()` (the run's rounds)."""
    args = shlex.split(flags)
    if "--recorded-rounds" in args:
        i = args.index("--recorded-rounds")
        args[i:i + 1] = ["--round-lengths", ",".join(str(n) for n in rounds())]
    out = subprocess.run([binary, "--config", config, "--steps", steps] + args, check=True,
                         capture_output=True, text=True).stdout
    layouts = []
    for line in out.splitlines():
        ranks = []
        for part in line.split("|"):
            fields = dict(f.split("=", 1) for f in part.split())
            ranks.append({"vision": [int(x) for x in fields["v"].split(",") if x],
                          "audio": [int(x) for x in fields["a"].split(",") if x],
                          "llm": [int(x) for x in fields.get("l", "").split(",") if x]})
        layouts.append(ranks)
    return layouts


def with_layout(per_rank: List[Dict[str, Any]], active: List[List[int]],
                layouts: List[List[Dict[str, List[int]]]]) -> List[Dict[str, Any]]:
    """The run's records with each step's encoder items replaced by the replayed layout."""
    out = [{"records": [dict(rec, items=dict(rec["items"])) for rec in r["records"]]} for r in per_rank]
    for k, (ranks, layout) in enumerate(zip(active, layouts)):
        for w in range(len(per_rank)):
            if k >= len(out[w]["records"]):
                continue
            mine = layout[ranks.index(w)] if w in ranks else {"vision": [], "audio": [], "llm": []}
            for phase in PHASES:
                out[w]["records"][k]["items"][phase] = mine[phase]
            if mine["llm"] and sorted(mine["llm"]) != sorted(out[w]["records"][k]["items"]["llm"]):
                # memory_llm_slack moved LLM samples (a packed LLM: its cost and memory are the samples')
                out[w]["records"][k]["items"]["llm"] = mine["llm"]
    return out


def price(per_rank: List[Dict[str, Any]], fits: Dict[str, List[float]], act: Dict[str, List[float]]
          ) -> Tuple[Dict[str, float], float, float]:
    """(modelled bound fraction per phase, activation peak max/mean over ranks, max peak MiB)."""
    frac = mt.modelled_bound_fractions(per_rank, fits)
    peaks = []
    for r in per_rank:
        peak = 0.0
        for rec in r["records"]:
            peak = max(peak, sum(mt.modelled_step_time(rec, p, act) for p in mt.COMPUTE_PHASES))
        peaks.append(peak)
    mean = sum(peaks) / len(peaks)
    return frac, max(peaks) / mean if mean else 1.0, max(peaks) / 2**20


def print_steps(name: str, per_rank: List[Dict[str, Any]], fits: Dict[str, List[float]],
                act: Dict[str, List[float]]) -> None:
    """Per step: each rank's modelled activation MiB, then per encoder phase the step's bound over
    its slowest rank (1: balanced), and the largest image's patches."""
    print(f"  {name}")
    for k in range(max(len(r["records"]) for r in per_rank)):
        recs = [r["records"][k] for r in per_rank if k < len(r["records"])]
        mib = [sum(mt.modelled_step_time(rec, p, act) for p in mt.COMPUTE_PHASES) / 2**20 for rec in recs]
        fracs = []
        for phase in PHASES:
            times = [mt.modelled_step_time(rec, phase, fits) for rec in recs]
            items = [u for rec in recs for u in rec["items"].get(phase, [])]
            bound = max([sum(times) / len(per_rank)] +
                        [mt.modelled_step_time({"items": {phase: [u]}}, phase, fits) for u in items])
            fracs.append(f"{phase} {bound / max(times):.2f}" if items and max(times) > 0 else f"{phase}    -")
        largest = max([u for rec in recs for u in rec["items"].get("vision", [])] + [0])
        print(f"    step {k:3d}  MiB " + " ".join(f"{m:5.1f}" for m in mib) + "  " + "  ".join(fracs) +
              f"  largest image {largest}")


def run_config(data: Dict[str, Any], method: str) -> Dict[str, Any]:
    """The odbd config the run's method had (examples/multimodal_train.py's daemon_config)."""
    args = argparse.Namespace(max_tokens=data["args"]["max_tokens"], seed=0, phase_costs=None, llm_step_time=None,
                              memory_plan=True, phase_steps=True,
                              memory_peak_round=data["args"].get("memory_peak_round", False),
                              memory_time_floor=data["args"].get("memory_time_floor", 0.0),
                              memory_llm_slack=data["args"].get("memory_llm_slack", 0.0))
    return mt.daemon_config(args, True, 0, method in mt.PACKED_METHODS)


def fitted(costs: Dict[str, Dict[str, float]]) -> Dict[str, List[float]]:
    return {p: [c["per_step"], c["per_item"], c["per_unit"], c["per_unit_sq"]] for p, c in costs.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="examples/multimodal_train.py --json outputs (with raw records)")
    p.add_argument("--method", default="odb_phases_packed")
    p.add_argument("--bin", default=str(HERE.parent / "bazel-bin/bench/phase_replay"))
    p.add_argument("--variant", action="append", default=[], help="NAME=FLAGS for phase_replay (repeatable)")
    p.add_argument("--per-step", action="store_true", help="also each step's peaks and phase balance per layout")
    p.add_argument("--targets", action="store_true",
                   help="also, per layout, how many runs meet each of issue 32's targets (each encoder phase "
                        ">= 0.95 of its bound, and the LLM's too, activation max/mean <= 1.10, x llm >= 1.15 "
                        "where the run has its LLM-only method) and all three at once (every phase)")
    p.add_argument("--rounds", action="store_true", help="print each run's recorded round lengths")
    a = p.parse_args()
    met: Dict[str, List[int]] = {}
    variants = [("daemon", "")] + [tuple(v.split("=", 1)) for v in a.variant]
    print(f"{'run':28s} {'layout':18s} {'vision':>7s} {'audio':>7s} {'llm':>7s} {'act m/m':>8s} {'peak MiB':>9s}"
          f" {'x llm':>6s}")
    for path in a.runs:
        data = json.load(open(path))
        per_rank = data["raw"][a.method]
        fits = fitted(data["methods"]["_fitted_phase_costs"])
        act = fitted(data["methods"]["_fitted_activation_bytes"])
        rows = [("recorded", per_rank)]
        # A run with the round rule (--memory-peak-round) is replayed by the "daemon" row in its own rounds.
        round_rule = data["args"].get("memory_peak_round", False)
        if a.rounds:
            print(f"{Path(path).name[:28]:28s} rounds (steps each): {recorded_rounds(per_rank)}")
        with tempfile.TemporaryDirectory() as tmp:
            steps = os.path.join(tmp, "steps.txt")
            active = write_steps(per_rank, steps)
            config = os.path.join(tmp, "odbd.yaml")
            with open(config, "w") as f:
                yaml.safe_dump(run_config(data, a.method), f)
            for name, flags in variants:
                if name == "daemon" and round_rule:
                    flags = "--recorded-rounds"
                layouts = replay(a.bin, config, steps, flags, lambda: recorded_rounds(per_rank))
                rows.append((name, with_layout(per_rank, active, layouts)))
        # The LLM-only method of the same LLM layout (its modelled synchronous time in the run's summary).
        baseline = data["methods"].get(mt.PHASE_METHODS.get(a.method, ""), {}).get("modelled_sync_time_s")
        for name, records in rows:
            frac, mm, peak = price(records, fits, act)
            speedup = f"{baseline / mt.modelled_sync_time(records, fits):6.3f}" if baseline else f"{'-':>6s}"
            print(f"{Path(path).name[:28]:28s} {name:18s} {frac['vision']:7.3f} {frac['audio']:7.3f} "
                  f"{frac['llm']:7.3f} {mm:8.3f} {peak:9.1f} {speedup}")
            enc = min(frac["vision"], frac["audio"]) >= 0.95
            every = enc and frac["llm"] >= 0.95  # memory_llm_slack spends LLM time too
            x_ok = not baseline or baseline / mt.modelled_sync_time(records, fits) >= 1.15
            counts = met.setdefault(name, [0, 0, 0, 0, 0, 0])
            for i, ok in enumerate((enc, every, mm <= 1.10, x_ok, every and mm <= 1.10 and x_ok, True)):
                counts[i] += ok
        if a.per_step:
            for name, records in rows:
                print_steps(name, records, fits, act)
    if a.targets:
        print(f"\n{'layout':18s} {'enc>=0.95':>9s} {'all>=0.95':>9s} {'act<=1.10':>9s} {'x>=1.15':>8s} {'all 3':>6s}"
              "  (of runs; all 3: every phase incl. the LLM, memory, x)")
        for name, (e, every, m, x, all3, n) in met.items():
            print(f"{name:18s} {e:9d} {every:9d} {m:9d} {x:8d} {all3:6d}  ({n})")


if __name__ == "__main__":
    main()
