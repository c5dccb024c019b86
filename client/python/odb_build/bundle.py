"""Bundling: a binary's shared libraries beyond glibc and the GCC runtime, copied into odb/.libs.

The extension (DT_RPATH $ORIGIN/.libs) and odbd (DT_RPATH $ORIGIN/../.libs) find them there, so
the package runs where Python is installed but libzmq, libprotobuf, abseil... are not. DT_RPATH,
not RUNPATH: it also serves the bundled libraries' own dependencies (libzmq.so.5 -> libsodium.so.23).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

# Libraries every Linux with Python has (glibc, the GCC runtime): never bundled.
SYSTEM_LIBS = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libdl.so", "librt.so", "libpthread.so",
               "libresolv.so", "libutil.so", "libstdc++.so", "libgcc_s.so")


def bundle_shared_libs(binary: Path, libs: Path) -> None:
    """Copies `binary`'s non-system shared libraries (ldd's full closure) into `libs`."""
    out = subprocess.run(["ldd", str(binary)], check=True, capture_output=True, text=True).stdout
    libs.mkdir(parents=True, exist_ok=True)
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] != "=>" or parts[0].startswith(SYSTEM_LIBS):
            continue
        soname, path = parts[0], parts[2]
        if path == "not":
            raise SystemExit(f"odb: {binary.name} needs {soname}, which is not installed:\n{out}")
        if Path(path).resolve().parent == libs.resolve():
            continue
        shutil.copyfile(path, libs / soname)  # the real file under its soname (no symlinks in wheels)
        os.chmod(libs / soname, 0o755)
