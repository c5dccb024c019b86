#!/usr/bin/python3
"""Accumulation windows in the batching simulator (issue 35): the odb policies at W ranks over the traces and step
models, without windows and with each window target, as one compact table.

Runs `batching_sim --window-tokens 0,T1,T2..` once per step model (every odb policy then runs without windows and
with each target; the daemon's align::ApplyWindows cuts the windows), writes the CSVs and markdown under --out, and
prints a row per (model, trace, policy, target):

  /usr/bin/python3 bench/window_sim_table.py --bin "$(bazel info -c opt bazel-bin)" --out bench/results/windows
  /usr/bin/python3 bench/window_sim_table.py bench/results/windows/win_*_w8.csv     # the table from CSVs only
  /usr/bin/python3 bench/window_sim_table.py --bin "$BIN" --out /tmp/mj --world 2 --max-tokens 512 \
      --models default_tokens --targets 16s --traces bench/results/windows/main_job_trace.txt   # the main job

With --partition-ranks P the global odb policies plan in blocks of P ranks (CSVs *_p<P>), and with
--partitioned-windows their windows are cut and balanced as a partitioned daemon does (CSVs *_p<P>pw);
--partition-table compares the two from the CSVs (docs/benchmarks.md, "Partitioned windows in the simulator"):

  /usr/bin/python3 bench/window_sim_table.py --bin "$BIN" --out /tmp/p --partition-ranks 4 --partitioned-windows \
      --models default_tokens --traces chat_longtail --targets 4m,16m
  /usr/bin/python3 bench/window_sim_table.py --partition-table /tmp/p/win_*.csv

With --unequal-microsteps, batching_sim --unequal-microsteps (CSVs *_uneq) and the table of unequal micro-step
counts per window (own counts, own + moves, re-dealt, the ceiling for any counts; docs/benchmarks.md, "Unequal
micro-step counts"); --unequal-table prints it from such CSVs:

  /usr/bin/python3 bench/window_sim_table.py --bin "$BIN" --out /tmp/u --models default_tokens --targets 1m \
      --unequal-microsteps
  /usr/bin/python3 bench/window_sim_table.py --unequal-table bench/results/windows/s24_uneq/win_*_w8_uneq.csv

Columns: the fraction of the padded bound (any-layout bound for packed policies, marked *) without windows, with
windows under time model (a) (every micro-step synchronised: FSDP/ZeRO) and (b) (only a window's last micro-step:
DDP with no_sync), the change of (a), IDLE rank-steps over all rank-steps, micro-steps with windows over without,
the mean-rank time (each micro-step at its ranks' mean cost: what the extra micro-steps cost without the
imbalance) over the unwindowed one and max/mean (time (a) over the mean-rank time: the imbalance between ranks
inside micro-steps), the windows and their mean and largest size over the target; the fraction of the window bound (a lower bound for
any schedule with as many windows, bench/bound.h WindowedBounds) under (a) and (b), and the ceiling: the most of
the padded bound any schedule with these windows can reach under (b) (bound / window bound). Then per (model, target) the cells within 2% of the
unwindowed fraction with IDLE <= 5% (issue 35's mark for window mode). docs/benchmarks.md, "Accumulation windows
in the simulator", has the bounds and why no windowed schedule beats them.
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from collections import defaultdict

MODELS = ("default_tokens", "gpu_1b_h100", "gpu_7b_h100", "gpu_70b_h200", "cpu_calibrated", "attention_heavy")
TRACES = "chat_longtail,image_text,high_variance,production_mix,bench/traces/debian_docs.txt"
# The daemon's defaults (global planner, window 512, rounds at half the queue, full rounds) and its packed mode, as
# bench/peers_sim_table.py compares them.
POLICIES = "odb:global:q32:w512:paced16:full,odb:global:q32:w512:paced16:full:packed"


def run_matrix(args: argparse.Namespace) -> list[str]:
    """Runs batching_sim once per model; returns the CSV paths."""
    os.makedirs(args.out, exist_ok=True)
    paths = []
    for model in args.models.split(","):
        stem = os.path.join(args.out, f"win_{model}_w{args.world}" + partition_suffix(args)
                            + ("_nobal" if args.no_window_balance else "")
                            + ("_uneq" if args.unequal_microsteps else ""))
        cmd = [os.path.join(args.bin, "bench/batching_sim"), "--model", model, "--world", str(args.world),
               "--samples", str(args.samples), "--window", str(args.window), "--max-tokens", str(args.max_tokens),
               "--traces", args.traces,
               "--policies", args.policies, "--window-tokens", "0," + args.targets,
               "--csv", stem + ".csv", "--md", stem + ".md"] + (["--no-window-balance"] if args.no_window_balance else [])
        cmd += ["--unequal-microsteps"] if args.unequal_microsteps else []
        cmd += ["--window-spread", str(args.window_spread)] if args.window_spread is not None else []
        cmd += ["--seed", str(args.seed)] if args.seed is not None else []
        if args.partition_ranks:
            cmd += ["--partition-ranks", str(args.partition_ranks)]
            cmd += ["--partitioned-windows"] if args.partitioned_windows else []
        print("+ " + " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        paths.append(stem + ".csv")
    return paths


def partition_suffix(args: argparse.Namespace) -> str:
    """The CSV name's mark of partitioned planning: _p<P> (whole-job windows) or _p<P>pw (partitioned windows)."""
    if not args.partition_ranks:
        return ""
    return f"_p{args.partition_ranks}" + ("pw" if args.partitioned_windows else "")


