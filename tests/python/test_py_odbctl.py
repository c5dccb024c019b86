"""`odbctl` says what it does (issue 31, findings 3 and 8):

* `odbctl demo --samples N` sends N samples in all (it sent 602 for 400: each rank's share was rounded up
  and one added);
* `odbctl --help`, `odbctl find-odbd --help` and `python -m odb.launch --help` list every place odb.find_odbd() looks, in its order, the
  package's own odb/bin/odbd included (it was left out);
* in a venv, `odbctl report` without matplotlib and `odb.OdbDataLoader` without torch say how to get them
  into that venv (its pip, or a venv of Debian's python3 made with --system-site-packages), not only
  `apt install`, which does not reach a venv.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from odb._native import ODBD_SEARCH_ORDER

ROOT = Path(__file__).resolve().parents[2]
ODBD = ROOT / ".build/src/daemon/odbd"


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ODB_"))}
    env.update(PYTHONPATH=str(ROOT / "client/python"), **extra)
    return env


def _odbctl(*args: str, python: str = sys.executable, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "odb.cli", *args], capture_output=True, text=True, timeout=180,
                          env=_env(**env), cwd=ROOT)


def test_demo_sends_exactly_the_samples_asked_for() -> None:
    out = _odbctl("demo", "--plain", "--samples", "400", "--delay", "0", ODBD=str(ODBD))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {int(line.split()[0]): line.split() for line in out.stdout.splitlines() if line[:4].strip().isdigit()}
    assert sorted(rows) == [0, 1], out.stdout
    received = [int(rows[r][1]) for r in range(2)]
    assert sum(received) == 400, out.stdout  # 602 before
    assert received[0] < received[1], out.stdout  # rank 1 still gets more (the view shows the evening out)


@pytest.mark.parametrize("samples, ranks", [(400, 2), (1, 3), (7, 4), (1000, 8), (5, 1)])
def test_demo_counts_sum_to_the_samples(samples: int, ranks: int) -> None:
    from odb.cli import demo_counts

    counts = demo_counts(samples, ranks)
    assert sum(counts) == samples and len(counts) == ranks and counts == sorted(counts), counts


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("module, args", [("odb.cli", ["--help"]), ("odb.cli", ["find-odbd", "--help"]),
                                          ("odb.launch", ["--help"])])
def test_help_lists_where_find_odbd_looks_in_its_order(module: str, args: List[str]) -> None:
    """`odbctl --help`, `odbctl find-odbd --help` and the launcher's --odbd help (the same list)."""
    text = _flat(subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60,
                                env=_env(), cwd=ROOT).stdout)
    places = [text.find(_flat(p)) for p in ODBD_SEARCH_ORDER]
    assert -1 not in places and places == sorted(places), (ODBD_SEARCH_ORDER, text)
    assert "package's own odb/bin/odbd" in text, text


def test_the_search_order_is_find_odbds(tmp_path: Path) -> None:
    """The list the help prints is the one find_odbd's docstring gives (one order, said twice)."""
    from odb._native import find_odbd

    doc = _flat(find_odbd.__doc__ or "")
    assert "$ODBD, then the package's own odb/bin/odbd, then `odbd` on PATH, then <repo>/.build/src/daemon/odbd" \
        in doc, doc
    assert [p.split()[-1] for p in ODBD_SEARCH_ORDER] == ["$ODBD", "odb/bin/odbd", "PATH", ".build/src/daemon/odbd"]


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv of Debian's python3 that does not see Debian's packages (no matplotlib, no torch)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return venv


def test_report_in_a_venv_says_how_to_get_matplotlib_into_it(bare_venv: Path, tmp_path: Path) -> None:
    (tmp_path / "rank0-epoch0.jsonl").write_text(json.dumps(
        {"epoch": 0, "rank": 0, "step": 0, "real": 5, "padded": 8, "idle": False, "lengths": [5]}) + "\n")
    out = _odbctl("report", str(tmp_path), python=str(bare_venv / "bin/python"))
    assert out.returncode == 1, out
    err = _flat(out.stderr)
    assert f"{bare_venv}/bin/python -m pip install matplotlib" in err, err
    assert "/usr/bin/python3 -m venv --system-site-packages" in err and "python3-matplotlib" in err, err


def test_loader_without_torch_in_a_venv_says_how_to_get_torch_into_it(bare_venv: Path) -> None:
    out = subprocess.run([str(bare_venv / "bin/python"), "-c", "import odb; odb.OdbDataLoader"], capture_output=True,
                         text=True, timeout=60, env=_env(), cwd=ROOT)
    err = _flat(out.stderr)
    assert out.returncode == 1 and "needs PyTorch" in err, err
    assert f"{bare_venv}/bin/python -m pip install torch" in err, err
    assert "/usr/bin/python3 -m venv --system-site-packages" in err and "python3-torch" in err, err
