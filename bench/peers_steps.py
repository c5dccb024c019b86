#!/usr/bin/env python3
"""Where a method's compute goes, micro-step by micro-step: reads `examples/train_demo.py
--record-steps` output (per rank and micro-step: sample ids, closes, IDLE, thread CPU seconds of its
forward + backward and optimizer step) and fits one cost model to every method's micro-steps together

    cpu = per_step + per_closing * closes + per_seq * sequences + per_token * tokens + per_sq * sum(len^2)

(least squares over all ranks' micro-steps). Per method it prints the rank totals measured and as
the shared model predicts them: a method whose measured total is above its prediction pays for
something the step's contents do not explain (the machine's speed at the time, the process around
the trainer); one whose prediction is high pays for what it put into its micro-steps.

  /usr/bin/python3 bench/peers_steps.py REC.json [--methods packed,odb_packed]
"""
from __future__ import annotations

import argparse
import json
from typing import Dict, List

import numpy as np

TERMS = ("per_step", "per_closing", "per_seq", "per_token", "per_sq")


def features(rec: dict, method: str) -> List[List[np.ndarray]]:
    """Per rank: rows [1, closes, sequences, tokens, sum len^2] and the measured CPU seconds."""
    lengths = rec["lengths"]
    out = []
    for log in rec["methods"][method]:
        rows, cpu = [], []
        for entry in log:
            if len(entry) < 6:
                raise SystemExit(f"{method}: the record has no CPU times (rerun with this train_demo.py)")
            _epoch, ids, _real, closes, _idle, seconds = entry[:6]
            toks = [lengths[i] for i in ids]
            rows.append([1.0, float(closes), float(len(toks)), float(sum(toks)), float(sum(t * t for t in toks))])
            cpu.append(seconds)
        out.append([np.array(rows, dtype=float).reshape(-1, len(TERMS)), np.array(cpu, dtype=float)])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("record")
    p.add_argument("--methods", default="", help="comma list (default: every method in the record)")
    args = p.parse_args()
    rec = json.loads(open(args.record).read())
    methods = [m for m in (args.methods.split(",") if args.methods else rec["methods"]) if m]
    data: Dict[str, List[List[np.ndarray]]] = {m: features(rec, m) for m in methods}
    x = np.vstack([r[0] for m in methods for r in data[m]])
    y = np.concatenate([r[1] for m in methods for r in data[m]])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    print("shared fit: " + ", ".join(f"{t} {c:.3g}" for t, c in zip(TERMS, coef)))
    print(f"{'method':<16}{'micro':>7}{'seqs':>7}{'tokens':>9}{'sum len^2':>12}"
          f"{'CPU max/mean (s)':>18}{'predicted':>18}{'measured/predicted':>20}")
    for m in methods:
        ranks = data[m]
        meas = [float(r[1].sum()) for r in ranks]
        pred = [float((r[0] @ coef).sum()) for r in ranks]
        rows = np.vstack([r[0] for r in ranks])
        print(f"{m:<16}{len(rows) // len(ranks):>7}{int(rows[:, 2].sum()):>7}{int(rows[:, 3].sum()):>9}"
              f"{rows[:, 4].sum():>12.3g}{max(meas):>9.1f} /{np.mean(meas):>6.1f}"
              f"{max(pred):>10.1f} /{np.mean(pred):>6.1f}{np.mean(meas) / np.mean(pred):>20.3f}")
        own, *_ = np.linalg.lstsq(rows, np.concatenate([r[1] for r in ranks]), rcond=None)
        print(" " * 16 + "own fit: " + ", ".join(f"{t} {c:.3g}" for t, c in zip(TERMS, own)))


if __name__ == "__main__":
    main()
