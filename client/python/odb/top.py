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

The endpoints' text is read with a strict parser of the Prometheus text
format (odb/exposition.py): an endpoint that serves something else is shown
as such, with the parser's reason, not read as zeros.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import urllib.request
from typing import Dict, List, Optional, Sequence, Union

from .exposition import parse

# A row of the view: an endpoint's figures, None (unreachable), or why its text could not be read.
Row = Union[Dict[str, float], None, str]


def rank_series(text: str) -> Dict[str, float]:
    """An odbd exposition's per-rank series as {name: value}, plus "rank" (the
    value of their `rank` label). odbd labels every series with its rank
    only; series with other labels are not the view's and are left out. One
    endpoint serving two ranks, a series with and without the rank label, or
    a rank label that is not an integer is a ValueError naming it; so is
    text that is not a valid exposition (ExpositionError)."""
    out: Dict[str, float] = {}
    ranks = set()
    for family in parse(text):
        for s in family.samples:
            if set(s.labels) - {"rank"}:
                continue
            if s.name in out:
                raise ValueError(f"metric {s.name} is exposed both with and without a rank label")
            out[s.name] = s.value
            if "rank" in s.labels:
                ranks.add(s.labels["rank"])
    if len(ranks) > 1:
        raise ValueError(f"one endpoint exposes several ranks ({', '.join(sorted(ranks))}): "
                         f"odb.top reads one endpoint per rank")
    if ranks:
        (rank,) = ranks
        if not (rank.isascii() and rank.isdigit()):
            raise ValueError(f"rank label {rank!r} is not a rank (a non-negative integer)")
        out["rank"] = float(rank)
    return out


def _metrics_url(url: str) -> str:
    if not url.startswith("http"):
        url = "http://" + url.replace("tcp://", "")
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    return url


def scrape(url: str, timeout: float = 5.0) -> Dict[str, float]:
    """One endpoint's per-rank series (rank_series). OSError when it cannot be
    read, ValueError when what it serves is not an odbd exposition."""
    with urllib.request.urlopen(_metrics_url(url), timeout=timeout) as response:
        raw = response.read()
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"the metrics text is not UTF-8 ({e})") from None
    return rank_series(text)


def read(url: str, timeout: float = 5.0) -> Row:
    """scrape(), or None when the endpoint is unreachable, or the reason its
    text is not an odbd exposition (a row that says so)."""
    try:
        return scrape(url, timeout)
    except OSError:
        return None
    except ValueError as e:  # ExpositionError included
        return f"{url}: {e}"


def _count(value: float, width: int) -> str:
    """A counter's figure; a NaN or infinite one (which no int() takes) as such."""
    return f"{int(value):>{width}}" if math.isfinite(value) else f"{value:>{width}}"


def table(rows: Sequence[Row], urls: Sequence[str]) -> str:
    """The view as text: one row per endpoint (an unreachable one, or one whose
    text could not be read, says so)."""
    head = (f"{'rank':>4} {'in':>9} {'out':>9} {'rej':>6} {'steps':>7} {'idle':>6} {'pad%':>6} {'bufMiB':>7} "
            f"{'queue':>5} {'movedMiB':>8} {'rt p50':>7} {'rt p99':>7} {'wait s':>8} {'tok/mean':>8}")
    lines = [head]
    figures = [r for r in rows if isinstance(r, dict)]
    tokens = [r.get("odb_real_tokens_total", 0.0) for r in figures]
    mean = sum(tokens) / len(tokens) if tokens else 0.0
    for url, r in zip(urls, rows):
        if r is None:
            lines.append(f"{'?':>4} unreachable: {url}")
            continue
        if isinstance(r, str):
            lines.append(f"{'?':>4} not an odbd metrics exposition: {r}")
            continue
        real, padded = r.get("odb_real_tokens_total", 0.0), r.get("odb_padded_tokens_total", 0.0)
        pad = 100.0 * (1 - real / padded) if padded else 0.0
        balance = real / mean if mean else 0.0
        lines.append(
            f"{_count(r.get('rank', -1), 4)} {_count(r.get('odb_samples_received_total', 0), 9)} "
            f"{_count(r.get('odb_samples_emitted_total', 0), 9)} {_count(r.get('odb_samples_rejected_total', 0), 6)} "
            f"{_count(r.get('odb_steps_emitted_total', 0), 7)} {_count(r.get('odb_idle_steps_total', 0), 6)} "
            f"{pad:>6.1f} {r.get('odb_buffer_bytes', 0) / 2**20:>7.1f} {_count(r.get('odb_queued_steps', 0), 5)} "
            f"{r.get('odb_exchange_bytes_sent_total', 0) / 2**20:>8.1f} "
            f"{r.get('odb_round_p50_microseconds', 0) / 1e3:>7.2f} {r.get('odb_round_p99_microseconds', 0) / 1e3:>7.2f} "
            f"{r.get(_WAIT, 0) / 1e6:>8.3f} {balance:>8.3f}")
    if tokens and mean:
        lines.append(f"real tokens max/mean over ranks: {max(tokens) / mean:.3f}")
    lines.append(data_wait_line(figures))
    return "\n".join(lines)


_WAIT = "odb_trainer_data_wait_microseconds_total"


def data_wait_line(rows: Sequence[Row]) -> str:
    """Names the rank whose trainer waited longest on data (the reachable ranks'
    reported waits), or says that none reported any."""
    waits = [(r.get(_WAIT, 0.0), int(r.get("rank", -1))) for r in rows
             if isinstance(r, dict) and math.isfinite(r.get(_WAIT, 0.0))]
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
        rows = [read(url) for url in a.endpoints]
        text = table(rows, a.endpoints)
        if a.once:
            print(text)
            return 0 if all(isinstance(r, dict) for r in rows) else 1
        sys.stdout.write("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S odb top\n") + text + "\n")
        sys.stdout.flush()
        try:
            time.sleep(a.interval)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
