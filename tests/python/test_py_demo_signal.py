"""A killed main job leaves nothing behind: after SIGTERM to an example's main process (examples/train_demo.py,
examples/multimodal_train.py) its rank processes exit, their odbd daemons (they die with their rank) and their
DataLoader send workers (odb's pump: a worker exits with the rank that started it; before, forkserver workers
lived on for good). The jobs start as a script's `job &` starts them, with SIGINT ignored: torch's spawn gives
each rank SIGINT when its parent dies, which such a rank ignores, and it trained on until its epochs ended
(tiny_lm.die_with_parent: SIGTERM instead). The jobs are long, so only the kill can stop them in time."""
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _processes() -> Dict[int, Tuple[int, str, str]]:
    """pid -> (parent pid, state, command line) of every process /proc shows."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        out[int(entry)] = (int(fields[1]), fields[0], cmd)
    return out


def _descendants(root: int) -> List[int]:
    procs = _processes()
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, _) in procs.items():
            if ppid == parent:
                found.append(pid)
                frontier.append(pid)
    return found


def _cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()  # state is fields[0]; utime, stime are fields 11, 12
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _alive(pids: List[int]) -> List[str]:
    procs = _processes()
    return [f"{pid}: {procs[pid][2][:120]}" for pid in pids if pid in procs and procs[pid][1] != "Z"]


def _wait_for(predicate, timeout: float, what: str):
    """Polls `predicate` until it returns something truthy (the event), or fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


JOBS = {
    "train_demo": ["examples/train_demo.py", "--methods", "odb", "--samples", "4000", "--epochs", "60",
                   "--workers", "1", "--quiet"],
    "multimodal_train": ["examples/multimodal_train.py", "--methods", "odb_phases_packed", "--samples", "48",
                         "--heldout", "8", "--epochs", "4000", "--d-model", "32", "--layers", "1", "--vision-width",
                         "32", "--audio-width", "16", "--enc-layers", "1", "--batch", "4", "--global-batch", "16",
                         "--max-tokens", "512", "--workers", "1", "--quiet"],
}


@pytest.mark.parametrize("example", sorted(JOBS))
def test_sigterm_to_the_main_job_stops_its_ranks_and_daemons(example: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1",
               ODB_NATIVE_LIB=str(ROOT / ".build/client/python/_odb_native.so"),
               ODB_ODBD=str(ROOT / ".build/src/daemon/odbd"))
    script, *args = JOBS[example]
    # Started as `job &` in a shell script starts it (or nohup ... &): SIGINT ignored, which the ranks inherit,
    # so torch's own parent-death signal for them (SIGINT) does nothing.
    job = subprocess.Popen(["/usr/bin/python3", str(ROOT / script), *args], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                           preexec_fn=functools.partial(signal.signal, signal.SIGINT, signal.SIG_IGN))
    tree: List[int] = []
    try:
        def running():  # both daemons, and each rank's forkserver with its send worker (--workers 1)
            kids = _descendants(job.pid)
            procs = _processes()
            daemons = [pid for pid in kids if pid in procs and "odbd" in procs[pid][2].split(" ")[0]]
            workers = [pid for pid in kids if pid in procs and "multiprocessing.forkserver" in procs[pid][2]]
            return kids if len(daemons) == 2 and len(workers) >= 4 else None

        tree = _wait_for(running, 180, "the job's two daemons and its ranks' send workers")
        # The kill comes while the ranks train: each has computed for 5 s since then.
        procs = _processes()
        ranks = [pid for pid in tree if procs.get(pid, (0, "", ""))[0] == job.pid
                 and "multiprocessing.spawn" in procs[pid][2]]
        assert len(ranks) == 2, [procs.get(pid) for pid in tree]
        started = {pid: _cpu_seconds(pid) for pid in ranks}
        _wait_for(lambda: all(_cpu_seconds(pid) >= started[pid] + 5 for pid in ranks), 300,
                  "both ranks to compute for 5 s")
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=30)
        # The event: every rank and daemon of the job has exited (reaped or a zombie of init).
        try:
            _wait_for(lambda: not _alive(tree), 60, "the ranks and daemons to exit")
        except AssertionError:
            raise AssertionError("still running after the job was killed:\n" + "\n".join(_alive(tree)))
    finally:
        for pid in [job.pid] + (tree or _descendants(job.pid)):  # what is left, pass or fail
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if job.poll() is None:
            job.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(subprocess.call(["/usr/bin/python3", "-m", "pytest", "-q", __file__]))
