"""Helpers for the multi-process integration tests: real odbd processes, real sockets."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".build"
ODBD = BIN / "src/daemon/odbd"
SYNTH = BIN / "client/cpp/odb_synth"
sys.path.insert(0, str(BIN / "proto"))


def require_built() -> None:
    for path in (ODBD, SYNTH, BIN / "proto/odb_pb2.py"):
        if not path.exists():
            raise RuntimeError(f"{path} is missing: run ./scripts/build.sh first")


class Daemon:
    """One odbd process with its own run_dir; stopped (and its log kept) by stop()."""

    def __init__(self, run_dir: Path, rank: int = 0, world: int = 1, config: str = "",
                 job_id: str | None = None, log_level: str = "info", extra_env: dict | None = None,
                 prefix: list[str] | None = None):
        require_built()
        self.run_dir = run_dir
        self.rank = rank
        run_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = run_dir / f"odbd-{rank}.yaml"
        self.config_path.write_text(config)
        self.log_path = run_dir / f"odbd-{rank}.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ)
        env.update(extra_env or {})
        self.proc = subprocess.Popen(
            (prefix or []) + [str(ODBD), "--config", str(self.config_path), "--rank", str(rank), "--world-size",
             str(world), "--run-dir", str(run_dir), "--job-id", job_id or f"t-{uuid.uuid4().hex[:8]}",
             "--log-level", log_level],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)

    @property
    def ingest(self) -> str:
        return f"ipc://{self.run_dir}/odb-{self.rank}-in.sock"

    @property
    def trainer(self) -> str:
        return f"ipc://{self.run_dir}/odb-{self.rank}-out.sock"

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.time() + timeout
        sock = Path(self.ingest[len("ipc://"):])
        while time.time() < deadline:
            if sock.exists() and Path(self.trainer[len("ipc://"):]).exists():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"odbd exited early ({self.proc.returncode}):\n{self.read_log()}")
            time.sleep(0.05)
        raise TimeoutError(f"odbd rank {self.rank} not ready after {timeout}s:\n{self.read_log()}")

    def read_log(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def wait_log(self, text: str, timeout: float = 60.0) -> None:
        """Waits until the daemon's log contains `text` (an event, not a sleep, as synchronisation)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if text in self.read_log():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"odbd exited ({self.proc.returncode}) before logging {text!r}:\n"
                                   f"{self.read_log()}")
            time.sleep(0.05)
        raise TimeoutError(f"odbd rank {self.rank} did not log {text!r} within {timeout}s:\n{self.read_log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def produce(endpoint: str, producer_id: str, count: int, seed: int, id_offset: int = 0,
            extra: list[str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [str(SYNTH), "produce", "--endpoint", endpoint, "--producer-id", producer_id, "--count",
         str(count), "--seed", str(seed), "--id-offset", str(id_offset)] + (extra or []),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def consume(endpoint: str, expected_producers: int, extra: list[str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [str(SYNTH), "consume", "--endpoint", endpoint, "--expected-producers",
         str(expected_producers), "--timeout-ms", "60000"] + (extra or []),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120.0) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def epochs(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def run_epoch(daemons: list[Daemon], counts: list[int], consumer_extra: list[str] | None = None,
              max_len: int = 1024) -> list[dict]:
    """Runs one epoch on already-started daemons: one verifying consumer and one producer per
    rank (rank r sends counts[r] samples with ids r*1e6 + k; an empty stream still ends), and
    returns each rank's epoch JSON. Fails with the daemon log on any error."""
    for d in daemons:
        d.wait_ready(timeout=60)
    consumers = [consume(d.trainer, expected_producers=1,
                         extra=["--rank", str(d.rank)] + (consumer_extra or [])) for d in daemons]
    for d in daemons:
        rc, _, err = finish(produce(d.ingest, f"r{d.rank}", counts[d.rank], seed=d.rank,
                                    id_offset=d.rank * 1_000_000, extra=["--max-len", str(max_len)]))
        assert rc == 0, err
    return collect_epochs(daemons, consumers)


def collect_epochs(daemons: list[Daemon], consumers: list[subprocess.Popen]) -> list[dict]:
    """Each rank's one epoch JSON from its consumer; fails with the daemon log on any error."""
    results = []
    for d, c in zip(daemons, consumers):
        rc, out, err = finish(c, timeout=120)
        assert rc == 0, f"rank {d.rank}: {err}\n{d.read_log()}"
        (e,) = epochs(out)
        results.append(e)
    return results
