"""The daemon in the package: odb/bin/odbd, built with Bazel from the checkout, its libraries bundled.

A build of the package (`pip install --no-build-isolation ./client/python`, or the wheel step of
scripts/build.sh) takes the checkout's fresh .build/src/daemon/odbd (below), else runs
`bazel build -c opt //src/daemon:odbd` in the odb checkout (offline with the repo's WORKSPACE; the
same configuration as scripts/build.sh), copies the binary to odb/bin/odbd, points its DT_RPATH at $ORIGIN/../.libs
(patchelf) and copies the shared libraries it needs beyond glibc and the GCC runtime into
odb/.libs, beside the extension's. `odb.find_odbd()` finds it there.

A checkout where `./scripts/build.sh` ran already has odbd: .build/src/daemon/odbd, when it is newer
than every file it is built from (src/, proto/, third_party/, WORKSPACE, BUILD, .bazelrc), is bundled
as is, without running Bazel (a from-source install after a build takes no Bazel time; in a fresh
clone Bazel's cache is cold: ~15 minutes on 2 cores).

Environment:
  ODB_ODBD_BINARY   an odbd built elsewhere: bundled instead of running Bazel
  ODB_REUSE_BUILD=0 never bundle .build/src/daemon/odbd: build with Bazel (or say why not)
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
from typing import Optional, Tuple

from .bundle import bundle_shared_libs
from .static_deps import say

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


# What //src/daemon:odbd is built from, relative to the checkout (a file newer than .build's odbd makes it stale).
ODBD_INPUTS = ("src", "proto", "third_party", "WORKSPACE", "BUILD", ".bazelrc")


def checkout_build(root: Path) -> Tuple[Optional[Path], str]:
    """The checkout's .build/src/daemon/odbd (scripts/build.sh) when it is newer than every input of
    //src/daemon:odbd, else None; with a line that says which, and why."""
    built = root / ".build" / "src" / "daemon" / "odbd"
    if not os.access(built, os.X_OK):
        return None, f"{built} is not built (./scripts/build.sh)"
    when = built.stat().st_mtime
    for name in ODBD_INPUTS:
        top = root / name
        files = [top] if top.is_file() else (p for p in top.rglob("*") if p.is_file()) if top.is_dir() else []
        for f in files:
            if f.stat().st_mtime > when:
                return None, f"{built} is older than {f.relative_to(root)}"
    return built, f"{built} is newer than its sources ({', '.join(ODBD_INPUTS)})"


def build_odbd(root: Path, package: Path) -> Optional[str]:
    """Puts odbd in `package`/bin/odbd with its libraries in `package`/.libs. Returns None when it did, else
    why not (no Bazel, no patchelf); then `package`/bin/odbd.missing holds that reason."""
    bin_dir = package / "bin"
    shutil.rmtree(bin_dir, ignore_errors=True)  # an earlier build's odbd or reason
    bin_dir.mkdir(parents=True)
    reason = None
    prebuilt = os.environ.get("ODB_ODBD_BINARY")
    if not prebuilt and os.environ.get("ODB_REUSE_BUILD", "1") != "0":
        reuse, why = checkout_build(root)
        say(f"odbd: bundling {reuse}: {why}, no Bazel run" if reuse else
            f"odbd: building with Bazel: {why}")
        prebuilt = str(reuse) if reuse else None
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
