"""`odbctl`: the command line of the odb Python package (installed as a console script).

    odbctl top URL [URL ...] [--interval S] [--once]   live per-rank view of a job (odb.top)
    odbctl demo [--ranks 2] [--samples 400]            a local job with a live view of it
    odbctl report SUMMARY_DIR [--out DIR]               end-of-epoch PNG plots (odb.report)
    odbctl find-odbd                                    where the odbd binary is (odb.find_odbd)
    odbd ARGS...                                        the package's own daemon (odb/bin/odbd), run as is
    odbctl produce --endpoint E --producer-id P --count N   send synthetic samples to a daemon
    odbctl consume --endpoint E [--expected-producers N]    receive and verify an epoch, print a JSON summary

`python -m odb.cli ...` is the same. Nothing here needs torch; `report` needs
matplotlib. Exit status: 0 on success, 1 on an error (said on stderr), 2 on a
usage error. The package installs a second command, `odbd` (odbd_main): the
daemon it carries, as `pip install ray` puts `ray` on the venv's PATH.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import struct
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Union

PROG = "odbctl"


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # Python < 3.8
        return "unknown"
    try:
        return version("odb")
    except PackageNotFoundError:
        return "source checkout"


def _cmd_top(a: argparse.Namespace) -> int:
    from . import top

    args = [*a.endpoints, "--interval", str(a.interval)] + (["--once"] if a.once else [])
    return top.main(args)


def _cmd_report(a: argparse.Namespace) -> int:
    from ._native import install_hint

    try:
        from .epoch_report import report
        paths = report(a.summary_dir, a.out)
    except ImportError as e:
        print(f"{PROG} report: needs matplotlib ({e}): {install_hint('matplotlib', 'python3-matplotlib')}",
              file=sys.stderr)
        return 1
    except FileNotFoundError as e:
        print(f"{PROG} report: {e}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


def _cmd_find_odbd(a: argparse.Namespace) -> int:
    from ._native import find_odbd

    try:
        print(find_odbd())
    except FileNotFoundError as e:
        print(f"{PROG} find-odbd: {e}", file=sys.stderr)
        return 1
    return 0


# Synthetic samples (`produce` / `consume`): sample `s` holds `input_ids` of its
# length whose token j is _token(s, j), so the consumer checks every byte from
# the header alone (sample id and length), without knowing the producer's seed.
_TOKEN_MOD = (1 << 61) - 1


def _token(sample_id: int, j: int) -> int:
    return (sample_id * 1_000_003 + j * 7919 + 1) % _TOKEN_MOD


def _cmd_produce(a: argparse.Namespace) -> int:
    """Sends --count synthetic samples (ids id_offset + k, lengths drawn in [min_len, max_len]) for each
    epoch, then ends the stream."""
    from ._native import native

    lib = native()
    int64 = lib.DTYPES["int64"]
    rng = random.Random(a.seed)
    p = lib.Producer(a.endpoint, a.producer_id, a.rank)
    sent = 0
    for epoch in range(a.first_epoch, a.first_epoch + a.epochs):
        p.start_epoch(epoch)
        for k in range(a.count):
            sid = a.id_offset + k
            n = rng.randint(a.min_len, a.max_len)
            ids = struct.pack(f"<{n}q", *(_token(sid, j) for j in range(n)))
            p.send(sid, epoch, n, 0, 0, [("input_ids", int64, (n,), ids)])
            sent += 1
        p.end_stream(epoch)
    print(json.dumps({"producer_id": a.producer_id, "epochs": a.epochs, "sent": sent}))
    return 0


def _check_step(d: Any) -> List[str]:
    """Every byte of a step's input_ids against the synthetic content; the problems found."""
    import ctypes

    s = d.step
    ids, lengths = list(s["sample_ids"]), list(s["lengths"])
    if not ids:
        return []
    data = ctypes.string_at(d.frame_address("input_ids"), d.frame_bytes("input_ids"))
    values = struct.unpack(f"<{len(data) // 8}q", data)
    packed = "cu_seqlens" in d.tensor_names()
    width = 0 if packed else len(values) // len(ids)
    problems, start = [], 0
    for r, (sid, n) in enumerate(zip(ids, lengths)):
        row_start = start if packed else r * width
        row = list(values[row_start:row_start + n])
        if row != [_token(sid, j) for j in range(n)]:
            problems.append(f"step {s['step_index']}: sample {sid} ({n} tokens) has wrong bytes")
        start += n
    return problems


