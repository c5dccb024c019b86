#!/usr/bin/env python3
"""Where a multimodal run's peak memory goes, per rank (examples/multimodal_train.py --json runs).

Per method and rank: the peak-memory figure the run reports (`peak_kb`: on a CPU since 2026-12-06 the
largest step's VmHWM above the step's start; before, VmHWM above the rank's level after warm-up), the
same over the steps after the warm-up where recorded, and the largest step's activation bytes (the
planner's model); with `--mem-trace` records also the glibc heap (mallinfo2: bytes in use at the
phase ends, the heap's size and free bytes at the run's end) and the resident set's parts. Then per
method the max/mean over ranks of each.

  /usr/bin/python3 bench/multimodal_mem.py RUN.json [RUN.json ...] [--steps]
      --steps: per step and rank, the step's figure (MiB) beside its activation bytes
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

MIB = 1024.0


def max_over_mean(values: List[float]) -> Optional[float]:
    return max(values) / (sum(values) / len(values)) if values and sum(values) else None


def fmt(values: List[float]) -> str:
    return " ".join(f"{v:6.1f}" for v in values)


def rank_row(r: Dict[str, Any]) -> Dict[str, Any]:
    recs = r["records"]
    row: Dict[str, Any] = {"peak": r["peak_kb"] / MIB if r.get("peak_kb") is not None else None,
                           "act": max(sum(rec["act"].values()) for rec in recs) / 2**20}
    if r.get("peak_kb_after_warmup") is not None:
        row["peak_warm"] = r["peak_kb_after_warmup"] / MIB
    traced = [rec for rec in recs if "mem" in rec]
    if traced:
        first = traced[0]["mem"][0]
        row["in_use"] = (max(m["used_kb"] for rec in traced for m in rec["mem"]) - first["used_kb"]) / MIB
        end = traced[-1]["mem"][-1]
        row["heap"], row["heap_free"] = end["heap_kb"] / MIB, end["free_kb"] / MIB
        row["anon_growth"] = (end["RssAnon"] - first["RssAnon"]) / MIB
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+")
    p.add_argument("--steps", action="store_true")
    a = p.parse_args()
    labels = {"peak": "peak MiB (the run's figure)", "peak_warm": "  the steps after warm-up",
              "act": "activation MiB (largest step)",
              "in_use": "malloc in use, most above the 1st traced step's start (phase ends)",
              "heap": "heap MiB at the end (mallinfo2 arena)", "heap_free": "  of it free",
              "anon_growth": "RssAnon growth over the traced steps"}
    for path in a.runs:
        data = json.load(open(path))
        malloc = data["args"].get("malloc", "dynamic (before --malloc)")
        for method, per_rank in data["raw"].items():
            print(f"{Path(path).parent.name}/{Path(path).name} {method} (malloc {malloc})")
            rows = [rank_row(r) for r in per_rank]
            for key, label in labels.items():
                if all(key in row and row[key] is not None for row in rows):
                    vals = [row[key] for row in rows]
                    mm = max_over_mean(vals)
                    print(f"  {label:68s} {fmt(vals)}  max/mean {mm:.3f}" if mm else f"  {label:68s} {fmt(vals)}")
            if a.steps and all("mem_kb" in rec for r in per_rank for rec in r["records"]):
                n = max(len(r["records"]) for r in per_rank)
                for k in range(n):
                    recs = [r["records"][k] if k < len(r["records"]) else None for r in per_rank]
                    mem = [rec["mem_kb"] / MIB if rec else 0.0 for rec in recs]
                    act = [sum(rec["act"].values()) / 2**20 if rec else 0.0 for rec in recs]
                    print(f"    step {k:3d}  step MiB {fmt(mem)}   act MiB {fmt(act)}   "
                          f"diff {fmt([m - x for m, x in zip(mem, act)])}")


if __name__ == "__main__":
    main()
