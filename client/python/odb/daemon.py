"""Running odbd as a sidecar: endpoints from the environment, local spawning.

One daemon serves one training rank. Its sockets are, by default,
``ipc://{run_dir}/odb-{rank}-in.sock`` (producers) and
``ipc://{run_dir}/odb-{rank}-out.sock`` (trainer). A launcher
(deploy/odb_launch.py, a Kubernetes sidecar, systemd) starts it and exports
``ODB_RUN_DIR``; the trainer finds it through :func:`endpoints`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

from ._native import find_odbd, native

# Daemons this process spawned, by trainer endpoint: the loader watches them so
# that a daemon dying mid-epoch is reported at once, not after a timeout.
_SPAWNED: Dict[str, "DaemonProcess"] = {}


@dataclass(frozen=True)
class Endpoints:
    """Where one rank's daemon listens."""

    ingest: str   # producers (DataLoader workers) push samples here
    trainer: str  # the trainer receives steps here


def env_rank() -> int:
    """This process's rank: torch.distributed if initialized, else $RANK, else 0."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:  # pragma: no cover
        pass
    return int(os.environ.get("RANK", "0"))


def env_world_size() -> int:
    """World size: torch.distributed if initialized, else $WORLD_SIZE, else 1."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except ImportError:  # pragma: no cover
        pass
    return int(os.environ.get("WORLD_SIZE", "1"))


def default_run_dir() -> str:
    """$ODB_RUN_DIR, else the daemon's own default /tmp/odb."""
    return os.environ.get("ODB_RUN_DIR", "/tmp/odb")


def endpoints(rank: Optional[int] = None, run_dir: Optional[str] = None) -> Endpoints:
    """The endpoints of `rank`'s daemon. $ODB_INGEST / $ODB_TRAINER override them."""
    rank = env_rank() if rank is None else rank
    run_dir = run_dir or default_run_dir()
    ingest = os.environ.get("ODB_INGEST") or f"ipc://{run_dir}/odb-{rank}-in.sock"
    trainer = os.environ.get("ODB_TRAINER") or f"ipc://{run_dir}/odb-{rank}-out.sock"
    return Endpoints(ingest=ingest.replace("{rank}", str(rank)), trainer=trainer.replace("{rank}", str(rank)))


def check_reachable(endpoint: str, what: str = "daemon") -> None:
    """Raises OdbError at once when an ipc:// endpoint has no socket file.

    ZeroMQ connects lazily, so without this check a wrong address would only
    show up as a receive timeout.
    """
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        if not os.path.exists(path):
            raise native().OdbError(
                f"no odbd listens at {endpoint} (socket file {path} does not exist): start the {what} "
                f"(odb.spawn_daemon, deploy/odb_launch.py) or fix ODB_RUN_DIR / the endpoint")


