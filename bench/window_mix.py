#!/usr/bin/python3
"""The length mix of each optimizer step (window), odb against Standard, and replay plans.

Reads the micro-steps a run recorded (`examples/train_demo.py --record-steps PATH`: per method and
rank, each micro-step's epoch, sample ids, real tokens, whether it closes the optimizer step, IDLE)
and rebuilds every optimizer step: the union over the ranks of their micro-steps up to the closing
one. Per method it reports

  * samples and loss tokens per optimizer step (mean, spread as the standard deviation, min, max),
    the mean and standard deviation of the sample lengths inside a step (averaged over the steps);
  * how far the steps are from random ones: for step k of n_k samples with mean length m_k, the
    z-score z_k = (m_k - mu) / sqrt(s^2 / n_k * (N - n_k) / (N - 1)) against the epoch's N samples
    (mean mu, variance s^2); random steps of the same sizes (a uniform draw without replacement)
    give var(z) = 1, steps of one length each give var(z) ~ n. `mix_var_ratio` is var(z); the same
    figure for the same sizes with the samples shuffled across the epoch's steps is printed beside
    it (`random_var_ratio`, the baseline the finite epoch gives);
  * the within-step spread of lengths over the epoch's (`within_sd_ratio`: 1 for random steps, 0
    for steps of one length each);
  * drift: the correlation of a step's mean length with its position in the epoch, and the mean
    length of the epoch's last 10% of steps over the epoch's mean (what the model sees last).

`--write-plan MODE --out PLAN` writes a replay plan of the chosen method's steps for
`train_demo.py --methods replay --replay PLAN` (the same --seed and --samples as the recorded run):

  same            the steps as recorded (the replay must give the method's loss: a check);
  shuffle-order   the same steps, their order shuffled within each epoch;
  random-members  the epoch's samples shuffled and cut into steps of the recorded sizes (samples);
  random-tokens   the epoch's samples shuffled and cut into steps of about --window-tokens loss tokens
                  (odb's recipe with random members; default the recorded run's window target);
  sorted          the epoch's samples sorted by length, cut into steps of the recorded sizes, the
                  steps' order shuffled (Standard with length-sorted windows);
  sorted-tokens   the same, cut by --window-tokens loss tokens (odb-like windows, nothing else of odb).
  steps-shuffled  the method's aligned micro-steps (all ranks' k-th micro-step as one unit) in a shuffled
                  order, cut into windows of --window-tokens at sample granularity (odb's windows, re-cut);
  steps-interleaved  the same micro-steps ordered long, short, long, ... (halves by mean sample length,
                  each shuffled), then cut alike: a step order that mixes lengths within a window;
  steps-folded    the same micro-steps paired k-th longest with k-th shortest, the pairs shuffled.
  groups-folded   each rank's micro-steps (its groups, not the aligned union) paired k-th longest with
                  k-th shortest, the pairs shuffled, then cut alike: the planner's groups (so its padding)
                  with a long and a short group in each window, as if one step paired them across ranks.

Examples:
  /usr/bin/python3 examples/train_demo.py --json --quiet --samples 1000 --heldout 100 --epochs 2 \\
      --eval-every 0 --eval-every-tokens 10000 --global-batch 16 --lr 1e-2 --record-steps /tmp/rec.json
  /usr/bin/python3 bench/window_mix.py /tmp/rec.json
  /usr/bin/python3 bench/window_mix.py /tmp/rec.json --method standard --write-plan sorted --out /tmp/p.json
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path


def optimizer_steps(ranks: list) -> list:
    """[(epoch, [ids])] per optimizer step from every rank's micro-steps ([epoch, ids, real, closes,
    idle] each): rank r's k-th closed segment is its share of step k."""
    per_rank = []
    for log in ranks:
        segments, current = [], []
        for epoch, ids, _real, closes, _idle, *_ in log:
            current.extend(ids)
            if closes:
                segments.append((epoch, current))
                current = []
        if current:
            segments.append((log[-1][0], current))
        per_rank.append(segments)
    count = max(len(s) for s in per_rank)
    if any(len(s) != count for s in per_rank):
        raise ValueError(f"ranks closed different numbers of optimizer steps: {[len(s) for s in per_rank]}")
    return [(per_rank[0][k][0], [i for s in per_rank for i in s[k][1]]) for k in range(count)]


def rank_groups(ranks: list) -> list:
    """[(epoch, [ids])] per rank micro-step (each rank's group on its own), IDLE ones left out."""
    return [(entry[0], list(entry[1])) for log in ranks for entry in log if entry[1]]


def micro_steps(ranks: list) -> list:
    """[(epoch, [ids])] per aligned micro-step: the union over the ranks of their k-th micro-step."""
    count = max(len(log) for log in ranks)
    return [(ranks[0][k][0], [i for log in ranks for i in log[k][1]]) for k in range(count)]


