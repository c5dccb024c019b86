#!/usr/bin/env python3
"""How even a run's accumulation windows are over the ranks, from a run recorded with
`examples/train_demo.py --record-steps R.json` (docs/alignment.md, invariant 6).

Per method: windows, micro-steps, IDLE rank-steps, padded tokens, and two ratios of padded
tokens (the compute a padded micro-step does):
  window max/mean  sum over windows of the slowest rank's sum over its micro-steps, over the
                   same sum of the mean rank: what DDP waits for (its micro-steps but the
                   window's last run under no_sync, so ranks meet once per window);
  step max/mean    the same with every micro-step a barrier (FSDP / ZeRO);
  window max/bound the first sum over the bound no layout can beat, whatever its micro-step
                   counts per rank: per window, max(its longest sample, its real tokens / W)
                   (no padding at all, whole samples).
1.0 is perfectly even; a window's samples cannot always be split evenly (whole samples).

  /usr/bin/python3 bench/window_balance.py R.json [--json]
"""
import argparse
import json
from typing import Dict, List


def window_balance(record: dict, method: str) -> Dict[str, float]:
    """The figures above for one method of a `--record-steps` file."""
    lengths: List[int] = record["lengths"]
    ranks = record["methods"][method]  # [rank][micro-step] = [epoch, ids, real, closes, idle]
    world, steps = len(ranks), len(ranks[0])

    def padded(ids: List[int]) -> int:
        return max((lengths[i] for i in ids), default=0) * len(ids)

    windows, current = [], []
    for k in range(steps):
        current.append([ranks[r][k] for r in range(world)])
        if ranks[0][k][3]:
            windows.append(current)
            current = []
    if current:
        windows.append(current)
    window_max = window_mean = step_max = bound = 0.0
    for w in windows:
        sums = [sum(padded(step[r][1]) for step in w) for r in range(world)]
        ids = [i for step in w for r in range(world) for i in step[r][1]]
        bound += max(max((lengths[i] for i in ids), default=0), sum(lengths[i] for i in ids) / world)
        window_max += max(sums)
        window_mean += sum(sums) / world
        step_max += sum(max(padded(step[r][1]) for r in range(world)) for step in w)
    return {
        "windows": len(windows),
        "micro_steps": steps,
        "idle_rank_steps": sum(1 for r in range(world) for k in range(steps) if ranks[r][k][4]),
        "padded_tokens": sum(padded(ranks[r][k][1]) for r in range(world) for k in range(steps)),
        "window_max_over_mean": window_max / window_mean if window_mean else 1.0,
        "step_max_over_mean": step_max / window_mean if window_mean else 1.0,
        "window_max_over_bound": window_max / bound if bound else 1.0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("record", help="a file written by examples/train_demo.py --record-steps")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args()
    with open(args.record) as f:
        record = json.load(f)
    out = {m: window_balance(record, m) for m in record["methods"]}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{'method':<16} {'windows':>7} {'micro':>6} {'IDLE':>5} {'padded':>8} {'window max/mean':>16} "
          f"{'step max/mean':>14} {'window max/bound':>17}")
    for m, f in out.items():
        print(f"{m:<16} {f['windows']:>7} {f['micro_steps']:>6} {f['idle_rank_steps']:>5} {f['padded_tokens']:>8} "
              f"{f['window_max_over_mean']:>16.3f} {f['step_max_over_mean']:>14.3f} {f['window_max_over_bound']:>17.3f}")


if __name__ == "__main__":
    main()
