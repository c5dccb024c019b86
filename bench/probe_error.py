#!/usr/bin/python3
"""Error of OdbDataLoader.loss_tokens_per_epoch()'s estimate before the first epoch (a fixed probe of
`probe` samples x the epoch's sample count) on 30 corpora like the main job's (3200 long-tail samples,
max 256 tokens), for three probe sizes. No daemon: the probe only reads the dataset.
docs/python.md, "Schedules and budgets", quotes it: /usr/bin/python3 bench/probe_error.py"""
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "client/python"), str(ROOT / "examples")]
import odb  # noqa: E402
import tiny_lm  # noqa: E402

for probe in (64, 256, 1024):
    errs = []
    for seed in range(30):
        lengths = tiny_lm.long_tail_lengths(3200, seed=seed, max_len=256)
        ds = tiny_lm.SyntheticCorpus(lengths, vocab=256)
        loader = odb.OdbDataLoader(ds, rank=0, world_size=2, ingest_endpoint="ipc:///x", trainer_endpoint="ipc:///x")
        est, exact = loader.loss_tokens_per_epoch(probe=probe)
        errs.append(est / sum(lengths) - 1)
    print(f"probe {probe}: relative error of the epoch's loss tokens over 30 corpora of 3200 long-tail samples: "
          f"mean {statistics.mean(errs)*100:+.2f}%, sd {statistics.pstdev(errs)*100:.2f}%, max |err| {max(map(abs, errs))*100:.2f}%")
