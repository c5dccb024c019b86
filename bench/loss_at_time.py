#!/usr/bin/python3
"""Loss at equal time: Standard vs odb, each at its best learning rate, on held-out loss.

Runs examples/train_demo.py (2 DDP ranks, the same model, initialisation, samples
and objective for both methods: token-level mean cross-entropy, AdamW with a short
linear warmup) once per learning rate of a small grid, at the same recipe by default
(--global-batch 16: Standard accumulates micro-batches to 16 samples per optimizer
step, odb runs accumulation windows of the same expected loss tokens; the memory
budget is then a throughput knob only; --global-batch 0: each method's budget sets
its optimizer batch, the comparison before windows). Each run records, for both
methods, the held-out loss against the training clock (evaluation excluded) and
against real tokens trained. Then:

  * best LR per method: the grid value with the lowest final held-out loss;
  * target: (1 + margin) x the higher of the two methods' best final held-out
    losses (both reach it by construction: each method's final point at its best
    LR is at or below it);
  * time to target: the training clock at which the held-out loss first reaches
    the target, linearly interpolated between the two evaluation points around
    the crossing; tokens and optimizer steps to target the same way;
  * real tokens/s: real tokens trained / the training clock, at the best LR.

Budget grid (optimizer-step granularity): a bigger token budget means fewer,
larger optimizer steps per epoch, which can cost loss per token. So each method
also runs alone at other budgets (--standard-budgets: Standard's batch size is
max_tokens // max_len; --odb-budgets, at least --max-len), each over the LR grid
--budget-lrs. Per (method, budget) configuration: its best LR (same rule), time
to the same target, real tokens per optimizer step and rank; per method the
fastest configuration ("best of the grid for each"); and matched pairs: each
Standard configuration against the odb configuration with the nearest real tokens
per step (the same step granularity). Empty --standard-budgets and --odb-budgets
(the defaults: at the same recipe the budget no longer sets the optimizer batch)
skip the grid.

Writes <out>/loss_at_time.json (every run's curves and the figures),
<out>/loss_at_time.md (tables) and <out>/loss_at_time.png (held-out loss vs
training clock and vs tokens, both methods at their best LR; every configuration
of the budget grid and its time to target); the demo's progress goes to
<out>/loss_at_time.log. The summary also gives odb's time-to-target speed-up over
its real tokens/s ratio (how much of its throughput survives as time to the same
loss: the recipe is the same, so the tokens to target should be too) and the
figures at one LR for both (Standard's best). The defaults (3 joint runs at budget
512, each 2 epochs of 2000 samples) take about three times as long as the main job
(scripts/train_demo.sh) on the same machine; the budget grid (e.g. --global-batch 0
--standard-budgets 1024,2048 --odb-budgets 256) adds 6 single-method runs. On a
GPU, e.g.:

  /usr/bin/python3 bench/loss_at_time.py --device cuda --samples 6000 --max-len 1024 \\
      --max-tokens 8192 --d-model 512 --layers 6 --vocab 4096 --workers 2 \\
      --eval-every-tokens 40000 --lrs 3e-4,1e-3,3e-3,1e-2 --global-batch 64 --out bench/results/gpu

Method and caveats: docs/benchmarks.md, section 5.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = (("standard", "Standard"), ("odb", "odb"))
# The peers (examples/peers.py) and odb's packed mode, trained in the same joint runs with --peers.
PEERS = ("length_grouped", "packed", "bucketing", "kk_balanced", "odb_packed")
ODB_MODES = ("odb", "odb_packed")


def crossing(curve: list, target: float, key: str):
    """The value of `key` where the held-out loss first reaches `target` (linear
    interpolation between the points around the crossing); None if it never does."""
    prev = None
    for c in curve:
        loss = c["heldout_loss"]
        if loss is not None and math.isfinite(loss) and loss <= target:
            if prev is None:
                return float(c[key])
            l0, l1 = prev["heldout_loss"], loss
            frac = 1.0 if l0 == l1 else (l0 - target) / (l0 - l1)
            return float(prev[key]) + frac * (float(c[key]) - float(prev[key]))
        if loss is not None and math.isfinite(loss):
            prev = c
    return None


def settled(curve: list, target: float, key: str):
    """The value of `key` from which the held-out loss stays at or below `target` for the
    rest of the curve (interpolated after the last point above it); None if it ends above."""
    points = [c for c in curve if c["heldout_loss"] is not None and math.isfinite(c["heldout_loss"])]
    above = [i for i, c in enumerate(points) if c["heldout_loss"] > target]
    if not above:
        return float(points[0][key]) if points else None
    if above[-1] == len(points) - 1:
        return None
    return crossing(points[above[-1]:], target, key)


def final_loss(run: dict) -> float:
    loss = run.get("final_heldout_loss")
    return loss if loss is not None and math.isfinite(loss) else math.inf


def fmt(x, spec: str, none: str = "not reached") -> str:
    return none if x is None else format(x, spec)


def analyse(runs: dict, margin: float, extra_factors=(1.5, 2.0, 4.0)) -> dict:
    """runs: {lr (str): demo summary}. Returns the figures (best LRs, target, times)."""
    best = {}
    for key, _ in METHODS:
        lr = min(runs, key=lambda r: final_loss(runs[r][key]))
        best[key] = lr
    worse = max(final_loss(runs[best[k]][k]) for k, _ in METHODS)
    target = (1.0 + margin) * worse
    out = {"best_lr": {k: float(best[k]) for k, _ in METHODS}, "reference_loss": worse, "margin": margin,
           "target": target, "methods": {}, "grid": {}, "targets": []}
    for key, _ in METHODS:
        run = runs[best[key]][key]
        out["methods"][key] = {
            "lr": float(best[key]), "final_heldout_loss": final_loss(run),
            "seconds_to_target": crossing(run["curve"], target, "seconds"),
            "tokens_to_target": crossing(run["curve"], target, "tokens"),
            "steps_to_target": crossing(run["curve"], target, "steps"),
            "seconds_to_stay_below_target": settled(run["curve"], target, "seconds"),
            "tokens_to_stay_below_target": settled(run["curve"], target, "tokens"),
            "real_tokens_per_s": run["real_tokens_per_s"], "samples_per_s": run["samples_per_s"],
            "train_seconds": run["seconds"], "steps": run["steps"], "real_tokens": run["real_tokens"],
            "padding_fraction": run["padding_fraction"], "eval_points": len(run["curve"]),
        }
        # The method's throughput does not depend on the LR (the same batches), so the median over
        # the grid's runs is a load-robust estimate of it on a shared machine.
        m = out["methods"][key]
        m["real_tokens_per_s_grid_median"] = statistics.median(runs[lr][key]["real_tokens_per_s"] for lr in runs)
        m["seconds_to_target_at_median_rate"] = (m["tokens_to_target"] / m["real_tokens_per_s_grid_median"]
                                                 if m["tokens_to_target"] is not None else None)
        out["grid"][key] = {lr: {"final_heldout_loss": final_loss(runs[lr][key]),
                                 "seconds_to_target": crossing(runs[lr][key]["curve"], target, "seconds"),
                                 "tokens_to_target": crossing(runs[lr][key]["curve"], target, "tokens"),
                                 "real_tokens_per_s": runs[lr][key]["real_tokens_per_s"],
                                 "steps": runs[lr][key]["steps"]} for lr in runs}
    s, o = out["methods"]["standard"], out["methods"]["odb"]
    out["ratio_real_tokens_per_s"] = o["real_tokens_per_s"] / s["real_tokens_per_s"]
    out["time_to_target_speedup"] = (s["seconds_to_target"] / o["seconds_to_target"]
                                     if s["seconds_to_target"] and o["seconds_to_target"] else None)
    out["time_to_target_speedup_at_median_rate"] = (
        s["seconds_to_target_at_median_rate"] / o["seconds_to_target_at_median_rate"]
        if s["seconds_to_target_at_median_rate"] and o["seconds_to_target_at_median_rate"] else None)
    out["ratio_real_tokens_per_s_grid_median"] = o["real_tokens_per_s_grid_median"] / s["real_tokens_per_s_grid_median"]
    out["time_to_stay_below_target_speedup"] = (
        s["seconds_to_stay_below_target"] / o["seconds_to_stay_below_target"]
        if s["seconds_to_stay_below_target"] and o["seconds_to_stay_below_target"] else None)
    out["tokens_to_target_ratio"] = (o["tokens_to_target"] / s["tokens_to_target"]
                                     if s["tokens_to_target"] and o["tokens_to_target"] else None)
    # How much of its tokens/s ratio odb keeps in time to target (1: all of it; at the same recipe the
    # tokens to target should match, so this should be near 1; the criterion of issue 20 is >= 0.85).
    out["speedup_over_rate_ratio"] = (out["time_to_target_speedup"] / out["ratio_real_tokens_per_s"]
                                      if out["time_to_target_speedup"] else None)
    out["speedup_over_rate_ratio_at_median_rate"] = (
        out["time_to_target_speedup_at_median_rate"] / out["ratio_real_tokens_per_s_grid_median"]
        if out["time_to_target_speedup_at_median_rate"] else None)
    # The same LR for both (Standard's best): the recipe's LR is not retuned for odb.
    lr = best["standard"]
    same = {k: crossing(runs[lr][k]["curve"], target, "seconds") for k, _ in METHODS}
    out["same_lr"] = {"lr": float(lr), "seconds_to_target": same,
                      "final_heldout_loss": {k: final_loss(runs[lr][k]) for k, _ in METHODS},
                      "speedup": (same["standard"] / same["odb"] if same["standard"] and same["odb"] else None),
                      "ratio_real_tokens_per_s": runs[lr]["odb"]["real_tokens_per_s"] /
                      runs[lr]["standard"]["real_tokens_per_s"]}
    initial = min(runs[best[k]][k]["curve"][0]["heldout_loss"] for k, _ in METHODS)
    for factor in (1.0 + margin,) + tuple(extra_factors):
        t = factor * worse
        if factor != 1.0 + margin and t >= 0.9 * initial:
            continue  # hardly below the untrained model's loss: not a target
        row = {"factor": factor, "target": t}
        for key, _ in METHODS:
            curve = runs[best[key]][key]["curve"]
            row[key] = {"seconds": crossing(curve, t, "seconds"), "tokens": crossing(curve, t, "tokens")}
        row["speedup"] = (row["standard"]["seconds"] / row["odb"]["seconds"]
                          if row["standard"]["seconds"] and row["odb"]["seconds"] else None)
        out["targets"].append(row)
    return out


def analyse_peers(runs: dict, margin: float) -> dict:
    """Every method of the joint runs (Standard, odb and the --peers): each at its best LR (the lowest
    final held-out loss of the grid), time and tokens to one target, (1 + margin) x the highest of
    their best final held-out losses, the real tokens/s at the best LR and its median over the grid.
    odb's best mode (the faster of odb and odb_packed to the target) against the fastest peer."""
    methods = [m for m in next(iter(runs.values()))["methods"]]
    best = {m: min(runs, key=lambda lr: final_loss(runs[lr][m])) for m in methods}
    worse = max(final_loss(runs[best[m]][m]) for m in methods)
    target = (1.0 + margin) * worse
    rows = {}
    for m in methods:
        run = runs[best[m]][m]
        rows[m] = {"lr": float(best[m]), "final_heldout_loss": final_loss(run),
                   "seconds_to_target": crossing(run["curve"], target, "seconds"),
                   "tokens_to_target": crossing(run["curve"], target, "tokens"),
                   "real_tokens_per_s": run["real_tokens_per_s"],
                   "real_tokens_per_s_grid_median": statistics.median(runs[lr][m]["real_tokens_per_s"] for lr in runs),
                   "optimizer_steps": run.get("optimizer_steps"), "padding_fraction": run["padding_fraction"]}
    out = {"methods": rows, "target": target, "reference_loss": worse, "margin": margin}
    reached = {m: r["seconds_to_target"] for m, r in rows.items() if r["seconds_to_target"] is not None}
    odb = [m for m in ODB_MODES if m in reached]
    others = [m for m in reached if m not in ODB_MODES]
    if odb and others:
        best_odb = min(odb, key=reached.get)
        best_peer = min(others, key=reached.get)
        out.update(best_odb_mode=best_odb, best_peer=best_peer,
                   time_to_target_speedup_vs_best_peer=reached[best_peer] / reached[best_odb])
    return out


