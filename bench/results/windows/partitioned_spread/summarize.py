#!/usr/bin/env python3
"""Tables of bench/results/windows/partitioned_spread/ (README.md): batching_sim CSVs before/after x whole/part x
spread 0/1, and scale_bench JSONs (median over repeats)."""
import csv
import glob
import json
import os
import statistics
import sys

D = os.path.dirname(os.path.abspath(__file__))


def sim_rows(path):
    with open(path) as f:
        return [r for r in csv.DictReader(f) if r["window_target"] not in ("", "0")]


def sim_table():
    print("| trace | policy | target | whole-job s0 | whole-job s1 | partitioned s0 (before = after) | "
          "partitioned s1 before | **partitioned s1 after** | IDLE whole s1 | IDLE part s0 | **IDLE part s1 after** | "
          "micro-steps part s0 / s1 after | mean / max window over target, part s1 after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    get = {}
    for tag in ("before", "after"):
        for mode in ("whole", "part"):
            for sp in ("0", "1"):
                for r in sim_rows(f"{D}/{tag}/sim_{mode}_s{sp}.csv"):
                    get[(tag, mode, sp, r["trace"], r["policy"], r["window_target"])] = r
    keys = sorted({k[3:] for k in get}, key=lambda k: (k[0], k[1].endswith("packed"), k[2]))
    for trace, policy, target in keys:
        def g(tag, mode, sp, col):
            return get[(tag, mode, sp, trace, policy, target)][col]
        mode = "packed" if policy.endswith(":packed") else "padded"
        print(f"| {trace} | {mode} | {target} | {float(g('after','whole','0','of_bound')):.3f} | "
              f"{float(g('after','whole','1','of_bound')):.3f} | {float(g('after','part','0','of_bound')):.3f} | "
              f"{float(g('before','part','1','of_bound')):.3f} | **{float(g('after','part','1','of_bound')):.3f}** | "
              f"{100*float(g('after','whole','1','idle_share')):.1f}% | {100*float(g('after','part','0','idle_share')):.1f}% | "
              f"**{100*float(g('after','part','1','idle_share')):.1f}%** | "
              f"{g('after','part','0','steps')} / {g('after','part','1','steps')} | "
              f"{float(g('after','part','1','mean_window_over_target')):.4f} / "
              f"{float(g('after','part','1','max_window_over_target')):.3f} |")


def sim_table_b():
    print("| trace | policy | target | whole-job s1 (b) | partitioned s0 (b) | **partitioned s1 after (b)** | "
          "of the window bound (b), part s0 / s1 after |")
    print("|---|---|---|---|---|---|---|")
    get = {}
    for mode in ("whole", "part"):
        for sp in ("0", "1"):
            for r in sim_rows(f"{D}/after/sim_{mode}_s{sp}.csv"):
                get[(mode, sp, r["trace"], r["policy"], r["window_target"])] = r
    keys = sorted({k[2:] for k in get}, key=lambda k: (k[0], k[1].endswith("packed"), k[2]))
    for trace, policy, target in keys:
        def g(mode, sp, col):
            return float(get[(mode, sp, trace, policy, target)][col])
        mode = "packed" if policy.endswith(":packed") else "padded"
        print(f"| {trace} | {mode} | {target} | {g('whole','1','of_bound_window'):.3f} | "
              f"{g('part','0','of_bound_window'):.3f} | **{g('part','1','of_bound_window'):.3f}** | "
              f"{g('part','0','of_window_bound_window'):.3f} / {g('part','1','of_window_bound_window'):.3f} |")


def scale_table():
    keys = ["window_cpu_ms_per_round", "bound_fraction", "bound_fraction_window", "idle_share", "micro_steps",
            "windows", "mean_window_over_target", "max_window_over_target"]
    print("| W, blocks, target | spread | code | window CPU ms/round (median of runs) | bound (a) | bound (b) | "
          "IDLE | micro-steps | windows | mean / max window over target |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for w, label in (("64", "64, 8, 1m"), ("2560", "2560, 256, 4M")):
        for sp in ("0", "1"):
            for tag in ("before", "after"):
                runs = [json.load(open(p)) for p in sorted(glob.glob(f"{D}/scale/{tag}_{w}_s{sp}_r*.json"))]
                if not runs:
                    continue
                cpu = statistics.median(r["window_cpu_ms_per_round"] for r in runs)
                cpus = ", ".join(f"{r['window_cpu_ms_per_round']:.1f}" for r in runs)
                r = runs[0]
                print(f"| {label} | {sp} | {tag} | {cpu:.1f} ({cpus}) | {r['bound_fraction']:.4f} | "
                      f"{r['bound_fraction_window']:.4f} | {100*r['idle_share']:.1f}% | {r['micro_steps']} | "
                      f"{r['windows']} | {r['mean_window_over_target']:.5f} / {r['max_window_over_target']:.5f} |")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    for name, table in (("sim", sim_table), ("simb", sim_table_b), ("scale", scale_table)):
        if what in (name, "all"):
            table()
            if what == "all":
                print()
