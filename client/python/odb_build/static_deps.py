"""ODB_STATIC_DEPS: ZeroMQ, protobuf-lite and abseil rebuilt as position-independent archives.

Debian 12's static archives cannot go into a shared object (they are PIE code with
local-exec thread-locals), so the archives are rebuilt from the Debian source packages of
the installed -dev packages (same versions, same patches: `apt-get source` with a private
deb-src list, so network access to the Debian archive once, and cmake) into a folder that
later builds reuse. See setup.py's docstring and docs/python.md ("Linking").
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional


# --- Static linking: position-independent archives rebuilt from Debian's sources ---------------------

# Installed dev package whose Debian source package is rebuilt -> its cmake arguments, targets, archives.
STATIC_SOURCES = {
    "libzmq3-dev": ["-DBUILD_SHARED=OFF", "-DBUILD_STATIC=ON", "-DBUILD_TESTS=OFF", "-DWITH_LIBSODIUM=OFF",
                    "-DENABLE_CURVE=ON", "-DWITH_LIBBSD=OFF", "-DENABLE_DRAFTS=OFF", "-DWITH_DOCS=OFF",
                    "-DWITH_TLS=OFF", "-DWITH_PERF_TOOL=OFF", "-DENABLE_PRECOMPILED=OFF", "-DWITH_OPENPGM=OFF",
                    "-DWITH_NORM=OFF"],
    "libprotobuf-dev": ["-Dprotobuf_BUILD_TESTS=OFF", "-Dprotobuf_WITH_ZLIB=OFF", "-Dprotobuf_BUILD_PROTOC_BINARIES=OFF",
                        "-Dprotobuf_BUILD_SHARED_LIBS=OFF"],
    "libabsl-dev": ["-DCMAKE_CXX_STANDARD=17", "-DBUILD_SHARED_LIBS=OFF", "-DBUILD_TESTING=OFF"],
}
STATIC_TARGETS = {"libzmq3-dev": ["libzmq-static"], "libprotobuf-dev": ["libprotobuf-lite"],
                  "libabsl-dev": ["status", "statusor"]}
STATIC_ARCHIVES = {"libzmq3-dev": "libzmq.a", "libprotobuf-dev": "libprotobuf-lite.a", "libabsl-dev": "libabsl_*.a"}


class StaticDepsError(RuntimeError):
    pass


def say(msg: str) -> None:
    print(f"odb: {msg}", file=sys.stderr, flush=True)


def _check(args: List[str], log: Path, cwd: Optional[Path] = None) -> None:
    """Runs `args` with its output appended to `log`; StaticDepsError with the log's tail on failure."""
    with open(log, "a") as out:
        p = subprocess.run(args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        raise StaticDepsError(f"{' '.join(args)} failed ({p.returncode}):\n{log.read_text(errors='replace')[-3000:]}")


def _deb_src_list() -> str:
    """The machine's Debian archives (sources.list and deb822 .sources) as one-line deb-src entries."""
    lines = []
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        for line in Path(path).read_text().splitlines() if os.path.exists(path) else []:
            if line.strip().startswith("deb "):
                lines.append("deb-src " + line.strip()[4:])
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        for stanza in Path(path).read_text().split("\n\n"):
            fields: Dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    key, value = line.split(":", 1)
                    fields[key.strip().lower()] = value.strip()
            if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
                continue
            opts = f" [signed-by={fields['signed-by']}]" if fields.get("signed-by", "").startswith("/") else ""
            for uri in fields.get("uris", "").split():
                for suite in fields.get("suites", "").split():
                    lines.append(f"deb-src{opts} {uri} {suite} {fields.get('components', '')}".rstrip())
    if not lines:
        raise StaticDepsError("cannot fetch Debian source packages: no Debian archive in /etc/apt/sources.list(.d)")
    return "\n".join(lines) + "\n"


def _apt_source(work: Path, dev_package: str) -> Path:
    """`apt-get source` of the installed dev package's source, same version, with a private deb-src list."""
    q = subprocess.run(["dpkg-query", "-W", "-f", "${source:Package} ${source:Version}", dev_package],
                       capture_output=True, text=True)
    if q.returncode != 0 or not q.stdout.strip():
        raise StaticDepsError(f"{dev_package} is not installed (scripts/install_deps.sh)")
    source, version = q.stdout.split()
    apt = work / "apt"
    (apt / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (apt / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (apt / "parts").mkdir(exist_ok=True)
    (apt / "sources.list").write_text(_deb_src_list())
    opts = ["-o", f"Dir::Etc::SourceList={apt / 'sources.list'}", "-o", f"Dir::Etc::SourceParts={apt / 'parts'}",
            "-o", f"Dir::State::Lists={apt / 'lists'}", "-o", f"Dir::Cache={apt / 'cache'}",
            "-o", "Debug::NoLocking=1", "-q"]
    if os.geteuid() == 0:
        opts += ["-o", "APT::Sandbox::User=root"]  # _apt cannot write into the caller's folder
    if shutil.which("dpkg-source") is None:
        raise StaticDepsError("dpkg-source is missing: apt install dpkg-dev")
    src = work / "src" / source
    try:
        if not any((apt / "lists").glob("*Sources*")):
            say("fetching the deb-src indexes (private apt lists under the static-deps folder)")
            _check(["apt-get", *opts, "update"], work / "apt.log")
            if not any((apt / "lists").glob("*Sources*")):
                raise StaticDepsError(f"apt-get update fetched no Sources index (see {work / 'apt.log'})")
        if not (src / ".odb-unpacked").exists():
            shutil.rmtree(src, ignore_errors=True)
            src.mkdir(parents=True)
            say(f"apt-get source {source}={version}")
            _check(["apt-get", *opts, "source", f"{source}={version}"], work / "apt.log", cwd=src)
            (src / ".odb-unpacked").write_text(version)
    except StaticDepsError as e:
        raise StaticDepsError(f"cannot fetch Debian source packages (network access to the archive): {e}") from e
    (tree,) = [p for p in src.iterdir() if p.is_dir() and (p / "CMakeLists.txt").exists()]
    return tree


def build_static_deps(prefix: Path) -> List[str]:
    """The PIC archives in `prefix`/lib (made on first use), in link order."""
    libdir = prefix / "lib"
    if not (prefix / ".odb-complete").exists():
        cmake = shutil.which("cmake")
        if cmake is None:
            raise StaticDepsError("cmake is missing: apt install cmake")
        generator = ["-G", "Ninja"] if shutil.which("ninja") else ["-G", "Unix Makefiles"]
        libdir.mkdir(parents=True, exist_ok=True)
        jobs = str(int(os.environ.get("ODB_BUILD_JOBS") or os.cpu_count() or 1))
        for dev, args in STATIC_SOURCES.items():
            tree = _apt_source(prefix, dev)
            build = prefix / "build" / dev
            shutil.rmtree(build, ignore_errors=True)
            build.parent.mkdir(parents=True, exist_ok=True)
            say(f"building position-independent {STATIC_ARCHIVES[dev]} from {tree.name} (log: {build}.log)")
            log = Path(f"{build}.log")
            _check([cmake, "-S", str(tree), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
                    "-DCMAKE_POSITION_INDEPENDENT_CODE=ON", *args], log)
            _check([cmake, "--build", str(build), "--parallel", jobs, "--target", *STATIC_TARGETS[dev]], log)
            found = sorted(build.rglob(STATIC_ARCHIVES[dev]))
            if not found:
                raise StaticDepsError(f"{dev}: no {STATIC_ARCHIVES[dev]} under {build}")
            for archive in found:
                shutil.copyfile(archive, libdir / archive.name)
        (prefix / ".odb-complete").write_text("libzmq.a libprotobuf-lite.a libabsl_*.a\n")
        for scratch in ("build", "src", "apt"):  # ~100 MiB of sources and objects; lib/ is what is used
            shutil.rmtree(prefix / scratch, ignore_errors=True)
    archives = [str(libdir / "libzmq.a"), str(libdir / "libprotobuf-lite.a")]
    absl = sorted(str(p) for p in libdir.glob("libabsl_*.a"))
    missing = [a for a in archives if not os.path.exists(a)] + ([] if absl else ["libabsl_*.a"])
    if missing:
        raise StaticDepsError(f"{prefix}: missing {missing} (remove {prefix / '.odb-complete'} to rebuild)")
    return [*archives, "-Wl,--start-group", *absl, "-Wl,--end-group"]


def static_link_args() -> Optional[List[str]]:
    """Link arguments for the static build, or None to bundle (ODB_STATIC_DEPS unset, or it failed)."""
    prefix = os.environ.get("ODB_STATIC_DEPS")
    if not prefix:
        return None
    try:
        archives = build_static_deps(Path(prefix).expanduser().resolve())
    except (StaticDepsError, OSError) as e:
        if os.environ.get("ODB_STATIC_REQUIRED") == "1":
            raise SystemExit(f"odb: ODB_STATIC_DEPS={prefix}: {e}")
        say(f"WARNING: cannot link statically ({e}); bundling the shared libraries in odb/.libs instead")
        return None
    # --exclude-libs: the archives' symbols stay inside the extension (no clash with torch's protobuf).
    return ["-Wl,--exclude-libs,ALL", "-Wl,--as-needed", *archives, "-lpthread", "-lrt"]
