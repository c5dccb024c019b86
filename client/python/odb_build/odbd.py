"""The daemon in the package: odb/bin/odbd, built with Bazel from the checkout, its libraries bundled.

`pip install ./client/python` runs `bazel build -c opt //src/daemon:odbd` in the odb checkout
(offline with the repo's WORKSPACE; the same configuration as scripts/build.sh, so a built tree is
a cache hit), copies the binary to odb/bin/odbd, points its DT_RPATH at $ORIGIN/../.libs
(patchelf) and copies the shared libraries it needs beyond glibc and the GCC runtime into
odb/.libs, beside the extension's. `odb.find_odbd()` finds it there.

Environment:
  ODB_ODBD_BINARY   an odbd built elsewhere: bundled instead of running Bazel
  BAZEL             the bazel binary (default: `bazel` on PATH)
  PATCHELF          the patchelf binary (default: `patchelf` on PATH; Debian: apt install patchelf)
  ODB_REQUIRE_ODBD=1  a package without odbd is an error instead of a warning

Without Bazel (or patchelf) the package is built without odbd, with a warning, and
odb/bin/odbd.missing says why; find_odbd() then quotes it and looks at $ODBD and PATH.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from .bundle import bundle_shared_libs

TARGET = "//src/daemon:odbd"
# What the package's odb/bin/odbd.missing is called (read by odb._native.find_odbd).
MISSING = "odbd.missing"


def _tool(env_var: str, name: str) -> Optional[str]:
    value = os.environ.get(env_var)
    if value:
        return value if os.path.isfile(value) and os.access(value, os.X_OK) else None
    return shutil.which(name)


def _bazel_build(root: Path, bazel: str) -> Path:
    """`bazel build -c opt //src/daemon:odbd` in the checkout; the binary in bazel-bin (a SystemExit with
    Bazel's output when the build fails: a broken build is an error, not a reason to leave odbd out)."""
    build = subprocess.run([bazel, "build", "-c", "opt", TARGET], cwd=root, capture_output=True, text=True)
    if build.returncode != 0:
        raise SystemExit(f"odb: `{bazel} build -c opt {TARGET}` in {root} failed ({build.returncode}):\n"
                         f"{(build.stdout + build.stderr)[-4000:]}")
    info = subprocess.run([bazel, "info", "-c", "opt", "bazel-bin"], cwd=root, capture_output=True, text=True)
    binary = Path(info.stdout.strip()) / "src" / "daemon" / "odbd"
    if info.returncode != 0 or not binary.is_file():
        raise SystemExit(f"odb: Bazel built {TARGET} but {binary} is not there: {info.stderr[-2000:]}")
    return binary


def build_odbd(root: Path, package: Path) -> Optional[str]:
    """Puts odbd in `package`/bin/odbd with its libraries in `package`/.libs. Returns None when it did, else
    why not (no Bazel, no patchelf); then `package`/bin/odbd.missing holds that reason."""
    bin_dir = package / "bin"
    shutil.rmtree(bin_dir, ignore_errors=True)  # an earlier build's odbd or reason
    bin_dir.mkdir(parents=True)
    reason = None
    prebuilt = os.environ.get("ODB_ODBD_BINARY")
    patchelf = _tool("PATCHELF", "patchelf")
    bazel = _tool("BAZEL", "bazel")
    if prebuilt and not (os.path.isfile(prebuilt) and os.access(prebuilt, os.X_OK)):
        raise SystemExit(f"odb: ODB_ODBD_BINARY={prebuilt} is not an executable file")
    if patchelf is None:
        reason = ("patchelf is not installed (apt install patchelf, or set $PATCHELF): it points the bundled "
                  "odbd at the package's libraries")
    elif not prebuilt and bazel is None:
        reason = (f"Bazel is not installed (or $BAZEL={os.environ.get('BAZEL')} is not executable): odbd is built "
                  f"with `bazel build -c opt {TARGET}` from the odb checkout; install Bazel (scripts/install_deps.sh) "
                  "or set ODB_ODBD_BINARY to an odbd built elsewhere, and reinstall")
    if reason is not None:
        (bin_dir / MISSING).write_text(reason + "\n")
        return reason
    source = Path(prebuilt) if prebuilt else _bazel_build(root, bazel)  # type: ignore[arg-type]
    odbd = bin_dir / "odbd"
    shutil.copyfile(source, odbd)  # Bazel's outputs are read-only; the copy is ours to patch
    os.chmod(odbd, 0o755)
    subprocess.run([patchelf, "--force-rpath", "--set-rpath", "$ORIGIN/../.libs", str(odbd)], check=True)
    bundle_shared_libs(odbd, package / ".libs")
    check = subprocess.run([str(odbd), "--help"], capture_output=True, text=True, env={})
    if check.returncode != 0:
        raise SystemExit(f"odb: the bundled {odbd} does not run ({check.returncode}):\n{check.stderr[-2000:]}")
    return None