def peers_markdown(result: dict) -> list:
    p = result["analysis"].get("peers")
    if not p:
        return []
    lines = ["", f"Every method of the joint runs (--peers), each at its best LR; target {p['target']:.3f} = "
                 f"(1 + {p['margin']:g}) x {p['reference_loss']:.3f}, the highest best final held-out loss:", "",
             "| method | best LR | final held-out loss | time to target (s) | tokens to target | real tokens/s "
             "(grid median) | optimizer steps | padding |", "|---|---|---|---|---|---|---|---|"]
    for m, r in p["methods"].items():
        lines.append(f"| {m} | {r['lr']:g} | {r['final_heldout_loss']:.3f} | {fmt(r['seconds_to_target'], '.1f')} | "
                     f"{fmt(r['tokens_to_target'], ',.0f')} | {r['real_tokens_per_s']:.0f} "
                     f"({r['real_tokens_per_s_grid_median']:.0f}) | {r['optimizer_steps']} | "
                     f"{r['padding_fraction'] * 100:.1f}% |")
    if "best_peer" in p:
        lines += ["", f"odb's best mode ({p['best_odb_mode']}) against the fastest peer ({p['best_peer']}) in time "
                      f"to target: x{p['time_to_target_speedup_vs_best_peer']:.2f} (above 1: odb is faster)."]
    return lines


