#!/usr/bin/python3
"""Data-plane benchmark: producer -> odbd -> consumer over both data planes, next to a raw ZMQ pair and memcpy.

For each payload size (1 KiB, 64 KiB, 1 MiB, 16 MiB) in one run:
  * odb-zmq: one `odbd` (rank 0 of 1, ipc:// sockets in a fresh run dir,
    `shm.trainer_data_plane: zmq`: steps go to the consumer as ZeroMQ frames), one
    `odb_synth produce --data-plane zmq --payload-bytes P` (payloads are
    windows of one precomputed pattern: no per-sample generation) and one
    `odb_synth consume` (which collates nothing itself; it checks every token
    of every sample and the first and last 64 bytes of every payload,
    `--verify-payload edges`, so the tools' own cost stays small next to the
    daemon's). Time = from launching the producer to the consumer's
    end-of-epoch line.
  * odb-shm: the same with `--data-plane shm` and the daemon's default
    `shm.trainer_data_plane: auto`: the producer writes each sample into its
    shared-memory arena (256 MiB memfd) and sends (offset, length)
    descriptors; the daemon collates from the mapped arena and places each
    step in the consumer's step arena (a memfd the consumer maps; only
    descriptors go over ZeroMQ; the consumer reads the tensors in place and
    returns the block): docs/shm.md. The consumer's JSON must say
    "data_plane": "shm" (and "zmq" for odb-zmq), or the run fails.
  * raw: `zmq_raw_bench`, a PUSH/PULL pair over ipc:// moving the same number
    of P-byte messages (no header, no batching, no verification).
  * memcpy: single-thread memcpy of P-byte blocks between two 256 MiB working
    sets, and the arena's own ceiling (a producer and a consumer process
    copying blocks through an arena, no daemon), both from `shm_bench`.
  * CPU per sample of the producer, the daemon and the consumer (user + system
    time of each process over the run, divided by the samples).
Each of raw, odb-zmq and odb-shm runs --repeat times (default 3, interleaved);
the median run is reported (every run's MB/s is in the JSON).
Then daemon memory per buffered sample: a fresh odbd, no trainer connected,
N samples pushed with --no-end (over ZeroMQ); VmRSS of the daemon before and
after, divided by N, next to the bytes each sample carries.

Writes bench/results/dataplane.{json,md,png} (the PNG when matplotlib is there).

    /usr/bin/python3 bench/dataplane.py --bin "$(bazel info -c opt bazel-bin)" --out bench/results [--quick] [--repeat N]
"""
import argparse
import json
import os
import pathlib
import resource
import shutil
import subprocess
import tempfile
import time

