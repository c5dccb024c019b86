#!/usr/bin/python3
"""Alignment rounds of W real odbd daemons against a raw Gloo all-gather (issue 22, item 3).

    ./scripts/build.sh && bazel build -c opt //bench:real_rounds_gloo
    /usr/bin/python3 bench/real_rounds.py --out bench/results          # as root, ~2.5 minutes on the 2-core VM

Each daemon is a host: its own network namespace, a veth link to one bridge
(a switch in its own namespace), and a qdisc on the host's side of the link
shaping what it sends (default 25 us one-way, 25 Gbit/s: a datacenter link;
--delay-us, --rate-gbit). With `tc netem` (a kernel with sch_netem) both are
on the link. Where the kernel has no netem (--delay-mode auto finds out; this
machine's VM kernel is one), the rate is on the link (`tc tbf`) and the delay
is added in the model: every hop of a ring collective waits one one-way delay,
a ring all-gather has W - 1 hops, a logarithmic one ceil(log2 W). A daemon
round's all-gather is one fixed-slot collective while the messages fit the slot
sized from the recent calls (src/align/gloo_peer_group.cc), run as Bruck's
logarithmic all-gather from 3 ranks up (GlooPeerGroupOptions::log_allgather_min_ranks).
For each W (default 2, 4, 8, 16, 32) the W daemons run one epoch of tiny
synthetic samples (real Gloo rendezvous and all-gathers, real payload exchange
of the global planner, producers and verifying consumers from odb_synth); every
daemon's odb_round_p50_microseconds (its median round, the last 256 rounds) is
read from its metrics endpoint. Then, in the same namespaces over the same
links, W processes of bench/real_rounds_gloo run a raw fixed-size all-gather
of the bytes one rank's round message has (the codec size of 2 x window pending
samples: the most a rank offers) and of 64 KiB (to fit the bandwidth term),
twice: Gloo's ring (gloo::allgather) and a raw Bruck all-gather on Gloo's
point-to-point buffers (no header, no slot). The round is compared with the
faster of the two (the strongest raw baseline) and with the ring.

The model, least squares over the runs, in hops H (W - 1 for a ring,
ceil(log2 W) for Bruck) and bytes:
    raw all-gather  T = alpha H + beta (W - 1) m
    daemon round    T = c0 + c1 H + beta (W - 1) m          (beta from the raw fit)
(with the delay in the model: alpha + d and c1 + d per hop), and the round
at --target-world (2560) is c0 + c1 H + beta (W - 1) m_prod
plus the planner and decode CPU of one round at that W from
bench/results/scale.json (production window, real planner, whole plan), with
m_prod that file's bytes per rank. The round's cost is then a fraction of one
step of each GPU-shaped model of bench/step_models.yaml (a full 4096-token
step), once per step (a round on every step's critical path) and per planned
step. Writes NAME.json and NAME.md under --out (--name, default real_rounds).

Partitioned (--partition-ranks P --local-world-size L): the daemons run with
alignment.partition_ranks P (blocks of P ranks rounded up to whole nodes of L;
a W with one block runs the unpartitioned round). Their round is three
collectives (src/align/aligner.cc PartitionedRound), so the baseline is
real_rounds_gloo's partitioned sequence of the same payloads: a world-wide
all-gather of the 26-B summary, the round message within the block, and a
world-wide all-gather of the token totals' bytes (13 + 4 x steps per round,
from every rank, as the daemon sends them), with rings and with Bruck. The
model counts hops H and bytes B over the collectives (raw T = alpha H + beta
B, round T = c0 + c1 H + beta B), and the round at --target-world (blocks of
--target-partition-ranks, nodes of --target-local-world-size) is the
Aligner's CPU and steps per round from --aligner-json
(bench/results/scale_aligner.json) plus the peer group's collectives through
its fixed slots (peer_group_collectives), under the fit, under W = 2's hop
with the link's delay and rate (odb's logarithmic all-gathers, and the same
bytes through Gloo's rings for comparison).
--repeat N measures each W N times (the daemons, then the raw collectives, each
time), so both sides of a ratio see the shared machine in about the same
state; the repeat with the median ratio from the last entry is the row, and
every repeat's ratios are listed.
--from-json FILE refits a recorded run without running anything.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/integration"))
import odbtest  # noqa: E402

GPU_MODELS = ["gpu_1b_h100", "gpu_7b_h100", "gpu_70b_h200"]
# Collectives per daemon round: the aligner's one AllGather is one fixed-slot all-gather (an
# overflow of the slot adds a second, not in steady state).
COLLECTIVES_PER_ROUND = 1
# A partitioned round's payloads (src/align/aligner.cc PartitionedRound; proto/peer.proto's
# RoundSummary and RankTotals, varints): a rank's summary (26 B in a full round), and a rank's token
# totals, sent by every rank: 13 B of header and about 4 B per planned step (a loss and a real token
# count of ~1,000-3,000: 2 B each). Both as bench/peer_codec_bench measures them (293 B at 70 steps).
SUMMARY_BYTES = 26
# GlooPeerGroupOptions::log_allgather_min_ranks: groups of at least this many ranks run Bruck.
LOG_ALLGATHER_MIN_RANKS = 3


def log_hops(n: int) -> int:
    """Rounds of Bruck's all-gather of n ranks: ceil(log2 n)."""
    return int(np.ceil(np.log2(n))) if n > 1 else 0


def peer_group_hops(n: int) -> int:
    """Sequential hops of one of the peer group's all-gathers among n ranks."""
    return log_hops(n) if n >= LOG_ALLGATHER_MIN_RANKS else n - 1


def totals_bytes(steps: int) -> int:
    return 13 + 4 * steps


