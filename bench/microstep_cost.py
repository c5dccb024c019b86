#!/usr/bin/python3
"""What a micro-step costs the main job's model beyond its tokens (issue 33: why `bucketing` keeps up with odb).

Times forward + backward of examples/tiny_lm.py's TinyCausalLM at the main job's shape (vocab 256, d_model 64,
2 layers, 4 heads, padded batches, one thread) in this thread's CPU time, so that other jobs' load does not
inflate it: the fastest of --reps runs per shape. Prints, per sample length, one micro-step of the whole
512-token budget against the same samples in two half-full micro-steps, and the fixed cost of a micro-step
(two halves minus one whole).

  OMP_NUM_THREADS=1 /usr/bin/python3 bench/microstep_cost.py [--reps 30]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import tiny_lm  # noqa: E402


def step_cpu_seconds(model: torch.nn.Module, batch: int, length: int, reps: int) -> float:
    """Fastest forward + backward of a padded [batch, length] micro-step, in thread CPU seconds."""
    ids = torch.randint(0, 256, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.int64)
    best = float("inf")
    for _ in range(reps):
        c0 = time.thread_time()
        logits = model(ids, mask)
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1)).backward()
        best = min(best, time.thread_time() - c0)
        model.zero_grad(set_to_none=True)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--budget", type=int, default=512, help="tokens per micro-step and rank")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_lm.TinyCausalLM(vocab=256, d_model=64, layers=2, heads=4, max_len=512)
    print("| sample length | one micro-step of the budget (ms) | two half-full micro-steps (ms) | "
          "fixed cost of a micro-step (ms) | as a share of the whole one |")
    print("|---|---|---|---|---|")
    for length in (32, 64, 128, 256):
        whole = args.budget // length
        if whole < 2:
            continue
        one = step_cpu_seconds(model, whole, length, args.reps)
        half = step_cpu_seconds(model, whole // 2, length, args.reps)
        fixed = 2 * half - one
        print(f"| {length} | {one * 1e3:.2f} | {2 * half * 1e3:.2f} | {fixed * 1e3:.2f} | {fixed / one:.0%} |")
    idle = step_cpu_seconds(model, 1, 1, args.reps)
    print(f"\nA one-token micro-step (the least an IDLE micro-step can cost): {idle * 1e3:.2f} ms.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