def fraction(row: dict, suffix: str = "") -> tuple[float, bool]:
    """The fraction of the padded bound, or of the any-layout bound (True) where the padded one does not apply."""
    padded = row["of_padded_bound" + suffix]
    if padded:
        return float(padded), False
    return float(row["of_bound" + suffix]), True


def mean_rank(row: dict) -> float:
    """Time model (a) with every micro-step at its mean rank's cost (perfect balance inside each micro-step)."""
    return float(row["sim_seconds"]) / float(row["max_over_mean"])


def table(paths: list[str], within: float = 0.02, idle_max: float = 0.05) -> int:
    """Prints the table and the per-(model, target) summary; returns 0."""
    runs: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for path in paths:
        with open(path) as f:
            for r in csv.DictReader(f):
                if not r["policy"].startswith("odb"):
                    continue
                target = r["window_target"]
                if target != "0" and r.get("window_balance", "1") == "0":
                    target += " no balance"  # --no-window-balance (CSVs before balance existed have no column)
                runs[(int(r["world"]), r["model"], r["trace"], r["policy"])][target] = r
    print("| W | model | trace | policy | window target (loss tokens) | no windows | (a) | (b) | (a) - none "
          "| of window bound (a) / (b) | ceiling (b) | IDLE share | micro-steps | mean-rank time / none | max/mean "
          "| windows | mean / target | max / target |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    # Per (W, model, target, policy): cells within the mark under (a), under (b), cells, worst (a) / none,
    # worst (b) / none, most IDLE.
    summary: dict[tuple, list] = defaultdict(lambda: [0, 0, 0, 1.0, 1.0, 0.0])
    for (world, model, trace, policy), by_target in sorted(runs.items()):
        base = by_target.get("0")
        if base is None:
            continue
        f0, any_layout = fraction(base)
        star = "*" if any_layout else ""
        for target, r in by_target.items():
            if target == "0":
                continue
            fa, _ = fraction(r)
            fb, _ = fraction(r, "_window")
            idle = float(r["idle_share"])
            # The most of the bound a schedule with these windows can reach (per-window time).
            base_bound = float(base["padded_bound_seconds"] if not any_layout else base["bound_seconds"])
            ceiling = base_bound / float(r["window_bound_window_seconds"])
            print(f"| {world} | {model} | {trace} | {policy} | {target} ({r['window_tokens']}) | {f0:.3f}{star} "
                  f"| {fa:.3f}{star} | {fb:.3f}{star} | {fa - f0:+.3f} "
                  f"| {float(r['of_window_bound']):.3f} / {float(r['of_window_bound_window']):.3f} "
                  f"| {ceiling:.3f}{star} | {100 * idle:.1f}% "
                  f"| {int(r['steps'])} / {int(base['steps'])} | {mean_rank(r) / mean_rank(base):.3f} "
                  f"| {float(r['max_over_mean']):.3f} | {r['windows']} "
                  f"| {float(r['mean_window_over_target']):.3f} | {float(r['max_window_over_target']):.3f} |")
            s = summary[(world, model, target, policy)]
            s[0] += fa >= f0 * (1 - within) and idle <= idle_max
            s[1] += fb >= f0 * (1 - within) and idle <= idle_max
            s[2] += 1
            s[3] = min(s[3], fa / f0 if f0 > 0 else 0.0)
            s[4] = min(s[4], fb / f0 if f0 > 0 else 0.0)
            s[5] = max(s[5], idle)
    print()
    for (world, model, target, policy), (ok_a, ok_b, n, worst_a, worst_b, idle) in sorted(summary.items()):
        print(f"W {world}, {model}, windows {target}, {policy}: of {n} traces, within {100 * within:.0f}% of the "
              f"unwindowed fraction with IDLE <= {100 * idle_max:.0f}%: {ok_a} under (a), {ok_b} under (b); worst "
              f"(a) / none {worst_a:.3f}, (b) / none {worst_b:.3f}, most IDLE {100 * idle:.1f}%")
    return 0


def digest(paths: list[str], within: float = 0.02, idle_max: float = 0.05) -> int:
    """Prints one row per (target, mode): ranges over the models and traces of the unwindowed fraction, the
    fractions under (a) and (b) with balance over the window (under (b) also the cut alone), IDLE, and the cells
    within `within` of the unwindowed fraction with IDLE <= idle_max under (a) and (b). The docs' table."""
    runs: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for path in paths:
        with open(path) as f:
            for r in csv.DictReader(f):
                if r["policy"].startswith("odb"):
                    cut_alone = r["window_target"] != "0" and r.get("window_balance", "1") == "0"
                    runs[(r["model"], r["trace"], r["policy"])][(r["window_target"], cut_alone)] = r
    cells: dict[tuple, list] = defaultdict(list)
    targets: list[str] = []
    for key, by in runs.items():
        base = by.get(("0", False)) or by.get(("0", True))
        if base is None:
            continue
        f0, _ = fraction(base)
        mode = "packed" if ":packed" in key[2] else "padded"
        for (target, cut_alone), r in by.items():
            if target == "0" or cut_alone:
                continue
            if target not in targets:
                targets.append(target)
            alone = by.get((target, True))
            cells[(target, mode)].append((f0, fraction(r)[0], fraction(r, "_window")[0],
                                          fraction(alone, "_window")[0] if alone else None, float(r["idle_share"])))

    def span(values: list, fmt: str = "{:.3f}") -> str:
        values = [v for v in values if v is not None]
        return (fmt.format(min(values)) + "-" + fmt.format(max(values))) if values else "n/a"

    print("| target | mode | no windows | (a) | (b), cut alone -> with balance | IDLE | within 2%, (a) / (b) |")
    print("|---|---|---|---|---|---|---|")
    for target in targets:  # as the runs list them
        for mode in ("padded", "packed"):
            c = cells.get((target, mode))
            if not c:
                continue
            ok_a = sum(fa >= f0 * (1 - within) and idle <= idle_max for f0, fa, _, _, idle in c)
            ok_b = sum(fb >= f0 * (1 - within) and idle <= idle_max for f0, _, fb, _, idle in c)
            print(f"| {target} | {mode} | {span([x[0] for x in c])} | {span([x[1] for x in c])} "
                  f"| {span([x[3] for x in c])} -> **{span([x[2] for x in c])}** "
                  f"| {span([100 * x[4] for x in c], '{:.1f}')}% | {ok_a} / {ok_b} of {len(c)} |")
    return 0


def partition_table(paths: list[str]) -> int:
    """Partitioned planning: per (W, blocks, model, trace, policy, target) the fraction of the bound under (a) and
    (b), IDLE rank-steps and the mean window over the target, with whole-job windows (ApplyWindows over every
    block's plan at once, which no partitioned daemon runs) and with partitioned windows (PartitionedWindows and
    BalanceBlockWindows, what the daemon runs), next to the same plans without windows. Reads the CSVs of runs with
    --partition-ranks P, with and without --partitioned-windows."""
    runs: dict[tuple, dict] = defaultdict(dict)
    for path in paths:
        with open(path) as f:
            for r in csv.DictReader(f):
                if not r["policy"].startswith("odb:global") or not int(r.get("partition_ranks") or 0):
                    continue
                if r.get("window_balance", "1") == "0" and r["window_target"] == "0":
                    continue
                mode = "none" if r["window_target"] == "0" else (
                    "partitioned" if r.get("partitioned_windows") == "1" else "whole")
                if r.get("window_balance", "1") == "0":
                    mode += " alone"  # --no-window-balance: the cut alone
                key = (int(r["world"]), int(r["partition_ranks"]), r["model"], r["trace"],
                       "packed" if ":packed" in r["policy"] else "padded")
                runs[key][(r["window_target"], mode)] = r
    print("| W | blocks | model | trace | mode | target | no windows | whole-job (a) / (b) | partitioned (a) / (b) "
          "| partitioned, cut alone (a) / (b) | IDLE: none / whole / partitioned | mean window / target: whole / "
          "partitioned |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    # Per (W, blocks, target, mode): the ranges over models and traces (the docs' table).
    ranges: dict[tuple, list] = defaultdict(list)
    for key, by in sorted(runs.items()):
        base = by.get(("0", "none"))
        if base is None:
            continue
        targets = sorted({t for t, m in by if t != "0"}, key=lambda t: float(t.rstrip("sm") or 0))
        for t in targets:
            whole, part, alone = by.get((t, "whole")), by.get((t, "partitioned")), by.get((t, "partitioned alone"))

            def ab(r: dict | None) -> str:
                return "n/a" if r is None else f"{fraction(r)[0]:.3f} / {fraction(r, '_window')[0]:.3f}"

            def idle(r: dict | None) -> str:
                return "n/a" if r is None else f"{100 * float(r['idle_share']):.1f}%"

            def mean(r: dict | None) -> str:
                return "n/a" if r is None else f"{float(r['mean_window_over_target']):.3f}"

            star = "*" if fraction(base)[1] else ""
            print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {t} | {fraction(base)[0]:.3f}{star} "
                  f"| {ab(whole)} | {ab(part)} | {ab(alone)} | {idle(base)} / {idle(whole)} / {idle(part)} "
                  f"| {mean(whole)} / {mean(part)} |")
            ranges[(key[0], key[1], t, key[4])].append((base, whole, part, alone))
    print()
    print("| W | blocks | target | mode | no windows | whole-job (b) | partitioned (a) | partitioned (b) "
          "| partitioned (b) / none | partitioned, cut alone (b) | IDLE whole / partitioned "
          "| mean window / target, partitioned |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")

    def span(values: list, fmt: str = "{:.3f}") -> str:
        values = [v for v in values if v is not None]
        return (fmt.format(min(values)) + "-" + fmt.format(max(values))) if values else "n/a"

    for (world, blocks, t, mode), cells in sorted(ranges.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                                  float(kv[0][2].rstrip("sm")),
                                                                                  kv[0][3])):
        def col(i: int, suffix: str = "") -> str:
            return span([fraction(c[i], suffix)[0] if c[i] else None for c in cells])

        def idle_col(i: int) -> str:
            return span([100 * float(c[i]["idle_share"]) if c[i] else None for c in cells], "{:.1f}") + "%"

        print(f"| {world} | {blocks} | {t} | {mode} | {col(0)} | {col(1, '_window')} | {col(2)} | "
              f"**{col(2, '_window')}** "
              f"| {span([fraction(c[2], '_window')[0] / fraction(c[0])[0] if c[2] else None for c in cells])} "
              f"| {col(3, '_window')} | {idle_col(1)} / {idle_col(2)} "
              f"| {span([float(c[2]['mean_window_over_target']) if c[2] else None for c in cells])} |")
    return 0


