#!/usr/bin/python3
"""The daemon's partitioned round through the real Aligner (issue 22): rank 0's
CPU per round and per planned step and the bytes its collectives deliver, at
W = 256, 1024, 2560 (bench/scale_aligner_bench.cc says what the other ranks do).

    bazel build -c opt //bench:scale_aligner_bench
    /usr/bin/python3 bench/scale_aligner.py --bin bazel-bin/bench/scale_aligner_bench --out bench/results

Writes scale_aligner.json (one row per W) and scale_aligner.md (the table).
"""
import argparse
import json
import pathlib
import subprocess
import time

DEFAULT_RUNS = [(256, 64), (1024, 256), (2560, 256)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="bazel-bin/bench/scale_aligner_bench")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", default=",".join(f"{w}:{p}" for w, p in DEFAULT_RUNS),
                    help="W:partition_ranks pairs, comma-separated")
    args = ap.parse_args()
    rows = []
    for pair in args.runs.split(","):
        world, partition = (int(x) for x in pair.split(":"))
        cmd = [args.bin, "--world", str(world), "--partition-ranks", str(partition), "--rounds", str(args.rounds)]
        t0 = time.monotonic()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        row["wall_s"] = round(time.monotonic() - t0, 2)
        row["command"] = " ".join(["scale_aligner_bench"] + cmd[1:])
        print(json.dumps(row), flush=True)
        rows.append(row)
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scale_aligner.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "Rank 0 of a partitioned round through the real `align::Aligner` over a FakeWorld of W in-process "
        "ranks (summary all-gather, block all-gather on a Split group, every rank's per-step token totals; the other ranks "
        "play the protocol with real messages without planning). Window 512/rank, queue 32 (full rounds), "
        "padded L_max 4096, a=512 b=1, chat_longtail, local_world_size 8, locality 0. CPU is rank 0's "
        "thread CPU of `RunRound` (encode, decode, gates, PlanBlock, weights); bytes are what its "
        "collectives delivered to it.",
        "",
        "| W | block ranks | rounds | steps / round | CPU / round | CPU / planned step | received B / round "
        "| received B / planned step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['world']} | {r['block_ranks']} | {r['rounds']} | {r['steps_per_round']:.1f} "
                     f"| {r['aligner_cpu_ms_per_round']:.1f} ms | {r['aligner_cpu_ms_per_step']:.2f} ms "
                     f"| {r['recv_bytes_per_round']:,.0f} | {r['recv_bytes_per_step']:,.0f} |")
    lines += ["", "Commands: " + "; ".join(f"`{r['command']}`" for r in rows), ""]
    (out_dir / "scale_aligner.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
