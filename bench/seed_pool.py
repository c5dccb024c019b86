#!/usr/bin/python3
"""Final held-out losses of several runs of `examples/train_demo.py --json`, pooled per method and seed.

At a learning rate near the edge of stability the final held-out loss is a chaotic function of the
order in which samples are trained: Standard's seeds differ by as much as odb's runs of one seed do
(odb's steps depend a little on the workers' timing, so each run of a seed is another draw). One run
per seed then cannot tell a code change from that spread. This pools every run given, per method:

  * runs, seeds, the mean over seeds of each seed's mean loss (each seed weighs the same however often
    it ran), the standard deviation of the seed means and their standard error;
  * the run-to-run standard deviation within a seed (pooled over the seeds that ran more than once;
    0 for a method whose runs repeat, e.g. Standard or `--deterministic`);
  * against a reference method (default `standard`): the difference of the means with its standard
    error (the two methods' seed means taken as independent samples), and paired by seed (each seed's
    mean difference over the seeds both ran) with the standard error of the paired mean.

Usage (the files may hold one seed or many, `--seeds N`, and any methods; order does not matter):

  /usr/bin/python3 bench/seed_pool.py run1.json run2.json ... [--reference standard] [--json]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def runs_of(doc: dict) -> list:
    """[(method, seed, final_heldout_loss)] of one train_demo --json summary."""
    out = []
    if "per_seed" in doc:
        for entry in doc["per_seed"]:
            for method, fig in entry.items():
                if isinstance(fig, dict) and "final_heldout_loss" in fig:
                    out.append((method, int(entry["seed"]), float(fig["final_heldout_loss"])))
        return out
    seeds = doc.get("seeds") or [doc.get("seed", 0)]
    if len(seeds) != 1:
        raise ValueError(f"a summary of {len(seeds)} seeds without per_seed")
    for method in doc.get("methods", []):
        fig = doc.get(method)
        if isinstance(fig, dict) and "final_heldout_loss" in fig:
            out.append((method, int(seeds[0]), float(fig["final_heldout_loss"])))
    return out


def _se(values: list) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")


def pool(runs: list, reference: str = "standard") -> dict:
    """Per method: runs, seeds, mean of the seed means, their sd and s.e., the within-seed sd, and the
    differences against `reference` (unpaired and paired by seed)."""
    by = {}
    for method, seed, loss in runs:
        by.setdefault(method, {}).setdefault(seed, []).append(loss)
    out = {}
    for method, seeds in sorted(by.items()):
        means = {s: statistics.fmean(v) for s, v in seeds.items()}
        dev2 = sum((x - means[s]) ** 2 for s, v in seeds.items() for x in v)
        dof = sum(len(v) - 1 for v in seeds.values())
        out[method] = {
            "runs": sum(len(v) for v in seeds.values()),
            "seeds": sorted(seeds),
            "mean": statistics.fmean(means.values()),
            "seed_sd": statistics.stdev(means.values()) if len(means) > 1 else float("nan"),
            "se": _se(list(means.values())),
            "within_seed_sd": math.sqrt(dev2 / dof) if dof else float("nan"),
            "seed_means": {str(s): m for s, m in sorted(means.items())},
        }
    ref = out.get(reference)
    if ref is not None:
        ref_means = {int(s): m for s, m in ref["seed_means"].items()}
        for method, fig in out.items():
            if method == reference:
                continue
            fig["vs_reference"] = fig["mean"] - ref["mean"]
            fig["vs_reference_se"] = math.sqrt(fig["se"] ** 2 + ref["se"] ** 2)
            common = [s for s in map(int, fig["seed_means"]) if s in ref_means]
            diffs = [fig["seed_means"][str(s)] - ref_means[s] for s in common]
            fig["paired"] = statistics.fmean(diffs) if diffs else float("nan")
            fig["paired_se"] = _se(diffs)
            fig["paired_seeds"] = len(common)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", help="train_demo.py --json outputs")
    p.add_argument("--reference", default="standard", help="the method the others are compared with")
    p.add_argument("--json", action="store_true", help="print the pooled figures as JSON")
    args = p.parse_args(argv)
    runs = []
    for f in args.files:
        try:
            runs += runs_of(json.loads(Path(f).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"seed_pool: {f}: not a train_demo --json summary ({e})", file=sys.stderr)
            return 2
    if not runs:
        print("seed_pool: no final held-out loss in the files given", file=sys.stderr)
        return 2
    res = pool(runs, args.reference)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{'method':<12} {'runs':>4} {'seeds':>5} {'mean':>8} {'seed sd':>8} {'s.e.':>7} {'run sd':>7}   "
          f"vs {args.reference} (s.e.)        paired by seed (s.e., seeds)")
    for method, f in res.items():
        line = (f"{method:<12} {f['runs']:>4} {len(f['seeds']):>5} {f['mean']:>8.4f} {f['seed_sd']:>8.4f} "
                f"{f['se']:>7.4f} {f['within_seed_sd']:>7.4f}")
        if "vs_reference" in f:
            rel = 100 * f["vs_reference"] / res[args.reference]["mean"]
            line += (f"   {f['vs_reference']:+.4f} ({f['vs_reference_se']:.4f}) {rel:+.1f}%"
                     f"   {f['paired']:+.4f} ({f['paired_se']:.4f}, {f['paired_seeds']})")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
