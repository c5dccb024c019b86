"""Runs one odbd next to a torchrun-style training process, then the trainer.

    python3 -m torch.distributed.run --standalone --nproc_per_node=8 --redirects 3 --tee 3 \\
        -m odb.launch [--odbd PATH] [--config odbd.yaml] [--job-id ID] train.py ARGS

(`torchrun` is the same where it runs the interpreter odb is installed in;
Debian 12's torch 1.13 on Python 3.11 needs `--redirects`/`--tee` other than
0, and `--tee 3` is what shows the script's output; see docs/python.md.)

torchrun starts this once per local rank with RANK / WORLD_SIZE / LOCAL_RANK
(and TORCHELASTIC_RUN_ID) set. It starts odbd for that rank, exports
ODB_RUN_DIR for the trainer (odb.OdbDataLoader finds its daemon there), runs
the script with the same interpreter and environment, and stops the daemon
when the script exits, however it exits (a crash, SIGTERM/SIGINT, or this
process being SIGKILLed: the daemon dies with it). The exit code is the
trainer's.

Job id (the daemons' rendezvous key): --job-id, else torchrun's run id, else
$SLURM_JOB_ID. Running the same command again in the same run_dir works: the
first daemon of the new run removes what the previous run left in the
rendezvous store; two *live* jobs with one id and run_dir are refused at once.

Multi-host: each daemon listens for its peers on this host's address: --gloo-
hostname, else $ODB_GLOO_HOSTNAME (or $ODB_GLOO_IFACE), else, when the job
spans hosts (WORLD_SIZE > LOCAL_WORLD_SIZE), the address this host uses to
reach $MASTER_ADDR.

Restarts: with `torchrun --max_restarts N`, a failed rank makes torchrun
restart every rank's launcher; each starts a fresh odbd whose job id carries
the restart count (TORCHELASTIC_RESTART_COUNT) and exports ODB_RESTART_COUNT
to the trainer. The trainer resumes from its last checkpoint (model,
optimizer and `OdbDataLoader.state_dict()`, see docs/resume.md): every sample
of the epoch is trained exactly once across the restart.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence


def default_job_id(env: "os._Environ[str] | dict" = os.environ) -> Optional[str]:
    """torchrun's run id (not its placeholder "none"), else the Slurm job id."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return run_id
    return env.get("SLURM_JOB_ID") or None


def host_address(peer: str, port: int = 29500) -> str:
    """The local address this host uses to reach `peer` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, port))
        return s.getsockname()[0]


def gloo_args(a: argparse.Namespace, env: "os._Environ[str] | dict" = os.environ) -> List[str]:
    """The odbd flags that set the address its peers reach it on (see the module doc)."""
    if a.gloo_hostname:
        return ["--gloo-hostname", a.gloo_hostname]
    if env.get("ODB_GLOO_HOSTNAME") or env.get("ODB_GLOO_IFACE"):
        return []  # odbd reads them itself
    world = int(env.get("WORLD_SIZE", "1"))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    master = env.get("MASTER_ADDR", "")
    if world > local_world and master:
        try:
            return ["--gloo-hostname", host_address(master, int(env.get("MASTER_PORT", "29500")))]
        except OSError as e:
            raise SystemExit(f"odb.launch: cannot find this host's address toward MASTER_ADDR={master} ({e}): "
                             f"pass --gloo-hostname or set ODB_GLOO_HOSTNAME / ODB_GLOO_IFACE") from None
    return []


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m odb.launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    from ._native import ODBD_SEARCH_ORDER

    p.add_argument("--odbd", help=f"odbd binary (default: odb.find_odbd(), the first of: {', '.join(ODBD_SEARCH_ORDER)})")
    p.add_argument("--config", help="odbd YAML config file (must exist)")
    p.add_argument("--run-dir", default=os.environ.get("ODB_RUN_DIR", "/tmp/odb"),
                   help="sockets, logs and the FileStore (default $ODB_RUN_DIR or /tmp/odb); shared by the job's ranks")
    p.add_argument("--job-id", default=default_job_id(),
                   help="rendezvous key, the same for every rank (default: torchrun's run id, else $SLURM_JOB_ID)")
    p.add_argument("--gloo-hostname", help="address the daemon's peers reach it on (multi-host)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--ready-timeout", type=float, default=120.0,
                   help="seconds to wait for the daemon (all ranks' daemons must start)")
    p.add_argument("script", help="training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if not a.job_id:
        p.error("--job-id is required outside torchrun/Slurm (the same for every rank of the job)")
    if a.config is not None and not Path(a.config).is_file():
        p.error(f"--config {a.config}: " + ("is a directory" if Path(a.config).is_dir() else "no such file"))
    if not Path(a.script).is_file():
        p.error(f"training script {a.script}: no such file")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    job_id = a.job_id if restart == "0" else f"{a.job_id}-restart{restart}"
    from .daemon import spawn_daemon

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    daemon = spawn_daemon(rank, world, a.run_dir, job_id=job_id, config=a.config, odbd=a.odbd,
                          log_level=a.log_level, wait=False, extra_args=gloo_args(a), die_with_parent=True)
    env = dict(os.environ, ODB_RUN_DIR=str(a.run_dir), ODB_RESTART_COUNT=restart)
    trainer: Optional[subprocess.Popen] = None

    def forward(sig: int, _frame: object) -> None:
        if trainer is not None and trainer.poll() is None:
            trainer.send_signal(sig)
        elif trainer is None:
            raise KeyboardInterrupt  # still starting: stop the daemon and leave

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        try:
            daemon.wait_ready(a.ready_timeout)
        except Exception as e:  # the daemon's own message (it exited, or never got ready)
            print(f"odb.launch rank {rank}: {e}", file=sys.stderr)
            return 1
        trainer = subprocess.Popen([sys.executable, a.script, *a.script_args], env=env)
        return trainer.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        if trainer is not None and trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        daemon.stop()


if __name__ == "__main__":
    sys.exit(main())
