"""Builds the `odb` package: the `odb._odb_native` extension and the daemon, `odb/bin/odbd`.

    pip install --no-build-isolation ./client/python      # offline, from a source checkout

setuptools builds the package, `wheel`'s bdist_wheel the wheel, pybind11's Pybind11Extension and
ParallelCompile the extension: client/python/bindings.cc, the C++ client (client/cpp/src/*.cc),
the tensor codec (src/wire, src/common/dtype.cc), the arenas (src/shm) and the protobuf code that
the system `protoc` generates from proto/odb.proto into the build directory. The daemon is built
with Bazel (odb_build/odbd.py). pybind11 and wheel are pure Python: where the interpreter running
pip has neither (a venv of another Python, offline), Debian's python3-pybind11 and python3-wheel
are loaded from /usr/lib/python3/dist-packages.

Two ways to make the extension self-contained (docs/python.md, "Linking"):

* Bundled (the default; offline): Debian 12's static archives cannot go into a shared object
  (PIE code, local-exec thread-locals; no libgssapi_krb5.a at all), so the extension links the
  shared libraries and the build copies every one it needs beyond glibc and the GCC runtime
  (libzmq and what it pulls in, libprotobuf, abseil) into odb/.libs/, found through the
  extension's DT_RPATH $ORIGIN/.libs (auditwheel's approach; odb_build/bundle.py).
* Static (ODB_STATIC_DEPS=DIR): ZeroMQ, protobuf-lite and abseil rebuilt as position-independent
  archives in DIR from the Debian source packages (odb_build/static_deps.py) and linked with their
  symbols hidden: `ldd` of the extension shows only libc, libm, libstdc++ and libgcc_s. If the
  archives cannot be made the build falls back to bundling, with a warning
  (ODB_STATIC_REQUIRED=1: an error instead).

odbd links the system's shared libraries either way: they go into odb/.libs too (DT_RPATH
$ORIGIN/../.libs), so the installed package needs no libzmq, libprotobuf... of the system.

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
  ODB_STATIC_DEPS   a folder for (or with) the position-independent static archives
  ODB_STATIC_REQUIRED=1  fail instead of falling back to bundling
  ODB_ODBD_BINARY, ODB_REUSE_BUILD, BAZEL, PATCHELF, ODB_REQUIRE_ODBD  the daemon's build (odb_build/odbd.py;
                    .build/src/daemon/odbd when newer than its sources):
                    without Bazel the package is built without odbd, with a warning
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from setuptools import Command, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.command.build import build
except ImportError:  # setuptools < 62
    from distutils.command.build import build

HERE = Path(__file__).resolve().parent
ROOT = Path(os.environ.get("ODB_SOURCE_ROOT") or HERE.parents[1]).resolve()
BUILD_DIR = Path(os.environ.get("ODB_BUILD_DIR") or ROOT / ".build" / "pip").resolve()
sys.path.insert(0, str(HERE))  # odb_build/ (setuptools' PEP 517 backend does not add it)

from odb_build.bundle import bundle_shared_libs  # noqa: E402
from odb_build.odbd import build_odbd  # noqa: E402
from odb_build.static_deps import say, static_link_args  # noqa: E402

# A literal list: bench/gpu_run.sh reads it (ast) to compile the extension without setuptools.
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

DEBIAN_DIST_PACKAGES = Path("/usr/lib/python3/dist-packages")


def _import_or_debian(name: str, debian_package: str) -> ModuleType:
    """`import name`, or Debian's pure-Python copy of it (python3-<name>) when this interpreter has none:
    a venv of another Python builds offline with the Debian machine's pybind11 and wheel. Only that
    one package is loaded from dist-packages, never the folder put on sys.path."""
    try:
        return importlib.import_module(name)
    except ImportError:
        pass
    init = DEBIAN_DIST_PACKAGES / name / "__init__.py"
    if not init.is_file():
        raise SystemExit(f"odb: building the package needs the Python package '{name}', which this interpreter "
                         f"({sys.executable}) cannot import: pip install {name}, or on Debian apt install "
                         f"{debian_package} (used from {DEBIAN_DIST_PACKAGES} by any Python)")
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_import_or_debian("pybind11", "python3-pybind11 pybind11-dev")
from pybind11.setup_helpers import ParallelCompile, Pybind11Extension  # noqa: E402

try:  # setuptools >= 70.1 has bdist_wheel itself
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    _import_or_debian("wheel", "python3-wheel")
    from wheel.bdist_wheel import bdist_wheel

# The extension's C++ compiles in parallel (ODB_BUILD_JOBS, default the CPU count).
ParallelCompile("ODB_BUILD_JOBS", default=0).install()


def _check_sources() -> None:
    missing = [s for s in CXX_SOURCES + ["proto/odb.proto"] if not (ROOT / s).exists()]
    if missing:
        raise SystemExit(
            f"odb: C++ sources not found under {ROOT} ({', '.join(missing)}): build from an odb source "
            "checkout (`pip install --no-build-isolation ./client/python`; pip >= 21.3 builds in place) "
            "or set ODB_SOURCE_ROOT to the checkout")


class BuildExt(build_ext):
    """Generates the protobuf C++ code, links statically or bundles the shared libraries."""

    def build_extension(self, ext: Pybind11Extension) -> None:
        static = static_link_args()
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
        ext.sources.append(str(pb_cc))
        ext.include_dirs.insert(0, str(gen))  # "proto/odb.pb.h"
        if static is not None:
            ext.extra_link_args = static
        ext_path = Path(self.get_ext_fullpath(ext.name))
        # An earlier build of the other kind (static or bundled) links again: the objects did not change.
        marker = Path(self.build_temp) / "odb-link-kind"
        kind = "static" if static is not None else "bundled"
        if ext_path.exists() and (not marker.exists() or marker.read_text() != kind):
            ext_path.unlink()
        super().build_extension(ext)
        marker.write_text(kind)
        if static is None:
            bundle_shared_libs(ext_path, ext_path.parent / ".libs")


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


class BuildOdbd(Command):
    """Puts the daemon in the package: odb/bin/odbd with its libraries in odb/.libs (odb_build/odbd.py)."""

    description = "build odbd with Bazel and bundle it into the package"
    user_options: list = []

    def initialize_options(self) -> None:
        self.build_lib = None

    def finalize_options(self) -> None:
        self.set_undefined_options("build", ("build_lib", "build_lib"))

    def run(self) -> None:
        reason = build_odbd(ROOT, Path(self.build_lib) / "odb")
        if reason is None:
            return
        if os.environ.get("ODB_REQUIRE_ODBD") == "1":
            raise SystemExit(f"odb: odbd cannot be built into the package (ODB_REQUIRE_ODBD=1): {reason}")
        say(f"WARNING: the package is built without odbd: {reason}. odb.find_odbd() will look at $ODBD and PATH.")


class Build(build):
    sub_commands = build.sub_commands + [("build_odbd", None)]


def _extension() -> Pybind11Extension:
    _check_sources()
    # DT_RPATH (not RUNPATH): it also serves the bundled libraries' own dependencies
    # (libzmq.so.5 -> libsodium.so.23), which RUNPATH would not.
    link = ["-Wl,--disable-new-dtags", "-Wl,-rpath,$ORIGIN/.libs", "-Wl,--as-needed",
            *[f"-l{name}" for name in LIBS], "-lpthread"]
    # The headers the sources include: an edited header rebuilds the extension (a kept build folder).
    headers = sorted(str(h) for d in ("client/cpp/include", "client/cpp/src", "client/python", "src/wire",
                                      "src/common", "src/shm") for h in (ROOT / d).rglob("*.h"))
    return Pybind11Extension(
        "odb._odb_native",
        sources=[str(ROOT / s) for s in CXX_SOURCES],
        depends=headers + [str(ROOT / "proto" / "odb.proto")],
        include_dirs=[str(ROOT), str(ROOT / "client/cpp/include")],
        cxx_std=20,  # Pybind11Extension adds -fvisibility=hidden and -g0
        # The arena code is compiled from src/shm above, as Bazel links //src/shm (see BUILD).
        define_macros=[("ODB_SHM_LINKED", "1")],
        extra_compile_args=["-O2", "-fvisibility-inlines-hidden", "-Wno-unused-parameter"],
        extra_link_args=link,
    )


setup(
    ext_modules=[_extension()],
    cmdclass={"build": Build, "build_ext": BuildExt, "build_odbd": BuildOdbd, "bdist_wheel": bdist_wheel},
    options={"build": {"build_base": str(BUILD_DIR / "build")}, "egg_info": {"egg_base": str(BUILD_DIR)}},
)
