"""Builds the `odb` package with a self-contained `odb._odb_native` extension.

    pip install --no-build-isolation ./client/python      # offline, from a source checkout

The extension is compiled for the interpreter that runs pip from
client/python/bindings.cc, the C++ client (client/cpp/src/*.cc), the tensor
codec (src/wire, src/common/dtype.cc) and the protobuf code that the system
`protoc` generates from proto/odb.proto into the build directory.

Two ways to make it self-contained (docs/python.md, "Linking"):

* Bundled (the default; offline): Debian 12's static archives cannot go into a
  shared object. They are PIE code: libzmq.a refers to glibc's data directly
  (`relocation R_X86_64_PC32 against symbol `stderr@@GLIBC_2.2.5' can not be
  used when making a shared object; recompile with -fPIC`; also in6addr_any,
  __libc_single_threaded, libstdc++'s vtables, GSSAPI's and NORM's constants),
  and libprotobuf(-lite).a and libabsl_base.a use local-exec thread-locals
  (`relocation R_X86_64_TPOFF32 against symbol `..ThreadSafeArena..thread_cache_E'
  can not be used when making a shared object`), which no flag can turn into a
  shared object's TLS; Debian ships no libgssapi_krb5.a at all (its libzmq
  needs it). So the extension links the shared libraries, and the build copies
  every one it needs beyond glibc and the GCC runtime (libzmq and what it pulls
  in: libsodium, OpenPGM, NORM, libbsd/libmd, Kerberos' GSSAPI; libprotobuf,
  libz, abseil) into odb/.libs/, which the extension finds through its DT_RPATH
  $ORIGIN/.libs (auditwheel's approach). The package or wheel runs where Python
  (and torch) are installed but libzmq/libprotobuf are not; `ldd` resolves
  those libraries inside the package.
* Static (ODB_STATIC_DEPS=DIR): ZeroMQ, protobuf-lite and abseil rebuilt as
  position-independent archives in DIR from the Debian source packages of the
  installed -dev packages (same versions, same patches; `apt-get source` with a
  private deb-src list, so network access to the Debian archive once, and
  cmake), then linked into the extension with their symbols hidden
  (--exclude-libs): `ldd` shows only libc, libm, libstdc++ and libgcc_s, and no
  odb/.libs/ is made. libzmq is built without what the client does not use
  (libsodium: CURVE uses the built-in TweetNaCl; GSSAPI, PGM, NORM, libbsd), and
  the protobuf code is generated for the lite runtime. DIR is reused by later
  builds. If the archives cannot be made the build falls back to bundling,
  with a warning (ODB_STATIC_REQUIRED=1: an error instead).

Environment:
  ODB_SOURCE_ROOT   the odb checkout (default: two levels above this file)
  ODB_BUILD_DIR     setuptools' build and egg-info folder (default: <root>/.build/pip,
                    ignored by git, so a build never leaves files in the source tree)
  ODB_BUILD_JOBS    parallel C++ compiles (default: CPU count)
  PROTOC            protoc binary (default: `protoc` on PATH); it must match
                    the protobuf headers and libprotobuf (Debian: protobuf-compiler)
  ODB_PROTO_GENERATED  a folder with code protoc generated elsewhere, used instead of
                    running protoc: DIR/gen-lite/proto/odb.pb.{h,cc} for the static build,
                    DIR/gen/proto/... for the bundled one, and DIR/odb.proto, the proto it
                    was made from (checked against proto/odb.proto); bench/gpu_bundle.sh
  ODB_STATIC_DEPS   a folder for (or with) the position-independent static archives:
                    link ZeroMQ, protobuf-lite and abseil statically (see above)
  ODB_STATIC_REQUIRED=1  fail instead of falling back to bundling

Without the `wheel` package (a venv made by `python -m venv` offline has only pip and
setuptools) a minimal bdist_wheel below builds the wheel, so that both
`pip install --no-build-isolation` and `pip wheel --no-build-isolation` work offline.
"""
from __future__ import annotations

import base64
import csv
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

from setuptools import Command, Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = Path(os.environ.get("ODB_SOURCE_ROOT") or HERE.parents[1]).resolve()
BUILD_DIR = Path(os.environ.get("ODB_BUILD_DIR") or ROOT / ".build" / "pip").resolve()

CXX_SOURCES = [
    "client/python/bindings.cc",
    "client/cpp/src/consumer.cc",
    "client/cpp/src/delivery_decoder.cc",
    "client/cpp/src/producer.cc",
    "src/wire/tensor_codec.cc",
    "src/common/dtype.cc",
    # The shared-memory arenas (producer arenas, the step arena): //src/shm in Bazel.
    "src/shm/arena.cc",
    "src/shm/arena_reader.cc",
    "src/shm/arena_writer.cc",
    "src/shm/completion_queue.cc",
    "src/shm/fd_passing.cc",
    "src/shm/process.cc",
    "src/shm/slot_allocator.cc",
]

