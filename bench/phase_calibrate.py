"""Fits the per-phase cost models of examples/multimodal_train.py's model from measured times.

One process, one thread (torch.set_num_threads(1)): forward + backward of the model on micro-batches
of the workload (random sizes of 1..2*--batch samples, text packed), each phase timed as thread CPU
time; then multimodal_train.fit_phase_costs (non-negative least squares of a step's time on
[1, items, sum(units), sum(units^2)]). Prints each phase's `per_step,per_item,per_unit,per_unit_sq`
(bench/phase_sim's --vision-cost / --audio-cost / --llm-cost) and the daemon's
alignment.vision_cost / audio_cost (per_item as per_sample).

Run: /usr/bin/python3 bench/phase_calibrate.py --samples 320
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import multimodal_data as mmd  # noqa: E402
import multimodal_train as mt  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=320)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    defaults = mt.parse_args([])
    ds = mmd.MixedModalDataset(mmd.prepare(args.samples, seed=args.seed))
    torch.manual_seed(args.seed)
    model = mt.MLLM(d=defaults.d_model, layers=defaults.layers, vision_width=defaults.vision_width,
                    audio_width=defaults.audio_width, enc_layers=defaults.enc_layers)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(ds))
    records, k = [], 0
    while k < len(order):
        n = int(rng.integers(1, 2 * args.batch + 1))
        batch = mt.packed_collate([ds[int(i)] for i in order[k:k + n]])
        k += n
        clock = mt.PhaseClock()
        _, _, items = mt.run_step(model, batch, clock, torch.device("cpu"), 1e-3)
        model.zero_grad(set_to_none=True)
        records.append({"t": clock.t, "items": items})
    fits = mt.fit_phase_costs({"results": {"calibration": [{"records": records}]}})
    out = {p: dict(zip(("per_step", "per_item", "per_unit", "per_unit_sq"), c)) for p, c in fits.items()}
    for phase, c in fits.items():
        print(f"--{phase}-cost " + ",".join(f"{v:.6g}" for v in c))
    print("alignment:")
    for phase in ("vision", "audio"):
        f = out[phase]
        print(f"  {phase}_cost: {{per_sample: {f['per_item']:.6g}, per_unit: {f['per_unit']:.6g}, "
              f"per_unit_sq: {f['per_unit_sq']:.6g}}}")
    if args.json:
        Path(args.json).write_text(json.dumps({"fits": out, "steps": len(records)}, indent=1))


if __name__ == "__main__":
    main()
