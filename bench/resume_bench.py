"""Resume cost at N samples (issue 10): how long state_dict() takes mid-epoch,
how long load_state_dict() + indices() take on a fresh loader, and how big the
state is. Nothing is replayed: the cost depends on N (one permutation, vector
ops) and on the state's size, not on the step the job had reached.

    /usr/bin/python3 bench/resume_bench.py --n 10000000 --consumed 0.5
    /usr/bin/python3 bench/resume_bench.py --n 10000000 --consumed 0.5 --sampler

--sampler: a custom sampler instead (a rank's list of n indices drawn with replacement, keyed by
position in the list): the cost of drawing the list at the epoch's start, of state_dict() (each step
names its samples' seqs, so a trained sample's position is a lookup), and of load + this rank's list
at the same world size. --no-seqs: steps without seqs (a daemon older than Step.seqs): the first
state_dict() of an epoch sorts the list once and maps trained copies of an index to its first free
positions.
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
    ap.add_argument("--sampler", action="store_true", help="a custom sampler with replacement (rank 0 of 1)")
    ap.add_argument("--no-seqs", action="store_true", help="--sampler: steps that do not name their seqs")
    args = ap.parse_args()
    if args.sampler:
        sampler_bench(args)
        return
    data = Lengths(args.n)
    loader = OdbDataLoader(data, shuffle=True, seed=1, rank=0, world_size=1, run_dir="/tmp/odb-bench-unused")
    order = loader._order.global_order()
    k = int(args.n * args.consumed)
    rng = np.random.default_rng(0)
    extra = rng.choice(np.arange(k, args.n), size=min(args.scatter, args.n - k), replace=False)
    loader._log.reset(0)  # what the loop records: one array per step
    loader._log.add(order[:k])
    loader._log.add(order[extra])
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


def sampler_bench(args: argparse.Namespace) -> None:
    data = Lengths(args.n)
    rng = np.random.default_rng(0)
    mine = rng.integers(0, args.n, size=args.n).astype(np.int64)  # with replacement: repeats
    loader = OdbDataLoader(data, sampler=mine, rank=0, world_size=1, run_dir="/tmp/odb-bench-unused")
    c0 = time.process_time()
    loader._order.start_epoch()  # what the epoch's start does: one draw of the list
    c1 = time.process_time()
    k = int(args.n * args.consumed)
    extra = rng.choice(np.arange(k, args.n), size=min(args.scatter, args.n - k), replace=False)
    loader._log.reset(0)  # what the loop records: one array per step
    # with seqs, a sample's seq is its index in the positions sent (all of them here)
    loader._log.add(mine[:k], seqs=None if args.no_seqs else np.arange(k, dtype=np.int64))
    loader._log.add(mine[extra], seqs=None if args.no_seqs else extra.astype(np.int64))
    c2 = time.process_time()
    state = loader.state_dict()
    c3 = time.process_time()
    loader.state_dict()  # a later checkpoint of the same epoch
    c4 = time.process_time()
    size = len(pickle.dumps(state))
    fresh = OdbDataLoader(data, sampler=mine, rank=0, world_size=1, run_dir="/tmp/odb-bench-unused")
    c5 = time.process_time()
    fresh.load_state_dict(state)
    rest = fresh.indices()
    c6 = time.process_time()
    print(json.dumps({"n": args.n, "sampler": "with replacement", "seqs": not args.no_seqs, "consumed": k + len(extra), "state_bytes": size,
                      "epoch_start_cpu_s": round(c1 - c0, 3), "state_dict_cpu_s": round(c3 - c2, 3),
                      "state_dict_again_cpu_s": round(c4 - c3, 3), "load_and_indices_cpu_s": round(c6 - c5, 3),
                      "remaining": len(rest)}))


if __name__ == "__main__":
    main()
