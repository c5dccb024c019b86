"""Peak memory of odbd (VmHWM, read from /proc from outside) over one epoch of N tiny samples whose
ids are a shuffled dataset's indices and whose seqs count up: what OdbDataLoader sends. The
exactly-once check keyed by seq keeps O(out of order), so the peak should not grow with N; keyed by
id (odb before it) it grew by ~20 bytes an id.

    /usr/bin/python3 bench/seq_memory.py [--odbd PATH] [--counts 200000 2000000] [--no-seq] [--max-samples 4096]

One daemon per count (a fresh process: its VmHWM is that epoch's peak), one producer
(odb_synth produce --shuffled-ids --seq), one verifying consumer. Prints one JSON line per count.
Not a test: the figures go to docs/architecture.md ("Memory bound")."""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]


def vm_hwm_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def run_one(odbd: str, synth: str, count: int, seq: bool, max_samples: int) -> dict:
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix="odbmem-"))
    config = run_dir / "odbd.yaml"
    # A small buffer: what it holds is bounded by the config, so what grows with N is the
    # per-epoch bookkeeping alone (with the default, a consumer that falls behind lets the
    # buffer fill to tens of thousands of samples, which varies run to run).
    config.write_text(f"buffer:\n  max_samples: {max_samples}\n")
    log = open(run_dir / "odbd.log", "w")
    d = subprocess.Popen([odbd, "--config", str(config), "--rank", "0", "--world-size", "1", "--run-dir",
                          str(run_dir), "--job-id", f"m-{uuid.uuid4().hex[:8]}", "--log-level", "warn"],
                         stdout=log, stderr=subprocess.STDOUT)
    ingest, trainer = f"ipc://{run_dir}/odb-0-in.sock", f"ipc://{run_dir}/odb-0-out.sock"
    deadline = time.time() + 30
    while not (pathlib.Path(ingest[6:]).exists() and pathlib.Path(trainer[6:]).exists()):
        if time.time() > deadline or d.poll() is not None:
            raise RuntimeError((run_dir / "odbd.log").read_text())
        time.sleep(0.05)
    try:
        idle = vm_hwm_kib(d.pid)
        start = time.time()
        c = subprocess.Popen([synth, "consume", "--endpoint", trainer, "--expected-producers", "1",
                              "--timeout-ms", "120000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        p = subprocess.run([synth, "produce", "--endpoint", ingest, "--producer-id", "p", "--count", str(count),
                            "--seed", "1", "--min-len", "1", "--max-len", "4", "--distribution", "uniform",
                            "--shuffled-ids"] + (["--seq"] if seq else []),
                           capture_output=True, text=True, timeout=1800)
        out, err = c.communicate(timeout=1800)
        if p.returncode != 0 or c.returncode != 0:
            raise RuntimeError(f"produce rc {p.returncode} {p.stderr}\nconsume rc {c.returncode} {err}")
        epoch = json.loads([line for line in out.splitlines() if line.startswith("{")][0])
        peak = vm_hwm_kib(d.pid)
        return {"count": count, "seq": seq, "odbd": odbd, "idle_vmhwm_mib": round(idle / 1024, 1),
                "peak_vmhwm_mib": round(peak / 1024, 1), "growth_mib": round((peak - idle) / 1024, 1),
                "emitted": epoch.get("summary_emitted"), "rejected": epoch.get("summary_rejected"),
                "seconds": round(time.time() - start, 1)}
    finally:
        d.terminate()
        d.wait(30)
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--odbd", default=str(ROOT / ".build/src/daemon/odbd"))
    ap.add_argument("--synth", default=str(ROOT / ".build/client/cpp/odb_synth"))
    ap.add_argument("--counts", type=int, nargs="+", default=[200_000, 2_000_000])
    ap.add_argument("--max-samples", type=int, default=4096, help="buffer.max_samples")
    ap.add_argument("--no-seq", action="store_true", help="send no seq: the id check (O(epoch) for shuffled ids)")
    a = ap.parse_args()
    for n in a.counts:
        print(json.dumps(run_one(a.odbd, a.synth, n, not a.no_seq, a.max_samples)), flush=True)


if __name__ == "__main__":
    main()