def _cmd_consume(a: argparse.Namespace) -> int:
    """Receives --epochs epochs, checks every sample's bytes and that no sample comes twice, prints one
    JSON summary per epoch; exit 1 on a wrong byte, a duplicate or a rejection."""
    from ._native import native

    c = native().Consumer(a.endpoint, int(a.timeout * 1000))
    ok = True
    for epoch in range(a.first_epoch, a.first_epoch + a.epochs):
        c.start_epoch(epoch, a.expected_producers)
        seen: Set[int] = set()
        steps = idle = tokens = 0
        problems: List[str] = []
        while True:
            d = c.next()
            if not d.is_step:
                summary = d.summary
                break
            s = d.step
            steps += 1
            idle += bool(s["idle"])
            tokens += int(s["real_tokens"])
            dup = seen.intersection(s["sample_ids"])
            if dup:
                problems.append(f"step {s['step_index']}: sample(s) {sorted(dup)[:5]} delivered twice")
            seen.update(s["sample_ids"])
            problems += _check_step(d)
        result = {"epoch": epoch, "rank": a.rank, "steps": steps, "idle_steps": idle, "samples": len(seen),
                  "real_tokens": tokens, "received": summary["received"], "emitted": summary["emitted"],
                  "rejected": summary["rejected"], "verified": not problems, "problems": problems[:10]}
        print(json.dumps(result), flush=True)
        ok = ok and not problems and summary["rejected"] == 0
    return 0 if ok else 1


def _metrics_url(daemon: Any, timeout: float = 30.0) -> str:
    """The http:// address of a daemon's metrics endpoint, from its start-up log line (this
    daemon's lines only: the log is appended across runs)."""
    deadline = time.monotonic() + timeout
    pattern = re.compile(r"metrics endpoint tcp://([0-9.]+:\d+)")
    text = ""
    while time.monotonic() < deadline:
        text = daemon.log_text()
        m = pattern.search(text)
        if m:
            return f"http://{m.group(1)}"
        if daemon.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"no metrics endpoint in {daemon.log_path} after {timeout:g}s:\n{text[-2000:]}")


