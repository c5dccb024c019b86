#!/usr/bin/env python3
"""Runs one odbd next to a torchrun-style training process, then the trainer.

    torchrun --nproc_per_node=8 deploy/odb_launch.py [--odbd PATH] [--config odbd.yaml] train.py ARGS

(Debian 12's torchrun needs `--redirects 1 --tee 2` or similar: its default 0
crashes on Python 3.11; see docs/python.md.)

torchrun starts this once per local rank with RANK / WORLD_SIZE / LOCAL_RANK
(and TORCHELASTIC_RUN_ID) set. It starts odbd for that rank (rendezvous key:
the run id, so every rank of the job agrees), exports ODB_RUN_DIR for the
trainer (odb.OdbDataLoader finds its daemon there), runs the script with the
same interpreter and environment, and stops the daemon when it exits (or on
SIGTERM/SIGINT). The exit code is the trainer's.

Restarts: with `torchrun --max-restarts N`, a failed rank makes torchrun
restart every rank's launcher; each starts a fresh odbd whose rendezvous key
carries the restart count (TORCHELASTIC_RESTART_COUNT), so the new daemons
never meet the old ones' store entries, and exports ODB_RESTART_COUNT to the
trainer. The trainer resumes from its last checkpoint (model, optimizer and
`OdbDataLoader.state_dict()`, see docs/resume.md): every sample of the epoch
is trained exactly once across the restart.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client/python"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--odbd", help="odbd binary (default $ODB_ODBD or the repo's build)")
    p.add_argument("--config", help="odbd YAML config")
    p.add_argument("--run-dir", default=os.environ.get("ODB_RUN_DIR", "/tmp/odb"))
    p.add_argument("--job-id", default=os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID"))
    p.add_argument("--log-level", default="info")
    p.add_argument("script", help="training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if not a.job_id:
        p.error("--job-id is required outside torchrun/Slurm (the same for every rank of the job)")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    job_id = a.job_id if restart == "0" else f"{a.job_id}-restart{restart}"
    import odb

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    daemon = odb.spawn_daemon(rank, world, a.run_dir, job_id=job_id, config=a.config, odbd=a.odbd,
                              log_level=a.log_level, wait=False)
    env = dict(os.environ, ODB_RUN_DIR=a.run_dir, ODB_RESTART_COUNT=restart)
    trainer = None

    def forward(sig, _frame):
        if trainer is not None and trainer.poll() is None:
            trainer.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        daemon.wait_ready(120)
        trainer = subprocess.Popen([sys.executable, a.script, *a.script_args], env=env)
        return trainer.wait()
    finally:
        daemon.stop()


if __name__ == "__main__":
    sys.exit(main())
