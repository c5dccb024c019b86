"""A live view of a running odb job, one row per rank, read from the daemons'
metrics endpoints (odbd's `metrics_endpoint`).

    python -m odb.top http://host0:9400 http://host1:9400 [--interval 2] [--once]

Columns: samples in / out / rejected, steps (idle), padding of the emitted
steps, buffered MiB, queued steps, payload MiB moved to other daemons (global
planner), alignment round time p50 / p99 (ms), the seconds the rank's trainer
waited for steps in next(loader) (reported on its credits; the line below the
table names the rank that waits most: its GPU is starved of data), and each
rank's real tokens against the mean of all ranks (max/mean below the table:
how even the work is). Needs no torch.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.request
from typing import Dict, List, Optional

_SERIES = re.compile(r'^(\w+)\{rank="(\d+)"\} (\S+)$')


def scrape(url: str, timeout: float = 5.0) -> Dict[str, float]:
    """One endpoint's series as {name: value} (Prometheus text format)."""
    if not url.startswith("http"):
        url = "http://" + url.replace("tcp://", "")
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    out: Dict[str, float] = {}
    for line in text.splitlines():
        m = _SERIES.match(line)
        if m:
            out[m.group(1)] = float(m.group(3))
            out["rank"] = float(m.group(2))
    return out


def table(rows: List[Optional[Dict[str, float]]], urls: List[str]) -> str:
    """The view as text: one row per endpoint (an unreachable one says so)."""
    head = (f"{'rank':>4} {'in':>9} {'out':>9} {'rej':>6} {'steps':>7} {'idle':>6} {'pad%':>6} {'bufMiB':>7} "
            f"{'queue':>5} {'movedMiB':>8} {'rt p50':>7} {'rt p99':>7} {'wait s':>8} {'tok/mean':>8}")
    lines = [head]
    tokens = [r.get("odb_real_tokens_total", 0.0) for r in rows if r]
    mean = sum(tokens) / len(tokens) if tokens else 0.0
    for url, r in zip(urls, rows):
        if r is None:
            lines.append(f"{'?':>4} unreachable: {url}")
            continue
        real, padded = r.get("odb_real_tokens_total", 0.0), r.get("odb_padded_tokens_total", 0.0)
        pad = 100.0 * (1 - real / padded) if padded else 0.0
        balance = real / mean if mean else 0.0
        lines.append(
            f"{int(r.get('rank', -1)):>4} {int(r.get('odb_samples_received_total', 0)):>9} "
            f"{int(r.get('odb_samples_emitted_total', 0)):>9} {int(r.get('odb_samples_rejected_total', 0)):>6} "
            f"{int(r.get('odb_steps_emitted_total', 0)):>7} {int(r.get('odb_idle_steps_total', 0)):>6} "
            f"{pad:>6.1f} {r.get('odb_buffer_bytes', 0) / 2**20:>7.1f} {int(r.get('odb_queued_steps', 0)):>5} "
            f"{r.get('odb_exchange_bytes_sent_total', 0) / 2**20:>8.1f} "
            f"{r.get('odb_round_p50_microseconds', 0) / 1e3:>7.2f} {r.get('odb_round_p99_microseconds', 0) / 1e3:>7.2f} "
            f"{r.get(_WAIT, 0) / 1e6:>8.3f} {balance:>8.3f}")
    if tokens and mean:
        lines.append(f"real tokens max/mean over ranks: {max(tokens) / mean:.3f}")
    lines.append(data_wait_line(rows))
    return "\n".join(lines)


_WAIT = "odb_trainer_data_wait_microseconds_total"


def data_wait_line(rows: List[Optional[Dict[str, float]]]) -> str:
    """Names the rank whose trainer waited longest on data (the reachable ranks'
    reported waits), or says that none reported any."""
    waits = [(r.get(_WAIT, 0.0), int(r.get("rank", -1))) for r in rows if r]
    total = sum(w for w, _ in waits)
    if not waits or total <= 0:
        return "data wait: no trainer has reported waiting for steps"
    most, rank = max(waits, key=lambda w: (w[0], -w[1]))  # a tie: the lower rank
    return (f"data wait: rank {rank}'s trainer waits most on data: {most / 1e6:.3f} s "
            f"({100.0 * most / total:.0f}% of all ranks' wait)")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("endpoints", nargs="+", help="metrics endpoints, one per rank (http://host:port)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print the table once and exit")
    a = p.parse_args(argv)
    while True:
        rows: List[Optional[Dict[str, float]]] = []
        for url in a.endpoints:
            try:
                rows.append(scrape(url))
            except OSError:
                rows.append(None)
        text = table(rows, a.endpoints)
        if a.once:
            print(text)
            return 0 if all(rows) else 1
        sys.stdout.write("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S odb top\n") + text + "\n")
        sys.stdout.flush()
        try:
            time.sleep(a.interval)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
