"""Resume cost at N samples (issue 10): how long state_dict() takes mid-epoch,
how long load_state_dict() + indices() take on a fresh loader, and how big the
state is. Nothing is replayed: the cost depends on N (one permutation, vector
ops) and on the state's size, not on the step the job had reached.

    /usr/bin/python3 bench/resume_bench.py --n 10000000 --consumed 0.5
"""
from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "client/python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from odb.loader import OdbDataLoader  # noqa: E402


class Lengths(torch.utils.data.Dataset):
    """A dataset of n samples that is never read (resume must not touch it)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        raise AssertionError("resume must not read samples")


def main() -> None:
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--consumed", type=float, default=0.5, help="fraction of the epoch trained before the checkpoint")
    ap.add_argument("--scatter", type=int, default=4096, help="consumed samples beyond the prefix (in flight)")
    ap.add_argument("--world", type=int, default=8)
    args = ap.parse_args()
    data = Lengths(args.n)
    loader = OdbDataLoader(data, shuffle=True, seed=1, rank=0, world_size=1, run_dir="/tmp/odb-bench-unused")
    order = loader._global_order()
    k = int(args.n * args.consumed)
    rng = np.random.default_rng(0)
    extra = rng.choice(np.arange(k, args.n), size=min(args.scatter, args.n - k), replace=False)
    loader._consumed_ids = [order[:k], order[extra]]  # what the loop records: one array per step
    loader._consumed_epoch = 0
    c0, t0 = time.process_time(), time.perf_counter()
    state = loader.state_dict()
    c1, t1 = time.process_time(), time.perf_counter()
    size = len(pickle.dumps(state))
    fresh = OdbDataLoader(data, shuffle=True, seed=1, rank=3, world_size=args.world, run_dir="/tmp/odb-bench-unused")
    c2, t2 = time.process_time(), time.perf_counter()
    fresh.load_state_dict(state)
    mine = fresh.indices()
    c3, t3 = time.process_time(), time.perf_counter()
    print(json.dumps({"n": args.n, "consumed": k + len(extra), "state_bytes": size,
                      "state_dict_s": round(t1 - t0, 3), "state_dict_cpu_s": round(c1 - c0, 3),
                      "load_and_indices_s": round(t3 - t2, 3), "load_and_indices_cpu_s": round(c3 - c2, 3),
                      "rank3_of_world_remaining": len(mine)}))


if __name__ == "__main__":
    main()
