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


MODELS = ("gpu_1b_h100", "gpu_7b_h100", "gpu_70b_h200", "cpu_calibrated", "default_tokens", "attention_heavy")
# The daemon's defaults in a trainer-bound job: global planner, window 512, a
# round waits for half of queue_steps (32) to be free and then plans every
# group of the windows (PlannerConfig::min_free_slots, full_rounds).
SHIPPED = "odb:global:q32:w512:paced16:full"
DETERMINISTIC = "odb:global:q32:w512:paced16:det"  # the same with alignment.deterministic
PREVIOUS = "odb:local:q32:w256:paced"  # the defaults before (local, window 256, a round per freed slot)
COLUMNS = [  # (policy, header)
    ("reference_odb:w16", "reference, window 16 (published default)"),
    ("reference_odb:w256", "reference, window 256"),
    (SHIPPED, "odb defaults (global, window 512, rounds at half the queue, full rounds), trainer-paced"),
    (DETERMINISTIC, "odb defaults + alignment.deterministic, trainer-paced"),
    (PREVIOUS, "previous defaults (local, window 256, a round per freed slot), trainer-paced"),
    ("offline_dp", "offline DP groups"),
]


def f(r, key):
    return float(r[key]) if r.get(key) not in (None, "") else None


def summary(rows):
    """Per trace: the bounds' ratio, then each column's fraction of the padded bound."""
    by = {(r["trace"], r["policy"]): r for r in rows}
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    cols = [(p, h) for p, h in COLUMNS if any(r["policy"] == p for r in rows)]
    head = ["trace", "Standard batch size (max / p99)", "padded bound / bound",
            "Standard, never over budget", "Standard at the p99 batch size (of bound; over-budget rank steps)"] + [
        h for _, h in cols] + ["packing (of bound)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tally = {SHIPPED: [0, 0], DETERMINISTIC: [0, 0]}
    for t in traces:
        any_row = by[(t, "standard")]
        pb, b = f(any_row, "padded_bound_seconds"), f(any_row, "bound_seconds")
        cells = [t, f"{any_row['batch_size']} / {any_row['p99_batch_size']}", f"{b / pb:.3f}",
                 f"{f(any_row, 'of_padded_bound'):.3f}"]
        p99 = by.get((t, "standard_p99"))
        cells.append(f"{f(p99, 'of_bound'):.3f} ({p99['over_budget_rank_steps']})" if p99 else "")
        for p, _ in cols:
            cells.append(f"{f(by[(t, p)], 'of_padded_bound'):.3f}")
        cells.append(f"{f(by[(t, 'packing')], 'of_bound'):.3f}" if (t, "packing") in by else "")
        lines.append("| " + " | ".join(cells) + " |")
        refs = [float(by[(t, p)]["samples_per_s"]) for p in ("reference_odb:w16", "reference_odb:w256")
                if (t, p) in by]
        for p, counts in tally.items():
            if (t, p) in by:
                counts[0] += all(float(by[(t, p)]["samples_per_s"]) > r for r in refs)
                counts[1] += f(by[(t, p)], "of_padded_bound") >= 0.97
    n = len(traces)
    checks = " ".join(f"`{p}`: ahead of both reference rows on {a}/{n} traces, within 3% of the padded bound "
                      f"on {w}/{n}." for p, (a, w) in tally.items() if any(r["policy"] == p for r in rows))
    return "\n".join(lines), checks


def bound_check(all_rows):
    """The largest fraction of either bound any row reaches (must stay <= 1)."""
    best_any = max(all_rows, key=lambda r: float(r["of_bound"]))
    padded = [r for r in all_rows if r["of_padded_bound"] not in ("", None)]
    best_pad = max(padded, key=lambda r: float(r["of_padded_bound"]))
    return (f"Highest fraction of the bound over every row of every table above: {float(best_any['of_bound']):.3f} "
            f"(`{best_any['policy']}`, {best_any['trace']}, `{best_any['model']}`); of the padded bound, over every "
            f"padded row within budget: {float(best_pad['of_padded_bound']):.3f} (`{best_pad['policy']}`, "
            f"{best_pad['trace']}, `{best_pad['model']}`). `batching_sim` exits with status 5 if a schedule within "
            f"budget ever beats a bound.")


def loss_at_time_section(out, cmd):
    """Section 5: time to a target held-out loss, Standard vs odb at their best LRs (bench/loss_at_time.py)."""
    import json

    md = ["## 5. Loss at equal time: time to a target held-out loss (bench/loss_at_time.py)", ""]
    path = out / "loss_at_time.json"
    try:
        result = json.loads(path.read_text())
        a, cfg = result["analysis"], result["config"]
    except (OSError, ValueError, KeyError) as e:
        text = path.read_text().strip() if path.exists() else ""
        return md + [f"not available ({text or type(e).__name__})", ""]
    md += [f"Command: `{cmd or result['command']}`", "",
           f"Same model, initialisation, samples and objective (token-level mean cross-entropy) for both; "
           f"AdamW with a {cfg['warmup_steps']}-step warmup; each method at its best LR of the grid "
           f"{', '.join(cfg['lrs'])} (lowest final held-out loss); {cfg['samples']} samples x {cfg['epochs']} "
           f"epochs, {cfg['heldout']} held-out samples, {cfg['world_size']} ranks, {cfg['device']}. Time = the "
           f"training clock, evaluation excluded. **Target {a['target']:.3f}** = (1 + {a['margin']:g}) x "
           f"{a['reference_loss']:.3f}, the higher of the two best final held-out losses. Load average "
           f"{result['loadavg_min']:.1f}-{result['loadavg_max']:.1f}. Method: docs/benchmarks.md section 5.", "",
           "| method | best LR | final held-out loss | time to target (s) | tokens to target | steps to target "
           "| real tokens/s |", "|---|---|---|---|---|---|---|"]

    def g(x, spec):
        return "not reached" if x is None else format(x, spec)

    for key, name in (("standard", "Standard"), ("odb", "odb")):
        m = a["methods"][key]
        md.append(f"| {name} | {m['lr']:g} | {m['final_heldout_loss']:.3f} | {g(m['seconds_to_target'], '.1f')} | "
                  f"{g(m['tokens_to_target'], ',.0f')} | {g(m['steps_to_target'], '.0f')} | "
                  f"{m['real_tokens_per_s']:.0f} |")
    sp, tr = a.get("time_to_target_speedup"), a.get("tokens_to_target_ratio")
    md += ["", f"odb speed-up in time to target (Standard's time / odb's): **x{g(sp, '.2f')}**; tokens to "
               f"target odb / Standard x{g(tr, '.2f')}; real tokens/s odb / Standard "
               f"x{a['ratio_real_tokens_per_s']:.2f}. Checks: from where each curve stays below the target "
               f"x{g(a.get('time_to_stay_below_target_speedup'), '.2f')}; tokens to target over each method's median "
               f"real tokens/s of the grid (load-robust) x{g(a.get('time_to_target_speedup_at_median_rate'), '.2f')}. "
               f"Every run of the grid and looser targets: "
               f"[loss_at_time.md](loss_at_time.md).", ""]
    try:  # the budget grid (optimizer-step granularity), from the same JSON
        import sys

        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
        import loss_at_time

        if "budgets" not in a:
            loss_at_time.add_budgets(result)
        grid = loss_at_time.budget_markdown(result)
    except (ImportError, KeyError, ValueError, ZeroDivisionError) as e:
        grid = ["", f"(budget grid: not available, {type(e).__name__}: {e})"]
    if grid:
        md += grid[1:] + [""]
    if (out / "loss_at_time.png").exists():
        md += ["![Held-out loss vs training clock and vs tokens, both methods at their best LR; the budget grid]"
               "(loss_at_time.png)",
               "", f"*Top: held-out loss vs the training clock (left) and vs real tokens (right) at budget "
                   f"{cfg['max_tokens']}; dashed: the target. Bottom (when the budget grid ran): every (method, "
                   f"budget) configuration at its best LR, and its time to the target; "
                   f"`{cmd or result['command']}`.*", ""]
    return md


def gpu_section(out):
    """Section 6: the GPU runs committed under <out>/gpu_h200/ (bench/gpu_run.sh on a GPU machine; bench/run
    cannot make them on a CPU, so it only reassembles them here)."""
    import json

    root = out / "gpu_h200"
    runs = sorted(p for p in root.glob("run*") if p.is_dir()) if root.is_dir() else []
    md = ["## 6. On a GPU (bench/gpu_run.sh, one H200; files under bench/results/gpu_h200/)", ""]
    if not runs:
        return md + ["not available (no bench/results/gpu_h200/run*/)", ""]
    md += ["Not produced by `bench/run` (no GPU here): the committed output of `bench/gpu_run.sh` on one H200, "
           "each run's `gpu_run.log` holds the machine, the build and every command; the per-run environment is in "
           "docs/benchmarks.md, \"Measured on an H200\".", "",
           "| run | demo: model, budget | demo real tokens/s Standard / odb (steps) | odb / Standard | loss: budget, "
           "target | time to target Standard / odb (best LR) | odb speed-up | loss command |",
           "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        cells = [run.name]
        try:
            d = json.loads((run / "gpu_demo.json").read_text())
            s, o = d["standard"], d["odb"]
            cells += [f"d{d['d_model']} x {d['layers']}, {d['max_tokens']}",
                      f"{s['real_tokens_per_s']:,.0f} ({s['steps']}) / {o['real_tokens_per_s']:,.0f} ({o['steps']})",
                      f"x{d['ratio_real_tokens_per_s']:.2f}"]
        except (OSError, ValueError, KeyError):
            cells += ["(no demo in this run)", "", ""]
        try:
            r = json.loads((run / "loss_at_time.json").read_text())
            a = r["analysis"]
            s, o = a["methods"]["standard"], a["methods"]["odb"]

            def t(m):
                return "not reached" if m["seconds_to_target"] is None else f"{m['seconds_to_target']:.1f} s"

            sp = a.get("time_to_target_speedup")
            cells += [f"{r['config']['max_tokens']}, {a['target']:.3f}",
                      f"{t(s)} ({s['lr']:g}) / {t(o)} ({o['lr']:g})",
                      "n/a" if sp is None else f"x{sp:.2f}", f"`{r['command']}`"]
        except (OSError, ValueError, KeyError):
            cells += ["(no loss run)", "", "", ""]
        md.append("| " + " | ".join(cells) + " |")
    return md + ["", "Below 1: odb slower to the target (budget 8192: odb's steps carry ~7x Standard's real tokens, "
                     "54-59 optimizer steps in 2 epochs). These runs have no budget grid (section 5's matched-"
                     "granularity comparison is CPU-only so far); the command for one is in docs/benchmarks.md.", ""]


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

    md += ["## 1. Batching policies (simulated)", "",
           "Every figure below is a fraction of a **lower bound no schedule can beat** (docs/benchmarks.md, "
           "\"The bound\"): the *padded bound* is the exact optimum of padded batching for one rank divided by "
           "W (no padded policy, odb included, can reach more than 1.000 of it); the *bound* is a relaxation "
           "that also covers packing and every other layout. `padded bound / bound` says how far the best "
           "padded schedule can at most be from the best layout of any kind. *Trainer-paced*: the trainer is "
           "slower than the daemon (any accelerator job): the daemon runs a round once half of its queue is free "
           "(Daemon::RoundDue) and plans every group of the windows (`:paced16:full`); the previous defaults ran "
           "a round each time one slot freed and planned one step per round (`:paced`); *drained*: every round "
           "sees the whole queue free. The reference rule is simulated with an unbounded queue (its best case).",
           ""]
    all_rows = []
    for model in MODELS:
        path = out / f"sim_{model}.csv"
        if not path.exists():
            continue
        rows = read_csv(path)
        all_rows += rows
        table, checks = summary(rows)
        md += [f"### Fraction of the padded bound, model `{model}`, W = 8", "",
               f"Command: `{cmds.get('sim_' + model, '?')}`", "", table, "", checks, ""]
    if all_rows:
        md += [bound_check(all_rows), ""]
    if (out / "sim_w1_default_tokens.csv").exists():
        rows = read_csv(out / "sim_w1_default_tokens.csv")
        table, _ = summary(rows)
        md += ["### Grouping alone: W = 1, model `default_tokens` (no cross-rank alignment or imbalance)", "",
               f"Command: `{cmds.get('sim_w1', '?')}`", "", table, ""]
    if (out / "sweep_scale.md").exists():
        md += ["### Longer epochs: fraction of the padded bound as the trace grows (W = 8)", "",
               f"Command: `{cmds.get('sweep', '?')}` (second part)", "",
               "Trainer-paced rounds of one step each degrade as the epoch grows (the samples no round wants "
               "pile up in the window); planning every group of the window per round (`deterministic`) or "
               "holding rounds until half the queue is free does not.", "",
               (out / "sweep_scale.md").read_text(), ""]
    if (out / "sweep_defaults.md").exists():
        md += ["### Which out-of-the-box configuration wins (all six models x five traces, W = 8)", "",
               f"Command: `{cmds.get('sweep', '?')}`", "",
               "Worst cell over the 30 trace x model cells of each configuration; *passes* = ahead of both "
               "reference rows in every cell and at least 0.970 of the padded bound in every cell.", "",
               (out / "sweep_defaults.md").read_text(), ""]
    for model in MODELS:
        if (out / f"sim_{model}.md").exists():
            md += [f"<details><summary>All policies, model <code>{model}</code>, W = 8</summary>", "",
                   f"Command: `{cmds.get('sim_' + model, '?')}`", "", (out / f"sim_{model}.md").read_text(), "",
                   "</details>", ""]
    md += ["### Figures", "", f"Command: `{cmds.get('plots', '?')}` (after the simulator command above)", ""]
    for png, caption in (("bound_fraction.png", "Fraction of the bound (any layout), per policy and trace"),
                         ("padding.png", "Padding fraction per policy and trace"),
                         ("step_cost.png", "Distribution of the slowest rank's step cost")):
        if (out / png).exists():
            md += [f"![{caption}]({png})", "", f"*{caption}; model gpu_7b_h100, W = 8; `{run_cmd}`.*", ""]

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
    md += loss_at_time_section(out, cmds.get("loss_at_time"))
    md += gpu_section(out)
    (out / "REPORT.md").write_text("\n".join(md))
    print(f"wrote {out / 'REPORT.md'}")


if __name__ == "__main__":
    main()
