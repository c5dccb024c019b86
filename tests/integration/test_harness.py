"""The test harness itself: a daemon a test starts is gone when the test stops it."""
from __future__ import annotations

from pathlib import Path

from odbtest import Daemon


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (children listed by /proc/<pid>/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for children in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                kids = [int(c) for c in children.read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_daemon_under_a_wrapper_is_stopped_with_it(tmp_path: Path) -> None:
    """`unshare --pid --fork odbd ...` (test_deploy's PID-namespace case): stopping the wrapper
    alone left odbd running after the suite (it does not pass SIGTERM on to its child)."""
    d = Daemon(tmp_path, prefix=["unshare", "--pid", "--fork"])
    try:
        d.wait_ready()
        under = _descendants(d.proc.pid)
        assert under, "the wrapper has no child: odbd is not running under it"
    finally:
        d.stop()
    left = [p for p in under if _alive(p)]
    assert not left, f"processes the daemon's wrapper started are still running: {left}"
