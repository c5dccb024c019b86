#!/usr/bin/python3
"""Assembles bench/results/REPORT.md from the files bench/run wrote there.

    /usr/bin/python3 bench/report.py --out bench/results
"""
import argparse
import csv
import datetime
import pathlib
import platform
import subprocess


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def commands(out):
    cmds = {}
    path = out / "commands.tsv"
    if path.exists():
        for line in path.read_text().splitlines():
            key, _, cmd = line.partition("\t")
            cmds[key] = cmd.replace(str(pathlib.Path.cwd()) + "/", "")
    return cmds


def short_bin(cmd):
    """Shows bazel-bin paths as `$(bazel info -c opt bazel-bin)/...`."""
    parts = []
    for word in cmd.split():
        if "/bazel-out/k8-opt/bin/" in word:
            word = "$BIN/" + word.split("/bazel-out/k8-opt/bin/", 1)[1]
        elif word.endswith("/bazel-out/k8-opt/bin"):
            word = "$BIN"
        parts.append(word)
    return " ".join(parts)


def summary(rows):
    by = {(r["trace"], r["policy"]): r for r in rows}
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    lines = ["| trace | odb (local) / reference | odb (local) / oracle | odb global / oracle | reference / oracle | "
             "padding local / global | max/mean rank cost local / global |", "|---|---|---|---|---|---|---|"]
    ahead = within = within_global = low_pad = 0
    for t in traces:
        o, g, ref, orc = by[(t, "odb")], by[(t, "odb_global")], by[(t, "reference_odb")], by[(t, "oracle")]
        so, sg = float(o["samples_per_s"]), float(g["samples_per_s"])
        sr, sc = float(ref["samples_per_s"]), float(orc["samples_per_s"])
        ahead += so > sr
        within += so >= 0.97 * sc
        within_global += sg >= 0.97 * sc
        low_pad += float(o["padding_fraction"]) < 0.05
        lines.append(f"| {t} | {so / sr:.3f} | {so / sc:.3f} | {sg / sc:.3f} | {sr / sc:.3f} | "
                     f"{100 * float(o['padding_fraction']):.1f}% / {100 * float(g['padding_fraction']):.1f}% | "
                     f"{float(o['max_over_mean']):.3f} / {float(g['max_over_mean']):.3f} |")
    n = len(traces)
    checks = (f"Targets (DESIGN.md): local odb ahead of the reference rule on {ahead}/{n} traces; "
              f"within 3% of the oracle: local {within}/{n}, global (alignment.planner: global) "
              f"{within_global}/{n}; local padding under 5% on {low_pad}/{n}.")
    return "\n".join(lines), checks


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", default="0")
    parser.add_argument("--elapsed", default="?")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    cmds = {k: short_bin(v) for k, v in commands(out).items()}
    run_cmd = "bench/run --quick" if args.quick == "1" else "bench/run"
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        rev = "?"
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    md = [f"# odb benchmark report", "",
          f"Produced by `{run_cmd}` on {datetime.datetime.now().isoformat(timespec='seconds')} "
          f"(git {rev} + working tree), {platform.node()}: {cpu}, {len(open('/proc/cpuinfo').read().split('processor')) - 1} "
          f"CPUs, in {args.elapsed} s. `$BIN` = `$(bazel info -c opt bazel-bin)`. What each number means: "
          f"docs/benchmarks.md.", ""]

    md += ["## 1. Batching policies (simulated)", ""]
    for model in ("cpu_calibrated", "default_tokens", "attention_heavy"):
        path = out / f"sim_{model}.csv"
        if not path.exists():
            continue
        table, checks = summary(read_csv(path))
        md += [f"### odb vs reference ODB vs oracle, model `{model}`, W = 8", "",
               f"Command: `{cmds.get('sim_' + model, '?')}`", "", table, "", checks, ""]
    if (out / "sim_w1_default_tokens.csv").exists():
        table, checks = summary(read_csv(out / "sim_w1_default_tokens.csv"))
        md += ["### Grouping alone: W = 1, model `default_tokens` (no cross-rank alignment or imbalance)", "",
               f"Command: `{cmds.get('sim_w1', '?')}`", "", table, "", checks, ""]
    if (out / "sim_cpu_calibrated.md").exists():
        md += ["### All policies, model `cpu_calibrated`, W = 8", "",
               f"Command: `{cmds.get('sim_cpu_calibrated', '?')}`", "",
               (out / "sim_cpu_calibrated.md").read_text(), ""]
    md += ["### Figures", "", f"Command: `{cmds.get('plots', '?')}` (after the simulator command above)", ""]
    for png, caption in (("throughput_ratio.png", "Throughput relative to Standard, per policy and trace"),
                         ("padding.png", "Padding fraction per policy and trace"),
                         ("step_cost.png", "Distribution of the slowest rank's step cost")):
        if (out / png).exists():
            md += [f"![{caption}]({png})", "", f"*{caption}; model cpu_calibrated, W = 8; `{run_cmd}`.*", ""]

    md += ["## 2. Data plane: producer -> odbd -> consumer vs raw ZMQ PUSH/PULL (ipc://)", "",
           f"Command: `{cmds.get('dataplane', '?')}`", ""]
    md += [(out / "dataplane.md").read_text() if (out / "dataplane.md").exists() else "not run", ""]

    md += ["## 3. Alignment round latency (src/align:align_bench)", ""]
    if "align_bench" in cmds:
        md += [f"Command: `{cmds['align_bench']}`", ""]
    md += ["```", (out / "align_bench.txt").read_text().strip() if (out / "align_bench.txt").exists() else "", "```", ""]

    md += ["## 4. Real training: Standard vs odb tokens/s (scripts/train_demo.sh --json)", ""]
    if "train_demo" in cmds:
        md += [f"Command: `{cmds['train_demo']}`", ""]
    md += ["```", (out / "train_demo.json").read_text().strip() if (out / "train_demo.json").exists() else "", "```",
           ""]
    (out / "REPORT.md").write_text("\n".join(md))
    print(f"wrote {out / 'REPORT.md'}")


if __name__ == "__main__":
    main()
