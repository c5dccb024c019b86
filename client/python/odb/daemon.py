"""Running odbd as a sidecar: endpoints from the environment, local spawning.

One daemon serves one training rank. Its sockets are, by default,
``ipc://{run_dir}/odb-{rank}-in.sock`` (producers) and
``ipc://{run_dir}/odb-{rank}-out.sock`` (trainer). A launcher
(`python -m odb.launch`, a Kubernetes sidecar, systemd) starts it and exports
``ODB_RUN_DIR``; the trainer finds it through :func:`endpoints`.
"""
from __future__ import annotations

import atexit
import errno
import functools
import json
import os
import signal
import socket
import subprocess
import threading
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


# odbd's default endpoints ({run}: its run_dir), as `odbd --print-default-config` prints them
# (ingest.endpoints, trainer.endpoint); test_py_docs checks that they agree.
INGEST_PATTERN = "ipc://{run}/odb-{rank}-in.sock"
TRAINER_PATTERN = "ipc://{run}/odb-{rank}-out.sock"


def ipc_endpoints(run_dir: str, rank: int) -> Endpoints:
    """The endpoints odbd binds by default for `rank` in `run_dir`."""
    return Endpoints(INGEST_PATTERN.format(run=run_dir, rank=rank), TRAINER_PATTERN.format(run=run_dir, rank=rank))


def endpoints(rank: Optional[int] = None, run_dir: Optional[str] = None) -> Endpoints:
    """The endpoints of `rank`'s daemon. $ODB_INGEST / $ODB_TRAINER override them."""
    rank = env_rank() if rank is None else rank
    default = ipc_endpoints(run_dir or default_run_dir(), rank)
    ingest = os.environ.get("ODB_INGEST") or default.ingest
    trainer = os.environ.get("ODB_TRAINER") or default.trainer
    return Endpoints(ingest=ingest.replace("{rank}", str(rank)), trainer=trainer.replace("{rank}", str(rank)))


def _ipc_path(endpoint: str) -> Optional[str]:
    return endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None


