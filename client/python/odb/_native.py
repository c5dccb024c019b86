"""Finds and loads the pybind11 extension `_odb_native`, and the `odbd` binary.

The extension, in this order:
  1. $ODB_NATIVE_LIB (a path to a `_odb_native*.so`);
  2. `odb._odb_native`, the extension the installed package carries (the wheel of
     scripts/build.sh, or a from-source pip install; its shared libraries in odb/.libs);
  3. in a source checkout, <repo>/.build/client/python/_odb_native.so (where
     scripts/build.sh copies Bazel's -c opt output). Not bazel-bin/ or bazel-out/:
     bazel-bin follows whichever configuration or output base built last (an
     ASan build, fastbuild), so it may hold an extension that cannot load here.

The daemon: :func:`find_odbd` (the package's own odb/bin/odbd after a pip install).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import List, Optional

# The checkout this package runs from, if it does (client/python/odb -> the repo).
REPO_ROOT = Path(__file__).resolve().parents[3]
_MODULE: Optional[ModuleType] = None


def source_checkout() -> Optional[Path]:
    """The odb repository when the package is imported from client/python of a checkout."""
    if (REPO_ROOT / "proto" / "odb.proto").exists() and (REPO_ROOT / "client" / "python" / "odb").is_dir():
        return REPO_ROOT
    return None


def _candidates(relative: str) -> List[Path]:
    repo = source_checkout()
    return [repo / ".build" / relative] if repo else []


def find_built(relative: str, env_var: str) -> Path:
    """Path of a build output of the checkout (e.g. "src/daemon/odbd"), or a clear error.

    $env_var wins; else <repo>/.build/<relative> (scripts/build.sh).
    """
    override = os.environ.get(env_var)
    if override:
        path = Path(override)
        if not path.exists():
            raise FileNotFoundError(f"${env_var}={override} does not exist")
        return path
    found = [p for p in _candidates(relative) if p.exists()]
    if found:
        return found[0]
    where = ", ".join(str(p) for p in _candidates(relative)) or "no source checkout"
    raise FileNotFoundError(f"{relative} is not built (looked at ${env_var} and {where}): "
                            f"run ./scripts/build.sh first")


def install_hint(package: str, debian_package: str) -> str:
    """How to get `package` into this interpreter. In a venv: pip into the venv, or Debian's package seen
    through a venv of /usr/bin/python3 made with --system-site-packages (apt alone does not reach a venv)."""
    if sys.prefix == getattr(sys, "base_prefix", sys.prefix):
        return f"pip install {package} for {sys.executable}, or (Debian's /usr/bin/python3) apt install {debian_package}"
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    sees_debian = sys.base_prefix == "/usr" and cfg.is_file() and re.search(
        r"^include-system-site-packages\s*=\s*true", cfg.read_text(), re.M | re.I) is not None
    hint = f"this venv ({sys.prefix}) lacks it: {sys.executable} -m pip install {package}"
    if sees_debian:
        return hint + f"; or, offline, apt install {debian_package} (this venv sees Debian's packages)"
    return hint + (f"; or, offline on Debian, apt install {debian_package} and use a venv that sees it: "
                   f"/usr/bin/python3 -m venv --system-site-packages DIR (docs/python.md, \"Install\")")


# Where find_odbd() looks, in its order: `odbctl --help` and `odbctl find-odbd --help` print this list.
ODBD_SEARCH_ORDER = ("$ODBD", "the package's own odb/bin/odbd", "`odbd` on PATH",
                     "the source checkout's .build/src/daemon/odbd")


def find_odbd() -> Path:
    """The odbd binary: $ODBD, then the package's own odb/bin/odbd, then `odbd` on PATH, then
    <repo>/.build/src/daemon/odbd.

    The package's odbd is the one built with it (the wheel, or a from-source pip install: same sources, so
    the same protocol): it wins over an `odbd` on PATH, which may be of another version. The
    last one only when this package runs from a source checkout (after ./scripts/build.sh).
    $ODB_ODBD, the older name of $ODBD, is honoured too. Raises FileNotFoundError saying what to
    do when none is found (and, for a package built without odbd, why it has none).
    """
    for var in ("ODBD", "ODB_ODBD"):
        value = os.environ.get(var)
        if value:
            path = Path(value)
            if not path.is_file() or not os.access(path, os.X_OK):
                raise FileNotFoundError(f"${var}={value} is not an executable file")
            return path
    bundled = Path(__file__).resolve().parent / "bin"
    if os.access(bundled / "odbd", os.X_OK):
        return bundled / "odbd"
    on_path = shutil.which("odbd")
    if on_path:
        return Path(on_path)
    repo = source_checkout()
    if repo and (repo / ".build" / "src" / "daemon" / "odbd").exists():
        return repo / ".build" / "src" / "daemon" / "odbd"
    checkout = (f"; in this checkout ({repo}) run ./scripts/build.sh to build .build/src/daemon/odbd"
                if repo else "")
    # odb_build/odbd.py writes why a package was built without its odbd (no Bazel there).
    missing = bundled / "odbd.missing"
    package = (f"; this odb package has no odbd of its own: {missing.read_text().strip()}"
               if missing.is_file() else "")
    raise FileNotFoundError(
        "odbd not found: set $ODBD to the daemon binary or put `odbd` on PATH (the wheel ./scripts/build.sh writes "
        "carries it: `pip install --no-index .build/dist/odb-*.whl`, docs/python.md \"Install\"; ./scripts/build.sh "
        f"also builds .build/src/daemon/odbd){checkout}{package}")


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_odb_native", str(path))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def native() -> ModuleType:
    """The loaded `_odb_native` module (loaded once per process)."""
    global _MODULE
    if _MODULE is None:
        module = sys.modules.get("_odb_native")
        if module is None:
            if os.environ.get("ODB_NATIVE_LIB"):
                module = _load(find_built("client/python/_odb_native.so", "ODB_NATIVE_LIB"))
            elif importlib.util.find_spec(f"{__package__}._odb_native") is not None:
                module = importlib.import_module(f"{__package__}._odb_native")
            else:
                try:
                    module = _load(find_built("client/python/_odb_native.so", "ODB_NATIVE_LIB"))
                except FileNotFoundError as e:
                    raise FileNotFoundError(
                        f"the odb native extension is missing: install the package "
                        f"(pip install --no-build-isolation ./client/python) or, in a checkout, {e}") from None
            sys.modules["_odb_native"] = module
        _MODULE = module
    return _MODULE