class DaemonProcess:
    """One odbd child process. Stop it with :meth:`stop` (also a context manager)."""

    def __init__(self, proc: subprocess.Popen, rank: int, run_dir: Path, log_path: Path,
                 eps: Endpoints) -> None:
        self.proc = proc
        self.rank = rank
        self.run_dir = run_dir
        self.log_path = log_path
        self.ingest = eps.ingest
        self.trainer = eps.trainer
        self._owner_pid = os.getpid()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> Optional[int]:
        """The exit code, or None while it runs.

        In a process forked from the one that spawned the daemon (a rank
        process, a worker) the daemon is not a child, so liveness comes from
        /proc and an exited daemon reads as -1.
        """
        if os.getpid() == self._owner_pid:
            return self.proc.poll()
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            return -1 if state in ("Z", "X") else None
        except (OSError, IndexError):
            return -1

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until both sockets exist; raises if the daemon exits first."""
        deadline = time.monotonic() + timeout
        paths = [e[len("ipc://"):] for e in (self.ingest, self.trainer) if e.startswith("ipc://")]
        while time.monotonic() < deadline:
            if all(os.path.exists(p) for p in paths):
                return
            if self.proc.poll() is not None:
                raise native().OdbError(
                    f"odbd rank {self.rank} exited with code {self.proc.returncode} during start-up; "
                    f"log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.02)
        raise native().OdbError(f"odbd rank {self.rank} not ready after {timeout}s; log {self.log_path}:\n"
                                f"{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> Optional[int]:
        """Stops the daemon (SIGTERM, then SIGKILL after `timeout`) and returns its exit code."""
        if os.getpid() != self._owner_pid:
            raise RuntimeError("stop() the daemon from the process that spawned it")
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _SPAWNED.pop(self.trainer, None)
        return self.proc.returncode

    def __enter__(self) -> "DaemonProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def spawned_daemon(trainer_endpoint: str) -> Optional[DaemonProcess]:
    """The daemon this process spawned for that trainer endpoint, if any."""
    return _SPAWNED.get(trainer_endpoint)


def spawn_daemon(rank: Optional[int] = None, world_size: Optional[int] = None,
                 run_dir: Optional[Union[str, Path]] = None, job_id: Optional[str] = None,
                 config: Optional[Union[Mapping[str, Any], str, Path]] = None,
                 odbd: Optional[Union[str, Path]] = None, log_level: str = "info",
                 log_path: Optional[Union[str, Path]] = None, wait: bool = True,
                 ready_timeout: float = 30.0, extra_args: Optional[List[str]] = None) -> DaemonProcess:
    """Starts one odbd for `rank` (local runs, tests, the launcher).

    Args:
      rank, world_size: default to torch.distributed / $RANK / $WORLD_SIZE.
      run_dir: socket and FileStore directory (default $ODB_RUN_DIR or /tmp/odb);
        every rank of a job must use the same one.
      job_id: rendezvous key prefix, fresh per job (default: random). All ranks
        of one job must pass the same id.
      config: a dict (written as JSON, which is YAML), YAML text, or a path.
      odbd: the binary (default :func:`odb.find_odbd`: $ODBD, `odbd` on PATH, the checkout's
        .build/src/daemon/odbd).
      wait: block until its sockets exist (not possible for W > 1 before every
        rank is started if the daemon waits for the rendezvous first).
    """
    rank = env_rank() if rank is None else rank
    world_size = env_world_size() if world_size is None else world_size
    run_dir = Path(run_dir or default_run_dir())
    run_dir.mkdir(parents=True, exist_ok=True)
    binary = Path(odbd) if odbd else find_odbd()
    if not binary.exists():
        raise FileNotFoundError(
            f"odbd binary {binary} does not exist: build it (./scripts/build.sh) or see odb.find_odbd")
    job_id = job_id or f"odb-{uuid.uuid4().hex[:12]}"
    args = [str(binary), "--rank", str(rank), "--world-size", str(world_size), "--run-dir", str(run_dir),
            "--job-id", job_id, "--log-level", log_level]
    if config is not None:
        if isinstance(config, Mapping):
            config_path = run_dir / f"odbd-{rank}.yaml"
            config_path.write_text(json.dumps(config, indent=1))  # JSON is valid YAML
        elif isinstance(config, Path) or (isinstance(config, str) and "\n" not in config
                                          and os.path.exists(config)):
            config_path = Path(config)
        else:
            config_path = run_dir / f"odbd-{rank}.yaml"
            config_path.write_text(str(config))
        args += ["--config", str(config_path)]
    args += list(extra_args or [])
    log_file = Path(log_path) if log_path else run_dir / f"odbd-{rank}.log"
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    eps = Endpoints(f"ipc://{run_dir}/odb-{rank}-in.sock", f"ipc://{run_dir}/odb-{rank}-out.sock")
    daemon = DaemonProcess(proc, rank, run_dir, log_file, eps)
    _SPAWNED[daemon.trainer] = daemon
    if wait:
        daemon.wait_ready(ready_timeout)
    return daemon
