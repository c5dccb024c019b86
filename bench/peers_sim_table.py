#!/usr/bin/python3
"""The peers in the batching simulator (issue 33): one row per (W, step model, trace) from the CSVs
`batching_sim --csv` wrote, with the fraction of the any-layout bound of odb's two modes, the best
peer (packing, kk_balanced, bucketing, length_grouped, standard) and whether odb's best mode is ahead.

  /usr/bin/python3 bench/peers_sim_table.py bench/results/peers/sim_*_w8.csv bench/results/peers/sim_*_w64.csv

Prints a markdown table and a summary line per (W, model): the cells where a peer is ahead and odb's
best mode's lowest fraction of the bound.
"""
from __future__ import annotations

import csv
import sys
from collections import defaultdict

ODB_PADDED_SUFFIX = ":paced16:full"
PEERS = ("packing", "kk_balanced", "bucketing", "length_grouped", "standard")


def rows_of(paths):
    cells = defaultdict(dict)
    for path in paths:
        with open(path) as f:
            for r in csv.DictReader(f):
                if r.get("window_target", "0") not in ("", "0"):
                    continue  # a run with accumulation windows (bench/window_sim_table.py tabulates those)
                cells[(int(r["world"]), r["model"], r["trace"])][r["policy"]] = r
    return cells


def odb_row(pol: dict, suffix: str) -> dict:
    """The row of odb's mode whose policy name ends with `suffix`."""
    return next(r for p, r in pol.items() if p.startswith("odb") and p.endswith(suffix))


def main(paths) -> int:
    cells = rows_of(paths)
    print("| W | model | trace | odb padded | odb packed | best peer | its fraction | odb best - peer "
          "| odb best, of the largest-sample bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    worst = defaultdict(lambda: (2.0, 0, 0, 2.0))
    for (world, model, trace), pol in sorted(cells.items()):
        rows = (odb_row(pol, ODB_PADDED_SUFFIX), odb_row(pol, ":packed"))
        padded, packed = (float(r["of_bound"]) for r in rows)
        peer = max((p for p in PEERS if p in pol), key=lambda p: float(pol[p]["of_bound"]))
        pf = float(pol[peer]["of_bound"])
        best = max(padded, packed)
        # The same schedule against the bound tightened by the longest sample's step (CSV files from before
        # that column have none).
        largest = max(float(r.get("of_largest_sample_bound") or "nan") for r in rows)
        print(f"| {world} | {model} | {trace} | {padded:.3f} | {packed:.3f} | {peer} | {pf:.3f} | {best - pf:+.3f} "
              f"| {largest:.3f} |")
        low, behind, n, low_largest = worst[(world, model)]
        worst[(world, model)] = (min(low, best), behind + (pf > best + 1e-9), n + 1, min(low_largest, largest))
    print()
    for (world, model), (low, behind, n, low_largest) in sorted(worst.items()):
        tighter = f" (>= {low_largest:.3f} of the largest-sample bound)" if low_largest <= 1.0 else ""
        print(f"W {world}, {model}: odb's best mode >= {low:.3f} of the bound on all {n} traces{tighter}; "
              f"a peer ahead on {behind}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
