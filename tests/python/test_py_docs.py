"""The docs cannot drift from the code (issue 19).

* Every fenced ```sh / ```python block of README.md, docs/python.md and docs/hand-run.md runs,
  as a user would (the torchrun command and the W > 1 recipe twice in a row
  in the same run_dir), unless the line before it is a
  `<!-- docs-test: skip (reason) -->` marker; the skips are counted.
* configs/odbd.yaml is `odbd --print-config-template`: the settings table (src/daemon/settings.cc) with
  every field, its default and its doc.
* deploy/odbd@.service: per-instance settings checked, `systemd-analyze verify` clean.
* `odbctl demo` without odbd, `python -m odb.launch` with a missing config: one line.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import yaml

from odb._native import find_built

ROOT = Path(__file__).resolve().parents[2]
ODBD = str(find_built("src/daemon/odbd", "ODB_ODBD"))
DOCS = ["README.md", "docs/python.md", "docs/hand-run.md"]
MARKER = re.compile(r"<!--\s*docs-test:\s*(run|twice|skip)\s*(?:\((.+)\))?\s*-->")


def blocks(doc: str) -> List[Tuple[int, str, str, str]]:
    """(line, language, marker, text) of every ```sh / ```bash / ```python block."""
    lines = (ROOT / doc).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(sh|bash|python)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = len(m.group(1)), m.group(2), i
        marker = MARKER.search(lines[i - 1]) if i > 0 else None
        kind = marker.group(1) if marker else "run"
        if kind == "skip":
            assert marker.group(2), f"{doc}:{i + 1}: a skip marker needs a reason in parentheses"
        i += 1
        body = []
        while not lines[i].strip().startswith("```"):
            body.append(lines[i][indent:])
            i += 1
        found.append((start + 1, lang, kind, "\n".join(body) + "\n"))
        i += 1
    return found


ALL = [(doc, *b) for doc in DOCS for b in blocks(doc)]


def test_every_block_is_run_or_skipped_with_a_reason() -> None:
    skipped = [(d, line) for d, line, _, kind, _ in ALL if kind == "skip"]
    ran = [(d, line) for d, line, _, kind, _ in ALL if kind != "skip"]
    # Counted: a new block runs here by default; a new skip must be added on purpose (update the count).
    assert len(skipped) == 7, f"skipped blocks changed: {skipped}"
    assert len(ran) >= 4, ran
    print(f"docs blocks: {len(ran)} run, {len(skipped)} skipped: {skipped}")


@pytest.mark.parametrize("doc,line,lang,kind,text", [b for b in ALL if b[3] != "skip"],
                         ids=[f"{b[0]}:{b[1]}" for b in ALL if b[3] != "skip"])
def test_doc_block_runs(tmp_path: Path, doc: str, line: int, lang: str, kind: str, text: str) -> None:
    # The suite runs after ./scripts/build.sh (conftest checks .build/): a block's build line is not repeated.
    text = "\n".join(ln for ln in text.splitlines() if ln.strip() != "./scripts/build.sh") + "\n"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to("/usr/bin/python3")  # the interpreter with torch (common rules)
    # What `pip install ./client/python` puts on PATH (its console script), here from the checkout.
    (bin_dir / "odbctl").write_text('#!/bin/sh\nexec /usr/bin/python3 -m odb.cli "$@"\n')
    (bin_dir / "odbctl").chmod(0o755)
    run_dir = Path(f"/tmp/odbdoc-{os.getpid()}-{line}")  # short: ipc paths must stay under 108 bytes
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ODB_RUN_DIR=str(run_dir),
               PYTHONPATH=str(ROOT / "client/python"), OMP_NUM_THREADS="1", ODBD=ODBD)
    cmd = ["bash", "-euo", "pipefail", "-c", text] if lang in ("sh", "bash") else ["/usr/bin/python3", "-c", text]
    try:
        for attempt in range(2 if kind == "twice" else 1):
            # Its own session: whatever a failing block left in the background is killed with it.
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
            try:
                stdout, stderr = proc.communicate(timeout=240)
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
            assert proc.returncode == 0, (f"{doc}:{line} (run {attempt + 1}) exited {proc.returncode}\n"
                                          f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-5000:]}")
    finally:
        subprocess.run(["rm", "-rf", str(run_dir)])


def _flatten(node: dict, prefix: str = "") -> Dict[str, object]:
    out: Dict[str, object] = {}
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def test_configs_odbd_yaml_is_the_settings_tables_template() -> None:
    """configs/odbd.yaml is what `odbd --print-config-template` makes from the settings table (src/daemon/settings.cc):
    every setting, its default and its doc come from the table's row; regenerate it after changing a row."""
    out = subprocess.run([ODBD, "--print-config-template"], capture_output=True, text=True, timeout=30, check=True)
    committed = (ROOT / "configs/odbd.yaml").read_text()
    assert committed == out.stdout, ("configs/odbd.yaml differs from the settings table: run "
                                     "`.build/src/daemon/odbd --print-config-template > configs/odbd.yaml`")
    # ... and it is a config odbd reads as every default, as the flat print says them.
    flat = subprocess.run([ODBD, "--print-default-config"], capture_output=True, text=True, timeout=30, check=True)
    parser = {path: yaml.safe_load(value) for path, value in
              (line.split(": ", 1) for line in flat.stdout.splitlines())}
    documented = _flatten(yaml.safe_load(committed))
    assert len(parser) > 50
    assert documented == parser