# What the C++ client links (as //client/cpp:odb_client does through //third_party).
LIBS = ["zmq", "protobuf", "absl_statusor", "absl_status", "absl_cord", "absl_cordz_info", "absl_cord_internal",
        "absl_cordz_functions", "absl_cordz_handle", "absl_exponential_biased", "absl_synchronization",
        "absl_graphcycles_internal", "absl_stacktrace", "absl_symbolize", "absl_debugging_internal",
        "absl_demangle_internal", "absl_malloc_internal", "absl_time", "absl_civil_time", "absl_time_zone",
        "absl_str_format_internal", "absl_strings", "absl_strings_internal", "absl_int128", "absl_throw_delegate",
        "absl_raw_logging_internal", "absl_base", "absl_spinlock_wait", "absl_log_severity"]

# Libraries every Linux with Python has (glibc, the GCC runtime): never bundled.
SYSTEM_LIBS = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libdl.so", "librt.so", "libpthread.so",
               "libresolv.so", "libutil.so", "libstdc++.so", "libgcc_s.so")


def _pybind11_include() -> str:
    try:
        import pybind11  # noqa: PLC0415 - optional at build time

        return pybind11.get_include()
    except ImportError:
        if Path("/usr/include/pybind11/pybind11.h").exists():
            return "/usr/include"  # Debian's pybind11-dev
        raise SystemExit("odb: pybind11 headers not found: pip install pybind11, or apt install pybind11-dev")


def _check_sources() -> None:
    missing = [s for s in CXX_SOURCES + ["proto/odb.proto"] if not (ROOT / s).exists()]
    if missing:
        raise SystemExit(
            f"odb: C++ sources not found under {ROOT} ({', '.join(missing)}): build from an odb source "
            "checkout (`pip install --no-build-isolation ./client/python`; pip >= 21.3 builds in place) "
            "or set ODB_SOURCE_ROOT to the checkout")


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


def _log(msg: str) -> None:
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
            _log("fetching the deb-src indexes (private apt lists under the static-deps folder)")
            _check(["apt-get", *opts, "update"], work / "apt.log")
            if not any((apt / "lists").glob("*Sources*")):
                raise StaticDepsError(f"apt-get update fetched no Sources index (see {work / 'apt.log'})")
        if not (src / ".odb-unpacked").exists():
            shutil.rmtree(src, ignore_errors=True)
            src.mkdir(parents=True)
            _log(f"apt-get source {source}={version}")
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
            _log(f"building position-independent {STATIC_ARCHIVES[dev]} from {tree.name} (log: {build}.log)")
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


def _static_link_args() -> Optional[List[str]]:
    """Link arguments for the static build, or None to bundle (ODB_STATIC_DEPS unset, or it failed)."""
    prefix = os.environ.get("ODB_STATIC_DEPS")
    if not prefix:
        return None
    try:
        archives = build_static_deps(Path(prefix).expanduser().resolve())
    except (StaticDepsError, OSError) as e:
        if os.environ.get("ODB_STATIC_REQUIRED") == "1":
            raise SystemExit(f"odb: ODB_STATIC_DEPS={prefix}: {e}")
        _log(f"WARNING: cannot link statically ({e}); bundling the shared libraries in odb/.libs instead")
        return None
    # --exclude-libs: the archives' symbols stay inside the extension (no clash with torch's protobuf).
    return ["-Wl,--exclude-libs,ALL", "-Wl,--as-needed", *archives, "-lpthread", "-lrt"]


