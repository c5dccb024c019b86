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
    return "\n".join(lines) + "\n"


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