def end_table(paths: list[str]) -> int:
    """How epochs end with windows: per (W, blocks, target, windows cut whole-job or partitioned, padded or
    packed) the ranges over models and traces of the short windows (closed short: the epoch's remainder, or a
    held tail that stopped growing), the windows under 90% of the target (short ones included; batching_sim's
    windows_under_90 column), the full windows' loss-token deviation over a random batch's of their mean sample
    count (window_sd_over_random: below 1 they vary less than a fixed-sample optimizer step), the fraction of the
    bound under (b) and IDLE rank-steps. One epoch per run, so "1-1" short windows is one per epoch."""
    cells: dict[tuple, list] = defaultdict(list)
    for path in paths:
        with open(path) as f:
            for r in csv.DictReader(f):
                if not r["policy"].startswith("odb") or r["window_target"] == "0":
                    continue
                blocks = int(r.get("partition_ranks") or 0)
                cut = "partitioned" if r.get("partitioned_windows") == "1" else "whole-job"
                key = (int(r["world"]), blocks, r["window_target"], cut,
                       "packed" if ":packed" in r["policy"] else "padded")
                cells[key].append((int(r["short_windows"]), int(r.get("windows_under_90") or -1),
                                   fraction(r, "_window")[0], 100 * float(r["idle_share"]),
                                   float(r.get("window_sd_over_random") or "nan")))

    def span(values: list, fmt: str = "{:.3f}") -> str:
        return fmt.format(min(values)) + "-" + fmt.format(max(values))

    print("| W | blocks | target | windows | mode | cells | short windows | under 90% | sd / random batch's | (b) "
          "| IDLE |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key, c in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], float(kv[0][2].rstrip("sm")),
                                                         kv[0][3], kv[0][4])):
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {len(c)} | {span([x[0] for x in c], '{}')} "
              f"| {span([x[1] for x in c], '{}')} | {span([x[4] for x in c], '{:.2f}')} | {span([x[2] for x in c])} "
              f"| {span([x[3] for x in c], '{:.1f}')}% |")
    return 0


