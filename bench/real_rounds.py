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
a raw all-gather has W - 1 hops and so has a daemon round (its peer group's
all-gather is one fixed-slot gloo::allgather while the messages fit the slot
sized from the previous round: src/align/gloo_peer_group.cc).
For each W (default 2, 4, 8, 16, 32) the W daemons run one epoch of tiny
synthetic samples (real Gloo rendezvous and all-gathers, real payload exchange
of the global planner, producers and verifying consumers from odb_synth); every
daemon's odb_round_p50_microseconds (its median round, the last 256 rounds) is
read from its metrics endpoint. Then, in the same namespaces over the same
links, W processes of bench/real_rounds_gloo run a raw fixed-size
gloo::allgather of the bytes one rank's round message has (the codec size of
2 x window pending samples: the most a rank offers) and of 64 KiB (to fit the
bandwidth term).

The model, least squares over the runs:
    raw all-gather  T = alpha (W - 1) + beta (W - 1) m           (ring: W - 1 hops)
    daemon round    T = c0 + c1 (W - 1) + beta (W - 1) m          (beta from the raw fit)
(with the delay in the model: alpha + d and c1 + 2 d per hop), and the round
at --target-world (2560) is c0 + c1 (W - 1) + beta (W - 1) m_prod
plus the planner and decode CPU of one round at that W from
bench/results/scale.json (production window, real planner, whole plan), with
m_prod that file's bytes per rank. The round's cost is then a fraction of one
step of each GPU-shaped model of bench/step_models.yaml (a full 4096-token
step), once per step (a round on every step's critical path) and per planned
step. Writes real_rounds.json and real_rounds.md under --out.
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
# Ring collectives per daemon round: the aligner's one AllGather is one
# gloo::allgather (an overflow of the slot adds an allgatherv, not in steady state).
COLLECTIVES_PER_ROUND = 1


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


def codec_bytes(gloo_bin: str, samples: int, max_tokens: int) -> int:
    out = subprocess.run([gloo_bin, "codec", "--samples", str(samples), "--max-tokens", str(max_tokens)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["bytes"]


def daemon_rounds(hosts, world: int, args, run_dir: pathlib.Path) -> dict:
    job = f"rr-{uuid.uuid4().hex[:8]}"
    daemons, consumers, producers = [], [], []
    try:
        for rank, (ns, addr) in enumerate(hosts):
            config = (f"local_world_size: 1\nalignment: {{gloo_hostname: {addr}, planner: global}}\n"
                      f"grouping: {{window: {args.window}, max_tokens: {args.max_tokens}}}\n"
                      f"emit: {{queue_steps: {args.queue_steps}}}\n"
                      'metrics_endpoint: "tcp://127.0.0.1:*"\n')
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
                 "odb_exchange_bytes_sent_total"]
        per_rank = [scrape(ns, d, names) for (ns, _), d in zip(hosts, daemons)]
    finally:
        for proc in producers + consumers:  # only left running when something above failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for d in daemons:
            d.stop()
    p50 = [r["odb_round_p50_microseconds"] for r in per_rank]
    return {
        "round_p50_us_max": max(p50),
        "round_p50_us_median": float(np.median(p50)),
        "round_p50_us_min": min(p50),
        "round_p99_us_max": max(r["odb_round_p99_microseconds"] for r in per_rank),
        "rounds": int(min(r["odb_rounds_total"] for r in per_rank)),
        "exchange_bytes_sent": int(sum(r["odb_exchange_bytes_sent_total"] for r in per_rank)),
        "samples_trained": emitted,
    }


def raw_gather(hosts, world: int, sizes: list[int], args, store: pathlib.Path) -> dict:
    store.mkdir(parents=True, exist_ok=True)
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, args.gloo_bin, "gather", "--rank", str(r), "--world",
                               str(world), "--store", str(store), "--hostname", addr, "--bytes",
                               ",".join(map(str, sizes)), "--iters", str(args.iters)],
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
        for variant in ("allgather", "sizes+allgatherv"):
            p50 = [row["p50_us"] for row in rows if row["bytes"] == size and row["variant"] == variant]
            if len(p50) != world:
                raise RuntimeError(f"real_rounds_gloo: {len(p50)} of {world} ranks reported {variant} of {size} B")
            result[(size, variant)] = {"p50_us_max": max(p50), "p50_us_median": float(np.median(p50))}
    return result


def step_seconds(model: dict, tokens: int = 4096) -> float:
    """A full step of one `tokens`-long sample: a + max(m, b (p + k)) + c s^2 (bench/step_models.yaml)."""
    return model["a"] + max(model.get("m", 0.0), model["b"] * (tokens + model.get("k", 0.0))) + model["c"] * tokens ** 2


def fit(rows: list[dict], big: int, model_delay_us: float) -> dict:
    # Raw Gloo: every (W, size) point, T = alpha (W-1) + beta (W-1) m.
    xs, ys = [], []
    for r in rows:
        for size, m in (("msg", r["msg_bytes"]), ("big", big)):
            xs.append([r["world"] - 1, (r["world"] - 1) * m])
            ys.append(r["raw_p50_us"][size])
    (alpha, beta), *_ = np.linalg.lstsq(np.array(xs, float), np.array(ys, float), rcond=None)
    # Daemon rounds: the bandwidth term from the raw fit, c0 + c1 (W-1) fitted.
    xd = np.array([[1.0, r["world"] - 1] for r in rows])
    yd = np.array([r["round_p50_us_median"] - beta * (r["world"] - 1) * r["msg_bytes"] for r in rows])
    (c0, c1), *_ = np.linalg.lstsq(xd, yd, rcond=None)
    resid = [r["round_p50_us_median"] - (c0 + c1 * (r["world"] - 1) + beta * (r["world"] - 1) * r["msg_bytes"])
             for r in rows]
    # A delay not on the link: one one-way delay per hop of each ring collective.
    return {"alpha_us_per_hop": float(alpha) + model_delay_us, "beta_us_per_byte_hop": float(beta),
            "implied_gbit_s": float(8e-3 / beta) if beta > 0 else None,
            "c0_us": float(c0), "c1_us_per_hop": float(c1) + COLLECTIVES_PER_ROUND * model_delay_us,
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
    # 1. The fit over this machine's runs, as it is: its per-hop terms carry W processes time-sharing 2 cores.
    scenarios["fit_here"] = {
        "round_comm_ms": (model["c0_us"] + model["c1_us_per_hop"] * w1 + model["beta_us_per_byte_hop"] * w1 * m_prod) / 1e3,
        "raw_ms": (model["alpha_us_per_hop"] * w1 + model["beta_us_per_byte_hop"] * w1 * m_prod) / 1e3}
    if two is not None:
        # 2. Each rank on its own cores (a real node): the per-hop software cost of W = 2 (two processes,
        # two cores), the link's delay and rate per hop, the daemon's fixed cost at W = 2 beyond its hops.
        hop = two["raw_p50_us"]["msg"] + model_delay
        fixed = two["round_p50_us_median"] - COLLECTIVES_PER_ROUND * two["raw_p50_us"]["msg"]
        scenarios["own_cores_ring"] = {
            "round_comm_ms": (fixed + COLLECTIVES_PER_ROUND * w1 * hop + w1 * m_prod * link_us_per_byte) / 1e3,
            "raw_ms": (w1 * hop + w1 * m_prod * link_us_per_byte) / 1e3,
            "hop_us": hop, "fixed_us": fixed}
        # 3. Not odb today: the same with a logarithmic all-gather (recursive doubling, ceil(log2 W) hops).
        hops = int(np.ceil(np.log2(target)))
        scenarios["own_cores_log_hops"] = {
            "round_comm_ms": (fixed + COLLECTIVES_PER_ROUND * hops * hop + w1 * m_prod * link_us_per_byte) / 1e3,
            "raw_ms": (hops * hop + w1 * m_prod * link_us_per_byte) / 1e3, "hops": hops}
    models = yaml.safe_load((ROOT / "bench/step_models.yaml").read_text())
    step_ms = {name: 1e3 * step_seconds(models[name]) for name in GPU_MODELS if name in models}
    for sc in scenarios.values():
        sc["round_ms"] = sc["round_comm_ms"] + cpu_ms
        sc["per_step"] = {name: sc["round_ms"] / ms for name, ms in step_ms.items()}
        sc["per_planned_step"] = {name: sc["round_ms"] / steps_per_round / ms for name, ms in step_ms.items()}
    return {"world": target, "msg_bytes": m_prod, "planner_decode_cpu_ms": cpu_ms,
            "steps_per_round": steps_per_round, "step_ms": step_ms, "scenarios": scenarios}


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
    ap.add_argument("--big-bytes", type=int, default=65536)
    ap.add_argument("--target-world", type=int, default=2560)
    ap.add_argument("--scale-json", default=str(ROOT / "bench/results/scale.json"))
    ap.add_argument("--gloo-bin", help="default: $(bazel info -c opt bazel-bin)/bench/real_rounds_gloo")
    ap.add_argument("--prefix", default="odbrr")
    ap.add_argument("--subnet", default="10.219.3")
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    args = ap.parse_args()
    odbtest.require_built()
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
        t0 = time.monotonic()
        work = pathlib.Path(tempfile.mkdtemp(prefix=f"rr{world}-", dir="/tmp"))
        try:
            with odbtest.bridged_hosts(args.prefix, world, args.subnet, link_delay, args.rate_gbit * 1000) as hosts:
                row = {"world": world, "msg_bytes": msg_bytes}
                row.update(daemon_rounds(hosts, world, args, work / "run"))
                raw = raw_gather(hosts, world, [msg_bytes, args.big_bytes], args, work / "store")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        # Median over ranks of each rank's median, for the daemons and the raw collectives alike.
        row["raw_p50_us"] = {"msg": raw[(msg_bytes, "allgather")]["p50_us_median"],
                             "big": raw[(args.big_bytes, "allgather")]["p50_us_median"],
                             "msg_sizes_allgatherv": raw[(msg_bytes, "sizes+allgatherv")]["p50_us_median"],
                             "big_sizes_allgatherv": raw[(args.big_bytes, "sizes+allgatherv")]["p50_us_median"],
                             "msg_max_over_ranks": raw[(msg_bytes, "allgather")]["p50_us_max"]}
        row["round_over_raw"] = row["round_p50_us_median"] / row["raw_p50_us"]["msg"]
        # The round against the two collectives the peer group ran before (kept as a reference point).
        row["round_over_sizes_allgatherv"] = row["round_p50_us_median"] / row["raw_p50_us"]["msg_sizes_allgatherv"]
        # With the delay in the model, the same ratio once each hop has waited for it.
        hops = world - 1
        row["round_over_raw_with_delay"] = ((row["round_p50_us_median"] + COLLECTIVES_PER_ROUND * hops * model_delay)
                                            / (row["raw_p50_us"]["msg"] + hops * model_delay))
        row["wall_s"] = round(time.monotonic() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)

    model = fit(rows, args.big_bytes, model_delay) if len(rows) >= 2 else None
    result = {"command": " ".join(["bench/real_rounds.py"] + sys.argv[1:]),
              "link": {"one_way_delay_us": args.delay_us, "rate_gbit_s": args.rate_gbit, "delay": mode,
                       "rate_qdisc": ("netem" if mode == "netem" else "tbf") if args.rate_gbit > 0 else None,
                       "tbf_burst_bytes": odbtest.tbf_burst_bytes(args.rate_gbit * 1000)
                       if mode == "model" and args.rate_gbit > 0 else None},
              "workload": {"samples_per_rank": args.samples, "max_len": args.max_len, "window": args.window,
                           "max_tokens": args.max_tokens, "queue_steps": args.queue_steps, "msg_bytes": msg_bytes, "big_bytes": args.big_bytes},
              "rows": rows, "model": model}
    if model is not None:
        result["extrapolation"] = extrapolate(rows, model, args, model_delay)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "real_rounds.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "real_rounds.md").write_text(render(result))
    print(render(result))
    return 0


def render(result: dict) -> str:
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
             "Each figure is the median over ranks of each rank's median (daemons: odb_round_p50_microseconds).", "",
             "| W | rounds | daemon round | (slowest rank) | raw all-gather, msg | sizes + allgatherv, msg | raw, "
             f"{w['big_bytes']} B | round / raw | with the delay | round / (sizes + allgatherv) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['world']} | {r['rounds']} | {r['round_p50_us_median'] / 1e3:.2f} ms | "
                     f"{r['round_p50_us_max'] / 1e3:.2f} ms | {r['raw_p50_us']['msg'] / 1e3:.2f} ms | "
                     f"{r['raw_p50_us']['msg_sizes_allgatherv'] / 1e3:.2f} ms | "
                     f"{r['raw_p50_us']['big'] / 1e3:.2f} ms | {r['round_over_raw']:.2f} | {r['round_over_raw_with_delay']:.2f} | "
                     f"{r['round_over_sizes_allgatherv']:.2f} |")
    m = result.get("model")
    if m:
        lines += ["", "Model (least squares): raw T = alpha (W-1) + beta (W-1) m; round T = c0 + c1 (W-1) + beta (W-1) m.",
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
                 "own_cores_ring": "each rank on its own cores: W = 2's hop, the link's delay and rate, ring",
                 "own_cores_log_hops": "as above with a logarithmic all-gather (not odb today)"}
        lines += ["", f"Extrapolated to W = {e['world']}: message {e['msg_bytes']:.0f} B per rank and planner + "
                  f"decode CPU {e['planner_decode_cpu_ms']:.0f} ms per round of {e['steps_per_round']:g} planned "
                  "steps (bench/results/scale.json, whole plan, production window); step = a full 4096-token step "
                  "(" + ", ".join(f"`{n}` {ms:.0f} ms" for n, ms in e["step_ms"].items()) + ").", "",
                  "| assumption | raw all-gather | round | round / `gpu_7b_h100` step | per planned step |",
                  "|---|---|---|---|---|"]
        for key, sc in e["scenarios"].items():
            lines.append(f"| {names[key]} | {sc['raw_ms']:.1f} ms | {sc['round_ms']:.1f} ms | "
                         f"{100 * sc['per_step'].get('gpu_7b_h100', float('nan')):.1f}% | "
                         f"{100 * sc['per_planned_step'].get('gpu_7b_h100', float('nan')):.2f}% |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