def _connect_errno(path: str) -> int:
    """0 when something accepts connections on the Unix socket `path`, else the errno.

    A socket file stays behind when its daemon is SIGKILLed (or any daemon
    that did not remove it): connect() then fails with ECONNREFUSED, which is
    how "no daemon" is told apart from "a daemon" without waiting."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(1.0)
        sock.connect(path)
        return 0
    except socket.timeout:
        return errno.ETIMEDOUT
    except OSError as e:
        return e.errno or errno.EIO
    finally:
        sock.close()


def check_reachable(endpoint: str, what: str = "daemon") -> None:
    """Raises OdbError at once when nothing listens on an ipc:// endpoint.

    ZeroMQ connects lazily, so without this check a missing daemon (no socket
    file, or a stale one a dead daemon left) would only show up as a receive
    timeout.
    """
    path = _ipc_path(endpoint)
    if path is None:
        return
    fix = (f"start the {what} (odb.spawn_daemon, python -m odb.launch, systemd odbd@RANK) or fix "
           f"ODB_RUN_DIR / the endpoint")
    if not os.path.exists(path):
        raise native().OdbError(f"no odbd listens at {endpoint} (socket file {path} does not exist): {fix}")
    err = _connect_errno(path)
    if err == errno.ECONNREFUSED:
        raise native().OdbError(
            f"no odbd listens at {endpoint}: the socket file {path} is stale (nothing accepts connections on "
            f"it; the daemon that made it has exited): {fix}")
    if err in (errno.EACCES, errno.EPERM):
        raise native().OdbError(
            f"cannot connect to odbd at {endpoint}: permission denied on {path} (the daemon runs as another "
            f"user: run the trainer in the daemon's group, or the daemon as the trainer's user)")
    if err not in (0, errno.EAGAIN, errno.ETIMEDOUT):  # a full backlog still means a live daemon
        raise native().OdbError(f"cannot connect to odbd at {endpoint} ({path}): {os.strerror(err)}")


def daemon_pid(endpoint: str) -> Optional[int]:
    """The pid of the odbd that holds an ipc:// endpoint, from its lock file
    (``<socket path>.lock``, held by the daemon for its life); None when unknown."""
    path = _ipc_path(endpoint)
    if path is None:
        return None
    try:
        with open(path + ".lock") as f:
            text = f.read(32).strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


class DaemonProcess:
    """One odbd child process. Stop it with :meth:`stop` (also a context manager)."""

    def __init__(self, proc: subprocess.Popen, rank: int, run_dir: Path, log_path: Path,
                 eps: Endpoints, log_offset: int = 0) -> None:
        self.proc = proc
        self.rank = rank
        self.run_dir = run_dir
        self.log_path = log_path
        # The log is appended across runs: this daemon's lines start here.
        self.log_offset = log_offset
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

    def log_text(self) -> str:
        """What this daemon wrote to its log (the file is appended across runs: earlier daemons'
        lines are not this one's); "" when the log cannot be read."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines this daemon wrote (never an earlier run's)."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until the daemon accepts connections on its ipc:// sockets;
        raises at once if it exits first (with its log's tail).

        A socket file alone proves nothing (a daemon that died leaves it
        behind): ready means this daemon holds the endpoint's lock and
        connect() on every socket succeeds."""
        deadline = time.monotonic() + timeout
        paths = [p for p in (_ipc_path(self.ingest), _ipc_path(self.trainer)) if p is not None]
        while True:
            code = self.poll()
            if code is not None:
                raise native().OdbError(
                    f"odbd rank {self.rank} (pid {self.pid}) exited with code {code} during start-up; "
                    f"log {self.log_path}:\n{self.log_tail()}")
            if all(daemon_pid(f"ipc://{p}") == self.pid and _connect_errno(p) == 0 for p in paths):
                return
            if time.monotonic() >= deadline:
                raise native().OdbError(f"odbd rank {self.rank} (pid {self.pid}) not ready after {timeout}s; "
                                        f"log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.02)

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
        if _SPAWNED.get(self.trainer) is self:
            _SPAWNED.pop(self.trainer, None)
        return self.proc.returncode

    def __enter__(self) -> "DaemonProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _die_with_parent(prctl: Any, parent: int) -> None:  # runs in the child between fork and exec
    prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl: nobody would stop us
        os._exit(1)


def _prctl() -> Any:
    """libc's prctl, looked up in the parent (no dlopen between fork and exec)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


def _is_yaml_text(text: str) -> bool:
    """YAML text rather than a path: several lines, a flow mapping, or `key: value`."""
    stripped = text.strip()
    return "\n" in stripped or stripped.startswith("{") or ": " in stripped or stripped.endswith(":")


@atexit.register
def _stop_spawned_at_exit() -> None:
    """A script that ends (or raises) without stopping its daemons does not leave them running."""
    for daemon in list(_SPAWNED.values()):
        if daemon._owner_pid == os.getpid():
            try:
                daemon.stop(timeout=5.0)
            except Exception:  # pragma: no cover - best effort at exit
                pass


def spawned_daemon(trainer_endpoint: str) -> Optional[DaemonProcess]:
    """The daemon this process spawned for that trainer endpoint, if any."""
    return _SPAWNED.get(trainer_endpoint)


def spawn_daemon(rank: Optional[int] = None, world_size: Optional[int] = None,
                 run_dir: Optional[Union[str, Path]] = None, job_id: Optional[str] = None,
                 config: Optional[Union[Mapping[str, Any], str, Path]] = None,
                 odbd: Optional[Union[str, Path]] = None, log_level: str = "info",
                 log_path: Optional[Union[str, Path]] = None, wait: bool = True,
                 ready_timeout: float = 30.0, extra_args: Optional[List[str]] = None,
                 die_with_parent: bool = True) -> DaemonProcess:
    """Starts one odbd for `rank` (local runs, tests, the launcher).

    Args:
      rank, world_size: default to torch.distributed / $RANK / $WORLD_SIZE.
      run_dir: socket and FileStore directory (default $ODB_RUN_DIR or /tmp/odb);
        every rank of a job must use the same one.
      job_id: rendezvous key prefix, fresh per job (default: random). All ranks
        of one job must pass the same id.
      config: a dict (written as JSON, which is YAML), YAML text (several lines, or
        one with ``key: value``), or a path (a Path, or a str without ``": "``), which
        must name an existing file. None: odbd's defaults (labels padded with -100).
      odbd: the binary (default :func:`odb.find_odbd`: $ODBD, `odbd` on PATH, the checkout's
        .build/src/daemon/odbd).
      wait: block until it accepts connections (not possible for W > 1 before
        every rank is started: the daemon joins its peers before it binds).
      die_with_parent: the daemon gets SIGTERM when this process dies (also on
        SIGKILL, when spawned from the main thread); and this process stops
        its daemons at a normal exit (atexit) either way.
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
        elif isinstance(config, Path) or not _is_yaml_text(str(config)):
            config_path = Path(config)
            if not config_path.is_file():
                raise FileNotFoundError(
                    f"odbd config file {config_path} " +
                    ("is a directory" if config_path.is_dir() else "does not exist") +
                    " (pass a path to a YAML file, YAML text, or a dict)")
        else:
            config_path = run_dir / f"odbd-{rank}.yaml"
            config_path.write_text(str(config))
        args += ["--config", str(config_path)]
    args += list(extra_args or [])
    log_file = Path(log_path) if log_path else run_dir / f"odbd-{rank}.log"
    with open(log_file, "ab") as log:
        log_offset = log.seek(0, os.SEEK_END)  # where this daemon's lines begin
        # The daemon dies with the thread that spawned it (PR_SET_PDEATHSIG): a
        # launcher or script killed with SIGKILL leaves no odbd behind. Only
        # from the main thread, whose exit is the process's.
        on_main = threading.current_thread() is threading.main_thread()
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=functools.partial(_die_with_parent, _prctl(), os.getpid())
                                if on_main and die_with_parent else None)
    eps = ipc_endpoints(run_dir, rank)
    daemon = DaemonProcess(proc, rank, run_dir, log_file, eps, log_offset)
    _SPAWNED[daemon.trainer] = daemon
    if wait:
        daemon.wait_ready(ready_timeout)
    return daemon
