#!/usr/bin/env python3
"""Planner CPU per planned step, received bytes and fraction of the padded
bound of `bench/scale_bench` runs, one row per (W, partition_ranks), the least
CPU of the repeats: the measurement behind `alignment.partition_ranks: auto`
(docs/balancing.md, "The default: `auto`").

    /usr/bin/python3 bench/partition_table.py bench/results/partition_default/r_w*.json
"""
import collections
import json
import sys


def main(paths):
    runs = collections.defaultdict(list)
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        runs[(d["world"], d["partition_ranks"])].append(d)
    print("| W | partition_ranks | block | runs | rank's planner CPU / planned step | received / planned step "
          "| decode CPU / round | fraction of the padded bound |")
    print("|---|---|---|---|---|---|---|---|")
    for (world, part), ds in sorted(runs.items()):
        cpu = min(d["block_plan_cpu_ms_per_step"] for d in ds)
        dec = min(d["block_decode_cpu_ms_per_round"] for d in ds)
        print(f"| {world} | {part} | {ds[0]['block_ranks']} | {len(ds)} | {cpu:.2f} ms | "
              f"{ds[0]['block_recv_bytes_per_step'] / 1e3:.0f} kB | {dec:.2f} ms | {ds[0]['bound_fraction']:.4f} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: partition_table.py SCALE_BENCH_JSON...")
    main(sys.argv[1:])
