"""Shared set-up of the Python client tests: real odbd processes, real torch.

Nothing is skipped: when the extension or the daemon is not built, every test
fails with a message saying to run ./scripts/build.sh.
"""
from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "client/python", ROOT / "examples", Path(__file__).resolve().parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


@pytest.fixture(autouse=True)
def _require_built() -> None:
    from odb._native import find_built

    try:
        find_built("client/python/_odb_native.so", "ODB_NATIVE_LIB")
        find_built("src/daemon/odbd", "ODB_ODBD")
    except FileNotFoundError as e:
        pytest.fail(f"{e} (the Python tests need the extension and odbd: run ./scripts/build.sh)")


@pytest.fixture
def run_dir() -> Path:
    """A fresh, short run directory (ipc socket paths must stay under ~100 bytes)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="odbpy-"))
    yield d
    import shutil

    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def job_id() -> str:
    return f"pytest-{uuid.uuid4().hex[:10]}"
