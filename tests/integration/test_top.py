"""`python -m odb.top`: a live view of a running job read from the daemons'
metrics endpoints, one row per rank (checked here with --once)."""
from __future__ import annotations

import re
import subprocess
import uuid

from odbtest import ROOT, Daemon, run_epoch


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
    finally:
        for d in daemons:
            d.stop()