def _cmd_demo(a: argparse.Namespace) -> int:
    """W local daemons (one job), a producer and a consumer per rank, and the live view."""
    from . import top
    from ._native import native
    from .daemon import spawn_daemon

    lib = native()
    int64 = lib.DTYPES["int64"]
    run_dir = Path(tempfile.mkdtemp(prefix="odbctl-demo-"))
    job = f"demo-{uuid.uuid4().hex[:8]}"
    config: Dict[str, Any] = {"metrics_endpoint": "tcp://127.0.0.1:*", "grouping": {"max_tokens": a.max_tokens},
                              "alignment": {"planner": a.planner}}
    daemons = [spawn_daemon(r, a.ranks, run_dir, job_id=job, config=config, log_level="info",
                            wait=False, odbd=a.odbd) for r in range(a.ranks)]
    errors: List[str] = []
    steps = [0] * a.ranks
    try:
        for d in daemons:
            d.wait_ready(60)
        urls = [_metrics_url(d) for d in daemons]
        rng = random.Random(a.seed)
        # Rank r gets more and longer samples the higher r is: the view shows the daemons evening it out.
        plans = [[rng.randint(8, 64 * (r + 1)) for _ in range(n)] for r, n in enumerate(demo_counts(a.samples, a.ranks))]

        def produce(rank: int) -> None:
            try:
                p = lib.Producer(daemons[rank].ingest, f"demo-r{rank}", rank)
                p.start_epoch(0)
                for i, n in enumerate(plans[rank]):
                    ids = struct.pack(f"<{n}q", *range(n))
                    p.send(rank * 1_000_000 + i, 0, n, 0, 0, [("input_ids", int64, (n,), ids)])
                    if a.delay:
                        time.sleep(a.delay)
                p.end_stream(0)
            except Exception as e:  # reported after the run
                errors.append(f"producer rank {rank}: {e!r}")

        def consume(rank: int) -> None:
            try:
                c = lib.Consumer(daemons[rank].trainer, 60000)
                c.start_epoch(0, 1)
                while True:
                    asked = time.monotonic()
                    if not c.next().is_step:
                        break
                    steps[rank] += 1
                    c.report_data_wait(time.monotonic() - asked)  # the view's `wait s`: this consumer only waits
            except Exception as e:  # reported after the run
                errors.append(f"consumer rank {rank}: {e!r}")

        threads = [threading.Thread(target=f, args=(r,), daemon=True) for r in range(a.ranks) for f in (consume, produce)]
        for t in threads:
            t.start()
        live = not a.plain and sys.stdout.isatty()
        while any(t.is_alive() for t in threads):
            if live:
                text = top.table([_scrape(u) for u in urls], urls)
                sys.stdout.write("\x1b[H\x1b[2J" + time.strftime(f"%H:%M:%S odbctl demo ({a.ranks} ranks)\n") + text +
                                 "\n")
                sys.stdout.flush()
            time.sleep(a.interval)
        final = top.table([_scrape(u) for u in urls], urls)
        print(("\x1b[H\x1b[2J" if live else "") + f"odbctl demo ({a.ranks} ranks): epoch 0 done\n" + final)
        print(f"job {job}: steps per rank {steps}; run dir {run_dir}")
    except KeyboardInterrupt:
        return 130
    finally:
        for d in daemons:
            d.stop()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def demo_counts(samples: int, ranks: int) -> List[int]:
    """Samples per rank of `odbctl demo`: rank r's share grows as r + 1, and the shares sum to `samples`
    exactly (--samples 400 sends 400)."""
    total = ranks * (ranks + 1) // 2
    cuts = [samples * (r * (r + 1) // 2) // total for r in range(ranks + 1)]
    return [cuts[r + 1] - cuts[r] for r in range(ranks)]


def _scrape(url: str) -> Union[Dict[str, float], None, str]:
    from . import top

    return top.read(url)  # None when unreachable, the reason when the text is not odbd's metrics


def parser() -> argparse.ArgumentParser:
    """The argument parser of `odbctl` (one sub-command per task)."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    t = sub.add_parser("top", help="live per-rank view of a running job, from the daemons' metrics endpoints",
                       description="One row per rank: samples in/out/rejected, steps, idle steps, padding, "
                                   "buffered MiB, queued steps, MiB moved, round time p50/p99, seconds the "
                                   "trainer waited on data (the rank that waits most is named below), real "
                                   "tokens against the mean of the ranks. Exit 1 with --once when an endpoint "
                                   "is unreachable.")
    t.add_argument("endpoints", nargs="+", metavar="URL",
                   help="a daemon's metrics endpoint (odbd's metrics_endpoint), one per rank: http://host:port")
    t.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    t.add_argument("--once", action="store_true", help="print the table once and exit")
    t.set_defaults(func=_cmd_top)

    d = sub.add_parser("demo", help="run a small local job (W daemons, synthetic samples) and show its live view",
                       description="Starts --ranks odbd daemons of one job (metrics on 127.0.0.1), one producer "
                                   "and one consumer per rank sending synthetic samples (rank r: more and longer "
                                   "ones the higher r), and shows the `odbctl top` view until the epoch ends. "
                                   "Needs odbd (see `odbctl find-odbd`).")
    d.add_argument("--ranks", type=int, default=2, help="ranks (daemons) of the job (default 2)")
    d.add_argument("--samples", type=int, default=400, help="samples in all, over the ranks (default 400)")
    d.add_argument("--max-tokens", type=int, default=512, help="token budget of a step (default 512)")
    d.add_argument("--planner", default="global", choices=["global", "local"],
                   help="alignment.planner of the daemons (default global)")
    d.add_argument("--delay", type=float, default=0.005, help="seconds between two samples of a producer")
    d.add_argument("--interval", type=float, default=0.5, help="seconds between refreshes (default 0.5)")
    d.add_argument("--seed", type=int, default=0, help="seed of the sample lengths")
    d.add_argument("--plain", action="store_true", help="no live refresh: print the final table only")
    d.add_argument("--odbd", help="the odbd binary (default: odb.find_odbd())")
    d.set_defaults(func=_cmd_demo)

    r = sub.add_parser("report", help="end-of-epoch PNG plots from an OdbDataLoader's summary_dir",
                       description="Writes one PNG per epoch (rank cost max vs mean per step, padding, idle "
                                   "steps per rank, length histogram) from the step records that "
                                   "OdbDataLoader(summary_dir=...) wrote, and prints their paths. Needs matplotlib.")
    r.add_argument("summary_dir", help="the directory of rank*-epoch*.jsonl step records")
    r.add_argument("--out", help="where to write the PNGs (default: summary_dir)")
    r.set_defaults(func=_cmd_report)

    from ._native import ODBD_SEARCH_ORDER

    f = sub.add_parser("find-odbd", help=f"print the odbd binary odb would start ({', '.join(ODBD_SEARCH_ORDER)})",
                       description=f"Prints the path odb.find_odbd() returns, the first of: "
                                   f"{', '.join(ODBD_SEARCH_ORDER)}; exit 1 saying what to do when there is none.")
    f.set_defaults(func=_cmd_find_odbd)

    pr = sub.add_parser("produce", help="send synthetic samples to a daemon (a stand-in for your data pipeline)",
                        description="Sends --count samples per epoch to a daemon's ingest endpoint (each an "
                                    "int64 input_ids of a random length whose bytes `odbctl consume` can "
                                    "check), then ends the stream. Prints a JSON line.")
    pr.add_argument("--endpoint", required=True, help="the daemon's ingest endpoint, e.g. ipc://$RUN/odb-0-in.sock")
    pr.add_argument("--producer-id", required=True, help="this producer's id (unique per daemon)")
    pr.add_argument("--count", type=int, required=True, help="samples per epoch")
    pr.add_argument("--rank", type=int, default=-1, help="the rank this producer feeds (-1: any)")
    pr.add_argument("--id-offset", type=int, default=0, help="first sample id (ids must be unique across ranks)")
    pr.add_argument("--epochs", type=int, default=1, help="epochs to send (default 1)")
    pr.add_argument("--first-epoch", type=int, default=0, help="the first epoch's number (default 0)")
    pr.add_argument("--min-len", type=int, default=8, help="shortest sample in tokens (default 8)")
    pr.add_argument("--max-len", type=int, default=1024, help="longest sample in tokens (default 1024)")
    pr.add_argument("--seed", type=int, default=0, help="seed of the lengths")
    pr.set_defaults(func=_cmd_produce)

    co = sub.add_parser("consume", help="receive epochs from a daemon as a trainer would, verifying every byte",
                        description="Asks the daemon for --epochs epochs, receives every step, checks the bytes "
                                    "of every sample `odbctl produce` sent and that none comes twice, and prints "
                                    "one JSON summary per epoch. Exit 1 on a wrong byte, a duplicate or a "
                                    "rejection.")
    co.add_argument("--endpoint", required=True, help="the daemon's trainer endpoint, e.g. ipc://$RUN/odb-0-out.sock")
    co.add_argument("--expected-producers", type=int, default=0,
                    help="producers that will stream each epoch (0: the daemon's config)")
    co.add_argument("--epochs", type=int, default=1, help="epochs to receive (default 1)")
    co.add_argument("--first-epoch", type=int, default=0, help="the first epoch's number (default 0)")
    co.add_argument("--rank", type=int, default=0, help="this trainer's rank (shown in the summary)")
    co.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a step before failing")
    co.set_defaults(func=_cmd_consume)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `odbctl` console script; returns the exit status."""
    a = parser().parse_args(list(argv) if argv is not None else None)
    if getattr(a, "ranks", 1) < 1 or getattr(a, "samples", 1) < 1:
        parser().error("--ranks and --samples must be at least 1")
    if getattr(a, "count", 0) < 0 or getattr(a, "epochs", 1) < 1:
        parser().error("--count must be at least 0 and --epochs at least 1")
    if not 1 <= getattr(a, "min_len", 1) <= getattr(a, "max_len", 1):
        parser().error("need 1 <= --min-len <= --max-len")
    func: Callable[[argparse.Namespace], int] = a.func
    try:
        return func(a)
    except (FileNotFoundError, PermissionError, RuntimeError) as e:
        # What to do fits on a line (no odbd, a daemon that did not start, ...): no traceback.
        print(f"{PROG} {a.command}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # OdbError and friends, from the native module
        if type(e).__name__ not in ("OdbError", "OdbTimeout"):
            raise
        print(f"{PROG} {a.command}: {e}", file=sys.stderr)
        return 1


def odbd_main() -> None:
    """Entry point of the `odbd` console script: execs the package's own odb/bin/odbd with the same
    arguments (this process becomes the daemon: its pid, signals and exit status are odbd's)."""
    own = Path(__file__).resolve().parent / "bin" / "odbd"
    if not os.access(own, os.X_OK):
        missing = own.with_name("odbd.missing")
        why = missing.read_text().strip() if missing.is_file() else f"{own} is not there"
        print(f"odbd: this odb package ({own.parent.parent}) has no odbd of its own: {why}", file=sys.stderr)
        sys.exit(1)
    os.execv(str(own), ["odbd", *sys.argv[1:]])  # argv[0] as typed: "Usage: odbd [OPTIONS]"


if __name__ == "__main__":
    sys.exit(main())
