#!/usr/bin/env python3
"""What fixing glibc's thresholds (examples/multimodal_train.py --malloc fixed) costs in compute.

One process per try (mallopt is per process), one thread, the example's model at its defaults, the
same micro-batches (the workload's first --samples samples, --batch per micro-batch, packed text as
Standard packed runs it), forward + backward + AdamW step per batch; reported per try: the thread CPU
time of the steps (time.thread_time: page faults are the thread's system time) and the largest step's
VmHWM above its start. Tries alternate fixed / dynamic so load drifts hit both alike.

  /usr/bin/python3 bench/multimodal_malloc_cost.py [--tries 3] [--samples 96] [--batch 8]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time
import torch
sys.path.insert(0, sys.argv[1])
import multimodal_data as mmd
import multimodal_train as mt
mode, samples, batch = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
if mode == "fixed":
    assert mt.fix_malloc_thresholds()
specs = mmd.prepare(samples, seed=0)
ds = mmd.MixedModalDataset(specs)
batches = [mt.packed_collate([ds[i] for i in range(k, min(samples, k + batch))]) for k in range(0, samples, batch)]
if "cu_seqlens" in batches[0]:
    for b in batches:
        b["segments"] = mt.counts_from_offsets(b["cu_seqlens"])
torch.manual_seed(0)
model = mt.MLLM()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
params = mt.param_storages(model)
cpu = torch.device("cpu")
mt.run_step(model, batches[0], mt.PhaseClock(params), cpu, 1e-3)  # first-run costs out of the timing
opt.step(); opt.zero_grad(set_to_none=True)
t, peak = 0.0, 0
for b in batches:
    start = mt.step_interval()
    t0 = time.thread_time()
    mt.run_step(model, b, mt.PhaseClock(params), cpu, 1e-3)
    opt.step(); opt.zero_grad(set_to_none=True)
    t += time.thread_time() - t0
    peak = max(peak, mt.step_memory_kb(start))
print(json.dumps({"mode": mode, "thread_s": t, "peak_mib": peak / 1024}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tries", type=int, default=3)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args()
    rows = []
    for _ in range(a.tries):
        for mode in ("fixed", "dynamic"):
            out = subprocess.run([sys.executable, "-c", CHILD, str(HERE.parent / "examples"), mode, str(a.samples),
                                  str(a.batch)], check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(f"{mode:8s} thread CPU {rows[-1]['thread_s']:7.3f} s  largest step {rows[-1]['peak_mib']:6.1f} MiB",
                  flush=True)
    for mode in ("fixed", "dynamic"):
        ts = sorted(r["thread_s"] for r in rows if r["mode"] == mode)
        print(f"{mode:8s} median thread CPU {ts[len(ts) // 2]:.3f} s (range {ts[0]:.3f}-{ts[-1]:.3f})")
    fixed = sorted(r["thread_s"] for r in rows if r["mode"] == "fixed")
    dynamic = sorted(r["thread_s"] for r in rows if r["mode"] == "dynamic")
    print(f"fixed / dynamic (medians): {fixed[len(fixed) // 2] / dynamic[len(dynamic) // 2]:.3f}")


if __name__ == "__main__":
    main()
