"""Issue 19: the documented paths work the second time too. Real odbd processes.

Each test names the failure it guards against: a second run with the same job
id in the same run_dir, a live duplicate job id, stale socket files of a dead
daemon, a daemon dying at start-up or mid-epoch, daemons outliving their
spawner, a missing config path, the labels pad default, the multi-host address
overrides.
"""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import List

import pytest

import odb
import tiny_lm
from odb._native import find_built, native

ROOT = Path(__file__).resolve().parents[2]
ODBD = str(find_built("src/daemon/odbd", "ODB_ODBD"))


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout}s")
        time.sleep(0.02)


def _run_epoch(daemons: List[odb.DaemonProcess], samples: int = 20) -> List[int]:
    """One epoch through every rank's daemon (a producer and a consumer per rank); the samples each rank got."""
    lib = native()
    int64 = lib.DTYPES["int64"]
    got: List[List[int]] = [[] for _ in daemons]
    errors: List[str] = []

    def produce(r: int) -> None:
        try:
            p = lib.Producer(daemons[r].ingest, f"p{r}", r)
            p.start_epoch(0)
            for i in range(samples):
                n = 4 + (i * 7 + r) % 30
                p.send(r * 1000 + i, 0, n, 0, 0, [("input_ids", int64, (n,), struct.pack(f"<{n}q", *range(n)))])
            p.end_stream(0)
        except Exception as e:  # reported below
            errors.append(f"producer {r}: {e!r}")

    def consume(r: int) -> None:
        try:
            c = lib.Consumer(daemons[r].trainer, 30000)
            c.start_epoch(0, 1)
            while True:
                d = c.next()
                if not d.is_step:
                    break
                got[r] += list(d.step.sample_ids)
        except Exception as e:  # reported below
            errors.append(f"consumer {r}: {e!r}")

    threads = [threading.Thread(target=f, args=(r,)) for r in range(len(daemons)) for f in (produce, consume)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    everything = sorted(i for g in got for i in g)
    assert everything == sorted(r * 1000 + i for r in range(len(daemons)) for i in range(samples))
    return [len(g) for g in got]


def _start(run_dir: Path, world: int, job_id: str) -> List[odb.DaemonProcess]:
    daemons = [odb.spawn_daemon(r, world, run_dir, job_id=job_id, wait=False, log_level="info")
               for r in range(world)]
    for d in daemons:
        d.wait_ready(60)
    return daemons


@pytest.mark.parametrize("first_run_ends", ["SIGTERM", "SIGKILL"])
def test_a_second_run_with_the_same_job_id_in_the_same_run_dir_works(run_dir: Path, first_run_ends: str) -> None:
    # The first run ends cleanly (its last daemon removes the job's keys) or is
    # SIGKILLed (the keys stay: the next run's first daemon removes them).
    first = _start(run_dir, 2, "myjob")
    _run_epoch(first)
    for d in first:
        d.stop(signal.SIGTERM if first_run_ends == "SIGTERM" else signal.SIGKILL)
    second = _start(run_dir, 2, "myjob")
    try:
        _run_epoch(second)
    finally:
        for d in second:
            d.stop()
    if first_run_ends == "SIGKILL":
        assert "removed the rendezvous keys a previous run" in (second[0].log_tail(200) + second[1].log_tail(200))


def test_two_live_jobs_with_one_id_are_a_clear_error_at_once(run_dir: Path, job_id: str) -> None:
    live = _start(run_dir, 2, job_id)
    try:
        dup = odb.spawn_daemon(0, 2, run_dir, job_id=job_id, wait=False, log_path=run_dir / "dup.log")
        with pytest.raises(odb.OdbError) as e:
            dup.wait_ready(30)
        text = str(e.value)
        assert f"job id '{job_id}' is in use" in text and f"pid {live[0].pid}" in text and "--job-id" in text, text
        assert dup.poll() == 3
        _run_epoch(live)  # the live job is untouched
    finally:
        for d in live:
            d.stop()


def test_sockets_are_removed_on_exit_and_a_stale_one_fails_fast(run_dir: Path) -> None:
    clean = odb.spawn_daemon(0, 1, run_dir / "clean", log_level="warn")
    socket_paths = [clean.ingest[len("ipc://"):], clean.trainer[len("ipc://"):]]
    assert all(os.path.exists(p) for p in socket_paths)
    assert clean.stop() == 0
    assert not [p for p in socket_paths if os.path.exists(p)], "a cleanly stopped daemon left its sockets"

    killed = odb.spawn_daemon(0, 1, run_dir / "killed", log_level="warn")
    killed.stop(signal.SIGKILL)
    assert os.path.exists(killed.trainer[len("ipc://"):])  # SIGKILL leaves them: detected at connect
    loader = odb.OdbDataLoader(tiny_lm.SyntheticCorpus([5, 6, 7]), rank=0, world_size=1,
                               run_dir=str(run_dir / "killed"), num_workers=0, timeout_s=120)
    start = time.monotonic()
    with pytest.raises(odb.OdbError) as e:
        next(iter(loader))
    elapsed = time.monotonic() - start
    assert "no odbd listens" in str(e.value) and "stale" in str(e.value)
    assert killed.ingest[len("ipc://"):] in str(e.value) or killed.trainer[len("ipc://"):] in str(e.value)
    assert elapsed < 5, f"{elapsed:.1f}s: a stale socket must fail at once, not wait for timeout_s"


def test_wait_ready_reports_a_daemon_that_died_at_start_up_despite_stale_sockets(run_dir: Path) -> None:
    killed = odb.spawn_daemon(0, 1, run_dir, log_level="warn")
    killed.stop(signal.SIGKILL)  # leaves odb-0-{in,out}.sock behind
    bad = odb.spawn_daemon(0, 1, run_dir, config={"grouping": {"max_tokens": -5}}, wait=False)
    with pytest.raises(odb.OdbError) as e:
        bad.wait_ready(30)
    assert "exited with code 2 during start-up" in str(e.value) and "max_tokens" in str(e.value), str(e.value)


SCRIPT_KILLS_ITS_DAEMON = textwrap.dedent("""
    import os, signal, sys, time
    sys.path[:0] = [{client!r}, {examples!r}]
    import odb, tiny_lm

    def main():
        run_dir, spawned = sys.argv[1], sys.argv[2] == "spawned"
        if spawned:
            d = odb.spawn_daemon(0, 1, run_dir, log_level="warn")
            pid = d.pid
        else:  # started by another process (a launcher): known to the loader only by its lock file
            pid = int(open(run_dir + "/odb-0-out.sock.lock").read())
        loader = odb.OdbDataLoader(tiny_lm.SyntheticCorpus([20] * 3000), rank=0, world_size=1, run_dir=run_dir,
                                   num_workers=int(sys.argv[3]), timeout_s=120, poll_ms=200)
        start = None
        try:
            for i, step in enumerate(loader):
                if i == 2:
                    os.kill(pid, signal.SIGKILL)
                    start = time.monotonic()
        except odb.OdbError as e:
            print(f"REPORTED {{time.monotonic() - start:.2f}} {{e}}")

    if __name__ == "__main__":
        main()
""").format(client=str(ROOT / "client/python"), examples=str(ROOT / "examples"))


@pytest.mark.parametrize("who,workers", [("spawned", 0), ("spawned", 1), ("other", 0)])
def test_a_killed_daemon_is_reported_within_poll_ms_not_after_10s(run_dir: Path, who: str, workers: int) -> None:
    script = run_dir / "train.py"
    script.write_text(SCRIPT_KILLS_ITS_DAEMON)
    other = None
    if who == "other":
        other = subprocess.Popen([ODBD, "--rank", "0", "--world-size", "1", "--run-dir", str(run_dir),
                                  "--log-level", "warn"], stdin=subprocess.DEVNULL)
        _wait_for(lambda: odb.daemon.daemon_pid(f"ipc://{run_dir}/odb-0-out.sock") == other.pid, 30,
                  "the daemon's lock file")
    try:
        out = subprocess.run([sys.executable, str(script), str(run_dir), who, str(workers)], capture_output=True,
                             text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    finally:
        if other is not None:
            other.kill()
            other.wait()
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("REPORTED")]
    assert line, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr[-3000:]}"
    seconds = float(line[0].split()[1])
    assert "exited" in line[0] or "is gone" in line[0], line[0]
    # poll_ms (0.2 s) plus scheduling on a loaded machine; before the fix: 10.2 s (the pump's
    # send could not be cancelled), or timeout_s (120 s) for a daemon this process did not spawn.
    assert seconds < 5, line[0]


