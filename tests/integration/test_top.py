"""`python -m odb.top`: a live view of a running job read from the daemons'
metrics endpoints, one row per rank (checked here with --once). The real
endpoints' text reads the same through odb.top's parser (odb/exposition.py)
as through the reference parser (Debian's python3-prometheus-client), and
every figure of odb.top's rows is the one the reference parser reads."""
from __future__ import annotations

import re
import subprocess
import uuid

from odbtest import ROOT, Daemon, parse_metrics, run_epoch, scrape


def test_top_shows_one_row_per_rank_of_a_real_job(tmp_path):
    job = f"top-{uuid.uuid4().hex[:8]}"
    config = 'metrics_endpoint: "tcp://127.0.0.1:*"\nalignment:\n  planner: global\n'
    daemons = [Daemon(tmp_path, rank=r, world=2, config=config, job_id=job) for r in range(2)]
    try:
        run_epoch(daemons, [300, 100], max_len=256)
        urls = []
        for d in daemons:
            d.wait_log("metrics endpoint tcp://")
            urls.append("http://" + re.search(r"metrics endpoint tcp://([0-9.]+:\d+)", d.read_log()).group(1))
        top = subprocess.run(["/usr/bin/python3", "-m", "odb.top", "--once", *urls], capture_output=True, text=True,
                             timeout=60, cwd=ROOT / "client/python")
        assert top.returncode == 0, top.stderr
        rows = {int(line.split()[0]): line.split() for line in top.stdout.splitlines()[1:] if line[:4].strip().isdigit()}
        assert sorted(rows) == [0, 1], top.stdout
        assert int(rows[0][1]) == 300 and int(rows[1][1]) == 100  # samples in per rank
        assert int(rows[0][2]) + int(rows[1][2]) == 400            # out: the global planner moves samples
        assert float(rows[0][11]) >= 0 and "max/mean" in top.stdout  # round p99 and the balance line
        gone = subprocess.run(["/usr/bin/python3", "-m", "odb.top", "--once", urls[0], "http://127.0.0.1:9"],
                              capture_output=True, text=True, timeout=60, cwd=ROOT / "client/python")
        assert gone.returncode == 1 and "unreachable: http://127.0.0.1:9" in gone.stdout
        _check_figures_against_the_reference_parser([scrape(u.removeprefix("http://")) for u in urls], urls)
    finally:
        for d in daemons:
            d.stop()


def _check_figures_against_the_reference_parser(texts, urls) -> None:
    import sys

    sys.path.insert(0, str(ROOT / "client/python"))
    from odb import exposition, top

    reference = [parse_metrics(t) for t in texts]  # {(name, labels): value}
    for text, ref in zip(texts, reference):
        ours = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in exposition.parse(text) for s in f.samples}
        assert ours == ref, (ours, ref)
        assert len(ref) > 30  # the daemon's whole table, not a few lines
    rows = [top.rank_series(t) for t in texts]
    shown = {int(line.split()[0]): line.split() for line in top.table(rows, urls).splitlines()
             if line[:4].strip().isdigit()}
    tokens = [sum(v for (n, _), v in ref.items() if n == "odb_real_tokens_total") for ref in reference]
    for ref in reference:
        (rank,) = {dict(labels)["rank"] for _, labels in ref}
        get = lambda name: ref[(name, (("rank", rank),))]  # noqa: E731
        row = shown[int(rank)]
        pad = 100.0 * (1 - get("odb_real_tokens_total") / get("odb_padded_tokens_total"))
        assert row[1:13] == [
            str(int(get("odb_samples_received_total"))), str(int(get("odb_samples_emitted_total"))),
            str(int(get("odb_samples_rejected_total"))), str(int(get("odb_steps_emitted_total"))),
            str(int(get("odb_idle_steps_total"))), f"{pad:.1f}", f"{get('odb_buffer_bytes') / 2**20:.1f}",
            str(int(get("odb_queued_steps"))), f"{get('odb_exchange_bytes_sent_total') / 2**20:.1f}",
            f"{get('odb_round_p50_microseconds') / 1e3:.2f}", f"{get('odb_round_p99_microseconds') / 1e3:.2f}",
            f"{get('odb_trainer_data_wait_microseconds_total') / 1e6:.3f}"], (row, rank)
        assert row[13] == f"{get('odb_real_tokens_total') / (sum(tokens) / len(tokens)):.3f}", (row, tokens)
