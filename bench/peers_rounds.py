#!/usr/bin/python3
"""Medians over interleaved rounds of `train_demo.py --methods all --json` (issue 33).

Each round is one job with every method (the order reversed every other round: --reverse); this
reads the rounds' JSON files and prints, per method, the median real tokens/s and training clock,
every round's figures, the held-out losses, optimizer steps, micro-steps, padding and busy time
max/mean; then odb's best mode against the best peer (ratio of medians; a gap within the rounds'
spread is a tie).

  /usr/bin/python3 bench/peers_rounds.py bench/results/peers/main_round*.json [--md out.md]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from train_demo import LABELS, ODB_MODES, over_rounds  # noqa: E402


def table(rounds: list) -> str:
    methods = rounds[0]["methods"]
    over = over_rounds(rounds, methods)
    first = rounds[0]
    lines = ["| method | optimizer steps | micro-steps | IDLE | real tokens/s, median (rounds) | training clock, median (s) "
             "| held-out loss (rounds) | padding | busy max / mean (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for m in methods:
        x, o = first[m], over[m]
        busy = [r[m]["busy_seconds"] for r in rounds if r[m].get("busy_seconds")]
        bmax = sorted(max(b) for b in busy)[len(busy) // 2] if busy else None
        bmean = sorted(sum(b) / len(b) for b in busy)[len(busy) // 2] if busy else None
        lines.append(
            f"| {LABELS[m]} | {x['optimizer_steps']} | {x['steps']} | {x['idle_steps']} | "
            f"**{o['median_real_tokens_per_s']:.0f}** ({', '.join(f'{v:.0f}' for v in o['real_tokens_per_s'])}) | "
            f"{o['median_seconds']:.1f} | {', '.join(f'{v:.3f}' for v in o['final_heldout_loss'])} | "
            f"{x['padding_fraction'] * 100:.1f}% | "
            + (f"{bmax:.1f} / {bmean:.1f} |" if busy else "n/a |"))
    odb = [m for m in ODB_MODES if m in methods]
    peers = [m for m in methods if m not in ODB_MODES]
    if odb and peers:
        best_odb = max(odb, key=lambda m: over[m]["median_real_tokens_per_s"])
        best_peer = max(peers, key=lambda m: over[m]["median_real_tokens_per_s"])
        a, b = over[best_odb], over[best_peer]
        ratio = a["median_real_tokens_per_s"] / b["median_real_tokens_per_s"]
        tie = (min(a["real_tokens_per_s"]) <= max(b["real_tokens_per_s"]) and
               min(b["real_tokens_per_s"]) <= max(a["real_tokens_per_s"]))
        lines += ["", f"odb's best mode ({LABELS[best_odb]}) / the best peer ({LABELS[best_peer]}): real tokens/s "
                      f"x{ratio:.2f} (medians over {len(rounds)} rounds)" +
                  (": the rounds' ranges overlap, a tie within the spread" if tie else "") + "."]
        lines.append("Per round, odb's best mode / that round's best peer (real tokens/s): " + ", ".join(
            f"x{per_round_ratio(r, odb, peers, wall_rate):.2f}" for r in rounds) + ".")
    lines += cpu_table(rounds, methods, odb, peers)
    return "\n".join(lines) + "\n"


def wall_rate(x: dict) -> float:
    """Real tokens per second of the training clock."""
    return x["real_tokens_per_s"]


def cpu_rate(x: dict) -> float | None:
    """Real tokens per second of the busiest rank's thread CPU time (forward, backward, optimizer): what
    the method would train per second on an unloaded machine if nothing but compute took time (no
    waits for data or the other rank, no fixed per-step overheads outside those intervals)."""
    cpu = x.get("busy_cpu_seconds")
    return x["real_tokens"] / max(cpu) if cpu and max(cpu) > 0 else None


def per_round_ratio(r: dict, odb: list, peers: list, rate) -> float:
    """odb's best mode over the best peer of one round, by `rate`."""
    return max(rate(r[m]) for m in odb) / max(rate(r[m]) for m in peers)


def cpu_table(rounds: list, methods: list, odb: list, peers: list) -> list:
    """The load-robust view: every method's busiest-rank thread CPU time and real tokens per CPU second,
    medians over the rounds (rounds recorded before busy_cpu_seconds existed have none)."""
    if not all(r[m].get("busy_cpu_seconds") for r in rounds for m in methods):
        return []
    lines = ["", "| method | busy CPU, busiest rank (s), median (rounds) | real tokens per busy CPU second, median |",
             "|---|---|---|"]
    for m in methods:
        cpu = [max(r[m]["busy_cpu_seconds"]) for r in rounds]
        rates = [cpu_rate(r[m]) for r in rounds]
        lines.append(f"| {LABELS[m]} | {median(cpu):.1f} ({', '.join(f'{v:.1f}' for v in cpu)}) | "
                     f"{median(rates):.0f} |")
    if odb and peers:
        lines.append("")
        lines.append("Per round, odb's best mode / the best peer (real tokens per busy CPU second): " + ", ".join(
            f"x{per_round_ratio(r, odb, peers, cpu_rate):.2f}" for r in rounds) + ".")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rounds", nargs="+", help="train_demo.py --json outputs, one per round")
    p.add_argument("--md", help="also write the table there")
    args = p.parse_args()
    rounds = [json.loads(Path(f).read_text()) for f in args.rounds]
    text = table(rounds)
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
