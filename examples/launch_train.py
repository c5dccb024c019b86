"""A small DDP training script for `python -m odb.launch` (docs/python.md, README).

Each rank trains examples/tiny_lm.py's causal LM on synthetic long-tail
samples through odb.OdbDataLoader, which finds its daemon from $ODB_RUN_DIR
and $RANK (set by the launcher / torchrun), and prints one summary line.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tiny_lm

import torch
import torch.distributed as dist

import odb
import tiny_lm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--epochs", type=int, default=1)
    a = p.parse_args()
    dist.init_process_group("gloo")  # torchrun's env:// variables
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        tiny_lm.TinyCausalLM(vocab=64, d_model=32, layers=1, heads=2, max_len=a.max_len))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    lengths = tiny_lm.long_tail_lengths(a.samples, seed=1, min_len=4, max_len=a.max_len, median=24)
    loader = odb.OdbDataLoader(tiny_lm.SyntheticCorpus(lengths, vocab=64), shuffle=True, num_workers=1)
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        samples, loss = 0, float("nan")
        for step in loader:
            b = step.batch
            out = odb.weighted_cross_entropy(model(b["input_ids"], b["attention_mask"]), b["labels"],
                                             step.loss_weight, step.real_tokens)
            opt.zero_grad()
            out.backward()
            opt.step()
            samples += len(step.sample_ids)
            if not step.dummy:
                loss = out.item() / max(step.loss_weight, 1e-12)
        print(f"rank {dist.get_rank()} epoch {epoch}: {samples} samples, {loader.last_summary['steps']} steps, "
              f"last loss {loss:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":  # the DataLoader workers (forkserver) import this script again
    main()
