"""Finds and loads the pybind11 extension `_odb_native.so` built by Bazel.

$ODB_NATIVE_LIB wins when set. Otherwise the newest of
<repo>/.build/client/python/_odb_native.so (where scripts/build.sh copies its
-c opt outputs), <repo>/bazel-bin/client/python/_odb_native.so and the
per-configuration folders <repo>/bazel-out/*/bin/... (bazel-bin follows
whichever configuration was built last, so it may point at a stale one).
The daemon binary is found the same way ($ODB_ODBD, then src/daemon/odbd).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import List, Optional

REPO_ROOT = Path(__file__).resolve().parents[3]
_MODULE: Optional[ModuleType] = None


def _candidates(relative: str) -> List[Path]:
    out = [REPO_ROOT / ".build" / relative, REPO_ROOT / "bazel-bin" / relative]
    for config in ("k8-fastbuild", "k8-opt", "k8-dbg"):
        out.append(REPO_ROOT / "bazel-out" / config / "bin" / relative)
    return out


def find_built(relative: str, env_var: str) -> Path:
    """Path of a Bazel output (e.g. "src/daemon/odbd"), or a clear error."""
    override = os.environ.get(env_var)
    if override:
        path = Path(override)
        if not path.exists():
            raise FileNotFoundError(f"${env_var}={override} does not exist")
        return path
    found = [p for p in _candidates(relative) if p.exists()]
    if found:
        return max(found, key=lambda p: p.stat().st_mtime)
    raise FileNotFoundError(
        f"{relative} is not built (looked in {', '.join(str(p) for p in _candidates(relative))} "
        f"and ${env_var}): run ./scripts/build.sh first")


def native() -> ModuleType:
    """The loaded `_odb_native` module (loaded once per process)."""
    global _MODULE
    if _MODULE is None:
        if "_odb_native" in sys.modules:
            _MODULE = sys.modules["_odb_native"]
            return _MODULE
        path = find_built("client/python/_odb_native.so", "ODB_NATIVE_LIB")
        spec = importlib.util.spec_from_file_location("_odb_native", str(path))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["_odb_native"] = module
        _MODULE = module
    return _MODULE
