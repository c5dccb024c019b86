#!/usr/bin/python3
"""Which out-of-the-box odb configuration wins? A sweep with batching_sim.

    /usr/bin/python3 bench/sweep_defaults.py --bin "$(bazel info -c opt bazel-bin)" \
        --out bench/results [--samples 20000] [--quick]

For every step model and candidate configuration (planner, emit.queue_steps,
grouping.window, round pacing) it runs //bench:batching_sim on the five traces,
W = 8, next to the reference rule at windows 16 and 256, and reports per
configuration the worst trace x model figures:

  - fraction of the padded bound (the exact limit of padded batching, which is
    what odb emits), and of the any-layout bound;
  - the ratio to the better of the two reference rows;
  - how many trace x model cells it is ahead of both reference rows.

A configuration passes when it is ahead of both reference rows in every cell
and within 3% of the padded bound in every cell. Writes sweep_defaults.csv
(every cell) and sweep_defaults.md (one row per configuration). Then, as the
epoch grows (20k, 50k, 100k samples; --quick: 5k, 10k, 20k), the fraction of
the padded bound of the shipped defaults and the candidates: sweep_scale.md.
"""
import argparse
import csv
import pathlib
import subprocess

MODELS = ["default_tokens", "attention_heavy", "cpu_calibrated", "gpu_1b_h100", "gpu_7b_h100", "gpu_70b_h200"]
TRACES = "chat_longtail,image_text,high_variance,production_mix,bench/traces/debian_docs.txt"
REFERENCES = ["reference_odb:w16", "reference_odb:w256"]


def candidates(quick):
    """Configuration specs, the shipped defaults (local, queue 32, window 256) among them."""
    out = []
    for planner in ("local", "global"):
        for w in ([256, 512] if quick else [256, 512, 1024]):
            out += [f"odb:{planner}:q32:w{w}", f"odb:{planner}:q32:w{w}:paced", f"odb:{planner}:q32:w{w}:paced:det",
                    f"odb:{planner}:q32:w{w}:paced16", f"odb:{planner}:q32:w{w}:paced16:full",
                    f"odb:{planner}:q64:w{w}:paced32"]
    return out


# Epoch length: the shipped defaults next to the candidates, on longer traces.
SCALE_POLICIES = ["reference_odb:w16", "reference_odb:w256", "odb:local:q32:w256:paced", "odb:local:q32:w256",
                  "odb:global:q32:w256:paced", "odb:global:q32:w256:paced:det", "odb:global:q32:w512:paced:det",
                  "odb:global:q32:w512:paced16:full",
                  "odb:global:q64:w1024:paced32", "offline_dp"]
SCALE_MODELS = ["gpu_7b_h100", "cpu_calibrated"]
SCALE_TRACES = "chat_longtail,high_variance,production_mix"


def describe(spec):
    parts = spec.split(":")
    planner, q, w = parts[1], parts[2][1:], parts[3][1:]
    opts = parts[4:]
    text = f"planner: {planner}, queue_steps: {q}, window: {w}"
    if "det" in opts:
        text += ", deterministic: true; trainer-paced"
    elif "paced" in opts:
        text += "; trainer-paced, a round per free slot (the daemon before)"
    elif any(o.startswith("paced") for o in opts):
        r = next(o for o in opts if o.startswith("paced"))[5:]
        text += f"; trainer-paced, rounds held until {r} slots are free"
        if "full" in opts:
            text += ", then every group of the windows planned (the daemon's defaults when r = queue_steps / 2)"
    else:
        text += "; every round sees the whole queue free (trainer faster than the daemon)"
    return text


def run_sim(binary, model, samples, traces, policies, csv_path):
    subprocess.run([f"{binary}/bench/batching_sim", "--model", model, "--world", "8", "--samples", str(samples),
                    "--traces", traces, "--policies", ",".join(policies), "--csv", str(csv_path)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    csv_path.unlink()
    return rows


def scale(binary, out, sizes):
    """Fraction of the padded bound as the epoch grows (per rank: samples / 8)."""
    lines = ["| model | trace | configuration | " + " | ".join(f"{n} samples" for n in sizes) + " |",
             "|---|---|---|" + "---|" * len(sizes)]
    for model in SCALE_MODELS:
        table = {}
        for n in sizes:
            for r in run_sim(binary, model, n, SCALE_TRACES, SCALE_POLICIES, out / f"scale_{model}_{n}.csv"):
                table[(r["trace"], r["policy"], n)] = float(r["of_padded_bound"])
        for trace in SCALE_TRACES.split(","):
            for p in SCALE_POLICIES:
                lines.append(f"| `{model}` | {trace} | `{p}` | " +
                             " | ".join(f"{table[(trace, p, n)]:.3f}" for n in sizes) + " |")
    (out / "sweep_scale.md").write_text("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True, help="bazel-bin of a -c opt build of //bench:batching_sim")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--quick", action="store_true", help="fewer candidates")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    specs = candidates(args.quick)
    cells = []
    for model in MODELS:
        rows = run_sim(args.bin, model, args.samples, TRACES, REFERENCES + specs, out / f"sweep_{model}.csv")
        by = {(r["trace"], r["policy"]): r for r in rows}
        for trace in dict.fromkeys(r["trace"] for r in rows):
            ref = max(float(by[(trace, p)]["samples_per_s"]) for p in REFERENCES)
            for spec in specs:
                r = by[(trace, spec)]
                cells.append({"model": model, "trace": trace, "config": spec,
                              "of_padded_bound": float(r["of_padded_bound"]), "of_bound": float(r["of_bound"]),
                              "vs_best_reference": float(r["samples_per_s"]) / ref})
    with open(out / "sweep_defaults.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(cells[0]))
        w.writeheader()
        w.writerows(cells)
    n = len(MODELS) * 5
    lines = ["| configuration | worst of padded bound | worst of bound | worst vs better reference | "
             "cells ahead of both references | passes |", "|---|---|---|---|---|---|"]
    for spec in specs:
        mine = [c for c in cells if c["config"] == spec]
        worst_pad = min(mine, key=lambda c: c["of_padded_bound"])
        worst_ref = min(mine, key=lambda c: c["vs_best_reference"])
        ahead = sum(c["vs_best_reference"] > 1.0 for c in mine)
        passes = ahead == len(mine) and worst_pad["of_padded_bound"] >= 0.97
        lines.append(f"| `{spec}` ({describe(spec)}) | {worst_pad['of_padded_bound']:.3f} "
                     f"({worst_pad['trace']}, {worst_pad['model']}) | {min(c['of_bound'] for c in mine):.3f} | "
                     f"{worst_ref['vs_best_reference']:.3f} ({worst_ref['trace']}, {worst_ref['model']}) | "
                     f"{ahead}/{len(mine)} | {'**yes**' if passes else 'no'} |")
    (out / "sweep_defaults.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'sweep_defaults.md'} ({len(specs)} configurations x {n} cells)")
    sizes = [5000, 10000, 20000] if args.quick else [20000, 50000, 100000]
    scale(args.bin, out, sizes)
    print(f"wrote {out / 'sweep_scale.md'} (epochs of {sizes} samples)")


if __name__ == "__main__":
    main()