def test_the_python_packages_daemon_defaults_are_odbds(monkeypatch) -> None:
    """What the Python side assumes of odbd's defaults (issue 34: a setting said in two places must not drift):
    the socket names, the run directory, the label value that counts no token, the length field."""
    from odb import daemon, encoding

    monkeypatch.delenv("ODB_RUN_DIR", raising=False)  # both sides' own default, not the environment's
    out = subprocess.run([ODBD, "--print-default-config"], capture_output=True, text=True, timeout=30, check=True,
                         env=dict(os.environ))
    parser = {path: yaml.safe_load(value) for path, value in (line.split(": ", 1) for line in out.stdout.splitlines())}
    assert parser["ingest_endpoints"] == [daemon.INGEST_PATTERN]
    assert parser["trainer_endpoint"] == daemon.TRAINER_PATTERN
    assert parser["run_dir"] == daemon.default_run_dir()
    labels = [f for f in parser["collate.fields"] if f["name"] == "labels"]
    assert labels and labels[0]["pad_value"] == encoding.IGNORE_INDEX, parser["collate.fields"]
    assert parser["collate.length_field"] == encoding.LENGTH_FIELD  # what the loader measures until odbd says
    eps = daemon.ipc_endpoints("/r", 3)
    assert (eps.ingest, eps.trainer) == ("ipc:///r/odb-3-in.sock", "ipc:///r/odb-3-out.sock")


def _unit(path: Path) -> Dict[str, Dict[str, str]]:
    sections: Dict[str, Dict[str, str]] = {}
    current = None
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        else:
            key, value = line.split("=", 1)
            current[key.strip()] = value.strip()
    return sections


def test_systemd_unit_is_per_instance_safe_non_root_and_verifies(tmp_path: Path) -> None:
    unit = ROOT / "deploy/odbd@.service"
    service = _unit(unit)["Service"]
    assert service.get("User") not in (None, "", "root", "0") and service.get("Group") not in (None, "", "root")
    # Stopping one instance must not delete the directory every instance's sockets are in.
    per_instance = "%i" in service.get("RuntimeDirectory", "")
    assert per_instance or service.get("RuntimeDirectoryPreserve") == "yes", service
    run_dir = "/run/" + service["RuntimeDirectory"].replace("%i", "{i}")
    assert f"--run-dir {run_dir}" in service["ExecStart"].replace("{i}", "%i"), service["ExecStart"]
    assert "ODB_RUN_DIR=/run/odb" in unit.read_text()  # what the trainer sets
    (tmp_path / "odbd@.service").write_text(unit.read_text())
    (tmp_path / "odbd@0.service").symlink_to("odbd@.service")
    if shutil.which("systemd-analyze") is None:  # scripts/install_deps.sh installs it
        pytest.skip("systemd-analyze is not installed (apt install systemd)")
    verify = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "odbd@0.service")], capture_output=True,
                            text=True, timeout=60)
    problems = [ln for ln in verify.stderr.splitlines() if "odbd@" in ln]
    assert verify.returncode == 0 and not problems, verify.stderr
    # verify does check: a misspelt key is reported.
    (tmp_path / "bad@.service").write_text(unit.read_text().replace("RuntimeDirectoryPreserve", "RuntimeDirPreserve"))
    (tmp_path / "bad@0.service").symlink_to("bad@.service")
    bad = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "bad@0.service")], capture_output=True,
                         text=True, timeout=60)
    assert "RuntimeDirPreserve" in bad.stderr


def test_odbctl_demo_without_odbd_is_one_line_not_a_traceback() -> None:
    env = dict(os.environ, ODBD="/nonexistent/odbd", PYTHONPATH=str(ROOT / "client/python"))
    proc = subprocess.run([sys.executable, "-m", "odb.cli", "demo", "--plain"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "odbctl demo:" in proc.stderr and "/nonexistent/odbd" in proc.stderr, \
        proc.stderr


def test_launcher_refuses_a_config_path_that_does_not_exist(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "client/python"), ODB_RUN_DIR=str(tmp_path))
    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    for launcher in (["-m", "odb.launch"], [str(ROOT / "deploy/odb_launch.py")]):
        proc = subprocess.run([sys.executable, *launcher, "--config", "odbd.yaml", "--job-id", "j", str(script)],
                              capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
        assert proc.returncode == 2 and "--config odbd.yaml: no such file" in proc.stderr, proc.stderr
        assert "never" not in proc.stdout


def test_readme_speaks_to_users_and_its_figures_have_commands() -> None:
    """README for users (issue 34): under 1,500 words; the training loop and the headline table in its first 60
    lines; every command of the headline table is in docs/benchmarks.md, where the figure's conditions are."""
    text = (ROOT / "README.md").read_text()
    words = len(text.split())
    assert words < 1500, f"README.md has {words} words: move detail to docs/ (the evidence: docs/benchmarks.md)"
    first = text.splitlines()[:60]
    assert any(line.startswith("## The training loop") for line in first), "the training loop is not in 60 lines"
    assert any("window_loss" in line for line in first), "the loop's code is not in the first 60 lines"
    start = next(i for i, line in enumerate(first) if line.startswith("## Where it stands"))
    assert any(line.startswith("| ") for line in first[start:]), "the headline table does not start by line 60"
    rows = []
    for line in text.splitlines()[start:]:
        if line.startswith("## ") and rows:
            break
        if line.startswith("| ") and not line.startswith("| what") and not line.startswith("|---"):
            rows.append(line)
    assert len(rows) >= 4, rows
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text()
    for row in rows:
        commands = re.findall(r"`([^`]*(?:\.sh|\.py|bench/run)[^`]*)`", row.split("|")[-2])
        assert commands, f"a headline row without its command: {row[:80]}"
        for command in commands:
            program = command.split(" --")[0].replace("/usr/bin/python3 ", "").strip()
            assert program in benchmarks, f"{program!r} (README headline) is not in docs/benchmarks.md"