def config_key(method: str, budget: int) -> str:
    return f"{method}:{int(budget)}"


def config_label(method: str, budget: int, max_len: int) -> str:
    name = dict(METHODS)[method]
    if method == "standard":
        return f"{name}, batch {max(1, int(budget) // max_len)} ({int(budget)} tokens)"
    return f"{name}, budget {int(budget)}"


def analyse_budgets(runs: dict, budget_runs: dict, main_budget: int, target: float, world: int,
                    max_len: int, main_worse: float = None) -> dict:
    """The budget grid: every (method, budget) configuration, the main budget's from the joint runs
    (`runs`: {lr: {standard, odb}}), the others from `budget_runs` ({"method:budget": {lr: run}}).
    Per configuration: its best LR (lowest final held-out loss, the main comparison's rule), the time,
    tokens and steps to the main comparison's target at that LR, throughput and step granularity
    (real tokens per optimizer step and rank). Per method: the fastest configuration to the target.
    Matched pairs: for each Standard configuration, the odb configuration whose real tokens per step
    is nearest (in ratio) -- the comparison at (about) the same optimizer-step granularity."""
    configs = {}
    for key, _ in METHODS:
        configs[config_key(key, main_budget)] = {lr: r[key] for lr, r in runs.items()}
    for ck, by_lr in budget_runs.items():
        configs[ck] = dict(by_lr)
    rows = {}
    for ck, by_lr in configs.items():
        method, budget = ck.split(":")
        budget = int(budget)
        lr = min(by_lr, key=lambda r: final_loss(by_lr[r]))
        run = by_lr[lr]
        rows[ck] = {
            "method": method, "budget": budget, "label": config_label(method, budget, max_len),
            "main": budget == main_budget, "lr": float(lr), "lr_key": lr, "lrs": sorted(float(x) for x in by_lr),
            "final_heldout_loss": final_loss(run),
            "seconds_to_target": crossing(run["curve"], target, "seconds"),
            "tokens_to_target": crossing(run["curve"], target, "tokens"),
            "steps_to_target": crossing(run["curve"], target, "steps"),
            "real_tokens_per_s": run["real_tokens_per_s"],
            "real_tokens_per_s_median": statistics.median(r["real_tokens_per_s"] for r in by_lr.values()),
            "steps": run["steps"], "train_seconds": run["seconds"], "padding_fraction": run["padding_fraction"],
            "real_tokens_per_step_rank": run["real_tokens"] / max(1, run["steps"]) / world,
            "grid": {x: {"final_heldout_loss": final_loss(r), "seconds_to_target": crossing(r["curve"], target, "seconds"),
                         "real_tokens_per_s": r["real_tokens_per_s"], "steps": r["steps"]} for x, r in by_lr.items()},
        }
    # A tighter target from the whole grid: (1 + the main target's margin) x the higher of the two
    # methods' best final losses over all their configurations (None without a margin to read).
    best_final = {k: min((r["final_heldout_loss"] for r in rows.values() if r["method"] == k), default=math.inf)
                  for k, _ in METHODS}
    grid_target = (target / main_worse) * max(best_final.values()) if main_worse else None
    for ck, r in rows.items():
        by_lr = configs[ck]
        r["seconds_to_grid_target"] = (crossing(by_lr[r["lr_key"]]["curve"], grid_target, "seconds")
                                       if grid_target else None)
    fastest = {}
    for key, _ in METHODS:
        reached = [ck for ck, r in rows.items() if r["method"] == key and r["seconds_to_target"] is not None]
        fastest[key] = min(reached, key=lambda ck: rows[ck]["seconds_to_target"]) if reached else None
    fs, fo = fastest["standard"], fastest["odb"]
    pairs = []
    odbs = [ck for ck, r in rows.items() if r["method"] == "odb"]
    for ck, r in rows.items():
        if r["method"] != "standard" or not odbs:
            continue
        near = min(odbs, key=lambda o: abs(math.log(rows[o]["real_tokens_per_step_rank"] / r["real_tokens_per_step_rank"])))
        st, ot = r["seconds_to_target"], rows[near]["seconds_to_target"]
        pairs.append({"standard": ck, "odb": near,
                      "granularity_ratio": rows[near]["real_tokens_per_step_rank"] / r["real_tokens_per_step_rank"],
                      "speedup": st / ot if st and ot else None,
                      "ratio_real_tokens_per_s": rows[near]["real_tokens_per_s"] / r["real_tokens_per_s"]})
    tight = {}
    for key, _ in METHODS:
        reached = [ck for ck, r in rows.items() if r["method"] == key and r["seconds_to_grid_target"] is not None]
        tight[key] = min(reached, key=lambda ck: rows[ck]["seconds_to_grid_target"]) if reached else None
    ts, to = tight["standard"], tight["odb"]
    return {"target": target, "grid_target": grid_target, "fastest_to_grid_target": tight,
            "best_vs_best_speedup_grid_target": (rows[ts]["seconds_to_grid_target"] / rows[to]["seconds_to_grid_target"]
                                                 if ts and to else None),
            "configs": rows, "fastest": fastest, "matched": pairs,
            "best_vs_best_speedup": (rows[fs]["seconds_to_target"] / rows[fo]["seconds_to_target"]
                                     if fs and fo else None),
            "best_vs_best_ratio_real_tokens_per_s": (rows[fo]["real_tokens_per_s"] / rows[fs]["real_tokens_per_s"]
                                                     if fs and fo else None)}


