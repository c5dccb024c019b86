#!/usr/bin/python3
"""Fits the simulator's step-time model to a real CPU measurement.

Times forward+backward of a tiny PyTorch transformer (1 layer, d_model 64,
4 heads, feed-forward 256, padded batches, one thread; the fastest of
--reps runs per shape, since the machine is shared) at a few (batch, length) shapes and fits

    step_seconds = a + b * padded_tokens + c * sum(len^2)

by least squares on the relative error (non-negative: a coefficient that comes out negative is
dropped and the rest refitted). With --write the fit replaces the
`cpu_calibrated` entry of bench/step_models.yaml.

    /usr/bin/python3 bench/calibrate_cpu.py --write
"""
import argparse
import datetime
import itertools
import pathlib
import re
import time

import numpy as np
import torch

SHAPES = [(1, 32), (8, 32), (32, 32), (1, 128), (8, 128), (1, 256), (4, 256), (1, 512), (2, 512),
          (1, 1024), (1, 2048)]


def time_shape(model, head, batch, length, reps):
    x = torch.randn(batch, length, 64)
    times = []
    for _ in range(reps + 1):  # the first run warms up the allocator
        t0 = time.perf_counter()
        out = head(model(x))
        out.float().pow(2).mean().backward()
        times.append(time.perf_counter() - t0)
    return min(times[1:])


def fit(rows):
    """rows: (seconds, padded_tokens, sum_len_sq). Non-negative least squares on the
    relative error (each row divided by its time, so small shapes count as much as
    large ones), by elimination of negative coefficients."""
    y = np.ones(len(rows))
    feats = np.array([[1.0 / r[0], r[1] / r[0], r[2] / r[0]] for r in rows])
    active = [0, 1, 2]
    while True:
        coef, *_ = np.linalg.lstsq(feats[:, active], y, rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            full = [0.0, 0.0, 0.0]
            for i, c in zip(active, coef):
                full[i] = max(float(c), 0.0)
            return full
        active.pop(int(np.argmin(coef)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="update bench/step_models.yaml")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the machine is shared; one thread is the stable measurement
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=256, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=1)
    head = torch.nn.Linear(64, 64)
    rows = []
    for batch, length in SHAPES:
        secs = time_shape(model, head, batch, length, args.reps)
        rows.append((secs, batch * length, batch * length * length))
        print(f"batch={batch:3d} len={length:5d} padded={batch * length:6d} seconds={secs:.5f}", flush=True)
    a, b, c = fit(rows)
    worst = max(abs(a + b * p + c * q - s) / s for s, p, q in rows)
    print(f"fit: a={a:.6g} b={b:.6g} c={c:.6g} (worst relative error {worst:.1%})")
    if args.write:
        path = pathlib.Path(__file__).resolve().parent / "step_models.yaml"
        text = path.read_text()
        stamp = datetime.date.today().isoformat()
        block = (f"cpu_calibrated:\n"
                 f"  # Fitted {stamp} by: /usr/bin/python3 bench/calibrate_cpu.py --write\n"
                 f"  # (1-layer d=64 transformer fwd+bwd, 1 thread; worst relative fit error {worst:.1%})\n"
                 f"  a: {a:.6g}\n  b: {b:.6g}\n  c: {c:.6g}\n")
        text = re.sub(r"cpu_calibrated:\n(?:  .*\n)*", block, text)
        path.write_text(text)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
