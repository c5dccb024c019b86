"""End-of-epoch report: PNG plots from the step records an OdbDataLoader
writes with ``summary_dir=...`` (one JSON line per step and rank).

    odb.report("/path/to/summary_dir")   # -> the PNG paths, next to the records

Plots, per epoch: the per-step cost of the ranks (padded tokens: the most
loaded rank against the mean — the time every rank waits for), padding per
step, IDLE steps per rank, and the histogram of sample lengths; the title
names the rank whose trainer waited longest on data (``wait_ms``: its time in
next(loader), a data stall). Needs
matplotlib (Debian: python3-matplotlib), not torch.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Union


def load_records(summary_dir: Union[str, Path]) -> Dict[int, List[dict]]:
    """Every step record of the directory, by epoch."""
    by_epoch: Dict[int, List[dict]] = defaultdict(list)
    for path in sorted(Path(summary_dir).glob("rank*-epoch*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                by_epoch[int(record["epoch"])].append(record)
    return dict(by_epoch)


def data_wait_by_rank(steps: List[dict]) -> Dict[int, float]:
    """Seconds each rank's trainer spent in next(loader) waiting for steps (records without
    ``wait_ms``, such as the steps a joined rank drains, count 0)."""
    waits: Dict[int, float] = defaultdict(float)
    for r in steps:
        waits[int(r["rank"])] += float(r.get("wait_ms", 0.0)) / 1000.0
    return dict(waits)


def report(summary_dir: Union[str, Path], out_dir: Union[str, Path, None] = None) -> List[Path]:
    """Writes one PNG per epoch found in `summary_dir` (into `out_dir`, default
    the same directory) and returns their paths; raises FileNotFoundError when
    the directory holds no step records."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = load_records(summary_dir)
    if not records:
        raise FileNotFoundError(f"no step records (rank*-epoch*.jsonl) in {summary_dir}: pass "
                                f"summary_dir=... to OdbDataLoader")
    out = Path(out_dir) if out_dir is not None else Path(summary_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for epoch, steps in sorted(records.items()):
        ranks = sorted({r["rank"] for r in steps})
        cost: Dict[int, Dict[int, int]] = defaultdict(dict)  # step -> rank -> padded tokens
        real: Dict[int, int] = defaultdict(int)
        padded: Dict[int, int] = defaultdict(int)
        idle = {rank: 0 for rank in ranks}
        lengths: List[int] = []
        for r in steps:
            cost[r["step"]][r["rank"]] = r["padded"]
            real[r["step"]] += r["real"]
            padded[r["step"]] += r["padded"]
            idle[r["rank"]] += int(r["idle"])
            lengths += r["lengths"]
        order = sorted(cost)
        worst = [max(cost[s].get(rank, 0) for rank in ranks) for s in order]
        mean = [sum(cost[s].get(rank, 0) for rank in ranks) / len(ranks) for s in order]
        pad = [100.0 * (1 - real[s] / padded[s]) if padded[s] else 0.0 for s in order]
        fig, ax = plt.subplots(2, 2, figsize=(12, 8))
        ax[0][0].plot(order, worst, label="max over ranks")
        ax[0][0].plot(order, mean, label="mean of ranks")
        ratio = sum(worst) / sum(mean) if sum(mean) else 1.0
        ax[0][0].set(title=f"per-step rank cost (padded tokens); sum max/mean {ratio:.3f}", xlabel="step")
        ax[0][0].legend()
        ax[0][1].plot(order, pad)
        ax[0][1].set(title="padding per step (%)", xlabel="step")
        ax[1][0].bar([str(r) for r in ranks], [idle[r] for r in ranks])
        ax[1][0].set(title="IDLE steps per rank", xlabel="rank")
        ax[1][1].hist(lengths, bins=40)
        ax[1][1].set(title=f"sample lengths ({len(lengths)} samples)", xlabel="tokens")
        waits = data_wait_by_rank(steps)
        stalled = max(waits, key=lambda k: waits[k]) if waits else None
        stall = f"; longest data wait: rank {stalled} ({waits[stalled]:.1f} s)" if stalled is not None else ""
        fig.suptitle(f"odb epoch {epoch}: {len(order)} steps, {len(ranks)} rank(s){stall}")
        fig.tight_layout()
        path = out / f"odb-epoch{epoch}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written
