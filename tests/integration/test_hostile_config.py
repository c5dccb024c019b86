"""Hostile start-up input to a real odbd: the settings of sessions 11-12 (buffer.max_id_runs,
round_trace) with bad values, and rank / world size from the command line and the environment.
Each is refused at start-up with exit 2 and a message naming what was wrong; none starts a
daemon under another rank than the one asked for."""
from __future__ import annotations

import os
import subprocess

import pytest

from odbtest import ODBD, require_built


def _odbd(tmp_path, args: list[str], env: dict[str, str] | None = None, config: str = "{}\n"):
    require_built()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(config)
    full_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                   "LOCAL_WORLD_SIZE")}
    full_env.update(env or {})
    return subprocess.run([str(ODBD), "--config", str(cfg), "--run-dir", str(tmp_path / "run"),
                           "--print-config", *args], capture_output=True, text=True, timeout=30,
                          env=full_env)


@pytest.mark.parametrize("text,expected", [
    ("buffer: {max_id_runs: -1}\n", "'buffer.max_id_runs': cannot read '-1'"),
    ("buffer: {max_id_runs: 0}\n", "'buffer.max_id_runs': 0 must be between buffer.max_samples"),
    ("buffer: {max_id_runs: 65535}\n", "'buffer.max_id_runs': 65535 must be between"),
    ("buffer: {max_id_runs: 4294967297}\n", "'buffer.max_id_runs': 4294967297 must be between"),
    ("buffer: {max_id_runs: 99999999999999999999999}\n", "use a whole number in 0..18446744073709551615"),
    ("buffer: {max_id_runs: '1e9'}\n", "'buffer.max_id_runs'"),
    ("buffer: {max_id_runs: [4194304]}\n", "'buffer.max_id_runs'"),
    ("buffer: {max_id_runs: }\n", "'buffer.max_id_runs' has no value"),
    ("round_trace: [a]\n", "'round_trace': cannot read"),
    ("round_trace: \n", "'round_trace' has no value"),
    pytest.param("round_trace: '" + "x" * 5000 + "'\n", "'round_trace'", id="round_trace-5000-bytes"),
    ("round_trace: \"a\\0b\"\n", "'round_trace': must not contain a NUL byte"),
])
def test_new_settings_with_bad_values_stop_startup_naming_the_key(tmp_path, text, expected):
    r = _odbd(tmp_path, [], config=text)
    assert r.returncode == 2, r.stdout + r.stderr
    assert expected in r.stderr, r.stderr
    assert len(r.stderr) < 1000  # a pasted blob is shortened, not echoed


@pytest.mark.parametrize("text", ["buffer: {max_id_runs: 65536}\n", "buffer: {max_id_runs: 4294967296}\n",
                                  "round_trace: '{run}/rounds-{rank}.txt'\n"])
def test_new_settings_at_their_bounds_are_accepted(tmp_path, text):
    r = _odbd(tmp_path, [], config=text)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("variable,value", [
    ("RANK", "4294967296"),            # wrapped to rank 0 by a cast
    ("RANK", "99999999999999999999"),  # clamped, then wrapped to rank -1
    ("RANK", "+1"), ("RANK", " 1"),
    ("WORLD_SIZE", "4294967298"),      # wrapped to 2
    ("LOCAL_WORLD_SIZE", "4294967297"),
])
def test_rank_from_the_environment_out_of_int_range_is_refused(tmp_path, variable, value):
    env = {"RANK": "0", "WORLD_SIZE": "2"}
    env[variable] = value
    r = _odbd(tmp_path, [], env=env)
    assert r.returncode == 2, r.stdout
    assert f"environment variable {variable}='" in r.stderr, r.stderr


@pytest.mark.parametrize("args,expected", [
    (["--rank", "-5"], "--rank"),              # was ignored: the daemon started as rank 0
    (["--rank", "4294967296"], "--rank"),
    (["--world-size", "0"], "--world-size"),
    (["--world-size", "-3"], "--world-size"),  # was ignored
    (["--no-such-flag"], "--no-such-flag"),
])
def test_bad_rank_or_world_size_on_the_command_line_exits_2_naming_the_flag(tmp_path, args, expected):
    r = _odbd(tmp_path, args, env={"RANK": "0", "WORLD_SIZE": "1"})
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert expected in r.stdout + r.stderr
    assert "rank=" not in r.stdout  # no effective config printed: it did not start


def test_good_rank_from_flags_and_environment_is_taken(tmp_path):
    r = _odbd(tmp_path, ["--rank", "1", "--world-size", "2"])
    assert r.returncode == 0, r.stderr
    assert "rank=1/2" in r.stdout
    r = _odbd(tmp_path, [], env={"RANK": "1", "WORLD_SIZE": "2"})
    assert r.returncode == 0, r.stderr
    assert "rank=1/2" in r.stdout