SCRIPT_CRASHES = textwrap.dedent("""
    import os, signal, sys
    sys.path[:0] = [{client!r}]
    import odb
    d = odb.spawn_daemon(0, 1, sys.argv[1], log_level="warn")
    print(d.pid, flush=True)
    if sys.argv[2] == "raise":
        raise RuntimeError("the training script crashed")
    os.kill(os.getpid(), signal.SIGKILL)
""").format(client=str(ROOT / "client/python"))


@pytest.mark.parametrize("how", ["raise", "SIGKILL"])
def test_a_crashed_script_does_not_leave_its_daemon_running(run_dir: Path, how: str) -> None:
    script = run_dir / "crash.py"
    script.write_text(SCRIPT_CRASHES)
    out = subprocess.run([sys.executable, str(script), str(run_dir), how], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.split()[0])
    _wait_for(lambda: not odb.daemon.pid_alive(pid), 15, f"odbd pid {pid} exiting after its script ({how})")


def test_a_config_path_that_does_not_exist_is_an_error_naming_it(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="odbd.yaml does not exist"):
        odb.spawn_daemon(0, 1, run_dir, config="odbd.yaml")
    with pytest.raises(FileNotFoundError, match="is a directory"):
        odb.spawn_daemon(0, 1, run_dir, config=str(tmp_path))
    proc = subprocess.run([ODBD, "--config", str(run_dir / "nope.yaml"), "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "nope.yaml' does not exist" in proc.stderr, proc.stderr
    # YAML text still works (one line with "key: value", or several lines).
    d = odb.spawn_daemon(0, 1, run_dir, config="grouping: {max_tokens: 64}", log_level="warn")
    d.stop()


def test_labels_are_padded_with_minus_100_without_any_config(run_dir: Path) -> None:
    d = odb.spawn_daemon(0, 1, run_dir, log_level="warn")  # no config at all
    try:
        loader = odb.OdbDataLoader(tiny_lm.SyntheticCorpus([3, 9, 5, 12]), rank=0, world_size=1,
                                   run_dir=str(run_dir), num_workers=0, shuffle=False, timeout_s=60)
        padded = 0
        for step in loader:
            labels, mask = step.batch["labels"], step.batch["attention_mask"]
            assert (labels[mask == 0] == -100).all(), labels
            assert (labels[mask == 1] != -100).all()
            padded += int((mask == 0).sum())
        assert padded > 0, "the samples should have needed padding"
    finally:
        d.stop()


def test_gloo_address_from_the_environment_and_the_command_line(run_dir: Path) -> None:
    def described(extra: List[str], env: dict) -> str:
        proc = subprocess.run([ODBD, "--rank", "0", "--world-size", "2", "--run-dir", str(run_dir), "--print-config",
                               *extra], capture_output=True, text=True, timeout=30, env=dict(os.environ, **env))
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "gloo=127.0.0.1" in described([], {})
    assert "gloo=10.1.2.3" in described([], {"ODB_GLOO_HOSTNAME": "10.1.2.3"})
    assert "gloo=10.9.9.9" in described(["--gloo-hostname", "10.9.9.9"], {"ODB_GLOO_HOSTNAME": "10.1.2.3"})
    assert "gloo=iface:lo" in described([], {"ODB_GLOO_IFACE": "lo"})


def test_launcher_job_id_and_multi_host_address_come_from_the_launchers_environment() -> None:
    from odb import launch

    assert launch.default_job_id({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77"}) == "77"
    assert launch.default_job_id({"TORCHELASTIC_RUN_ID": "abc"}) == "abc"
    assert launch.default_job_id({"TORCHELASTIC_RUN_ID": "none"}) is None  # then --job-id is required
    a = launch.parser().parse_args(["train.py"])
    multi = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1"}
    assert launch.gloo_args(a, multi) == ["--gloo-hostname", "127.0.0.1"]  # the address toward MASTER_ADDR
    assert launch.gloo_args(a, dict(multi, ODB_GLOO_HOSTNAME="10.0.0.7")) == []  # odbd reads it itself
    assert launch.gloo_args(a, {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h"}) == []  # one host
    a = launch.parser().parse_args(["--gloo-hostname", "10.1.1.1", "train.py"])
    assert launch.gloo_args(a, multi) == ["--gloo-hostname", "10.1.1.1"]