def unequal_table(paths: list[str], within: float = 0.02) -> int:
    """Unequal micro-step counts (batching_sim --unequal-microsteps; time model (b) only): per (model, trace,
    policy, target) the fraction of the padded bound (any-layout for packed, *) without windows, with equal counts
    (the daemon's windows), with each rank's own count, own counts with single moves off the slowest rank, and
    re-dealt (the cheapest per window of those and the LPT deals); the rank-steps and the windows whose counts
    differ. Then per (model, target, policy) the traces within `within` of the unwindowed fraction under each."""
    runs: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for path in paths:
        with open(path) as f:
            for r in csv.DictReader(f):
                if r["policy"].startswith("odb"):
                    runs[(r["model"], r["trace"], r["policy"])][r["window_target"]] = r
    print("| model | trace | policy | target | no windows | equal counts (b) | own counts (b) | own + moves (b) "
          "| re-dealt (b) | ceiling, any counts | ceiling, equal counts | rank-steps equal / own / re-dealt "
          "| windows with unequal counts, own / re-dealt |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    summary: dict[tuple, list] = defaultdict(lambda: [0, 0, 0, 0, 0, [], [], [], [], [], 0, [], 0])
    for (model, trace, policy), by in sorted(runs.items()):
        base = by.get("0")
        if base is None:
            continue
        f0, any_layout = fraction(base)
        star = "*" if any_layout else ""
        bound = float(base["bound_seconds"] if any_layout else base["padded_bound_seconds"])
        for target, r in by.items():
            if target == "0" or not r.get("uneq_own_seconds"):
                continue
            fe, fo, fm, fr = (bound / float(r[c]) for c in ("uneq_equal_seconds", "uneq_own_seconds",
                                                            "uneq_moves_seconds", "uneq_redealt_seconds"))
            n = int(r["windows"])
            ceiling = bound / float(r["uneq_per_window_bound_seconds"])
            # The per-window bound for equal counts (bench/window_bound.h; CSVs from s26_ceil on).
            equal = bound / float(r["uneq_equal_counts_bound_seconds"]) if r.get("uneq_equal_counts_bound_seconds") \
                else None
            print(f"| {model} | {trace} | {'packed' if ':packed' in policy else 'padded'} "
                  f"| {target} | {f0:.3f}{star} | {fe:.3f} | {fo:.3f} | {fm:.3f} | {fr:.3f} | {ceiling:.3f} "
                  f"| {'-' if equal is None else f'{equal:.3f}'} "
                  f"| {r['uneq_equal_rank_steps']} / {r['uneq_own_rank_steps']} / {r['uneq_redealt_rank_steps']} "
                  f"| {100 * int(r['uneq_own_differ']) / n:.1f}% / {100 * int(r['uneq_redealt_differ']) / n:.1f}% |")
            s = summary[(model, target, "packed" if ":packed" in policy else "padded")]
            for i, f in enumerate((fe, fo, fm, fr)):
                s[i] += f >= f0 * (1 - within)
                s[5 + i].append(f)
            s[4] += 1
            s[9].append(ceiling)
            s[10] += ceiling >= f0 * (1 - within)
            if equal is not None:
                s[11].append(equal)
                s[12] += equal >= f0 * (1 - within)
    print()
    print(f"| model | target | mode | equal counts (b) | own counts (b) | own + moves (b) | re-dealt (b) "
          f"| ceiling, any counts | ceiling, equal counts | traces within {100 * within:.0f}% of unwindowed: equal / "
          f"own / moves / re-dealt / ceiling any / ceiling equal |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (model, target, mode), s in sorted(summary.items(), key=lambda kv: (kv[0][0], float(kv[0][1].rstrip("sm")),
                                                                              kv[0][2])):
        spans = [f"{min(v):.3f}-{max(v):.3f}" if v else "-" for v in s[5:10] + [s[11]]]
        eq = str(s[12]) if s[11] else "-"
        print(f"| {model} | {target} | {mode} | {' | '.join(spans)} | {s[0]} / {s[1]} / {s[2]} / {s[3]} / {s[10]} / {eq} "
              f"of {s[4]} |")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csvs", nargs="*", help="batching_sim CSVs to tabulate (without --bin)")
    p.add_argument("--bin", help="bazel-bin of a -c opt build: run the matrix first")
    p.add_argument("--out", default="bench/results/windows", help="where the runs write their CSV and markdown")
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--window", type=int, default=512, help="grouping.window of policies without :wN")
    p.add_argument("--max-tokens", type=int, default=4096, help="L_max: padded tokens per rank step")
    p.add_argument("--targets", default="16s,1m",
                   help="window targets (loss tokens; Ns = N mean samples of the trace, Nm = N x W x L_max)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--no-window-balance", action="store_true",
                   help="windows without balance over the window (the cut alone); CSVs named *_nobal")
    p.add_argument("--traces", default=TRACES)
    p.add_argument("--policies", default=POLICIES)
    p.add_argument("--partition-ranks", type=int, default=0,
                   help="plan the global odb policies in blocks of this many ranks (batching_sim --partition-ranks); "
                        "CSVs named *_p<P>")
    p.add_argument("--partitioned-windows", action="store_true",
                   help="with --partition-ranks: windows as a partitioned daemon cuts them (CSVs *_p<P>pw)")
    p.add_argument("--partition-table", action="store_true",
                   help="the partitioned-planning table (whole-job against partitioned windows) from the CSVs")
    p.add_argument("--end-table", action="store_true",
                   help="how the epochs end: short windows, windows under 90%% of the target, (b) and IDLE")
    p.add_argument("--window-spread", type=float, default=None,
                   help="batching_sim --window-spread (optimizer.window_spread; default: batching_sim's, the daemon's 1)")
    p.add_argument("--seed", type=int, default=None,
                   help="batching_sim --seed (the traces' and arrival order's; default: batching_sim's, 1)")
    p.add_argument("--unequal-microsteps", action="store_true",
                   help="batching_sim --unequal-microsteps (CSVs *_uneq), then the unequal-counts table")
    p.add_argument("--unequal-table", action="store_true",
                   help="the unequal micro-step counts table from CSVs of --unequal-microsteps runs")
    p.add_argument("--digest", action="store_true",
                   help="one row per (target, mode) over the models and traces instead (the docs' table)")
    args = p.parse_args()
    paths = list(args.csvs)
    if args.bin:
        paths += run_matrix(args)
    if not paths:
        p.error("give --bin to run the matrix, or CSV files")
    if args.partition_table:
        return partition_table(paths)
    if args.end_table:
        return end_table(paths)
    if args.unequal_microsteps or args.unequal_table:
        return unequal_table(paths)
    return digest(paths) if args.digest else table(paths)


if __name__ == "__main__":
    sys.exit(main())