class BuildExt(build_ext):
    """Generates the protobuf C++ code, compiles in parallel, bundles the shared libraries."""

    def build_extension(self, ext: Extension) -> None:
        static = _static_link_args()
        # The static build links protobuf-lite: the generated code is for the lite runtime.
        gen = Path(self.build_temp).resolve() / ("gen-lite" if static else "gen")
        (gen / "proto").mkdir(parents=True, exist_ok=True)
        proto = ROOT / "proto" / "odb.proto"
        pb_cc = gen / "proto" / "odb.pb.cc"
        if os.environ.get("ODB_PROTO_GENERATED"):
            _copy_pregenerated(Path(os.environ["ODB_PROTO_GENERATED"]), gen, proto)
        elif not pb_cc.exists() or pb_cc.stat().st_mtime < proto.stat().st_mtime:
            protoc = os.environ.get("PROTOC") or shutil.which("protoc") or "/usr/bin/protoc"
            if not Path(protoc).exists():
                raise SystemExit("odb: protoc not found: apt install protobuf-compiler, or set PROTOC")
            out = f"--cpp_out={'lite:' if static else ''}{gen / 'proto'}"
            subprocess.check_call([protoc, f"--proto_path={proto.parent}", out, str(proto)])
        both = [str(gen.parent / name) for name in ("gen", "gen-lite")]
        ext.sources = [s for s in ext.sources if not any(s == f"{g}/proto/odb.pb.cc" for g in both)]
        ext.include_dirs = [d for d in ext.include_dirs if d not in both]
        if str(pb_cc) not in ext.sources:
            ext.sources.append(str(pb_cc))
        if str(gen) not in ext.include_dirs:
            ext.include_dirs.insert(0, str(gen))  # "proto/odb.pb.h"
        if static is not None:
            ext.extra_link_args = static
        self.compiler.compile = _parallel_compile.__get__(self.compiler)  # type: ignore[method-assign]
        ext_path = Path(self.get_ext_fullpath(ext.name))
        libs = ext_path.parent / ".libs"
        if static is not None and libs.exists():
            shutil.rmtree(libs)  # an earlier bundled build's copies
            ext_path.unlink(missing_ok=True)  # relink: the objects did not change, the link did
        if static is None and ext_path.exists() and not libs.exists():
            ext_path.unlink()  # an earlier static build's extension: link it again, bundled
        super().build_extension(ext)
        if static is None:
            _bundle_shared_libs(ext_path)


def _copy_pregenerated(pregen: Path, gen: Path, proto: Path) -> None:
    """ODB_PROTO_GENERATED=DIR: DIR/<gen-lite|gen>/proto/odb.pb.{h,cc}, made elsewhere by the protoc that
    matches the protobuf headers and library (bench/gpu_bundle.sh), for a machine without protoc. DIR/odb.proto,
    when present, is the proto they were made from: a different proto/odb.proto is an error."""
    src = pregen.expanduser().resolve() / gen.name / "proto"
    missing = [name for name in ("odb.pb.h", "odb.pb.cc") if not (src / name).is_file()]
    if missing:
        raise SystemExit(f"odb: ODB_PROTO_GENERATED={pregen}: no {', '.join(missing)} in {src} "
                         f"(this build needs the {'lite' if gen.name == 'gen-lite' else 'full'} runtime's code)")
    made_from = pregen.expanduser().resolve() / "odb.proto"
    if made_from.is_file() and made_from.read_bytes() != proto.read_bytes():
        raise SystemExit(f"odb: ODB_PROTO_GENERATED={pregen} was generated from another odb.proto than {proto}: "
                         "generate it again (bench/gpu_bundle.sh)")
    for name in ("odb.pb.h", "odb.pb.cc"):
        target = gen / "proto" / name
        if not target.exists() or target.read_bytes() != (src / name).read_bytes():
            shutil.copyfile(src / name, target)


def _bundle_shared_libs(ext_path: Path) -> None:
    """Copies the extension's non-system shared libraries (ldd's full closure) to <package>/.libs/."""
    out = subprocess.run(["ldd", str(ext_path)], check=True, capture_output=True, text=True).stdout
    libs = ext_path.parent / ".libs"
    libs.mkdir(exist_ok=True)
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] != "=>" or parts[0].startswith(SYSTEM_LIBS):
            continue
        soname, path = parts[0], parts[2]
        if path == "not":
            raise SystemExit(f"odb: {ext_path.name} needs {soname}, which is not installed:\n{out}")
        if Path(path).resolve().parent == libs.resolve():
            continue
        shutil.copyfile(path, libs / soname)  # the real file under its soname (no symlinks in wheels)
        os.chmod(libs / soname, 0o755)


def _parallel_compile(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,  # type: ignore[no-untyped-def]
                      extra_preargs=None, extra_postargs=None, depends=None):
    """distutils' CCompiler.compile, one thread per source (the compiler does the work)."""
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)
    jobs = int(os.environ.get("ODB_BUILD_JOBS") or os.cpu_count() or 1)

    def one(obj: str) -> None:
        src, ext = build[obj]
        self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, objects))
    return objects


def _wheel_tag() -> str:
    """cpXY-cpXY-<platform> of the running CPython (what pip accepts for this interpreter)."""
    if sys.implementation.name != "cpython":
        raise SystemExit("odb: the minimal bdist_wheel only knows CPython tags; pip install wheel")
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    soabi = sysconfig.get_config_var("SOABI") or ""
    abi = "cp" + soabi.split("-")[1] if soabi.startswith("cpython-") else py
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{py}-{abi}-{plat}"