def budget_markdown(result: dict) -> list:
    """The budget-grid tables (empty when the run had no grid)."""
    b = result["analysis"].get("budgets")
    if not b or len(b["configs"]) <= 2:
        return []
    cfg = result["config"]
    rows = b["configs"]
    order = sorted(rows, key=lambda ck: (ck.split(":")[0] != "standard", int(ck.split(":")[1])))
    lines = ["", f"**Budget grid** (optimizer-step granularity): the same target {b['target']:.3f}; each configuration "
                 f"at its best LR (lowest final held-out loss) of its grid (budget {cfg['max_tokens']}: "
                 f"{', '.join(cfg['lrs'])}, the joint runs above; other budgets: "
                 f"{', '.join(cfg.get('budget_lrs_list', []))}, one method per run). Real tokens/s of runs made at "
                 f"different times compare less well than those of one joint run (the machine's load varies).", "",
             "| configuration | real tokens / step / rank | best LR | final held-out loss | time to target (s) "
             "| tokens to target | steps to target | steps, total | real tokens/s | padding | time to the grid's "
             "tighter target (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for ck in order:
        r = rows[ck]
        edge = " (grid edge)" if len(r["lrs"]) > 1 and r["lr"] in (r["lrs"][0], r["lrs"][-1]) else ""
        mark = " *" if ck in b["fastest"].values() else ""
        lines.append(f"| {r['label']}{mark} | {r['real_tokens_per_step_rank']:.0f} | {r['lr']:g}{edge} | "
                     f"{r['final_heldout_loss']:.3f} | {fmt(r['seconds_to_target'], '.1f')} | "
                     f"{fmt(r['tokens_to_target'], ',.0f')} | {fmt(r['steps_to_target'], '.0f')} | {r['steps']} | "
                     f"{r['real_tokens_per_s']:.0f} | {r['padding_fraction'] * 100:.1f}% | "
                     f"{fmt(r.get('seconds_to_grid_target'), '.1f')} |")
    fs, fo = b["fastest"]["standard"], b["fastest"]["odb"]
    lines += ["", "\\* the fastest configuration of each method to the target.", ""]
    if fs and fo:
        lines.append(f"Best of the grid for each: {rows[fs]['label']} {rows[fs]['seconds_to_target']:.1f} s vs "
                     f"{rows[fo]['label']} {rows[fo]['seconds_to_target']:.1f} s: **odb speed-up "
                     f"x{b['best_vs_best_speedup']:.2f}** (real tokens/s x{b['best_vs_best_ratio_real_tokens_per_s']:.2f}).")
    else:
        lines.append(f"Best of the grid: Standard {rows[fs]['label'] if fs else 'never reaches the target'}, "
                     f"odb {rows[fo]['label'] if fo else 'never reaches the target'}.")
    if b.get("grid_target"):
        ts, to = b["fastest_to_grid_target"]["standard"], b["fastest_to_grid_target"]["odb"]
        lines += ["", f"The grid's tighter target {b['grid_target']:.3f} = (1 + {result['analysis']['margin']:g}) x the "
                      f"higher of the two methods' best final held-out losses over all their configurations: "
                      f"{(rows[ts]['label'] + ' ' + format(rows[ts]['seconds_to_grid_target'], '.1f') + ' s') if ts else 'never'}"
                      f" vs {(rows[to]['label'] + ' ' + format(rows[to]['seconds_to_grid_target'], '.1f') + ' s') if to else 'never'}"
                      f": odb speed-up x{fmt(b.get('best_vs_best_speedup_grid_target'), '.2f', 'n/a')}."]
    lines += ["", "Matched granularity (for each Standard configuration, the odb configuration with the nearest real "
                  "tokens per optimizer step and rank):", "",
              "| Standard | odb | odb / Standard real tokens per step | time to target: Standard / odb (s) "
              "| odb speed-up | real tokens/s odb / Standard |", "|---|---|---|---|---|---|"]
    for m in b["matched"]:
        s, o = rows[m["standard"]], rows[m["odb"]]
        lines.append(f"| {s['label']} | {o['label']} | x{m['granularity_ratio']:.2f} | "
                     f"{fmt(s['seconds_to_target'], '.1f')} / {fmt(o['seconds_to_target'], '.1f')} | "
                     f"x{fmt(m['speedup'], '.2f', 'n/a')} | x{m['ratio_real_tokens_per_s']:.2f} |")
    lines += ["", "Every run of the budget grid:", "",
              "| configuration | LR | final held-out loss | time to target (s) | real tokens/s | steps |",
              "|---|---|---|---|---|---|"]
    for ck in order:
        if rows[ck]["main"]:
            continue
        for lr, g in sorted(rows[ck]["grid"].items(), key=lambda kv: float(kv[0])):
            lines.append(f"| {rows[ck]['label']} | {float(lr):g} | {g['final_heldout_loss']:.3f} | "
                         f"{fmt(g['seconds_to_target'], '.1f')} | {g['real_tokens_per_s']:.0f} | {g['steps']} |")
    return lines


def markdown(result: dict) -> str:
    a, cfg = result["analysis"], result["config"]
    s, o = a["methods"]["standard"], a["methods"]["odb"]
    lines = [
        f"Command: `{result['command']}`", "",
        f"{cfg['world_size']} ranks, DDP gloo, device {cfg['device']}; TinyCausalLM d_model {cfg['d_model']}, "
        f"{cfg['layers']} layers, vocab {cfg['vocab']}; {cfg['samples']} training samples (long tail, max "
        f"{cfg['max_len']} tokens) x {cfg['epochs']} epochs, {cfg['heldout']} held-out samples; budget "
        f"{cfg['max_tokens']} tokens/step/rank (Standard: batch {max(1, cfg['max_tokens'] // cfg['max_len'])}); "
        f"AdamW, {cfg['warmup_steps']}-step linear warmup, LR grid {', '.join(cfg['lrs'])}; held-out loss every "
        f"{cfg['eval_every_tokens']} real tokens. Load average (1 min, before and after each run): "
        f"{result['loadavg_min']:.1f}-{result['loadavg_max']:.1f} on {result.get('cpus', '?')} CPUs.", "",
        f"**Target held-out loss {a['target']:.3f}** = (1 + {a['margin']:g}) x {a['reference_loss']:.3f}, the "
        f"higher of the two methods' best final held-out losses.", "",
        "| method | best LR | final held-out loss | time to target (s) | tokens to target | steps to target "
        "| real tokens/s (grid median) | steps, total | padding |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, name in METHODS:
        m = a["methods"][key]
        lines.append(f"| {name} | {m['lr']:g} | {m['final_heldout_loss']:.3f} | {fmt(m['seconds_to_target'], '.1f')} | "
                     f"{fmt(m['tokens_to_target'], ',.0f')} | {fmt(m['steps_to_target'], '.0f')} | "
                     f"{m['real_tokens_per_s']:.0f} ({m['real_tokens_per_s_grid_median']:.0f}) | {m['steps']} | "
                     f"{m['padding_fraction'] * 100:.1f}% |")
    sp, tr = a["time_to_target_speedup"], a["tokens_to_target_ratio"]
    lines += ["", f"Time to target: Standard {fmt(s['seconds_to_target'], '.1f')} s, odb "
                  f"{fmt(o['seconds_to_target'], '.1f')} s: **odb speed-up x{fmt(sp, '.2f', 'n/a')}** (Standard's "
                  f"time / odb's; above 1: odb is faster). odb / Standard: tokens to target "
                  f"x{fmt(tr, '.2f', 'n/a')}, real tokens/s x{a['ratio_real_tokens_per_s']:.2f}.", "",
              f"Recipe: {'the same for both, ' + str(cfg.get('global_batch')) + ' samples per optimizer step (Standard: gradient accumulation; odb: windows of the same expected loss tokens)' if cfg.get('global_batch') else 'each method one optimizer step per step (the budget sets the optimizer batch)'}; "
              f"schedule {cfg.get('schedule', 'warmup')}. odb keeps **x{fmt(a.get('speedup_over_rate_ratio'), '.2f', 'n/a')}** of "
              f"its real tokens/s ratio in time to target (speed-up / tokens/s ratio; x"
              f"{fmt(a.get('speedup_over_rate_ratio_at_median_rate'), '.2f', 'n/a')} at the grid-median rates).", "",
              *([f"At the same LR for both (Standard's best, {a['same_lr']['lr']:g}): final held-out loss Standard "
                 f"{a['same_lr']['final_heldout_loss']['standard']:.3f}, odb {a['same_lr']['final_heldout_loss']['odb']:.3f}; "
                 f"time to target Standard {fmt(a['same_lr']['seconds_to_target']['standard'], '.1f')} s, odb "
                 f"{fmt(a['same_lr']['seconds_to_target']['odb'], '.1f')} s: speed-up "
                 f"x{fmt(a['same_lr']['speedup'], '.2f', 'n/a')} (real tokens/s x{a['same_lr']['ratio_real_tokens_per_s']:.2f}).", ""]
                if "same_lr" in a else []),
              f"Load-robust check (wall-clock rates on a shared machine vary with its load): tokens to target / "
              f"the method's median real tokens/s over the {len(a['grid']['standard'])} runs of the grid = "
              f"Standard {fmt(s['seconds_to_target_at_median_rate'], '.1f')} s, odb "
              f"{fmt(o['seconds_to_target_at_median_rate'], '.1f')} s: speed-up "
              f"x{fmt(a['time_to_target_speedup_at_median_rate'], '.2f', 'n/a')} (median real tokens/s "
              f"x{a['ratio_real_tokens_per_s_grid_median']:.2f}).", "",
              f"The held-out loss is noisy (odb's more so: fewer, larger steps at a higher LR); from the first "
              f"point after which it stays at or below the target: Standard "
              f"{fmt(s['seconds_to_stay_below_target'], '.1f')} s / {fmt(s['tokens_to_stay_below_target'], ',.0f')} "
              f"tokens, odb {fmt(o['seconds_to_stay_below_target'], '.1f')} s / "
              f"{fmt(o['tokens_to_stay_below_target'], ',.0f')} tokens: speed-up "
              f"x{fmt(a['time_to_stay_below_target_speedup'], '.2f', 'n/a')}.", "",
              "Looser targets (multiples of the reference loss; the same runs at the best LRs):", "",
              "| target | Standard: s / tokens | odb: s / tokens | odb speed-up in time |", "|---|---|---|---|"]
    for row in a["targets"]:
        lines.append(f"| {row['target']:.3f} ({row['factor']:g} x) | {fmt(row['standard']['seconds'], '.1f')} / "
                     f"{fmt(row['standard']['tokens'], ',.0f')} | {fmt(row['odb']['seconds'], '.1f')} / "
                     f"{fmt(row['odb']['tokens'], ',.0f')} | x{fmt(row['speedup'], '.2f', 'n/a')} |")
    lines += ["", "Every run of the grid (time to the same target):", "",
              "| method | LR | final held-out loss | time to target (s) | tokens to target | real tokens/s | steps |",
              "|---|---|---|---|---|---|---|"]
    for key, name in METHODS:
        for lr, g in a["grid"][key].items():
            lines.append(f"| {name} | {float(lr):g} | {g['final_heldout_loss']:.3f} | "
                         f"{fmt(g['seconds_to_target'], '.1f')} | {fmt(g['tokens_to_target'], ',.0f')} | "
                         f"{g['real_tokens_per_s']:.0f} | {g['steps']} |")
    lines += peers_markdown(result)
    lines += budget_markdown(result)
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    a = result["analysis"]
    b = a.get("budgets")
    grid = bool(b) and len(b["configs"]) > 2
    fig, axes2 = plt.subplots(2 if grid else 1, 2, figsize=(13, 9.5 if grid else 4.5), squeeze=False)
    axes = axes2[0]
    colors = {"standard": "tab:blue", "odb": "tab:orange"}
    for key, name in METHODS:
        lr = a["methods"][key]["lr"]
        curve = result["runs"][result["lr_keys"][str(lr)]][key]["curve"]
        for ax, x, scale in ((axes[0], "seconds", 1.0), (axes[1], "tokens", 1e-3)):
            ax.plot([c[x] * scale for c in curve], [c["heldout_loss"] for c in curve], "-o", ms=3,
                    color=colors[key], label=f"{name} (LR {lr:g})")
            hit = a["methods"][key][f"{x}_to_target"]
            if hit is not None:
                ax.axvline(hit * scale, color=colors[key], ls=":", lw=1)

    def log_y(ax):
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
        ax.yaxis.set_minor_locator(LogLocator(subs="all"))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))

    for ax, xlabel in ((axes[0], "training clock (s), evaluation excluded"), (axes[1], "real tokens trained (k)")):
        ax.axhline(a["target"], color="gray", ls="--", lw=1, label=f"target {a['target']:.3f}")
        log_y(ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out loss (token-level cross-entropy)")
        ax.grid(alpha=0.3)
        ax.legend()
    sp = a["time_to_target_speedup"]
    cfg = result["config"]
    axes[0].set_title(f"Budget {cfg['max_tokens']}: held-out loss vs time (odb speed-up x{fmt(sp, '.2f', 'n/a')})",
                      fontsize=10)
    axes[1].set_title(f"Budget {cfg['max_tokens']}: held-out loss vs tokens", fontsize=10)
    if grid:
        rows = b["configs"]
        order = sorted(rows, key=lambda ck: (ck.split(":")[0] != "standard", int(ck.split(":")[1])))
        shades = {"standard": plt.get_cmap("Blues"), "odb": plt.get_cmap("Oranges")}
        count = {k: sum(1 for ck in order if rows[ck]["method"] == k) for k, _ in METHODS}
        seen = {k: 0 for k, _ in METHODS}
        ax = axes2[1][0]
        bars = []
        for ck in order:
            r = rows[ck]
            m = r["method"]
            seen[m] += 1
            color = shades[m](0.45 + 0.5 * seen[m] / max(1, count[m]))
            runs = result["runs"] if r["main"] else result["budget_runs"][ck]
            curve = (runs[r["lr_key"]][m] if r["main"] else runs[r["lr_key"]])["curve"]
            ax.plot([c["seconds"] for c in curve], [c["heldout_loss"] for c in curve], marker="o", ms=2, color=color,
                    ls="-" if m == "odb" else "--", label=f"{r['label']}, LR {r['lr']:g}")
            bars.append((f"{r['label']}\n{r['real_tokens_per_step_rank']:.0f} real tok/step/rank, LR {r['lr']:g}",
                         r["seconds_to_target"], r["train_seconds"], color))
        ax.axhline(a["target"], color="gray", ls="--", lw=1, label=f"target {a['target']:.3f}")
        log_y(ax)
        ax.set_xlabel("training clock (s), evaluation excluded")
        ax.set_ylabel("held-out loss")
        ax.set_title("Budget grid: every configuration at its best LR", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax = axes2[1][1]
        ys = list(range(len(bars)))[::-1]
        for y, (label, t, total, color) in zip(ys, bars):
            if t is None:
                ax.barh(y, total, color="white", edgecolor=color, hatch="//")
                ax.text(total, y, " not reached", va="center", fontsize=8)
            else:
                ax.barh(y, t, color=color)
                ax.text(t, y, f" {t:.0f} s", va="center", fontsize=8)
        ax.set_yticks(ys)
        ax.set_yticklabels([x[0] for x in bars], fontsize=7)
        ax.set_xlabel(f"time to held-out loss {a['target']:.3f} (s); hatched: not reached in the whole run")
        sp2 = b.get("best_vs_best_speedup")
        ax.set_title(f"Time to target per configuration (best of each: odb x{fmt(sp2, '.2f', 'n/a')})", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(f"Standard vs odb, each at its best LR; {cfg['world_size']} ranks, {cfg['device']}, "
                 f"{cfg['samples']} samples x {cfg['epochs']} epochs", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--samples", type=int, default=2000, help="training samples per epoch")
    p.add_argument("--heldout", type=int, default=100, help="held-out samples (never trained)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=512, help="token budget per step and rank")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--planner", choices=("local", "global"), default="global")
    p.add_argument("--lrs", default="3e-3,1e-2,3e-2", help="the LR grid of the main budget (comma-separated)")
    p.add_argument("--standard-budgets", default="",
                   help="budget grid: more max_tokens for Standard alone (batch = max_tokens // max_len), each "
                        "over --budget-lrs; empty: none")
    p.add_argument("--odb-budgets", default="",
                   help="budget grid: more max_tokens for odb alone (at least --max-len), each over --budget-lrs")
    p.add_argument("--budget-lrs", default="1e-2,3e-2", help="the LR grid of the budget grid's runs")
    p.add_argument("--peers", default="",
                   help="also train these methods in every joint run (comma-separated, or all: " + ", ".join(PEERS) +
                        "; train_demo.py --methods), each at its best LR of the grid against the same target")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--global-batch", type=int, default=16, metavar="G",
                   help="the same recipe for both methods (train_demo.py --global-batch): Standard accumulates to "
                        "G samples per optimizer step, odb runs windows of the same expected loss tokens; 0: the "
                        "old comparison, where each method's budget sets its optimizer batch")
    p.add_argument("--schedule", choices=("warmup", "cosine"), default="warmup",
                   help="train_demo.py --schedule (both methods)")
    p.add_argument("--eval-every-tokens", type=int, default=20000,
                   help="held-out loss each time this many more real tokens are trained (both methods)")
    p.add_argument("--margin", type=float, default=0.10,
                   help="target = (1 + margin) x the higher of the two best final held-out losses")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=int, default=1800, help="seconds per demo run")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--from-json", metavar="PATH",
                   help="no runs: redo the figures, tables and plot from an earlier loss_at_time.json")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
        result["analysis"] = analyse(result["runs"], result["config"]["margin"])
        if result["config"].get("peers"):
            result["analysis"]["peers"] = analyse_peers(result["runs"], result["config"]["margin"])
        add_budgets(result)
        write(result, out)
        return 0
    lrs = [x.strip() for x in args.lrs.split(",") if x.strip()]
    peers = PEERS if args.peers.strip() == "all" else tuple(x.strip() for x in args.peers.split(",") if x.strip())
    if any(m not in PEERS for m in peers):
        p.error(f"--peers: all, or a comma-separated subset of {','.join(PEERS)}")
    budget_lrs = [x.strip() for x in args.budget_lrs.split(",") if x.strip()]
    extra = [(m, int(x)) for m, spec in (("standard", args.standard_budgets), ("odb", args.odb_budgets))
             for x in spec.split(",") if x.strip() and int(x) != args.max_tokens]
    if any(b < args.max_len for m, b in extra if m == "odb"):
        p.error("--odb-budgets: a budget below --max-len cannot hold the longest sample")
    common = ["--json", "--quiet", "--device", args.device, "--samples", str(args.samples), "--heldout",
              str(args.heldout), "--epochs", str(args.epochs), "--max-len", str(args.max_len), "--max-tokens",
              str(args.max_tokens), "--d-model", str(args.d_model), "--layers", str(args.layers), "--vocab",
              str(args.vocab), "--world-size", str(args.world_size), "--workers", str(args.workers), "--planner",
              args.planner, "--warmup-steps", str(args.warmup_steps), "--eval-every", "0",
              "--global-batch", str(args.global_batch), "--schedule", args.schedule,
              "--eval-every-tokens", str(args.eval_every_tokens), "--seed", str(args.seed)]

    def demo(cmd, label, log):
        """One demo run (one retry: the shared build tree can be rebuilt under a run); its summary or None."""
        for attempt in (1, 2):
            loads.append(os.getloadavg()[0])
            print(f"[loss_at_time] {label} (attempt {attempt}): {shlex.join(cmd[1:])}", file=sys.stderr, flush=True)
            log.write(f"== {label} attempt {attempt}: {shlex.join(cmd)}\n")
            log.flush()
            t0 = time.time()
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                                  timeout=args.timeout)
            loads.append(os.getloadavg()[0])
            if proc.returncode == 0:
                summary = json.loads(proc.stdout)
                summary["loadavg_before_after"] = loads[-2:]
                summary["run_seconds"] = time.time() - t0
                print(f"[loss_at_time] {label}: {time.time() - t0:.0f} s; " + "; ".join(
                    f"{name}: final held-out loss {summary[k]['final_heldout_loss']:.3f}, real tokens/s "
                    f"{summary[k]['real_tokens_per_s']:.0f}" for k, name in METHODS if k in summary),
                    file=sys.stderr, flush=True)
                return summary
            log.write(proc.stdout)
            print(f"[loss_at_time] {label}: the demo failed (rc {proc.returncode}); see {out / 'loss_at_time.log'}",
                  file=sys.stderr, flush=True)
        return None

    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    runs, budget_runs, loads, started = {}, {}, [], time.time()
    with open(out / "loss_at_time.log", "w") as log:
        for lr in lrs:
            cmd = [args.python, str(ROOT / "examples/train_demo.py"), *common, "--lr", lr,
                   "--methods", ",".join(("standard", "odb") + peers)]
            runs[lr] = demo(cmd, f"budget {args.max_tokens}, lr {lr}", log)
            if runs[lr] is None:
                return 1
        for method, budget in extra:
            by_lr = budget_runs.setdefault(config_key(method, budget), {})
            for lr in budget_lrs:
                cmd = [args.python, str(ROOT / "examples/train_demo.py"), *common, "--methods", method,
                       "--max-tokens", str(budget), "--lr", lr]  # the later --max-tokens wins
                summary = demo(cmd, f"{method} alone, budget {budget}, lr {lr}", log)
                if summary is None:
                    return 1
                by_lr[lr] = dict(summary[method], loadavg_before_after=summary["loadavg_before_after"],
                                 run_seconds=summary["run_seconds"])
    analysis = analyse(runs, args.margin)
    if peers:
        analysis["peers"] = analyse_peers(runs, args.margin)
    command = "/usr/bin/python3 bench/loss_at_time.py" + "".join(
        f" {a}" for a in sys.argv[1:])
    result = {"command": command, "config": dict(vars(args), lrs=lrs, budget_lrs_list=budget_lrs),
              "elapsed_s": time.time() - started, "budget_runs": budget_runs,
              "cpus": os.cpu_count(),
              "loadavg_min": min(loads), "loadavg_max": max(loads), "lr_keys": {str(float(lr)): lr for lr in lrs},
              "analysis": analysis, "runs": runs}
    add_budgets(result)
    write(result, out)
    return 0


def add_budgets(result: dict) -> None:
    cfg = result["config"]
    result["analysis"]["budgets"] = analyse_budgets(result["runs"], result.get("budget_runs", {}), cfg["max_tokens"],
                                                    result["analysis"]["target"], cfg["world_size"], cfg["max_len"],
                                                    result["analysis"]["reference_loss"])


def write(result: dict, out: Path) -> None:
    (out / "loss_at_time.json").write_text(json.dumps(result, indent=1))
    (out / "loss_at_time.md").write_text(markdown(result))
    plot(result, out / "loss_at_time.png")
    print(markdown(result))
    print(f"wrote {out / 'loss_at_time.json'}, .md, .png (the runs took {result['elapsed_s']:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
