#!/usr/bin/python3
"""Data-plane benchmark: producer -> odbd -> consumer against a raw ZMQ pair.

For each payload size (1 KiB, 64 KiB, 1 MiB) in one run:
  * odb: one `odbd` (rank 0 of 1, ipc:// sockets in a fresh run dir), one
    `odb_synth produce --payload-bytes P` (payloads are windows of one
    precomputed pattern: no per-sample generation) and one `odb_synth consume`
    (which collates nothing itself; it checks every token of every sample and
    the first and last 64 bytes of every payload, `--verify-payload edges`, so
    the tools' own cost stays small next to the daemon's). Time = from
    launching the producer to the consumer's end-of-epoch line.
  * raw: `zmq_raw_bench`, a PUSH/PULL pair over ipc:// moving the same number
    of P-byte messages (no header, no batching, no verification).
Then daemon memory per buffered sample: a fresh odbd, no trainer connected,
N samples pushed with --no-end; VmRSS of the daemon before and after, divided
by N, next to the bytes each sample carries.

    /usr/bin/python3 bench/dataplane.py --bin "$(bazel info -c opt bazel-bin)" --out bench/results [--quick]
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

SIZES = [1024, 65536, 1048576]
# (full, quick) sample counts per payload size; runs of >= ~1 s so that process
# start-up (measured separately, see `startup`) is a small part.
COUNTS = {1024: (100000, 20000), 65536: (10000, 3000), 1048576: (1000, 300)}
MAX_LEN = 64  # tokens per sample (int64): a small input_ids tensor next to the payload


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


def odb_run(bindir, tmp, payload, count):
    d = Odbd(f"{bindir}/src/daemon/odbd", f"{tmp}/odb-{payload}",
             "grouping: {max_tokens: 4096, window: 256}\nbuffer: {max_bytes: 2147483648, max_samples: 100000}\n")
    synth = f"{bindir}/client/cpp/odb_synth"
    try:
        consumer = subprocess.Popen([synth, "consume", "--endpoint", d.trainer, "--expected-producers", "1",
                                     "--max-tokens", "4096", "--timeout-ms", "120000",
                                     "--verify-payload", "edges"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)  # the consumer has said StartEpoch before the first sample is sent
        t0 = time.perf_counter()
        producer = subprocess.run([synth, "produce", "--endpoint", d.ingest, "--producer-id", "p0", "--count",
                                   str(count), "--max-len", str(MAX_LEN), "--payload-bytes", str(payload)],
                                  capture_output=True, text=True, timeout=300)
        out, err = consumer.communicate(timeout=300)
        secs = time.perf_counter() - t0
        if producer.returncode != 0 or consumer.returncode != 0:
            raise RuntimeError(f"odb run failed: producer {producer.stderr} consumer {err}")
        summary = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
        if summary["unique_ids"] != count or summary["failures"] != 0:
            raise RuntimeError(f"odb run lost samples or failed checks: {summary}")
        return {"seconds": secs, "samples_per_s": count / secs, "mb_per_s": count * payload / secs / 1e6,
                "steps": summary["steps"], "consumer_seconds": summary["seconds"]}
    finally:
        d.stop()


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
                        "--payload-bytes", str(payload), "--no-end"], check=True, timeout=300, capture_output=True)
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
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="odb-dp-", dir="/tmp")
    rows, mem = [], []
    try:
        # Fixed cost of an odb run (producer process start, hello, end of stream,
        # epoch end) from a 1-sample epoch; the corrected rate subtracts it.
        startup = min(odb_run(args.bin, tmp, 1024, 1)["seconds"] for _ in range(3))
        print(json.dumps({"startup_seconds": startup}), flush=True)
        for payload in SIZES:
            count = COUNTS[payload][1 if args.quick else 0]
            raw = raw_run(args.bin, tmp, payload, count)
            odb = odb_run(args.bin, tmp, payload, count)
            odb["samples_per_s_startup_corrected"] = count / max(odb["seconds"] - startup, 1e-9)
            rows.append({"payload_bytes": payload, "samples": count, "odb": odb, "raw": raw,
                         "ratio": odb["samples_per_s"] / raw["samples_per_s"]})
            print(json.dumps(rows[-1]), flush=True)
        for payload, count in ((1024, 5000 if args.quick else 20000), (65536, 500 if args.quick else 2000)):
            mem.append(memory_run(args.bin, tmp, payload, count))
            print(json.dumps(mem[-1]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (out / "dataplane.json").write_text(json.dumps({"startup_seconds": startup, "throughput": rows,
                                                    "memory": mem}, indent=1))
    lines = [f"odb start-up cost (1-sample epoch, subtracted in the corrected column): {startup * 1000:.0f} ms", "",
             "| payload | samples | odb samples/s | odb MB/s | odb samples/s (start-up corrected) | "
             "raw ZMQ samples/s | raw ZMQ MB/s | odb / raw | corrected odb / raw |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['payload_bytes']} B | {r['samples']} | {r['odb']['samples_per_s']:.0f} | "
                     f"{r['odb']['mb_per_s']:.1f} | {r['odb']['samples_per_s_startup_corrected']:.0f} | "
                     f"{r['raw']['samples_per_s']:.0f} | {r['raw']['mb_per_s']:.1f} | {r['ratio']:.2f} | "
                     f"{r['odb']['samples_per_s_startup_corrected'] / r['raw']['samples_per_s']:.2f} |")
    lines += ["", "| payload + tokens per sample | samples buffered | RSS growth per sample | overhead per sample |",
              "|---|---|---|---|"]
    for m in mem:
        lines.append(f"| {m['payload_bytes']} B | {m['samples']} | {m['bytes_per_sample']:.0f} B | "
                     f"{m['overhead_bytes']:.0f} B |")
    (out / "dataplane.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