def interleaved(units: list, lengths: list, rng: random.Random) -> list:
    """The units (micro-steps) in an order that alternates long and short ones: sorted by mean
    sample length, cut into a long and a short half, each half shuffled, then long, short, long..."""
    units = [u for u in units if u]
    ranked = sorted(units, key=lambda u: (statistics.fmean(lengths[i] for i in u), rng.random()))
    short, long = ranked[:len(ranked) // 2], ranked[len(ranked) // 2:]
    rng.shuffle(short)
    rng.shuffle(long)
    out = []
    for k in range(len(long)):
        out.append(long[k])
        if k < len(short):
            out.append(short[k])
    return out


def folded(units: list, lengths: list, rng: random.Random) -> list:
    """The units sorted by mean sample length and paired antithetically (k-th longest with k-th
    shortest), the pairs in a shuffled order: long, short, long, short with near-constant pair means."""
    units = [u for u in units if u]
    ranked = sorted(units, key=lambda u: (-statistics.fmean(lengths[i] for i in u), rng.random()))
    pairs = [[ranked[k]] + ([ranked[-1 - k]] if len(ranked) - 1 - k > k else [])
             for k in range((len(ranked) + 1) // 2)]
    rng.shuffle(pairs)
    return [u for pair in pairs for u in pair]


def describe(values: list) -> dict:
    return {"mean": statistics.fmean(values), "sd": statistics.pstdev(values), "min": min(values),
            "max": max(values)}


def var_ratio(windows: list, lengths: list, pool: list) -> float:
    """var(z) of the windows' mean lengths against random windows of the same sizes from `pool`."""
    big_n = len(pool)
    mu = statistics.fmean(lengths[i] for i in pool)
    s2 = statistics.pvariance([lengths[i] for i in pool]) * big_n / max(1, big_n - 1)
    z = []
    for w in windows:
        n = len(w)
        if n == 0 or n >= big_n:
            continue
        sd = math.sqrt(s2 / n * (big_n - n) / (big_n - 1))
        z.append((statistics.fmean(lengths[i] for i in w) - mu) / sd)
    return statistics.fmean(x * x for x in z)


def cut_by_sizes(order: list, sizes: list) -> list:
    out, at = [], 0
    for n in sizes:
        out.append(order[at:at + n])
        at += n
    if at < len(order):
        out[-1].extend(order[at:])
    return [w for w in out if w]


def cut_by_tokens(order: list, lengths: list, target: float) -> list:
    """Consecutive windows of about `target` tokens: a window closes at the sample that brings it
    nearest the target (odb's windows split within one sample of it)."""
    out, w, tokens = [], [], 0
    for i in order:
        if w and abs(tokens + lengths[i] - target) > abs(tokens - target):
            out.append(w)
            w, tokens = [], 0
        w.append(i)
        tokens += lengths[i]
    return out + ([w] if w else [])


def by_epoch(steps: list) -> dict:
    epochs = {}
    for epoch, ids in steps:
        epochs.setdefault(epoch, []).append(ids)
    return epochs


def analyse(rec: dict, method: str, seed: int) -> dict:
    lengths = rec["lengths"]
    steps = optimizer_steps(rec["methods"][method])
    rng = random.Random(seed)
    out = {"optimizer_steps": len(steps), "epochs": {}}
    for epoch, windows in sorted(by_epoch(steps).items()):
        pool = [i for w in windows for i in w]
        mu = statistics.fmean(lengths[i] for i in pool)
        sd_all = statistics.pstdev([lengths[i] for i in pool])
        means = [statistics.fmean(lengths[i] for i in w) for w in windows]
        within = [statistics.pstdev([lengths[i] for i in w]) if len(w) > 1 else 0.0 for w in windows]
        shuffled = pool[:]
        rng.shuffle(shuffled)
        baseline = cut_by_sizes(shuffled, [len(w) for w in windows])
        tail = max(1, len(windows) // 10)
        pos = list(range(len(windows)))
        corr = (statistics.correlation(pos, means) if len(windows) > 2 and statistics.pstdev(means) > 0 else 0.0)
        out["epochs"][epoch] = {
            "steps": len(windows), "samples": len(pool), "mean_length": mu, "sd_length": sd_all,
            "samples_per_step": describe([len(w) for w in windows]),
            "loss_tokens_per_step": describe([sum(lengths[i] for i in w) for w in windows]),
            "step_mean_length": describe(means),
            "within_sd_ratio": statistics.fmean(within) / sd_all if sd_all else 0.0,
            "random_within_sd_ratio": statistics.fmean(
                statistics.pstdev([lengths[i] for i in w]) if len(w) > 1 else 0.0 for w in baseline) / sd_all,
            "mix_var_ratio": var_ratio(windows, lengths, pool),
            "random_var_ratio": var_ratio(baseline, lengths, pool),
            "position_corr": corr,
            "last10pct_mean_length_over_mean": statistics.fmean(
                lengths[i] for w in windows[-tail:] for i in w) / mu,
        }
    return out


def write_plan(rec: dict, method: str, mode: str, seed: int, window_tokens: float) -> dict:
    lengths = rec["lengths"]
    rng = random.Random(seed)
    epochs = []
    if mode in ("steps-shuffled", "steps-interleaved", "steps-folded", "groups-folded"):
        unit_of = rank_groups if mode == "groups-folded" else micro_steps
        for epoch, units in sorted(by_epoch(unit_of(rec["methods"][method])).items()):
            units = [u for u in units if u]
            if mode == "steps-shuffled":
                rng.shuffle(units)
            elif mode in ("steps-folded", "groups-folded"):
                units = folded(units, lengths, rng)
            else:
                units = interleaved(units, lengths, rng)
            epochs.append(cut_by_tokens([i for u in units for i in u], lengths, window_tokens))
        return {"epochs": epochs, "source_method": method, "mode": mode, "seed": seed}
    for epoch, windows in sorted(by_epoch(optimizer_steps(rec["methods"][method])).items()):
        pool = [i for w in windows for i in w]
        sizes = [len(w) for w in windows]
        if mode == "same":
            plan = [list(w) for w in windows]
        elif mode == "shuffle-order":
            plan = [list(w) for w in windows]
            rng.shuffle(plan)
        elif mode in ("random-members", "random-tokens"):
            order = pool[:]
            rng.shuffle(order)
            plan = (cut_by_sizes(order, sizes) if mode == "random-members"
                    else cut_by_tokens(order, lengths, window_tokens))
        elif mode in ("sorted", "sorted-tokens"):
            order = sorted(pool, key=lambda i: (lengths[i], rng.random()))
            plan = (cut_by_sizes(order, sizes) if mode == "sorted" else cut_by_tokens(order, lengths, window_tokens))
            rng.shuffle(plan)
        else:
            raise ValueError(mode)
        epochs.append(plan)
    return {"epochs": epochs, "source_method": method, "mode": mode, "seed": seed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("record", help="train_demo.py --record-steps output")
    p.add_argument("--method", default="", help="only this method (default: every recorded one)")
    p.add_argument("--seed", type=int, default=0, help="the random baseline's and the plan's shuffles")
    p.add_argument("--write-plan", default="", choices=("", "same", "shuffle-order", "random-members",
                                                         "random-tokens", "sorted", "sorted-tokens",
                                                         "steps-shuffled", "steps-interleaved", "steps-folded",
                                                         "groups-folded"))
    p.add_argument("--window-tokens", type=float, default=0.0,
                   help="loss tokens per step for the *-tokens plans (default: the recorded window target)")
    p.add_argument("--out", default="", help="where --write-plan writes")
    p.add_argument("--plan", default="", help="also report the length mix of this replay plan's steps")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rec = json.loads(Path(args.record).read_text())
    methods = [args.method] if args.method else list(rec["methods"])
    if args.write_plan:
        if len(methods) != 1 or not args.out:
            p.error("--write-plan needs --method and --out")
        plan = write_plan(rec, methods[0], args.write_plan, args.seed,
                          args.window_tokens or rec.get("window_tokens") or 1.0)
        Path(args.out).write_text(json.dumps(plan))
        sizes = [len(w) for e in plan["epochs"] for w in e]
        print(f"wrote {args.out}: {len(sizes)} optimizer steps, {statistics.fmean(sizes):.1f} samples each "
              f"(sd {statistics.pstdev(sizes):.1f})", file=sys.stderr)
        return 0
    if args.plan:  # a plan's steps as one more "method": one rank holding every step's samples
        plan = json.loads(Path(args.plan).read_text())
        rec["methods"]["plan"] = [[[e, w, 0, True, False] for e, ws in enumerate(plan["epochs"]) for w in ws]]
        methods.append("plan")
    result = {m: analyse(rec, m, args.seed) for m in methods}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{args.record}: W = {rec['world']}, budget {rec['max_tokens']}, window target "
          f"{rec.get('window_tokens')} loss tokens ({rec.get('global_batch')} samples)")
    print(f"{'method':10s}{'ep':>3s}{'steps':>6s}{'samples/step':>16s}{'tokens/step':>18s}{'step mean len sd':>17s}"
          f"{'var(z)':>8s}{'random':>8s}{'within sd':>10s}{'random':>8s}{'pos corr':>9s}{'last10%':>8s}")
    for m in methods:
        for epoch, e in result[m]["epochs"].items():
            sp, tk = e["samples_per_step"], e["loss_tokens_per_step"]
            print(f"{m:10s}{epoch:3d}{e['steps']:6d}{sp['mean']:9.1f} +-{sp['sd']:4.1f}"
                  f"{tk['mean']:10.0f} +-{tk['sd']:5.0f}{e['step_mean_length']['sd']:17.1f}"
                  f"{e['mix_var_ratio']:8.2f}{e['random_var_ratio']:8.2f}{e['within_sd_ratio']:10.2f}"
                  f"{e['random_within_sd_ratio']:8.2f}{e['position_corr']:9.2f}"
                  f"{e['last10pct_mean_length_over_mean']:8.2f}")
    print("(var(z): variance of the steps' mean-length z-scores, 1 for random steps of the same sizes; random: "
          "the same for the epoch's samples shuffled into steps of those sizes; within sd: a step's length spread "
          "over the epoch's; pos corr: step mean length vs position in the epoch; last10%: mean length of the "
          "epoch's last 10% of steps over the epoch's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