class MinimalBdistWheel(Command):
    """bdist_wheel for when the `wheel` package is missing (offline venvs).

    Writes <name>-<version>-<tag>.whl from the build tree: the package, the
    extension, a .dist-info with METADATA (setuptools' PKG-INFO), WHEEL and RECORD.
    `egg2dist` is what setuptools' dist_info (pip's metadata step) calls.
    """

    description = "build a wheel (minimal; used when the 'wheel' package is not installed)"
    user_options = [("dist-dir=", "d", "directory for the wheel"), ("bdist-dir=", "b", "staging directory"),
                    ("keep-temp", "k", "keep the staging directory")]
    boolean_options = ["keep-temp"]

    def initialize_options(self) -> None:
        self.dist_dir = None
        self.bdist_dir = None
        self.keep_temp = False

    def finalize_options(self) -> None:
        self.dist_dir = self.dist_dir or "dist"
        if self.bdist_dir is None:
            self.bdist_dir = os.path.join(self.get_finalized_command("bdist").bdist_base, "odb-wheel")

    def egg2dist(self, egg_info_dir: str, dist_info_dir: str) -> None:
        os.makedirs(dist_info_dir, exist_ok=True)
        shutil.copyfile(os.path.join(egg_info_dir, "PKG-INFO"), os.path.join(dist_info_dir, "METADATA"))
        for name in ("entry_points.txt", "top_level.txt"):
            if os.path.exists(os.path.join(egg_info_dir, name)):
                shutil.copyfile(os.path.join(egg_info_dir, name), os.path.join(dist_info_dir, name))
        shutil.rmtree(egg_info_dir)

    def run(self) -> None:
        self.run_command("build")
        build_lib = self.get_finalized_command("build").build_lib
        stage = Path(self.bdist_dir)
        shutil.rmtree(stage, ignore_errors=True)
        shutil.copytree(build_lib, stage)
        name, version = self.distribution.get_name(), self.distribution.get_version()
        dist_info = stage / f"{name}-{version}.dist-info"
        egg_info = self.reinitialize_command("egg_info")
        egg_info.egg_base = str(stage)
        self.run_command("egg_info")
        self.egg2dist(egg_info.egg_info, str(dist_info))
        tag = _wheel_tag()
        (dist_info / "WHEEL").write_text(
            f"Wheel-Version: 1.0\nGenerator: odb setup.py (minimal bdist_wheel)\nRoot-Is-Purelib: false\nTag: {tag}\n")
        records = []
        for path in sorted(p for p in stage.rglob("*") if p.is_file()):
            data = path.read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append((path.relative_to(stage).as_posix(), f"sha256={digest}", str(len(data))))
        record = dist_info / "RECORD"
        records.append((record.relative_to(stage).as_posix(), "", ""))
        with open(record, "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows(records)
        os.makedirs(self.dist_dir, exist_ok=True)
        wheel_path = Path(self.dist_dir) / f"{name}-{version}-{tag}.whl"
        with zipfile.ZipFile(wheel_path, "w", zipfile.ZIP_DEFLATED) as zf:
            for rel, _, _ in records:
                zf.write(stage / rel, rel)
        if not self.keep_temp:
            shutil.rmtree(stage, ignore_errors=True)
        print(f"odb: wrote {wheel_path}")


def _cmdclass() -> Dict[str, type]:
    cmds: Dict[str, type] = {"build_ext": BuildExt}
    try:
        import wheel.bdist_wheel  # noqa: F401 - the real one when available
    except ImportError:
        cmds["bdist_wheel"] = MinimalBdistWheel
    return cmds


def _extension() -> Extension:
    _check_sources()
    # DT_RPATH (not RUNPATH): it also serves the bundled libraries' own dependencies
    # (libzmq.so.5 -> libsodium.so.23), which RUNPATH would not.
    link = ["-Wl,--disable-new-dtags", "-Wl,-rpath,$ORIGIN/.libs", "-Wl,--as-needed",
            *[f"-l{name}" for name in LIBS], "-lpthread"]
    return Extension(
        "odb._odb_native",
        sources=[str(ROOT / s) for s in CXX_SOURCES],
        include_dirs=[str(ROOT), str(ROOT / "client/cpp/include"), _pybind11_include()],
        language="c++",
        # The arena code is compiled from src/shm above, as Bazel links //src/shm (see BUILD).
        define_macros=[("ODB_SHM_LINKED", "1")],
        extra_compile_args=["-std=c++20", "-O2", "-g0", "-fvisibility=hidden", "-fvisibility-inlines-hidden",
                            "-Wno-unused-parameter"],
        extra_link_args=link,
    )


setup(
    ext_modules=[_extension()],
    cmdclass=_cmdclass(),
    options={"build": {"build_base": str(BUILD_DIR / "build")}, "egg_info": {"egg_base": str(BUILD_DIR)}},
)
