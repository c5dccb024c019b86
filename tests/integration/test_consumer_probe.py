"""The C++ client facing no daemon (issue 31, finding 6): a stale socket file, a missing one and a
daemon killed while the consumer waits are named at once, not after the receive timeout (60 s here;
the Python loader already failed in 1 ms)."""
from __future__ import annotations

import signal
import socket
from pathlib import Path

from odbtest import Daemon, consume, finish


def test_a_stale_socket_file_is_named_at_connect(tmp_path: Path) -> None:
    path = tmp_path / "odb-0-out.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))  # a socket file with nothing behind it: what a SIGKILLed daemon leaves
    s.close()
    rc, _, err = finish(consume(f"ipc://{path}", expected_producers=1), timeout=30)
    assert rc != 0 and "is stale" in err and str(path) in err, err
    assert "no step from the daemon" not in err, err  # not the receive timeout


def test_a_missing_socket_file_is_named_at_connect(tmp_path: Path) -> None:
    path = tmp_path / "odb-0-out.sock"
    rc, _, err = finish(consume(f"ipc://{path}", expected_producers=1), timeout=30)
    assert rc != 0 and "does not exist" in err and str(path) in err, err


def test_a_daemon_killed_while_the_consumer_waits_is_named(tmp_path: Path) -> None:
    d = Daemon(tmp_path)
    try:
        d.wait_ready()
        c = consume(d.trainer, expected_producers=1)  # no producer: it waits for a step
        d.wait_log("trainer session")  # the consumer's session is open: it is waiting now
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        rc, _, err = finish(c, timeout=30)
    finally:
        d.stop()
    assert rc != 0 and f"odbd (pid {d.proc.pid})" in err and "is gone" in err, err
    assert "no step from the daemon" not in err, err
