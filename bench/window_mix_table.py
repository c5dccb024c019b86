#!/usr/bin/env python3
"""Window mode under the grouping.mix_lengths choices, from window_sim_table.py CSVs of one step model:
per window target, the fraction of the bound under (a) and (b) averaged over the traces, and the worst
trace under (a), for each CSV's packed (or, with --padded, padded) odb policy.

    /usr/bin/python3 bench/window_mix_table.py --labels false,true,steps \\
        bench/results/windows/spread/win_default_tokens_w8.csv \\
        bench/results/windows/mix_default/win_default_tokens_w8.csv \\
        bench/results/windows/mix_default/win_default_tokens_w8_packed_steps.csv
"""
import argparse
import csv
import statistics


def load(path, packed):
    rows = {}
    for r in csv.DictReader(open(path)):
        if (":packed" in r["policy"]) != packed or not r["policy"].startswith("odb"):
            continue
        rows[(r["trace"].split("/")[-1], r["window_target"])] = (float(r["of_bound"]), float(r["of_bound_window"]))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csvs", nargs="+")
    p.add_argument("--labels", required=True, help="one label per CSV, comma-separated")
    p.add_argument("--padded", action="store_true", help="the padded policy instead of the packed one")
    args = p.parse_args()
    labels = args.labels.split(",")
    if len(labels) != len(args.csvs):
        p.error("one label per CSV")
    runs = [load(c, not args.padded) for c in args.csvs]
    targets = sorted({t for run in runs for (_, t) in run}, key=lambda t: (t != "0", len(t), t))
    who = " / ".join(labels)
    print(f"| target | (a), mean over traces: {who} | (b): {who} | worst (a): {who} |")
    print("|---|---|---|---|")
    for t in targets:
        traces = sorted(set.intersection(*[{k for k in run if k[1] == t} for run in runs]))
        if not traces:
            continue
        mean = [statistics.mean(run[k][0] for k in traces) for run in runs]
        mean_b = [statistics.mean(run[k][1] for k in traces) for run in runs]
        worst = [min(run[k][0] for k in traces) for run in runs]
        fmt = lambda xs: " / ".join(f"{x:.3f}" for x in xs)
        print(f"| {t if t != '0' else 'none'} | {fmt(mean)} | {fmt(mean_b)} | {fmt(worst)} |")


if __name__ == "__main__":
    main()