def block_ranks(partition_ranks: int, local_world_size: int, world: int) -> int:
    """balance::BlockRanks: partition_ranks rounded up to whole nodes, at most the world."""
    if partition_ranks == 0 or local_world_size == 0:
        return world
    return min(world, -(-partition_ranks // local_world_size) * local_world_size)


# GlooPeerGroup's fixed slot (src/align/gloo_peer_group.{h,cc} ResizeSlot): every rank sends an
# 8-byte size header and `slot` payload bytes; what does not fit goes through a second all-gather of
# the rests. The slot is the largest of the last SLOT_MEMORY calls' wants.
SLOT_HEADER, SLOT_MIN, SLOT_MAX, SLOT_PADDING, SLOT_MEMORY = 8, 256, 1 << 20, 4, 4


def slot_want(largest: int, total: int, world: int) -> int:
    up = lambda n: (n + 63) // 64 * 64  # noqa: E731
    cap = max(SLOT_MIN, up(SLOT_PADDING * total // world))
    return min(max(min(up(largest + largest // 4), cap), SLOT_MIN), SLOT_MAX)


def peer_group_collectives(world: int, block: int, msg: int, steps: int) -> list[dict]:
    """The all-gathers of one steady-state partitioned round, through the peer group's slots: name,
    ranks n, frame (header + slot), bytes one rank sends over the collective ((n - 1) frames, ring or
    Bruck alike), and hops (odb's: Bruck's ceil(log2 n) from LOG_ALLGATHER_MIN_RANKS up; the ring's
    n - 1 in ring_hops). The world group's calls alternate between the summary and the totals (every
    rank sends both), so its slot fits the larger of the two; the block's holds the round message."""
    tot = totals_bytes(steps)
    world_slot = max(slot_want(SUMMARY_BYTES, SUMMARY_BYTES * world, world), slot_want(tot, tot * world, world))
    block_slot = slot_want(msg, msg * block, block)
    out = []
    for name, n, slot, size in (("summary all-gather", world, world_slot, SUMMARY_BYTES),
                                ("block all-gather", block, block_slot, msg),
                                ("token totals all-gather", world, world_slot, tot)):
        frame = SLOT_HEADER + slot
        out.append({"name": name, "ranks": n, "frame": frame, "bytes": (n - 1) * frame,
                    "hops": peer_group_hops(n), "ring_hops": n - 1})
        if size > slot:  # every rank's rest, a second all-gather
            rest = size - slot
            out.append({"name": name + " overflow", "ranks": n, "frame": rest, "bytes": (n - 1) * rest,
                        "hops": peer_group_hops(n), "ring_hops": n - 1})
    return out


def nonneg_lstsq2(x, y) -> tuple[float, float]:
    """Least squares y ~ a x[:,0] + b x[:,1] with a, b >= 0. Noise (a few worlds on shared cores) can
    tilt the free fit below zero in one term, and a model in which hops or bytes cost less than
    nothing extrapolates rounds cheaper than their own CPU; then the best fit of one term alone."""
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    if a >= 0 and b >= 0:
        return float(a), float(b)
    best = None
    for col in (0, 1):
        (k,), *_ = np.linalg.lstsq(x[:, [col]], y, rcond=None)
        k = max(0.0, float(k))
        err = float(np.sum((y - k * x[:, col]) ** 2))
        if best is None or err < best[0]:
            best = (err, (k, 0.0) if col == 0 else (0.0, k))
    return best[1]


def extrapolate_partitioned(rows: list[dict], model: dict, args, model_delay: float) -> dict:
    """The partitioned round at args.target_world with blocks of args.target_partition_ranks rounded to
    nodes of args.target_local_world_size: the three collectives' hops and bytes through the peer
    group's slots, the Aligner's CPU per round (encode, decode, gates, PlanBlock, weights) and its
    steps per round from --aligner-json (bench/scale_aligner.py, rank 0 of the real Aligner)."""
    target = args.target_world
    block = block_ranks(args.target_partition_ranks, args.target_local_world_size, target)
    cpu_rows = [r for r in json.loads(pathlib.Path(args.aligner_json).read_text())
                if r["world"] == target and r["block_ranks"] == block]
    if not cpu_rows:
        raise SystemExit(f"{args.aligner_json} has no W = {target}, block {block} row (bench/scale_aligner.py)")
    cpu = cpu_rows[0]
    steps = int(round(cpu["steps_per_round"]))
    # What rank 0 received per round = every summary + its block's messages + every rank's totals.
    msg = round((cpu["recv_bytes_per_round"] - SUMMARY_BYTES * target - target * totals_bytes(steps)) / block)
    colls = peer_group_collectives(target, block, msg, steps)
    hops = sum(c["hops"] for c in colls)
    ring_hops = sum(c["ring_hops"] for c in colls)
    sent = sum(c["bytes"] for c in colls)
    link_us_per_byte = 8 / (args.rate_gbit * 1e3) if args.rate_gbit > 0 else model["beta_us_per_byte_hop"]
    cpu_ms = cpu["aligner_cpu_ms_per_round"]
    two = next((r for r in rows if r["world"] == 2), None)
    scenarios = {"fit_here": {
        "round_comm_ms": (model["c0_us"] + model["c1_us_per_hop"] * hops + model["beta_us_per_byte_hop"] * sent) / 1e3,
        "raw_ms": (model["alpha_us_per_hop"] * hops + model["beta_us_per_byte_hop"] * sent) / 1e3,
        "hops": hops}}
    if two is not None:
        hop = two["raw_p50_us"]["msg"] + model_delay
        fixed = max(0.0, two["round_p50_us_median"] - two["raw_p50_us"]["msg"])
        # odb: Bruck's all-gathers; for comparison, the same bytes through Gloo's rings.
        for key, h in (("own_cores_log_hops", hops), ("own_cores_ring", ring_hops)):
            scenarios[key] = {"round_comm_ms": (fixed + h * hop + sent * link_us_per_byte) / 1e3,
                              "raw_ms": (h * hop + sent * link_us_per_byte) / 1e3,
                              "hops": h, "hop_us": hop, "fixed_us": fixed}
    models = yaml.safe_load((ROOT / "bench/step_models.yaml").read_text())
    step_ms = {name: 1e3 * step_seconds(models[name]) for name in GPU_MODELS if name in models}
    for sc in scenarios.values():
        sc["round_ms"] = sc["round_comm_ms"] + cpu_ms
        sc["per_step"] = {name: sc["round_ms"] / ms for name, ms in step_ms.items()}
        sc["per_planned_step"] = {name: sc["round_ms"] / steps / ms for name, ms in step_ms.items()}
        if "hop_us" in sc and "gpu_7b_h100" in step_ms:
            # The per-hop cost at which this round is 5% of the gpu_7b_h100 steps it plans.
            budget_us = 1e3 * (0.05 * steps * step_ms["gpu_7b_h100"] - cpu_ms) - sc["fixed_us"] - sent * link_us_per_byte
            sc["hop_us_for_5pct_per_planned_step"] = budget_us / sc["hops"]
    return {"world": target, "partitioned": True, "block": block, "local_world_size": args.target_local_world_size,
            "msg_bytes": msg, "collectives": colls, "bytes_sent_per_rank": sent,
            "link_ms": sent * link_us_per_byte / 1e3, "planner_decode_cpu_ms": cpu_ms,
            "steps_per_round": steps, "step_ms": step_ms, "scenarios": scenarios,
            "cpu_source": cpu["command"]}


def scrape(ns: str, daemon: odbtest.Daemon, names: list[str]) -> dict:
    """The daemon's metrics `names`, read inside its namespace (its endpoint is the namespace's loopback)."""
    daemon.wait_log("metrics endpoint tcp://", timeout=60)
    address = re.search(r"metrics endpoint tcp://([0-9.]+:\d+)", daemon.read_log()).group(1)
    text = subprocess.run(["ip", "netns", "exec", ns, "curl", "-sf", "--max-time", "10", f"http://{address}/metrics"],
                          check=True, capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0]
        if name in names:
            out[name] = float(line.rsplit(" ", 1)[1])
    missing = set(names) - set(out)
    if missing:
        raise RuntimeError(f"rank {daemon.rank}: metrics {sorted(missing)} missing from {address}")
    return out


def from_last_entry(entries: list[list[int]], exits: list[list[int]]) -> dict:
    """Rounds (or raw iterations) timed from the last rank's entry: for the k-th collective,
    each rank's exit minus the latest entry of any rank (wall-clock ns, one host). What is left
    is the collective and the CPU around it; the wait for a late rank to arrive (the entry skew)
    is apart. Median over ranks of each rank's median, in us, and the median skew."""
    n = min(len(e) for e in entries + exits)
    if n == 0:
        raise RuntimeError("no rounds traced")
    e = np.array([row[:n] for row in entries], dtype=np.int64)
    x = np.array([row[:n] for row in exits], dtype=np.int64)
    last = e.max(axis=0)
    after = (x - last) / 1e3  # ranks x rounds, us
    per_rank = np.median(after, axis=1)
    return {"p50_us_median": float(np.median(per_rank)), "p50_us_max": float(per_rank.max()),
            "skew_p50_us": float(np.median((last - e.min(axis=0)) / 1e3)), "collectives": int(n)}


def read_round_trace(path: pathlib.Path) -> tuple[list[int], list[int], list[int]]:
    """A daemon's round_trace: lines "round entry_ns exit_ns cpu_ns", the k-th line the k-th round."""
    entries, exits, cpus = [], [], []
    for k, line in enumerate(path.read_text().splitlines()):
        round_, entry, exit_, cpu = (int(v) for v in line.split())
        if round_ != k:
            raise RuntimeError(f"{path}: line {k + 1} is round {round_}")
        entries.append(entry)
        exits.append(exit_)
        cpus.append(cpu)
    return entries, exits, cpus


def codec_bytes(gloo_bin: str, samples: int, max_tokens: int) -> int:
    out = subprocess.run([gloo_bin, "codec", "--samples", str(samples), "--max-tokens", str(max_tokens)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["bytes"]


def daemon_rounds(hosts, world: int, args, run_dir: pathlib.Path) -> dict:
    job = f"rr-{uuid.uuid4().hex[:8]}"
    daemons, consumers, producers = [], [], []
    try:
        for rank, (ns, addr) in enumerate(hosts):
            partition = f", partition_ranks: {args.partition_ranks}" if args.partition_ranks else ""
            config = (f"local_world_size: {args.local_world_size}\n"
                      f"alignment: {{gloo_hostname: {addr}, planner: global{partition}}}\n"
                      f"grouping: {{window: {args.window}, max_tokens: {args.max_tokens}}}\n"
                      f"emit: {{queue_steps: {args.queue_steps}}}\n"
                      'metrics_endpoint: "tcp://127.0.0.1:*"\n'
                      f'round_trace: "{run_dir}/rounds-{rank}.txt"\n')
            daemons.append(odbtest.Daemon(run_dir, rank=rank, world=world, config=config, job_id=job,
                                          log_level="info",  # it names the metrics endpoint
                                          prefix=["ip", "netns", "exec", ns]))
        for d in daemons:
            d.wait_ready(timeout=120)
        consumers = [odbtest.consume(d.trainer, expected_producers=1,
                                     extra=["--rank", str(d.rank), "--max-tokens", str(args.max_tokens)])
                     for d in daemons]
        producers = [odbtest.produce(d.ingest, f"r{d.rank}", args.samples, seed=d.rank, id_offset=d.rank * 1_000_000,
                                     extra=["--max-len", str(args.max_len), "--min-len", "1", "--data-plane", "zmq"]) for d in daemons]
        for d, p in zip(daemons, producers):
            rc, _, err = odbtest.finish(p, timeout=300)
            if rc != 0:
                raise RuntimeError(f"producer of rank {d.rank}: {err}\n{d.read_log()}")
        emitted = 0
        for d, c in zip(daemons, consumers):
            rc, out, err = odbtest.finish(c, timeout=300)
            if rc != 0:
                raise RuntimeError(f"consumer of rank {d.rank}: {err}\n{d.read_log()}")
            (epoch,) = odbtest.epochs(out)
            emitted += len(epoch["ids"])
        if emitted != world * args.samples:
            raise RuntimeError(f"W={world}: {emitted} samples trained of {world * args.samples}")
        names = ["odb_round_p50_microseconds", "odb_round_p99_microseconds", "odb_rounds_total",
                 "odb_exchange_bytes_sent_total", "odb_steps_emitted_total"]
        per_rank = [scrape(ns, d, names) for (ns, _), d in zip(hosts, daemons)]
    finally:
        for proc in producers + consumers:  # only left running when something above failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for d in daemons:
            d.stop()
    traces = [read_round_trace(run_dir / f"rounds-{d.rank}.txt") for d in daemons]
    last_entry = from_last_entry([t[0] for t in traces], [t[1] for t in traces])
    # The planner thread's CPU per round (median over ranks of each rank's median): what a round
    # costs a rank on a core of its own, besides its collective.
    last_entry["cpu_p50_us"] = float(np.median([np.median(t[2]) / 1e3 for t in traces]))
    p50 = [r["odb_round_p50_microseconds"] for r in per_rank]
    return {
        "round_from_last_entry": last_entry,
        "round_p50_us_max": max(p50),
        "round_p50_us_median": float(np.median(p50)),
        "round_p50_us_min": min(p50),
        "round_p99_us_max": max(r["odb_round_p99_microseconds"] for r in per_rank),
        "rounds": int(min(r["odb_rounds_total"] for r in per_rank)),
        "exchange_bytes_sent": int(sum(r["odb_exchange_bytes_sent_total"] for r in per_rank)),
        "samples_trained": emitted,
        # Steps over rounds, gated rounds included: a floor on what a planning round plans.
        "steps_per_round": float(np.median([r["odb_steps_emitted_total"] / max(1.0, r["odb_rounds_total"])
                                            for r in per_rank])),
    }


def raw_gather(hosts, world: int, sizes: list[int], args, store: pathlib.Path, partitioned: dict | None = None) -> dict:
    """Raw fixed-size all-gathers of each of `sizes` (world-wide), and with `partitioned` ({block,
    summary_bytes, totals_bytes}) the raw partitioned sequence of real_rounds_gloo (sizes[0] within
    the block). Median over ranks of each rank's median."""
    store.mkdir(parents=True, exist_ok=True)
    extra = []
    if partitioned:
        extra = ["--block", str(partitioned["block"]), "--summary-bytes", str(partitioned["summary_bytes"]),
                 "--totals-bytes", str(partitioned["totals_bytes"])]
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, args.gloo_bin, "gather", "--rank", str(r), "--world",
                               str(world), "--store", str(store), "--hostname", addr, "--bytes",
                               ",".join(map(str, sizes)), "--iters", str(args.iters)] + extra,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r, (ns, addr) in enumerate(hosts)]
    rows = []
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=300)
            if p.returncode != 0:
                raise RuntimeError(f"real_rounds_gloo rank {r}: {err}")
            rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    finally:
        for p in procs:  # the others would wait for a failed rank until Gloo's timeout
            if p.poll() is None:
                p.kill()
                p.wait()
    result = {}
    for size in sizes:
        for variant in ("allgather", "sizes+allgatherv", "bruck"):
            p50 = [row["p50_us"] for row in rows if row["bytes"] == size and row["variant"] == variant]
            if len(p50) != world:
                raise RuntimeError(f"real_rounds_gloo: {len(p50)} of {world} ranks reported {variant} of {size} B")
            result[(size, variant)] = {"p50_us_max": max(p50), "p50_us_median": float(np.median(p50))}
            timed = sorted((row for row in rows if row["bytes"] == size and row["variant"] == variant),
                           key=lambda row: row["rank"])
            result[(size, variant)]["from_last_entry"] = from_last_entry([row["entry_ns"] for row in timed],
                                                                         [row["exit_ns"] for row in timed])
    if partitioned:
        for variant in ("partitioned", "partitioned_bruck"):
            part = [row for row in rows if row["variant"] == variant]
            if len(part) != world:
                raise RuntimeError(f"real_rounds_gloo: {len(part)} of {world} ranks reported the {variant} sequence")
            result[variant] = {key: float(np.median([row[key] for row in part]))
                               for key in ("p50_us", "summary_p50_us", "block_p50_us", "totals_p50_us")}
            result[variant]["p50_us_max"] = max(row["p50_us"] for row in part)
            timed = sorted(part, key=lambda row: row["rank"])
            result[variant]["from_last_entry"] = from_last_entry([row["entry_ns"] for row in timed],
                                                                 [row["exit_ns"] for row in timed])
    return result


def step_seconds(model: dict, tokens: int = 4096) -> float:
    """A full step of one `tokens`-long sample: a + max(m, b (p + k)) + c s^2 (bench/step_models.yaml)."""
    return model["a"] + max(model.get("m", 0.0), model["b"] * (tokens + model.get("k", 0.0))) + model["c"] * tokens ** 2


def fit(rows: list[dict], big: int, model_delay_us: float) -> dict:
    """Least squares over the runs, in hops H and bytes B one rank sends (row["hop_bytes"]: (W - 1) m
    for one world-wide all-gather; summed over the three collectives of a partitioned round). Raw
    collectives are rings (H = W - 1 each) or Bruck's (H = ceil(log2 W) each); the daemon's hops are
    its peer group's (row["hops"]):
        raw T = alpha H + beta B        (the world-wide all-gathers of m and `big` B, ring and Bruck,
                                         and the raw partitioned sequences where measured)
        round T = c0 + c1 H + beta B    (beta from the raw fit)."""
    xs, ys = [], []
    for r in rows:
        w1 = r["world"] - 1
        for size, m in (("msg", r["msg_bytes"]), ("big", big)):
            xs.append([w1, w1 * m])
            ys.append(r["raw_p50_us"][size])
            if size + "_bruck" in r["raw_p50_us"]:
                xs.append([log_hops(r["world"]), w1 * m])
                ys.append(r["raw_p50_us"][size + "_bruck"])
        if r.get("partition"):
            xs.append([r.get("raw_ring_hops", r["hops"]), r["hop_bytes"]])
            ys.append(r["raw_p50_us"]["partitioned"])
            if "partitioned_bruck" in r["raw_p50_us"]:
                xs.append([r["raw_log_hops"], r["hop_bytes"]])
                ys.append(r["raw_p50_us"]["partitioned_bruck"])
    alpha, beta = nonneg_lstsq2(np.array(xs, float), np.array(ys, float))
    # Daemon rounds: the bandwidth term from the raw fit, c0 + c1 H fitted.
    xd = np.array([[1.0, r.get("hops", r["world"] - 1)] for r in rows])
    yd = np.array([r["round_p50_us_median"] - beta * r.get("hop_bytes", (r["world"] - 1) * r["msg_bytes"]) for r in rows])
    c0, c1 = nonneg_lstsq2(xd, yd)
    resid = [r["round_p50_us_median"] - (c0 + c1 * r.get("hops", r["world"] - 1) + beta * r.get("hop_bytes", (r["world"] - 1) * r["msg_bytes"])) for r in rows]
    # A delay not on the link: one one-way delay per hop.
    return {"alpha_us_per_hop": float(alpha) + model_delay_us, "beta_us_per_byte_hop": float(beta),
            "implied_gbit_s": float(8e-3 / beta) if beta > 0 else None,
            "c0_us": float(c0), "c1_us_per_hop": float(c1) + model_delay_us,
            "measured_alpha_us_per_hop": float(alpha), "measured_c1_us_per_hop": float(c1),
            "delay_added_us_per_hop": model_delay_us,
            "daemon_residuals_us": [round(float(x), 1) for x in resid]}


def extrapolate(rows: list[dict], model: dict, args, model_delay: float) -> dict:
    """The round at args.target_world under three sets of assumptions (see the module docstring)."""
    scale = {r["world"]: r for r in json.loads(pathlib.Path(args.scale_json).read_text())}
    target = args.target_world
    w1 = target - 1
    prod = scale.get(target)
    if prod is None:
        raise SystemExit(f"{args.scale_json} has no W = {target} row (bench/scale.py --worlds ... {target})")
    m_prod = prod["sent_bytes_per_round"]
    cpu_ms = prod["plan_cpu_ms_per_round"] + float(np.mean(prod.get("decode_cpu_ms", [0.0])))
    steps_per_round = float(np.mean(prod["steps"]))
    link_us_per_byte = 8 / (args.rate_gbit * 1e3) if args.rate_gbit > 0 else model["beta_us_per_byte_hop"]
    two = next((r for r in rows if r["world"] == 2), None)
    scenarios = {}
    log = peer_group_hops(target)  # odb's all-gather (Bruck)
    # 1. The fit over this machine's runs, as it is: its per-hop terms carry W processes time-sharing 2 cores.
    scenarios["fit_here"] = {
        "round_comm_ms": (model["c0_us"] + model["c1_us_per_hop"] * log + model["beta_us_per_byte_hop"] * w1 * m_prod) / 1e3,
        "raw_ms": (model["alpha_us_per_hop"] * log + model["beta_us_per_byte_hop"] * w1 * m_prod) / 1e3, "hops": log}
    if two is not None:
        # 2. Each rank on its own cores (a real node): the per-hop software cost of W = 2 (two processes,
        # two cores), the link's delay and rate per hop, the daemon's fixed cost at W = 2 beyond its hops.
        hop = two["raw_p50_us"]["msg"] + model_delay
        fixed = two["round_p50_us_median"] - COLLECTIVES_PER_ROUND * two["raw_p50_us"]["msg"]
        # odb's Bruck all-gather (ceil(log2 W) hops), and for comparison Gloo's ring (W - 1 hops).
        for key, h in (("own_cores_log_hops", log), ("own_cores_ring", w1)):
            scenarios[key] = {
                "round_comm_ms": (fixed + COLLECTIVES_PER_ROUND * h * hop + w1 * m_prod * link_us_per_byte) / 1e3,
                "raw_ms": (h * hop + w1 * m_prod * link_us_per_byte) / 1e3,
                "hops": h, "hop_us": hop, "fixed_us": fixed}
    models = yaml.safe_load((ROOT / "bench/step_models.yaml").read_text())
    step_ms = {name: 1e3 * step_seconds(models[name]) for name in GPU_MODELS if name in models}
    for sc in scenarios.values():
        sc["round_ms"] = sc["round_comm_ms"] + cpu_ms
        sc["per_step"] = {name: sc["round_ms"] / ms for name, ms in step_ms.items()}
        sc["per_planned_step"] = {name: sc["round_ms"] / steps_per_round / ms for name, ms in step_ms.items()}
    return {"world": target, "msg_bytes": m_prod, "planner_decode_cpu_ms": cpu_ms,
            "steps_per_round": steps_per_round, "step_ms": step_ms, "scenarios": scenarios}


def refit(args) -> int:
    result = json.loads(pathlib.Path(args.from_json).read_text())
    rows = result["rows"]
    model_delay = result["link"]["one_way_delay_us"] if result["link"]["delay"] == "model" else 0.0
    args.rate_gbit = result["link"]["rate_gbit_s"]
    args.partition_ranks = result["workload"].get("partition_ranks", 0)
    result["model"] = fit(rows, result["workload"]["big_bytes"], model_delay)
    result["extrapolation"] = (extrapolate_partitioned if args.partition_ranks else extrapolate)(
        rows, result["model"], args, model_delay)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{args.name}.md").write_text(render(result))
    print(render(result))
    return 0


def measure_world(world: int, args, msg_bytes: int, link_delay: float, model_delay: float) -> dict:
    """One measurement at W = world: the daemons' rounds, then the raw collectives over the same links."""
    t0 = time.monotonic()
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"rr{world}-", dir="/tmp"))
    try:
        with odbtest.bridged_hosts(args.prefix, world, args.subnet, link_delay, args.rate_gbit * 1000) as hosts:
            row = {"world": world, "msg_bytes": msg_bytes}
            row.update(daemon_rounds(hosts, world, args, work / "run"))
            block = block_ranks(args.partition_ranks, args.local_world_size, world)
            part = None
            if block < world:
                # The raw sequence moves the round's payloads, every rank sending its token
                # totals' bytes (as the daemon does).
                part = {"partition_ranks": args.partition_ranks, "local_world_size": args.local_world_size,
                        "block": block, "summary_bytes": SUMMARY_BYTES,
                        "totals_bytes": totals_bytes(int(np.ceil(row["steps_per_round"])))}
            row["partition"] = part
            raw = raw_gather(hosts, world, [msg_bytes, args.big_bytes], args, work / "store", part)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # Median over ranks of each rank's median, for the daemons and the raw collectives alike.
    row["raw_p50_us"] = {"msg": raw[(msg_bytes, "allgather")]["p50_us_median"],
                         "big": raw[(args.big_bytes, "allgather")]["p50_us_median"],
                         "msg_sizes_allgatherv": raw[(msg_bytes, "sizes+allgatherv")]["p50_us_median"],
                         "big_sizes_allgatherv": raw[(args.big_bytes, "sizes+allgatherv")]["p50_us_median"],
                         "msg_bruck": raw[(msg_bytes, "bruck")]["p50_us_median"],
                         "big_bruck": raw[(args.big_bytes, "bruck")]["p50_us_median"],
                         "msg_max_over_ranks": raw[(msg_bytes, "allgather")]["p50_us_max"]}
    # Both timed from the last rank's entry: the collective and its CPU, without the entry skew.
    row["raw_from_last_entry"] = {"msg": raw[(msg_bytes, "allgather")]["from_last_entry"],
                                  "msg_bruck": raw[(msg_bytes, "bruck")]["from_last_entry"]}
    if part:
        # Hops and bytes one rank sends: summaries and totals world-wide, the metadata in the block.
        for variant in ("partitioned", "partitioned_bruck"):
            row["raw_p50_us"][variant] = raw[variant]["p50_us"]
            row["raw_p50_us"][variant + "_parts"] = {k: raw[variant][k] for k in
                                                     ("summary_p50_us", "block_p50_us", "totals_p50_us")}
            row["raw_p50_us"][variant + "_max_over_ranks"] = raw[variant]["p50_us_max"]
            row["raw_from_last_entry"][variant] = raw[variant]["from_last_entry"]
        row["hops"] = 2 * peer_group_hops(world) + peer_group_hops(block)  # the daemon's
        row["raw_ring_hops"] = 2 * (world - 1) + (block - 1)
        row["raw_log_hops"] = 2 * log_hops(world) + log_hops(block)
        row["hop_bytes"] = ((world - 1) * (part["summary_bytes"] + part["totals_bytes"])
                            + (block - 1) * msg_bytes)
        ring, log = "partitioned", "partitioned_bruck"
    else:
        row["hops"] = peer_group_hops(world)
        row["raw_ring_hops"] = world - 1
        row["raw_log_hops"] = log_hops(world)
        row["hop_bytes"] = (world - 1) * msg_bytes
        ring, log = "msg", "msg_bruck"
    # The strongest raw baseline: the faster of the ring and Bruck's all-gathers of the same bytes.
    row["raw_baseline"] = log if row["raw_p50_us"][log] < row["raw_p50_us"][ring] else ring
    row["round_over_raw"] = row["round_p50_us_median"] / row["raw_p50_us"][row["raw_baseline"]]
    row["round_over_raw_ring"] = row["round_p50_us_median"] / row["raw_p50_us"][ring]
    row["round_over_raw_bruck"] = row["round_p50_us_median"] / row["raw_p50_us"][log]
    # The round from the last daemon's entry against the faster raw baseline (the all-gather, or the
    # partitioned sequence), timed alike.
    raw_last = min(row["raw_from_last_entry"][k]["p50_us_median"] for k in (ring, log))
    row["round_over_raw_from_last_entry"] = row["round_from_last_entry"]["p50_us_median"] / raw_last
    # The round against one world-wide all-gather of every rank's message (the unpartitioned round's).
    row["round_over_raw_world_msg"] = row["round_p50_us_median"] / row["raw_p50_us"]["msg"]
    # The round against the two collectives the peer group ran before (kept as a reference point).
    row["round_over_sizes_allgatherv"] = row["round_p50_us_median"] / row["raw_p50_us"]["msg_sizes_allgatherv"]
    # With the delay in the model, the same ratio once each hop has waited for it.
    base_hops = row["raw_log_hops"] if row["raw_baseline"] == log else row["raw_ring_hops"]
    row["round_over_raw_with_delay"] = ((row["round_p50_us_median"] + row["hops"] * model_delay)
                                        / (row["raw_p50_us"][row["raw_baseline"]] + base_hops * model_delay))
    row["wall_s"] = round(time.monotonic() - t0, 1)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="2,4,8,16,32")
    ap.add_argument("--delay-us", type=float, default=25.0, help="one-way latency of each host's link (netem)")
    ap.add_argument("--rate-gbit", type=float, default=25.0, help="each host's NIC rate; 0 = unlimited")
    ap.add_argument("--delay-mode", choices=["auto", "netem", "model"], default="auto",
                    help="the delay on the link (netem), in the model, or netem where the kernel has it")
    ap.add_argument("--samples", type=int, default=120, help="samples per rank (tiny: the round is the object)")
    ap.add_argument("--max-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--window", type=int, default=4, help="small: many rounds per sample, each a full round")
    ap.add_argument("--queue-steps", type=int, default=64, help="emit.queue_steps: a round every queue_steps / 2 steps")
    ap.add_argument("--iters", type=int, default=30, help="raw all-gathers per size")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure each W this many times (daemons, then raw, each time); the median repeat is reported")
    ap.add_argument("--big-bytes", type=int, default=65536)
    ap.add_argument("--partition-ranks", type=int, default=0,
                    help="alignment.partition_ranks of the daemons (0 = off: one all-gather of every window)")
    ap.add_argument("--local-world-size", type=int, default=1,
                    help="the daemons' local_world_size (a block is partition_ranks rounded up to whole nodes)")
    ap.add_argument("--target-world", type=int, default=2560)
    ap.add_argument("--target-partition-ranks", type=int, default=256, help="with --partition-ranks: at --target-world")
    ap.add_argument("--target-local-world-size", type=int, default=8, help="with --partition-ranks: at --target-world")
    ap.add_argument("--scale-json", default=str(ROOT / "bench/results/scale.json"),
                    help="planner CPU and bytes of the whole plan (unpartitioned extrapolation)")
    ap.add_argument("--aligner-json", default=str(ROOT / "bench/results/scale_aligner.json"),
                    help="the partitioned Aligner's CPU, bytes and steps per round (partitioned extrapolation)")
    ap.add_argument("--name", default="real_rounds", help="writes NAME.json and NAME.md under --out")
    ap.add_argument("--from-json", help="no runs: refit and re-extrapolate the rows of this result file "
                    "(its link, workload and command kept; the target options and the JSON inputs from here)")
    ap.add_argument("--gloo-bin", help="default: $(bazel info -c opt bazel-bin)/bench/real_rounds_gloo")
    ap.add_argument("--prefix", default="odbrr")
    ap.add_argument("--subnet", default="10.219.3")
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    args = ap.parse_args()
    if args.from_json:
        return refit(args)
    odbtest.require_built()
    if args.partition_ranks < 0 or args.local_world_size < 0:
        sys.exit("--partition-ranks and --local-world-size must be >= 0")
    if args.repeat < 1:
        sys.exit("--repeat must be >= 1")
    if args.gloo_bin is None:
        bin_dir = subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout.strip()
        args.gloo_bin = f"{bin_dir}/bench/real_rounds_gloo"
    if not pathlib.Path(args.gloo_bin).exists():
        sys.exit(f"{args.gloo_bin} is missing: bazel build -c opt //bench:real_rounds_gloo (or pass --gloo-bin)")
    worlds = [int(w) for w in args.worlds.split(",")]
    mode = args.delay_mode
    if mode == "auto":
        mode = "netem" if odbtest.netem_available() else "model"
    if mode == "netem" and not odbtest.netem_available():
        sys.exit("--delay-mode netem: this kernel has no netem qdisc (tc: unknown qdisc); use --delay-mode model")
    link_delay = args.delay_us if mode == "netem" else 0.0
    model_delay = args.delay_us if mode == "model" else 0.0
    msg_bytes = codec_bytes(args.gloo_bin, 2 * args.window, args.max_len)
    rows = []
    for world in worlds:
        # Each repeat runs the daemons and then the raw collectives again, so that both sides of
        # every ratio see the machine in about the same state; the row is the repeat with the
        # median ratio from the last entry, and every repeat's ratios are kept.
        reps = [measure_world(world, args, msg_bytes, link_delay, model_delay) for _ in range(args.repeat)]
        reps.sort(key=lambda r: r["round_over_raw_from_last_entry"])
        row = dict(reps[len(reps) // 2])
        if len(reps) > 1:
            row["repeats"] = [{key: r[key] for key in ("round_over_raw", "round_over_raw_from_last_entry",
                                                       "round_p50_us_median", "wall_s")} for r in reps]
        rows.append(row)
        print(json.dumps(row), flush=True)

    model = fit(rows, args.big_bytes, model_delay) if len(rows) >= 2 else None
    result = {"command": " ".join(["bench/real_rounds.py"] + sys.argv[1:]),
              "link": {"one_way_delay_us": args.delay_us, "rate_gbit_s": args.rate_gbit, "delay": mode,
                       "rate_qdisc": ("netem" if mode == "netem" else "tbf") if args.rate_gbit > 0 else None,
                       "tbf_burst_bytes": odbtest.tbf_burst_bytes(args.rate_gbit * 1000)
                       if mode == "model" and args.rate_gbit > 0 else None},
              "workload": {"samples_per_rank": args.samples, "max_len": args.max_len, "window": args.window,
                           "max_tokens": args.max_tokens, "queue_steps": args.queue_steps, "msg_bytes": msg_bytes, "big_bytes": args.big_bytes,
                           "partition_ranks": args.partition_ranks, "local_world_size": args.local_world_size},
              "rows": rows, "model": model}
    if model is not None:
        result["extrapolation"] = (extrapolate_partitioned if args.partition_ranks else extrapolate)(
            rows, model, args, model_delay)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{args.name}.md").write_text(render(result))
    print(render(result))
    return 0


def render_repeats(rows: list[dict]) -> list[str]:
    """One line per W measured more than once: every repeat's ratios, least first."""
    out = []
    for r in rows:
        reps = r.get("repeats")
        if not reps:
            continue
        last = ", ".join(f"{x['round_over_raw_from_last_entry']:.2f}" for x in reps)
        own = ", ".join(f"{x['round_over_raw']:.2f}" for x in reps)
        out.append(f"- W = {r['world']}, {len(reps)} repeats (daemons then raw, each time; the rows above are the "
                   f"median one): round / raw from the last entry {last}; from its own entry {own}.")
    return ["", *out] if out else []


def render(result: dict) -> str:
    if result["workload"].get("partition_ranks"):
        return render_partitioned(result)
    link = result["link"]
    w = result["workload"]
    lines = ["# Real alignment rounds: odbd daemons in network namespaces vs raw Gloo all-gather",
             "", f"`{result['command']}`", "",
             f"Link per host (host egress): {link['one_way_delay_us']:g} us one-way "
             + ("(tc netem, on the link)" if link["delay"] == "netem" else
                "(added in the model: this kernel has no netem; not in the measured columns)")
             + f", {link['rate_gbit_s']:g} Gbit/s (tc {link['rate_qdisc']}). Workload per rank: {w['samples_per_rank']} samples of 1-{w['max_len']} "
             f"tokens, window {w['window']}, max_tokens {w['max_tokens']}; round message {w['msg_bytes']} B "
             f"(2 x window samples, the most a rank offers).", "",
             "Each figure is the median over ranks of each rank's median (daemons: odb_round_p50_microseconds). "
             "Raw ring = gloo::allgather; raw Bruck = Bruck's all-gather on Gloo's point-to-point buffers "
             "(ceil(log2 W) hops, no header or slot); round / raw = against the faster of the two.", "",
             "| W | rounds | daemon round | (slowest rank) | raw ring, msg | raw Bruck, msg | sizes + allgatherv, "
             f"msg | raw ring / Bruck, {w['big_bytes']} B | **round / raw** | round / raw ring | with the delay |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        raw = r["raw_p50_us"]
        lines.append(f"| {r['world']} | {r['rounds']} | {r['round_p50_us_median'] / 1e3:.2f} ms | "
                     f"{r['round_p50_us_max'] / 1e3:.2f} ms | {raw['msg'] / 1e3:.2f} ms | "
                     f"{raw.get('msg_bruck', float('nan')) / 1e3:.2f} ms | "
                     f"{raw['msg_sizes_allgatherv'] / 1e3:.2f} ms | "
                     f"{raw['big'] / 1e3:.2f} / {raw.get('big_bruck', float('nan')) / 1e3:.2f} ms | "
                     f"**{r['round_over_raw']:.2f}** | {r.get('round_over_raw_ring', r['round_over_raw']):.2f} | "
                     f"{r['round_over_raw_with_delay']:.2f} |")
    timed = [r for r in result["rows"] if "round_from_last_entry" in r]
    if timed:
        lines += ["", "The same runs timed from the last rank's entry (`round_trace`: each daemon's wall-clock entry "
                  "and exit of every round; the raw all-gathers' entry and exit of every iteration): for the k-th "
                  "collective, each rank's exit minus the latest entry of any rank, median over ranks of each "
                  "rank's median. This is the round's own cost (its collective and the CPU around it); the entry "
                  "skew is how long the first rank waited for the last to arrive (a daemon enters a round when its "
                  "own trainer and producers make one due; the raw ranks leave a barrier together).", "",
                  "| W | daemon round, from the last entry | its planner-thread CPU | entry skew (median) | "
                  "raw ring, from the last entry | raw Bruck, from the last entry | **round / raw, from the last entry** |",
                  "|---|---|---|---|---|---|---|"]
        for r in timed:
            d, raw = r["round_from_last_entry"], r["raw_from_last_entry"]
            lines.append(f"| {r['world']} | {d['p50_us_median'] / 1e3:.2f} ms | {d.get('cpu_p50_us', float('nan')) / 1e3:.2f} ms | "
                         f"{d['skew_p50_us'] / 1e3:.2f} ms | "
                         f"{raw['msg']['p50_us_median'] / 1e3:.2f} ms | {raw['msg_bruck']['p50_us_median'] / 1e3:.2f} ms | "
                         f"**{r['round_over_raw_from_last_entry']:.2f}** |")
    lines += render_repeats(result["rows"])
    m = result.get("model")
    if m:
        lines += ["", "Model (least squares, H = hops: W - 1 for a ring, ceil(log2 W) for Bruck and the daemons): "
                  "raw T = alpha H + beta (W-1) m; round T = c0 + c1 H + beta (W-1) m.",
                  f"alpha = {m['alpha_us_per_hop']:.1f} us/hop, beta = {m['beta_us_per_byte_hop'] * 1e3:.3f} ns/B/hop"
                  + (f" ({m['implied_gbit_s']:.2f} Gbit/s)" if m["implied_gbit_s"] else "")
                  + f", c0 = {m['c0_us']:.0f} us, c1 = {m['c1_us_per_hop']:.1f} us/hop; "
                  f"round residuals {m['daemon_residuals_us']} us"
                  + (f" (alpha and c1 include {m['delay_added_us_per_hop']:g} and "
                     f"{COLLECTIVES_PER_ROUND * m['delay_added_us_per_hop']:g} us of delay per hop added in the model; measured "
                     f"{m['measured_alpha_us_per_hop']:.1f} and {m['measured_c1_us_per_hop']:.1f})"
                     if m["delay_added_us_per_hop"] else "") + "."]
    e = result.get("extrapolation")
    if e:
        names = {"fit_here": "the fit over these runs (W processes on this machine's 2 cores)",
                 "own_cores_log_hops": "each rank on its own cores: W = 2's hop, the link's delay and rate; "
                                       "odb's log all-gather",
                 "own_cores_ring": "as above through Gloo's ring (W - 1 hops; odb before the log all-gather)"}
        lines += ["", f"Extrapolated to W = {e['world']}: message {e['msg_bytes']:.0f} B per rank and planner + "
                  f"decode CPU {e['planner_decode_cpu_ms']:.0f} ms per round of {e['steps_per_round']:g} planned "
                  "steps (bench/results/scale.json, whole plan, production window); step = a full 4096-token step "
                  "(" + ", ".join(f"`{n}` {ms:.0f} ms" for n, ms in e["step_ms"].items()) + ").", "",
                  "| assumption | hops | raw all-gather | round | round / `gpu_7b_h100` step | per planned step |",
                  "|---|---|---|---|---|---|"]
        for key, sc in e["scenarios"].items():
            lines.append(f"| {names[key]} | {sc.get('hops', '')} | {sc['raw_ms']:.1f} ms | {sc['round_ms']:.1f} ms | "
                         f"{100 * sc['per_step'].get('gpu_7b_h100', float('nan')):.1f}% | "
                         f"{100 * sc['per_planned_step'].get('gpu_7b_h100', float('nan')):.2f}% |")
    return "\n".join(lines) + "\n"



def render_partitioned(result: dict) -> str:
    link = result["link"]
    w = result["workload"]
    lines = ["# Real partitioned alignment rounds: odbd daemons in network namespaces vs raw Gloo all-gathers",
             "", f"`{result['command']}`", "",
             f"Link per host (host egress): {link['one_way_delay_us']:g} us one-way "
             + ("(tc netem, on the link)" if link["delay"] == "netem" else
                "(added in the model: this kernel has no netem; not in the measured columns)")
             + f", {link['rate_gbit_s']:g} Gbit/s (tc {link['rate_qdisc']}). Daemons: `alignment.partition_ranks: "
             f"{w['partition_ranks']}`, `local_world_size: {w['local_world_size']}`. Workload per rank: "
             f"{w['samples_per_rank']} samples of 1-{w['max_len']} tokens, window {w['window']}, max_tokens "
             f"{w['max_tokens']}, queue_steps {w['queue_steps']}; round message {w['msg_bytes']} B "
             "(2 x window samples, the most a rank offers).", "",
             "Raw partitioned = one real_rounds_gloo sequence per iteration, after a barrier: a world-wide "
             "all-gather of the 26-B summary, an all-gather of the round message within the block (its own "
             "Gloo context), a world-wide all-gather of the token totals' bytes (13 + 4 x steps per round, "
             "rounded up; from every rank, as the daemon sends them); once with Gloo's rings, once with "
             "Bruck's all-gathers (ceil(log2 n) hops each, no header or slot). Round / raw = against the "
             "faster of the two sequences. Raw world msg = one world-wide ring all-gather of the round "
             "message (what an unpartitioned round moves). Each figure is the median over ranks of each "
             "rank's median (daemons: odb_round_p50_microseconds). Rows without a block are unpartitioned "
             "(block >= W; their raw baseline is the faster world-wide all-gather of the message).", "",
             "| W | block | rounds | steps / round | daemon round | (slowest rank) | raw partitioned, rings "
             "(summary + block + totals) | raw partitioned, Bruck | raw world msg | **round / raw** | "
             "round / raw rings | with the delay |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        part = r.get("partition")
        raws = []
        for variant in ("partitioned", "partitioned_bruck"):
            if part and variant in r["raw_p50_us"]:
                pp = r["raw_p50_us"][variant + "_parts"]
                raws.append(f"{r['raw_p50_us'][variant] / 1e3:.2f} ms ({pp['summary_p50_us'] / 1e3:.2f} + "
                            f"{pp['block_p50_us'] / 1e3:.2f} + {pp['totals_p50_us'] / 1e3:.2f})")
            else:
                raws.append("")
        lines.append(f"| {r['world']} | {part['block'] if part else '-'} | {r['rounds']} | {r['steps_per_round']:.1f} | "
                     f"{r['round_p50_us_median'] / 1e3:.2f} ms | {r['round_p50_us_max'] / 1e3:.2f} ms | {raws[0]} | "
                     f"{raws[1]} | {r['raw_p50_us']['msg'] / 1e3:.2f} ms | **{r['round_over_raw']:.2f}** | "
                     f"{r.get('round_over_raw_ring', r['round_over_raw']):.2f} | {r['round_over_raw_with_delay']:.2f} |")
    timed = [r for r in result["rows"] if "round_over_raw_from_last_entry" in r]
    if timed:
        lines += ["", "The same runs timed from the last rank's entry (each daemon's `round_trace`; the raw "
                  "sequences' wall-clock entry and exit of every iteration): for the k-th round or sequence, each "
                  "rank's exit minus the latest entry of any rank, median over ranks of each rank's median: the "
                  "collectives and the CPU around them, the entry skew apart.", "",
                  "| W | daemon round, from the last entry | its planner-thread CPU | entry skew (median) | "
                  "raw rings, from the last entry | raw Bruck, from the last entry | "
                  "**round / raw, from the last entry** |",
                  "|---|---|---|---|---|---|---|"]
        for r in timed:
            d, raw = r["round_from_last_entry"], r["raw_from_last_entry"]
            ring, log = ("partitioned", "partitioned_bruck") if r.get("partition") else ("msg", "msg_bruck")
            lines.append(f"| {r['world']} | {d['p50_us_median'] / 1e3:.2f} ms | "
                         f"{d.get('cpu_p50_us', float('nan')) / 1e3:.2f} ms | {d['skew_p50_us'] / 1e3:.2f} ms | "
                         f"{raw[ring]['p50_us_median'] / 1e3:.2f} ms | {raw[log]['p50_us_median'] / 1e3:.2f} ms | "
                         f"**{r['round_over_raw_from_last_entry']:.2f}** |")
    lines += render_repeats(result["rows"])
    m = result.get("model")
    if m:
        lines += ["", "Model (least squares over every row, H = sequential hops, B = bytes one rank sends): "
                  "raw T = alpha H + beta B (the world msg and 64 KiB all-gathers: H = W - 1 for the ring, "
                  "ceil(log2 W) for Bruck, B = (W - 1) m; the raw partitioned sequences: H = 2 (W - 1) + "
                  "(block - 1) or 2 ceil(log2 W) + ceil(log2 block)); round T = c0 + c1 H + beta B with the "
                  "daemon's H (its peer group's log all-gathers).",
                  f"alpha = {m['alpha_us_per_hop']:.1f} us/hop, beta = {m['beta_us_per_byte_hop'] * 1e3:.3f} ns/B/hop"
                  + (f" ({m['implied_gbit_s']:.2f} Gbit/s)" if m["implied_gbit_s"] else "")
                  + f", c0 = {m['c0_us']:.0f} us, c1 = {m['c1_us_per_hop']:.1f} us/hop; "
                  f"round residuals {m['daemon_residuals_us']} us"
                  + (f" (alpha and c1 include {m['delay_added_us_per_hop']:g} us of delay per hop added in the "
                     f"model; measured {m['measured_alpha_us_per_hop']:.1f} and {m['measured_c1_us_per_hop']:.1f})"
                     if m["delay_added_us_per_hop"] else "") + "."]
    e = result.get("extrapolation")
    if e:
        lines += ["", f"Extrapolated to W = {e['world']}, blocks of {e['block']} ranks (`local_world_size` "
                  f"{e['local_world_size']}): the Aligner's CPU {e['planner_decode_cpu_ms']:.1f} ms per round of "
                  f"{e['steps_per_round']} planned steps and a block message of {e['msg_bytes']} B per rank "
                  f"(bench/results/scale_aligner.json, `{e['cpu_source']}`); the collectives through the peer "
                  "group's fixed slots (8-B header + slot, slot >= 256 B, the largest of the last 4 calls' "
                  "wants; every rank sends its totals, so nothing overflows):", "",
                  "| collective | ranks | hops: odb (Bruck) / ring | frame (bytes per rank) | bytes one rank sends |",
                  "|---|---|---|---|---|"]
        for c in e["collectives"]:
            lines.append(f"| {c['name']} | {c['ranks']} | {c.get('hops', '')} / {c.get('ring_hops', c['ranks'] - 1)} | "
                         f"{c['frame']} | {c['bytes']:,} |")
        lines += ["", f"{e['bytes_sent_per_rank']:,} B per rank per round: {e['link_ms']:.2f} ms at "
                  f"{link['rate_gbit_s']:g} Gbit/s. Step = a full 4096-token step ("
                  + ", ".join(f"`{n}` {ms:.0f} ms" for n, ms in e["step_ms"].items()) + "). Per step = round / "
                  "one step (the round on one step's critical path); per planned step = round / (steps it "
                  "plans x step).", "",
                  "| assumption | hops | per hop | raw collectives | round | round / `gpu_7b_h100` step | "
                  "per planned step | per hop for 5% per planned step |",
                  "|---|---|---|---|---|---|---|---|"]
        names = {"fit_here": "the fit over these runs (W processes on this machine's 2 cores), odb's hops",
                 "own_cores_log_hops": "each rank on its own cores: W = 2's raw hop + the link's delay, the "
                                       "link's rate; odb's log all-gathers (ceil(log2 n) hops each)",
                 "own_cores_ring": "as above through Gloo's rings (n - 1 hops each; odb before)"}
        for key, sc in e["scenarios"].items():
            per_hop = (f"{sc['hop_us']:.0f} us" if "hop_us" in sc else
                       f"c1 {result['model']['c1_us_per_hop']:.0f} us")
            lines.append(f"| {names[key]} | {sc['hops']} | {per_hop} | {sc['raw_ms']:.1f} ms | {sc['round_ms']:.1f} ms | "
                         f"{100 * sc['per_step'].get('gpu_7b_h100', float('nan')):.1f}% | "
                         f"{100 * sc['per_planned_step'].get('gpu_7b_h100', float('nan')):.2f}% | "
                         + (f"{sc['hop_us_for_5pct_per_planned_step']:.0f} us |"
                            if "hop_us_for_5pct_per_planned_step" in sc else " |"))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
