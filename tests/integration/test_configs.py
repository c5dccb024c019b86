"""Shipped configs load, and config errors name the field and stop start-up."""
from __future__ import annotations

import subprocess

import pytest

from odbtest import ODBD, ROOT, require_built


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_config_loads(path):
    require_built()
    r = subprocess.run([str(ODBD), "--config", str(path), "--rank", "0", "--world-size", "1",
                        "--print-config"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "max_tokens=" in r.stdout
    assert "planner=" in r.stdout and "start_wait_ms=" in r.stdout  # the alignment knobs are shown too


@pytest.mark.parametrize("text,field", [
    ("grouping: {windo: 3}\n", "grouping.windo"),
    ("alignment: {mode: maybe}\n", "alignment.mode"),
    ("emit: {outstanding_depth: 0}\n", "emit.outstanding_depth"),
    ("buffer: {max_bytes: lots}\n", "buffer.max_bytes"),
])
def test_bad_config_names_the_field(tmp_path, text, field):
    require_built()
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    r = subprocess.run([str(ODBD), "--config", str(cfg), "--run-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert field in r.stderr, r.stderr


def test_unreachable_redis_store_fails_startup_not_hangs(tmp_path):
    require_built()
    cfg = tmp_path / "redis.yaml"
    # Port 1 on loopback: nothing listens there.
    cfg.write_text("alignment: {store: redis, redis_port: 1, connect_timeout_ms: 3000}\n")
    r = subprocess.run([str(ODBD), "--config", str(cfg), "--rank", "0", "--world-size", "2",
                        "--run-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3
    assert "redis" in (r.stdout + r.stderr).lower()


def test_run_dir_from_the_environment_as_the_python_client_reads_it(tmp_path):
    """odbd ignored $ODB_RUN_DIR, which the Python client uses to find the sockets: a daemon started by
    hand in such an environment put them in /tmp/odb and the client found none. --run-dir > env > file."""
    require_built()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run_dir: {tmp_path}/file\n")

    def endpoints(extra, env):
        import os

        r = subprocess.run([str(ODBD), "--config", str(cfg), "--rank", "0", "--world-size", "1", "--print-config",
                            *extra], capture_output=True, text=True, timeout=30, env=dict(os.environ, **env))
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert f"{tmp_path}/file/odb-0-in.sock" in endpoints([], {})
    assert f"{tmp_path}/env/odb-0-in.sock" in endpoints([], {"ODB_RUN_DIR": f"{tmp_path}/env"})
    assert f"{tmp_path}/flag/odb-0-in.sock" in endpoints(["--run-dir", f"{tmp_path}/flag"],
                                                         {"ODB_RUN_DIR": f"{tmp_path}/env"})
