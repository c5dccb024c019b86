#!/usr/bin/python3
"""Figures for bench/results/REPORT.md from batching_sim's CSV files.

    /usr/bin/python3 bench/plot.py --sim-csv bench/results/sim_gpu_7b_h100.csv \
        --steps-csv bench/results/steps_gpu_7b_h100.csv --out bench/results

Writes bound_fraction.png (fraction of the lower bound no schedule beats, per
policy per trace), padding.png (padding fraction per policy per trace) and
step_cost.png (distribution of the slowest rank's cost per step).
"""
import argparse
import collections
import csv
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def grouped_bars(rows, field, ylabel, title, out, scale=1.0, hline=None):
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    value = {(r["trace"], r["policy"]): float(r[field]) * scale for r in rows}
    width = 0.8 / len(policies)
    fig, ax = plt.subplots(figsize=(max(10, 2.4 * len(traces)), 6.5))
    colors = plt.cm.tab20.colors
    for i, p in enumerate(policies):
        xs = [t + (i - len(policies) / 2 + 0.5) * width for t in range(len(traces))]
        ax.bar(xs, [value.get((t, p), 0.0) for t in traces], width, label=p, color=colors[i % len(colors)])
    if hline is not None:
        ax.axhline(hline, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(traces)))
    ax.set_xticklabels(traces)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def step_costs(path, out, title):
    costs = collections.defaultdict(list)
    for r in read(path):
        costs[(r["trace"], r["policy"])].append(float(r["cost"]))
    traces = list(dict.fromkeys(t for t, _ in costs))
    policies = list(dict.fromkeys(p for _, p in costs))
    fig, axes = plt.subplots(1, len(traces), figsize=(3.2 * len(traces), 4.2), sharey=False, squeeze=False)
    for ax, t in zip(axes[0], traces):
        data = [costs[(t, p)] for p in policies]
        ax.boxplot(data, labels=policies, showfliers=False, whis=(1, 99))
        ax.set_title(t, fontsize=9)
        ax.tick_params(axis="x", labelrotation=75, labelsize=7)
        ax.set_yscale("log")
    axes[0][0].set_ylabel("slowest rank step cost\n(model units; whiskers 1-99%)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sim-csv", required=True)
    parser.add_argument("--steps-csv")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--command", default="", help="the command that produced the CSVs (shown in titles)")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = read(args.sim_csv)
    model, world = rows[0]["model"], rows[0]["world"]
    tag = f"model {model}, W={world}" + (f"\n{args.command}" if args.command else "")
    grouped_bars(rows, "of_bound", "fraction of the bound (1.0 = no schedule can do better)",
                 "Fraction of the lower bound; " + tag, out / "bound_fraction.png", hline=1.0)
    grouped_bars(rows, "padding_fraction", "padding (% of computed tokens)", "Padding; " + tag,
                 out / "padding.png", scale=100.0)
    if args.steps_csv:
        step_costs(args.steps_csv, out / "step_cost.png", "Step cost distribution; " + tag)
    print(f"wrote figures to {out}")


if __name__ == "__main__":
    main()
