#!/usr/bin/python3
"""Loss at equal time: Standard vs odb, each at its best learning rate, on held-out loss.

Runs examples/train_demo.py (2 DDP ranks, the same model, initialisation, samples
and objective for both methods: token-level mean cross-entropy, AdamW with a short
linear warmup) once per learning rate of a small grid. Each run records, for both
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

Writes <out>/loss_at_time.json (every run's curves and the figures),
<out>/loss_at_time.md (tables) and <out>/loss_at_time.png (held-out loss vs
training clock and vs tokens, both methods at their best LR); the demo's progress
goes to <out>/loss_at_time.log. The defaults (4 demo runs) take ~10-15 minutes on
a 2-core CPU (longer while other jobs share it). On a GPU, e.g.:

  /usr/bin/python3 bench/loss_at_time.py --device cuda --samples 6000 --max-len 1024 \\
      --max-tokens 8192 --d-model 512 --layers 6 --vocab 4096 --workers 2 \\
      --eval-every-tokens 40000 --lrs 3e-4,1e-3,3e-3,1e-2 --out bench/results/gpu

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
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    a = result["analysis"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
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
    for ax, xlabel in ((axes[0], "training clock (s), evaluation excluded"), (axes[1], "real tokens trained (k)")):
        ax.axhline(a["target"], color="gray", ls="--", lw=1, label=f"target {a['target']:.3f}")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
        ax.yaxis.set_minor_locator(LogLocator(subs="all"))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out loss (token-level cross-entropy)")
        ax.grid(alpha=0.3)
        ax.legend()
    sp = a["time_to_target_speedup"]
    axes[0].set_title(f"Held-out loss vs time (time-to-target speed-up of odb: x{fmt(sp, '.2f', 'n/a')})")
    axes[1].set_title("Held-out loss vs tokens")
    cfg = result["config"]
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
    p.add_argument("--lrs", default="3e-3,1e-2,3e-2,1e-1", help="the LR grid (comma-separated)")
    p.add_argument("--warmup-steps", type=int, default=10)
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
        write(result, out)
        return 0
    lrs = [x.strip() for x in args.lrs.split(",") if x.strip()]
    common = ["--json", "--quiet", "--device", args.device, "--samples", str(args.samples), "--heldout",
              str(args.heldout), "--epochs", str(args.epochs), "--max-len", str(args.max_len), "--max-tokens",
              str(args.max_tokens), "--d-model", str(args.d_model), "--layers", str(args.layers), "--vocab",
              str(args.vocab), "--world-size", str(args.world_size), "--workers", str(args.workers), "--planner",
              args.planner, "--warmup-steps", str(args.warmup_steps), "--eval-every", "0",
              "--eval-every-tokens", str(args.eval_every_tokens), "--seed", str(args.seed)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    runs, loads, started = {}, [], time.time()
    with open(out / "loss_at_time.log", "w") as log:
        for lr in lrs:
            cmd = [args.python, str(ROOT / "examples/train_demo.py"), *common, "--lr", lr]
            for attempt in (1, 2):  # one retry: the shared build tree can be rebuilt under a run
                loads.append(os.getloadavg()[0])
                print(f"[loss_at_time] lr {lr} (attempt {attempt}): {shlex.join(cmd[1:])}", file=sys.stderr,
                      flush=True)
                log.write(f"== lr {lr} attempt {attempt}: {shlex.join(cmd)}\n")
                log.flush()
                t0 = time.time()
                proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                                      timeout=args.timeout)
                loads.append(os.getloadavg()[0])
                if proc.returncode == 0:
                    runs[lr] = json.loads(proc.stdout)
                    runs[lr]["loadavg_before_after"] = loads[-2:]
                    runs[lr]["run_seconds"] = time.time() - t0
                    s, o = runs[lr]["standard"], runs[lr]["odb"]
                    print(f"[loss_at_time] lr {lr}: {time.time() - t0:.0f} s; final held-out loss Standard "
                          f"{s['final_heldout_loss']:.3f}, odb {o['final_heldout_loss']:.3f}; real tokens/s "
                          f"{s['real_tokens_per_s']:.0f} vs {o['real_tokens_per_s']:.0f}", file=sys.stderr, flush=True)
                    break
                log.write(proc.stdout)
                print(f"[loss_at_time] lr {lr}: the demo failed (rc {proc.returncode}); see {out / 'loss_at_time.log'}",
                      file=sys.stderr, flush=True)
            else:
                return 1
    analysis = analyse(runs, args.margin)
    command = "/usr/bin/python3 bench/loss_at_time.py" + "".join(
        f" {a}" for a in sys.argv[1:])
    result = {"command": command, "config": dict(vars(args), lrs=lrs), "elapsed_s": time.time() - started,
              "cpus": os.cpu_count(),
              "loadavg_min": min(loads), "loadavg_max": max(loads), "lr_keys": {str(float(lr)): lr for lr in lrs},
              "analysis": analysis, "runs": runs}
    write(result, out)
    return 0


def write(result: dict, out: Path) -> None:
    (out / "loss_at_time.json").write_text(json.dumps(result, indent=1))
    (out / "loss_at_time.md").write_text(markdown(result))
    plot(result, out / "loss_at_time.png")
    print(markdown(result))
    print(f"wrote {out / 'loss_at_time.json'}, .md, .png (the runs took {result['elapsed_s']:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