SIZES = [1024, 65536, 1048576, 16777216]
# (full, quick) sample counts per payload size; runs of >= ~1 s so that process
# start-up (measured separately, see `startup`) is a small part, and of ~4 GB
# from 64 KiB up, so that the first pass through fresh arena pages (a page
# fault and a page clear per 4 KiB on both sides: ~1 GB/s on a VM, against
# ~10 GB/s for memory already mapped) is a small part of the run, as it is of
# an epoch: a producer's 256 MiB arena and the step arena's working set are
# touched once, then reused (best fit, lowest address first).
COUNTS = {1024: (200000, 40000), 65536: (60000, 10000), 1048576: (4000, 600), 16777216: (256, 40)}
MAX_LEN = 64  # tokens per sample (int64): a small input_ids tensor next to the payload
PLANES = ("zmq", "shm")
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Odbd:
    def __init__(self, binary, run_dir, config):
        self.run_dir = pathlib.Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.run_dir / "odbd.yaml"
        cfg.write_text(config)
        self.log = open(self.run_dir / "odbd.log", "w")
        self.proc = subprocess.Popen(
            [binary, "--config", str(cfg), "--rank", "0", "--world-size", "1", "--run-dir", str(self.run_dir),
             "--job-id", f"bench-{os.getpid()}-{time.time_ns()}", "--log-level", "warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.ingest = f"ipc://{self.run_dir}/odb-0-in.sock"
        self.trainer = f"ipc://{self.run_dir}/odb-0-out.sock"
        deadline = time.time() + 30
        while not (self.run_dir / "odb-0-in.sock").exists() or not (self.run_dir / "odb-0-out.sock").exists():
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("odbd did not start: " + (self.run_dir / "odbd.log").read_text())
            time.sleep(0.05)

    def cpu_seconds(self):
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime

    def rss_bytes(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def config_for(payload, plane="zmq"):
    """The daemon's config for a payload size: steps of at most ~64 MiB (16 MiB samples: 4 per step, and a
    shorter output queue) so that queued steps stay within a few GiB. odb-zmq sends steps as frames; odb-shm
    through the step arena (the default, 1 GiB of address space: a full arena holds the planner back)."""
    group = 0 if payload <= (1 << 20) else max(1, (64 << 20) // payload)
    queue = 32 if payload <= (1 << 20) else 8
    trainer = "zmq" if plane == "zmq" else "auto"
    return (f"grouping: {{max_tokens: 4096, window: 256, max_group_size: {group}}}\n"
            f"buffer: {{max_bytes: 2147483648, max_samples: 100000}}\nemit: {{queue_steps: {queue}}}\n"
            f"shm: {{trainer_data_plane: {trainer}}}\n")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def odb_run(bindir, tmp, payload, count, plane="zmq"):
    d = Odbd(f"{bindir}/src/daemon/odbd", f"{tmp}/odb-{plane}-{payload}", config_for(payload, plane))
    synth = f"{bindir}/client/cpp/odb_synth"
    try:
        consumer = subprocess.Popen([synth, "consume", "--endpoint", d.trainer, "--expected-producers", "1",
                                     "--max-tokens", "4096", "--timeout-ms", "120000",
                                     "--verify-payload", "edges", "--data-plane", plane],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)  # the consumer has said StartEpoch before the first sample is sent
        daemon_cpu0, cpu0 = d.cpu_seconds(), children_cpu()
        t0 = time.perf_counter()
        producer = subprocess.run([synth, "produce", "--endpoint", d.ingest, "--producer-id", "p0", "--count",
                                   str(count), "--max-len", str(MAX_LEN), "--payload-bytes", str(payload),
                                   "--data-plane", plane],
                                  capture_output=True, text=True, timeout=600)
        cpu1 = children_cpu()
        out, err = consumer.communicate(timeout=600)
        secs = time.perf_counter() - t0
        cpu2, daemon_cpu = children_cpu(), d.cpu_seconds() - daemon_cpu0
        if producer.returncode != 0 or consumer.returncode != 0:
            raise RuntimeError(f"odb {plane} run failed: producer {producer.stderr} consumer {err}")
        summary = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
        if summary["unique_ids"] != count or summary["failures"] != 0:
            raise RuntimeError(f"odb {plane} run lost samples or failed checks: {summary}")
        if summary.get("data_plane") != plane:
            raise RuntimeError(f"odb {plane} run: the consumer received steps over {summary.get('data_plane')}")
        # The consumer ran (and started) before t0: its CPU is all of it, start-up included (small).
        return {"data_plane": plane, "seconds": secs, "samples_per_s": count / secs,
                "mb_per_s": count * payload / secs / 1e6, "steps": summary["steps"],
                "consumer_seconds": summary["seconds"],
                "cpu_us_per_sample": {"producer": (cpu1 - cpu0) / count * 1e6, "daemon": daemon_cpu / count * 1e6,
                                      "consumer": (cpu2 - cpu1) / count * 1e6}}
    finally:
        d.stop()


def median_run(runs):
    return sorted(runs, key=lambda r: r["samples_per_s"])[len(runs) // 2]


def shm_bench_run(bindir, payload, count):
    """memcpy and the arena's ceiling for P-byte blocks (bench/shm_bench, median of 3)."""
    if not os.path.exists(f"{bindir}/bench/shm_bench"):
        raise SystemExit(f"{bindir}/bench/shm_bench is not built: bazel build -c opt //bench:shm_bench")
    total_mib = max(64, min(1024, count * payload * 2 >> 20))
    out = subprocess.run([f"{bindir}/bench/shm_bench", "--sizes", str(payload), "--total-mib", str(total_mib),
                          "--repeat", "3", "--json"], capture_output=True, text=True, timeout=600, check=True).stdout
    row = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    return {"memcpy_mb_per_s": row["memcpy_gb_per_s"] * 1e3, "arena_copy_mb_per_s": row["shm_copy_gb_per_s"] * 1e3,
            "arena_zero_copy_mb_per_s": row["shm_zero_copy_gb_per_s"] * 1e3, "shm_bench": row}


def raw_run(bindir, tmp, payload, count):
    out = subprocess.run([f"{bindir}/bench/zmq_raw_bench", "--endpoint", f"ipc://{tmp}/raw-{payload}.sock",
                          "--payload-bytes", str(payload), "--count", str(count)],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return json.loads(out)


def memory_run(bindir, tmp, payload, count):
    d = Odbd(f"{bindir}/src/daemon/odbd", f"{tmp}/mem-{payload}",
             "buffer: {max_bytes: 4294967296, max_samples: 1000000}\ningest_hwm: 10\n")
    try:
        time.sleep(0.5)
        before = d.rss_bytes()
        subprocess.run([f"{bindir}/client/cpp/odb_synth", "produce", "--endpoint", d.ingest, "--producer-id", "m",
                        "--count", str(count), "--min-len", str(MAX_LEN), "--max-len", str(MAX_LEN),
                        "--payload-bytes", str(payload), "--no-end", "--data-plane", "zmq"], check=True, timeout=300, capture_output=True)
        # Wait until the daemon has read everything (RSS stops growing).
        last, stable = -1, 0
        while stable < 4:
            time.sleep(0.25)
            now = d.rss_bytes()
            stable = stable + 1 if now == last else 0
            last = now
        per_sample = (last - before) / count
        carried = payload + MAX_LEN * 8
        return {"samples": count, "rss_before": before, "rss_after": last, "bytes_per_sample": per_sample,
                "payload_bytes": carried, "overhead_bytes": per_sample - carried}
    finally:
        d.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True, help="bazel-bin of a -c opt build")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (the median is reported)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="payload sizes (bytes), comma-separated")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="odb-dp-", dir="/tmp")
    rows, mem = [], []
    try:
        # Fixed cost of an odb run (producer process start, hello, end of stream,
        # epoch end) from a 1-sample epoch; the corrected rate subtracts it.
        startup = min(odb_run(args.bin, tmp, 1024, 1)["seconds"] for _ in range(3))
        print(json.dumps({"startup_seconds": startup}), flush=True)
        for payload in sizes:
            count = COUNTS.get(payload, (max(100, (1 << 30) // payload), max(30, (1 << 28) // payload)))[
                1 if args.quick else 0]
            # Interleaved repeats, the median run of each (by time): load from other jobs hits all alike.
            trials = {"raw": [], "zmq": [], "shm": []}
            for _ in range(args.repeat):
                trials["raw"].append(raw_run(args.bin, tmp, payload, count))
                for plane in PLANES:
                    trials[plane].append(odb_run(args.bin, tmp, payload, count, plane))
            raw = median_run(trials["raw"])
            runs = {plane: median_run(trials[plane]) for plane in PLANES}
            for name, t in trials.items():
                (raw if name == "raw" else runs[name])["mb_per_s_all_runs"] = sorted(x["mb_per_s"] for x in t)
            for r in runs.values():
                r["samples_per_s_startup_corrected"] = count / max(r["seconds"] - startup, 1e-9)
            copy = shm_bench_run(args.bin, payload, count)
            rows.append({"payload_bytes": payload, "samples": count, "odb": runs["zmq"], "shm": runs["shm"],
                         "raw": raw, "memcpy": copy,
                         "ratio": runs["zmq"]["samples_per_s"] / raw["samples_per_s"],
                         "shm_ratio": runs["shm"]["samples_per_s"] / raw["samples_per_s"],
                         "shm_vs_memcpy": runs["shm"]["mb_per_s"] / copy["memcpy_mb_per_s"]})
            print(json.dumps(rows[-1]), flush=True)
        for payload, count in ((1024, 5000 if args.quick else 20000), (65536, 500 if args.quick else 2000)):
            mem.append(memory_run(args.bin, tmp, payload, count))
            print(json.dumps(mem[-1]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (out / "dataplane.json").write_text(json.dumps({"startup_seconds": startup, "throughput": rows,
                                                    "memory": mem}, indent=1))
    png = plot(rows, out / "dataplane.png")

    def size(b):
        return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"

    load = open("/proc/loadavg").read().split()[:3]
    lines = [f"odb start-up cost (1-sample epoch, subtracted in the corrected columns): {startup * 1000:.0f} ms; "
             f"median of {args.repeat} interleaved runs per cell; load average at the end {' '.join(load)} "
             f"on {os.cpu_count()} CPUs", "",
             "Throughput (MB/s of payload; odb-zmq: payload frames and steps over ZeroMQ, odb-shm: the producer's "
             "shared-memory arena in, the consumer's step arena out):", "",
             "| payload | samples | odb-zmq MB/s | odb-shm MB/s | raw ZMQ MB/s | memcpy MB/s | arena alone MB/s | "
             "zmq / raw | shm / raw | shm / memcpy | shm / raw (corrected) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        z, m, c = r["odb"], r["shm"], r["memcpy"]
        lines.append(f"| {size(r['payload_bytes'])} | {r['samples']} | {z['mb_per_s']:.0f} | {m['mb_per_s']:.0f} | "
                     f"{r['raw']['mb_per_s']:.0f} | {c['memcpy_mb_per_s']:.0f} | {c['arena_copy_mb_per_s']:.0f} | "
                     f"{r['ratio']:.2f} | {r['shm_ratio']:.2f} | {r['shm_vs_memcpy']:.2f} | "
                     f"{m['samples_per_s_startup_corrected'] / r['raw']['samples_per_s']:.2f} |")
    lines += ["", "Samples/s and CPU per sample (µs of user + system time: producer / daemon / consumer):", "",
              "| payload | odb-zmq samples/s | odb-zmq CPU µs | odb-shm samples/s | odb-shm CPU µs | raw ZMQ samples/s |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        z, m = r["odb"], r["shm"]

        def cpu(x):
            c = x["cpu_us_per_sample"]
            return f"{c['producer']:.1f} / {c['daemon']:.1f} / {c['consumer']:.1f}"

        lines.append(f"| {size(r['payload_bytes'])} | {z['samples_per_s']:.0f} | {cpu(z)} | {m['samples_per_s']:.0f} | "
                     f"{cpu(m)} | {r['raw']['samples_per_s']:.0f} |")
    lines += ["", "| payload + tokens per sample | samples buffered | RSS growth per sample | overhead per sample |",
              "|---|---|---|---|"]
    for m in mem:
        lines.append(f"| {m['payload_bytes']} B | {m['samples']} | {m['bytes_per_sample']:.0f} B | "
                     f"{m['overhead_bytes']:.0f} B |")
    if png:
        lines += ["", f"![throughput vs payload size]({png.name})"]
    (out / "dataplane.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(rows, path):
    """Throughput vs payload size, log-log; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no PNG", flush=True)
        return None
    sizes = [r["payload_bytes"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = [("odb-shm (producer arena + step arena)", [r["shm"]["mb_per_s"] for r in rows], "o-"),
              ("odb-zmq (frames both ways)", [r["odb"]["mb_per_s"] for r in rows], "s-"),
              ("raw ZeroMQ PUSH/PULL", [r["raw"]["mb_per_s"] for r in rows], "^--"),
              ("memcpy, one thread", [r["memcpy"]["memcpy_mb_per_s"] for r in rows], "k:"),
              ("arena alone, 2 processes (shm_bench)", [r["memcpy"]["arena_copy_mb_per_s"] for r in rows], "x:")]
    for label, ys, style in series:
        ax.plot(sizes, ys, style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB" for s in sizes])
    ax.set_xlabel("payload per sample")
    ax.set_ylabel("MB/s of payload")
    ax.set_title("producer -> odbd -> consumer, one host (bench/dataplane.py)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
