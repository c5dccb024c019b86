"""Writes the multimodal example's workload as a length trace for bench/phase_sim.

One line per sample, "tokens vision_patches audio_frames" (bench/trace.h), from
examples/multimodal_data.py's specs (the same seed gives the same samples as
examples/multimodal_train.py; audio is synthesised into the cache if missing).

Run: /usr/bin/python3 bench/phase_trace.py --samples 2000 --out bench/phase_trace_debian.txt
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import multimodal_data as mmd  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    specs = mmd.prepare(args.samples, seed=args.seed)
    lines = [f"# examples/multimodal_data.py, seed {args.seed}: {mmd.mix_counts(specs)}",
             "# tokens vision_patches audio_frames"]
    lines += [" ".join(str(v) for v in mmd.lengths_of(s)) for s in specs]
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
