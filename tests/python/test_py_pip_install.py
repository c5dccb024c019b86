"""`pip install --no-build-isolation ./client/python` into a fresh venv of an interpreter that is not Debian's.

The venv (of the `python3` on PATH, e.g. pyenv's) has neither torch, numpy nor
pybind11, and no `wheel` package: setup.py loads Debian's pure-Python pybind11
(setup_helpers) and wheel (bdist_wheel). The package is built once per session
in a temporary folder (the C++ compile takes a minute or two on 2 cores; odbd
comes from Bazel, a cache hit after ./scripts/build.sh), then:

* the installed extension's and odbd's shared libraries resolve inside the
  package (odb/.libs) apart from glibc and the GCC runtime: no system
  libzmq/libprotobuf/abseil/yaml-cpp...;
* a script in the venv, with no $ODBD and no odbd on PATH, imports odb without
  torch, finds the package's own odbd (odb.find_odbd()), spawns it and runs an
  epoch: samples sent with odb.Producer come back intact through odb.Consumer;
* `pip wheel` makes a wheel holding the extension, odbd and their libraries;
* the same script runs with the system's libzmq, libprotobuf, libsodium,
  abseil, yaml-cpp, gloo... made unreadable (bind-mounted over with /dev/null in
  a private mount namespace, where unshare is allowed), the daemon inside that
  namespace too: the package needs none of them;
* odb.__version__ is the package metadata's version (one place: odb/__init__.py);
* without Bazel the package is built without odbd and says why (find_odbd()'s
  error quotes it); with ODB_REQUIRE_ODBD=1 that is a build error;
* the `odbctl` console script works from the venv: --help, find-odbd, a live
  2-rank demo against real daemons, top, report;
* docs/hand-run.md's pip-only hand-run block (the one marked "pip-only hand-run") runs
  as written, with bash, from the venv alone (its bin on PATH, no odbd
  elsewhere, not in the checkout): its odbd, `odbctl consume` verifying every
  byte of the 2000 samples `odbctl produce` sent;
* with ODB_STATIC_DEPS (ZeroMQ, protobuf-lite and abseil rebuilt as PIC archives
  from Debian's source packages, kept in .build/static-deps) the extension links
  them statically: `ldd` shows only libc/libm/libstdc++/libgcc_s (odb/.libs
  holds only what odbd needs).
  It skips only when the Debian source packages cannot be fetched (no network).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import zipfile
from pathlib import Path
from typing import Dict, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What every Linux with Python provides; anything else must come from the package.
SYSTEM_LIBS = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libdl.so", "librt.so", "libpthread.so",
               "libresolv.so", "libstdc++.so", "libgcc_s.so")


def _clean_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ODB_", "PIP_"))}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1")
    env.update(extra)
    return env


def _run(args: list, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, args))[:500]} failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p


def _other_python() -> str:
    """The `python3` on PATH, when it is not Debian's (else the test skips)."""
    interp = shutil.which("python3")
    if interp is None:
        pytest.skip("no python3 on PATH")
    real = subprocess.run([interp, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                          env=_clean_env()).stdout.strip()
    if real and os.path.exists("/usr/bin/python3") and os.path.samefile(real, "/usr/bin/python3"):
        pytest.skip(f"python3 on PATH ({interp}) is Debian's /usr/bin/python3: this test needs a second, "
                    f"non-Debian interpreter (e.g. pyenv) to show that the package installs outside Debian's")
    return interp


def _site(py: Path) -> Path:
    return Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                     env=_clean_env()).stdout.strip())


@pytest.fixture(scope="session")
def pip_venv(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    interp = _other_python()
    tmp = tmp_path_factory.mktemp("pip")
    venv, build, wheels = tmp / "venv", tmp / "build", tmp / "wheels"
    _run([interp, "-m", "venv", venv], env=_clean_env())
    py = venv / "bin" / "python"
    env = _clean_env(ODB_BUILD_DIR=str(build))
    _run([py, "-m", "pip", "install", "--no-build-isolation", ROOT / "client/python"], env=env, cwd=tmp)
    # Same build folder: the extension is not compiled again.
    _run([py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", wheels, ROOT / "client/python"],
         env=env, cwd=tmp)
    return {"python": py, "tmp": tmp, "package": _site(py) / "odb", "wheels": wheels, "bin": venv / "bin",
            "build": build}


# Where the position-independent archives are built once and kept (git ignores .build/).
STATIC_DEPS = ROOT / ".build" / "static-deps"


@pytest.fixture(scope="session")
def static_venv(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """A second venv whose extension links ZeroMQ, protobuf-lite and abseil statically (ODB_STATIC_DEPS)."""
    interp = _other_python()
    tmp = tmp_path_factory.mktemp("pip-static")
    venv = tmp / "venv"
    _run([interp, "-m", "venv", venv], env=_clean_env())
    py = venv / "bin" / "python"
    env = _clean_env(ODB_BUILD_DIR=str(tmp / "build"), ODB_STATIC_DEPS=str(STATIC_DEPS), ODB_STATIC_REQUIRED="1")
    p = subprocess.run([str(py), "-m", "pip", "install", "-v", "--no-build-isolation", str(ROOT / "client/python")],
                       capture_output=True, text=True, env=env, cwd=tmp, timeout=3000)
    if p.returncode != 0 and "cannot fetch Debian source packages" in p.stdout + p.stderr:
        pytest.skip("the static build needs Debian's source packages once (apt-get source), and they cannot be "
                    "fetched here:\n" + (p.stdout + p.stderr)[-1500:])
    assert p.returncode == 0, f"static pip install failed:\n{p.stdout[-6000:]}\n{p.stderr[-3000:]}"
    return {"python": py, "tmp": tmp, "package": _site(py) / "odb", "bin": venv / "bin"}


def _ldd(ext: Path) -> Dict[str, str]:
    resolved = {}
    for line in _run(["ldd", ext]).stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>":
            resolved[parts[0]] = parts[2]
    return resolved


# System libraries the package must not need: hidden from a run where the kernel lets us.
HIDDEN = ("libzmq.so", "libprotobuf.so", "libprotobuf-lite.so", "libsodium.so", "libpgm-", "libnorm.so",
          "libabsl_", "libgssapi_krb5.so", "libkrb5.so", "libk5crypto.so", "libyaml-cpp.so", "libgloo.so",
          "libspdlog.so", "libfmt.so", "libhiredis.so", "libibverbs.so", "libnl-", "libbsd.so", "libmd.so")


def _without_system_libs(cmd: List[str], tmp: Path) -> Optional[List[str]]:
    """`cmd` run in a private mount namespace where the system's libzmq, libprotobuf, libsodium, abseil...
    are /dev/null (as on a machine without them); None where unshare is not allowed (not root)."""
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        return None
    files = sorted({str(Path(p).resolve()) for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu",
                                                       "/usr/lib64", "/usr/local/lib") if os.path.isdir(d)
                    for p in Path(d).iterdir() if p.name.startswith(HIDDEN) and ".so" in p.name})
    script = tmp / "hide_system_libs.sh"
    script.write_text("set -e\n" + "".join(f"mount --bind /dev/null {f}\n" for f in files) + 'exec "$@"\n')
    return ["unshare", "-m", "--propagation", "private", "sh", str(script), *map(str, cmd)]


@pytest.mark.parametrize("binary", ["extension", "odbd"])
def test_installed_binaries_need_no_system_zmq_or_protobuf(pip_venv: Dict[str, Path], binary: str) -> None:
    package = pip_venv["package"]
    (path,) = package.glob("_odb_native*.so") if binary == "extension" else [package / "bin" / "odbd"]
    resolved = _ldd(path)
    assert "not" not in resolved.values(), resolved
    outside = {name: where for name, where in resolved.items()
               if not name.startswith(SYSTEM_LIBS) and Path(where).resolve().parent != (package / ".libs").resolve()}
    assert not outside, f"{binary}: libraries resolved outside the package: {outside}"
    for lib in ("libzmq.so", "libprotobuf.so") + (("libyaml-cpp.so", "libspdlog.so") if binary == "odbd" else ()):
        (where,) = [p for n, p in resolved.items() if n.startswith(lib)]
        assert Path(where).resolve().parent == (package / ".libs").resolve(), resolved
    assert (package / "py.typed").exists()


def test_wheel_holds_the_extension_and_its_libraries(pip_venv: Dict[str, Path]) -> None:
    (wheel,) = pip_venv["wheels"].glob("odb-*.whl")
    tag = wheel.name.split("-", 2)[2]
    assert tag.startswith("cp3") and tag.endswith("linux_x86_64.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("odb/_odb_native") and n.endswith(".so") for n in names), names
    assert "odb/.libs/libzmq.so.5" in names and any(n.startswith("odb/.libs/libprotobuf.so") for n in names), names
    assert any(n.startswith("odb/.libs/libyaml-cpp.so") for n in names), names  # odbd's own libraries
    odbd = zipfile.ZipFile(wheel).getinfo("odb/bin/odbd")
    assert (odbd.external_attr >> 16) & 0o111, oct(odbd.external_attr >> 16)  # installed executable
    assert any(n.endswith(".dist-info/RECORD") for n in names) and "odb/py.typed" in names
    assert "odb/_odb_native.pyi" in names and "odb/cli.py" in names and "odb/launch.py" in names, names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "odbctl = odb.cli:main" in scripts and "odbd = odb.cli:odbd_main" in scripts, scripts


END_TO_END = textwrap.dedent(r'''
    import ctypes, json, os, struct, sys, tempfile, threading, uuid
    from pathlib import Path
    try:
        import torch  # noqa: F401
        sys.exit("torch is importable in the venv: the test would not show odb works without it")
    except ImportError:
        pass
    import odb
    assert "site-packages" in odb.__file__, odb.__file__
    assert "torch" not in sys.modules and "numpy" not in sys.modules
    try:
        odb.OdbDataLoader
        sys.exit("odb.OdbDataLoader imported without torch")
    except ImportError as e:
        loader_error = str(e)
    import importlib.metadata
    assert odb.__version__ == importlib.metadata.version("odb"), odb.__version__
    odbd = odb.find_odbd()  # no $ODBD, no odbd on PATH: the package's own
    assert odbd == Path(odb.__file__).resolve().parent / "bin" / "odbd", odbd
    run_dir = tempfile.mkdtemp(prefix="odbpip-")
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=f"pip-{uuid.uuid4().hex[:8]}",
                              config={"grouping": {"max_tokens": 64}}, log_level="warn")
    with open(f"/proc/{daemon.proc.pid}/maps") as f:
        daemon_mapped = sorted({line.split()[-1] for line in f if ".so" in line.split()[-1]})
    from odb._native import native
    n, int64 = 40, native().DTYPES["int64"]
    lengths = {i: 1 + (i * 7) % 13 for i in range(n)}
    errors = []
    def produce():
        try:
            p = odb.Producer(daemon.ingest, "pip-p0", 0)
            p.start_epoch(0)
            for i in range(n):
                ids = struct.pack(f"<{lengths[i]}q", *[i * 1000 + j for j in range(lengths[i])])
                p.send(i, 0, lengths[i], 0, 0, [("input_ids", int64, (lengths[i],), ids)])
            p.end_stream(0)
        except Exception as e:  # reported below
            errors.append(repr(e))
    try:
        c = odb.Consumer(daemon.trainer, 30000)
        c.start_epoch(0, 1)
        t = threading.Thread(target=produce)
        t.start()
        seen, steps = {}, 0
        while True:
            d = c.next()
            if not d.is_step:
                summary = d.summary
                break
            s = d.step
            if s["idle"]:
                continue
            steps += 1
            rows = len(s["sample_ids"])
            nbytes = d.frame_bytes("input_ids")
            data = ctypes.string_at(d.frame_address("input_ids"), nbytes)
            width = nbytes // 8 // rows
            values = struct.unpack(f"<{rows * width}q", data)
            for r, (sid, length) in enumerate(zip(s["sample_ids"], s["lengths"])):
                assert length == lengths[sid], (sid, length)
                row = list(values[r * width:r * width + length])
                assert row == [sid * 1000 + j for j in range(length)], (sid, row)
                assert sid not in seen
                seen[sid] = length
        t.join(30)
    finally:
        daemon.stop()
    with open("/proc/self/maps") as f:
        mapped = sorted({line.split()[-1] for line in f if ".so" in line.split()[-1]})
    print(json.dumps({"errors": errors, "seen": len(seen), "steps": steps, "summary": summary,
                      "loader_error": loader_error, "odbd": str(odbd), "mapped": mapped,
                      "daemon_mapped": daemon_mapped, "package": os.path.dirname(odb.__file__)}))
''')


def _path_without_odbd() -> str:
    """$PATH less any folder holding an `odbd`: the venv alone must provide it."""
    path = os.environ.get("PATH", "/usr/bin:/bin")
    return os.pathsep.join(p for p in path.split(os.pathsep) if not (Path(p) / "odbd").exists())


def _end_to_end(venv: Dict[str, Path], hide_system_libs: bool = False) -> dict:
    """A whole epoch from the venv alone: its odb, its odbd (found by odb.find_odbd()), their libraries."""
    script = venv["tmp"] / "end_to_end.py"
    script.write_text(END_TO_END)
    cmd: Optional[List[str]] = [str(venv["python"]), str(script)]
    env = _clean_env(PATH=_path_without_odbd())
    if hide_system_libs:
        cmd = _without_system_libs(cmd, venv["tmp"])  # type: ignore[arg-type]
        if cmd is None:
            pytest.skip("unshare -m is not allowed here (needs root): the ldd and /proc/self/maps checks stand")
    out = _run(cmd, env=env, cwd=venv["tmp"], timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == [], result
    assert result["seen"] == 40 and result["steps"] >= 2, result
    assert result["summary"]["received"] == 40 and result["summary"]["emitted"] == 40, result
    assert result["summary"]["rejected"] == 0, result
    assert "torch" in result["loader_error"], result
    assert result["odbd"] == str(venv["package"].resolve() / "bin" / "odbd"), result
    return result


def test_an_epoch_from_the_venv_alone_through_its_own_odbd_without_torch(pip_venv: Dict[str, Path]) -> None:
    result = _end_to_end(pip_venv)
    # What the processes really loaded (not only what ldd says): libzmq, libprotobuf, yaml-cpp from odb/.libs.
    libs = (pip_venv["package"] / ".libs").resolve()
    ours = [m for m in result["mapped"] if Path(m).name.startswith(("libzmq", "libprotobuf"))]
    assert len(ours) >= 2 and all(Path(m).resolve().parent == libs for m in ours), result["mapped"]
    daemon = [m for m in result["daemon_mapped"] if Path(m).name.startswith(HIDDEN)]
    assert any(Path(m).name.startswith("libyaml-cpp") for m in daemon), result["daemon_mapped"]
    assert all(Path(m).resolve().parent == libs for m in daemon), result["daemon_mapped"]


def test_runs_where_the_system_has_no_libzmq_or_libprotobuf(pip_venv: Dict[str, Path]) -> None:
    result = _end_to_end(pip_venv, hide_system_libs=True)  # odbd runs inside the namespace too
    assert any(Path(m).name.startswith("libzmq") for m in result["mapped"]), result["mapped"]
    assert any(Path(m).name.startswith("libyaml-cpp") for m in result["daemon_mapped"]), result["daemon_mapped"]


FIND_ODBD = ("import odb\ntry:\n    print(odb.find_odbd())\nexcept FileNotFoundError as e:\n"
             "    print('ERROR', e)\n")


def test_find_odbd_order(pip_venv: Dict[str, Path], tmp_path: Path) -> None:
    """$ODBD, then the package's own odbd (built with the client: same protocol), then PATH."""
    fake = tmp_path / "bin" / "odbd"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    own = str(pip_venv["package"].resolve() / "bin" / "odbd")
    bare = _path_without_odbd()
    alone = _run([pip_venv["python"], "-c", FIND_ODBD], env=_clean_env(PATH=bare), cwd=tmp_path).stdout.strip()
    assert alone == own, alone
    on_path = _run([pip_venv["python"], "-c", FIND_ODBD], env=_clean_env(PATH=f"{fake.parent}{os.pathsep}{bare}"),
                   cwd=tmp_path).stdout.strip()
    assert on_path == own, on_path
    env_wins = _run([pip_venv["python"], "-c", FIND_ODBD],
                    env=_clean_env(PATH=f"{fake.parent}{os.pathsep}{bare}", ODBD=str(fake)), cwd=tmp_path).stdout.strip()
    assert env_wins == str(fake), env_wins


def test_without_bazel_the_package_has_no_odbd_and_says_why(pip_venv: Dict[str, Path], tmp_path: Path) -> None:
    """No Bazel at build time: a warning, a package without odbd whose find_odbd() error quotes the reason,
    then PATH; ODB_REQUIRE_ODBD=1 makes it a build error. (Same build folder: the extension is not compiled
    again, and the earlier build's odbd must not leak into this package.)"""
    py, target = pip_venv["python"], tmp_path / "target"
    env = _clean_env(ODB_BUILD_DIR=str(pip_venv["build"]), BAZEL=str(tmp_path / "no-bazel"), ODB_REUSE_BUILD="0")
    install = [py, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps", "--target", target,
               ROOT / "client/python"]
    built = _run(install, env=env, cwd=tmp_path)
    assert "WARNING: the package is built without odbd: Bazel is not installed" in built.stdout + built.stderr
    assert not (target / "odb" / "bin" / "odbd").exists(), list((target / "odb" / "bin").iterdir())
    out = _run([py, "-c", FIND_ODBD], env=_clean_env(PATH=_path_without_odbd(), PYTHONPATH=str(target)),
               cwd=tmp_path).stdout
    assert out.startswith("ERROR") and "$ODBD" in out and "PATH" in out, out
    assert "this odb package has no odbd of its own: Bazel is not installed" in out and "ODB_ODBD_BINARY" in out, out
    # The package's `odbd` command says the same (its console script execs odb/bin/odbd).
    odbd_cmd = subprocess.run([str(py), "-c", "import sys; sys.argv = ['odbd', '--help']; import odb.cli; "
                               "odb.cli.odbd_main()"], capture_output=True, text=True, timeout=60,
                              env=_clean_env(PYTHONPATH=str(target)), cwd=tmp_path)
    assert odbd_cmd.returncode == 1 and "has no odbd of its own: Bazel is not installed" in odbd_cmd.stderr, odbd_cmd
    fake = tmp_path / "bin" / "odbd"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    on_path = _run([py, "-c", FIND_ODBD], env=_clean_env(PATH=f"{fake.parent}{os.pathsep}{_path_without_odbd()}",
                                                        PYTHONPATH=str(target)), cwd=tmp_path).stdout.strip()
    assert on_path == str(fake), on_path
    env["ODB_REQUIRE_ODBD"] = "1"
    shutil.rmtree(target)
    required = subprocess.run([str(a) for a in install], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert required.returncode != 0, required.stdout[-2000:]
    assert "odbd cannot be built into the package (ODB_REQUIRE_ODBD=1): Bazel is not installed" in \
        required.stdout + required.stderr, (required.stdout + required.stderr)[-3000:]


def _odbctl(venv: Dict[str, Path], *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    """The installed console script (venv/bin/odbctl), as a user runs it."""
    cmd = [str(venv["bin"] / "odbctl"), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(**env), cwd=venv["tmp"], timeout=180)
    if check:
        assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def test_odbctl_console_script(pip_venv: Dict[str, Path], tmp_path: Path) -> None:
    odbd = str(ROOT / ".build/src/daemon/odbd")
    assert (pip_venv["bin"] / "odbctl").exists(), list(pip_venv["bin"].iterdir())
    usage = _odbctl(pip_venv, "--help").stdout
    for command in ("top", "demo", "report", "find-odbd"):
        assert command in usage, usage
    version = _run([pip_venv["python"], "-c", "import odb; print(odb.__version__)"], env=_clean_env()).stdout.strip()
    assert version and _odbctl(pip_venv, "--version").stdout.strip() == f"odbctl {version}"
    assert "metrics endpoint" in _odbctl(pip_venv, "top", "--help").stdout
    assert _odbctl(pip_venv, "find-odbd", ODBD=odbd).stdout.strip() == odbd
    gone = _odbctl(pip_venv, "find-odbd", check=False, ODBD=str(tmp_path / "none"))
    assert gone.returncode == 1 and "odbctl find-odbd:" in gone.stderr, gone
    bad = _odbctl(pip_venv, "frobnicate", check=False)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr, bad
    # The live view of a 2-rank job: two real daemons (global planner), a producer and consumer per rank.
    # From the venv alone: its own odbd (no $ODBD, none on PATH).
    demo = _odbctl(pip_venv, "demo", "--plain", "--samples", "150", "--delay", "0", PATH=_path_without_odbd()).stdout
    rows = {int(line.split()[0]): line.split() for line in demo.splitlines() if line[:4].strip().isdigit()}
    assert sorted(rows) == [0, 1], demo
    sent = [50, 100]  # 150 samples, rank r's share growing as r + 1 (odb.cli.demo_counts)
    assert [int(rows[r][1]) for r in range(2)] == sent, demo              # samples in, per rank
    assert int(rows[0][2]) + int(rows[1][2]) == sum(sent), demo           # all emitted
    assert rows[0][4] == rows[1][4] and int(rows[0][4]) >= 2, demo        # same step count on both ranks
    assert "max/mean" in demo and "steps per rank" in demo, demo
    unreachable = _odbctl(pip_venv, "top", "--once", "http://127.0.0.1:9", check=False)
    assert unreachable.returncode == 1 and "unreachable: http://127.0.0.1:9" in unreachable.stdout, unreachable
    # No matplotlib in the venv: report says what to install; a folder without records says so.
    (tmp_path / "rank0-epoch0.jsonl").write_text(json.dumps(
        {"epoch": 0, "rank": 0, "step": 0, "real": 5, "padded": 8, "idle": False, "lengths": [5]}) + "\n")
    report = _odbctl(pip_venv, "report", str(tmp_path), check=False)
    assert report.returncode == 1 and "matplotlib" in report.stderr, report
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _odbctl(pip_venv, "report", str(empty), check=False).returncode == 1


def test_odbctl_report_writes_pngs_with_debian_python(tmp_path: Path) -> None:
    """The same entry point in Debian's interpreter (matplotlib installed) writes the epoch's PNG."""
    for rank in range(2):
        with open(tmp_path / f"rank{rank}-epoch0.jsonl", "w") as f:
            for step in range(4):
                f.write(json.dumps({"epoch": 0, "rank": rank, "step": step, "real": 10 + rank + step,
                                    "padded": 16, "idle": rank == 1 and step == 3, "lengths": [4, 6 + step]}) + "\n")
    out = _run(["/usr/bin/python3", "-c", "import sys, odb.cli; sys.exit(odb.cli.main(sys.argv[1:]))",
                "report", tmp_path, "--out", tmp_path / "png"],
               env=_clean_env(PYTHONPATH=str(ROOT / "client/python")), cwd=tmp_path, timeout=120).stdout
    (png,) = [Path(line) for line in out.split()]
    assert png.parent == tmp_path / "png" and png.suffix == ".png" and png.read_bytes()[:4] == b"\x89PNG", out


def test_static_extension_links_no_zmq_protobuf_or_abseil(static_venv: Dict[str, Path]) -> None:
    package = static_venv["package"]
    (ext,) = package.glob("_odb_native*.so")
    resolved = _ldd(ext)
    assert set(resolved) <= {"libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6"}, resolved
    # odb/.libs holds odbd's libraries only (odbd links the shared ones in either build).
    assert {p.name for p in (package / ".libs").iterdir()} <= set(_ldd(package / "bin" / "odbd")), \
        sorted(p.name for p in (package / ".libs").iterdir())
    exported = _run(["nm", "-D", "--defined-only", ext]).stdout
    assert "PyInit__odb_native" in exported
    assert not [line for line in exported.splitlines() if "zmq_" in line or "google" in line or "absl" in line]


def test_static_extension_end_to_end_without_system_libs(static_venv: Dict[str, Path]) -> None:
    result = _end_to_end(static_venv)
    assert not [m for m in result["mapped"] if Path(m).name.startswith(HIDDEN)], result["mapped"]
    _end_to_end(static_venv, hide_system_libs=True)
    assert _odbctl(static_venv, "find-odbd").stdout.strip() == str(static_venv["package"].resolve() / "bin" / "odbd")


def _readme_pip_block() -> str:
    """docs/hand-run.md's pip-only hand-run block (the README links it): the sh block right after its marker."""
    lines = (ROOT / "docs" / "hand-run.md").read_text().splitlines()
    (mark,) = [i for i, line in enumerate(lines) if line.startswith("<!-- pip-only hand-run")]
    assert lines[mark + 1].strip() == "```sh", lines[mark + 1]
    end = next(i for i in range(mark + 2, len(lines)) if lines[i].strip().startswith("```"))
    return "\n".join(lines[mark + 2:end]) + "\n"


def test_readme_pip_only_hand_run_from_the_venv_alone(pip_venv: Dict[str, Path], tmp_path: Path) -> None:
    """Issue 23's "Done when": a fresh venv with only `pip install ./client/python` runs docs/hand-run.md's
    hand-run example end to end (the pip-only block, as written)."""
    block = _readme_pip_block()
    assert "odbctl produce" in block and "odbctl consume" in block and ".build/" not in block, block
    run_dir = Path(f"/tmp/odbpip-{os.getpid()}")  # short: ipc paths must stay under 108 bytes
    env = _clean_env(PATH=f"{pip_venv['bin']}{os.pathsep}{_path_without_odbd()}", ODB_RUN_DIR=str(run_dir),
                     VIRTUAL_ENV=str(pip_venv["bin"].parent))
    env.pop("ODBD", None)
    try:
        # Its own session, run outside the checkout: whatever it leaves in the background dies with it.
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=180)
        finally:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            proc.wait()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    (consumed,) = [r for r in results if "verified" in r]
    (produced,) = [r for r in results if "sent" in r]
    assert produced["sent"] == 2000, results
    assert consumed["verified"] and consumed["problems"] == [], consumed
    assert consumed["samples"] == consumed["received"] == consumed["emitted"] == 2000, consumed
    assert consumed["rejected"] == 0 and consumed["steps"] >= 2, consumed
    # The odbd it started is the venv's own (the block starts "$(odbctl find-odbd)" in this environment).
    found = _run([pip_venv["bin"] / "odbctl", "find-odbd"], env=env, cwd=tmp_path).stdout.strip()
    assert found == str(pip_venv["package"].resolve() / "bin" / "odbd"), found


# ----------------------------------------------------------------- the wheel of ./scripts/build.sh (issue 31)

# What a build would run: each stands first on PATH during the install and fails loudly, logging its call.
BUILD_TOOLS = ("bazel", "bazelisk", "gcc", "g++", "cc", "c++", "clang", "clang++", "gcc-12", "g++-12",
               "x86_64-linux-gnu-gcc", "x86_64-linux-gnu-g++", "x86_64-linux-gnu-gcc-12", "x86_64-linux-gnu-g++-12",
               "ld", "protoc", "patchelf", "cmake", "make")


def _failing_tools(tmp: Path, names: tuple = BUILD_TOOLS) -> tuple:
    """A folder of stand-ins for `names` that log their call to a file and exit 97, and that log."""
    shims, log = tmp / "shims", tmp / "build-tools-called.log"
    shims.mkdir()
    for name in names:
        (shims / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n'
                                  f'echo "{name} ran during an install that must not build anything" >&2\nexit 97\n')
        (shims / name).chmod(0o755)
    return shims, log


def _doc_block(doc: str, heading: str, lang: str) -> str:
    """The first ```lang block after the line that starts with `heading` in `doc` (dedented)."""
    lines = (ROOT / doc).read_text().splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith(heading)]
    first = next(i for i in range(start, len(lines)) if lines[i].strip() == f"```{lang}")
    end = next(i for i in range(first + 1, len(lines)) if lines[i].strip().startswith("```"))
    return textwrap.dedent("\n".join(lines[first + 1:end])) + "\n"


def _pip_command(block: str) -> str:
    (line,) = [ln.split("#")[0].strip() for ln in block.splitlines() if ln.startswith("pip install")]
    return line


def test_the_wheel_installs_with_the_documented_commands_without_bazel_or_a_compiler(tmp_path: Path) -> None:
    """Issue 31's "Done when": after ./scripts/build.sh, docs/python.md's install block (README quotes its
    one pip command) installs the wheel into a new venv of Debian's python3 made with --system-site-packages,
    with Bazel and every compiler failing first on PATH; then `odbd --help`, the windows loop and the
    torchrun command of docs/python.md run from that venv (Debian's torch, the package's odb and odbd)."""
    import time

    wheels = sorted((ROOT / ".build" / "dist").glob("odb-*.whl"))
    assert len(wheels) == 1, f"./scripts/build.sh writes one wheel into .build/dist (found {wheels}): run it"
    block = _doc_block("docs/python.md", "## Install", "sh")
    lines = block.splitlines()
    assert lines[0].startswith("./scripts/build.sh"), lines[0]
    pip = _pip_command(block)
    assert pip.endswith(".build/dist/odb-*.whl") and "--no-index" in pip, pip
    assert f"`{pip}`" in (ROOT / "README.md").read_text(), f"README.md does not give the install command `{pip}`"
    shims, log = _failing_tools(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    env = _clean_env(HOME=str(home), PATH=f"{shims}{os.pathsep}{_path_without_odbd()}", CC=str(shims / "cc"),
                     CXX=str(shims / "c++"))
    env.pop("VIRTUAL_ENV", None)
    script = "\n".join(lines[1:]) + "\n"  # the build line ran before the suite
    started = time.monotonic()
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=600)
    took = time.monotonic() - started
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert not log.exists(), f"the install ran build tools:\n{log.read_text()}"
    print(f"docs/python.md's install block (venv + pip install of the wheel + --help): {took:.1f} s")
    venv = home / "odb-venv"
    cfg = (venv / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = true" in cfg and "/usr/bin" in cfg, cfg
    in_venv = _clean_env(PATH=f"{venv / 'bin'}{os.pathsep}{shims}{os.pathsep}{_path_without_odbd()}",
                         VIRTUAL_ENV=str(venv), OMP_NUM_THREADS="1")
    in_venv.pop("ODBD", None)  # the package's own odbd, found by odb.find_odbd()
    # `odbd` is a command of the venv, the package's own daemon.
    which = _run(["bash", "-c", "command -v odbd; odbd --help"], env=in_venv, cwd=tmp_path).stdout
    assert which.splitlines()[0] == str(venv / "bin" / "odbd"), which
    assert "--rank" in which and "--run-dir" in which, which
    where = _run([venv / "bin/python", "-c", "import odb, torch; print(odb.__file__); print(odb.find_odbd())"],
                 env=in_venv, cwd=tmp_path).stdout.split()
    assert where[0].startswith(str(venv)) and where[1].startswith(str(venv)), where
    # The windows loop, as docs/python.md gives it, from the venv (outside the checkout).
    loop = _doc_block("docs/python.md", "## Accumulation windows: the optimizer batch in loss tokens", "python")
    (tmp_path / "windows.py").write_text(loop)
    out = _run([venv / "bin/python", tmp_path / "windows.py"], env=in_venv, cwd=tmp_path, timeout=300).stdout
    assert "optimizer steps;" in out, out
    # The torchrun command of docs/python.md ("Daemon"), from the checkout with the venv's python3: its torch
    # is Debian's (--system-site-packages), its odb and odbd the wheel's.
    torchrun = _doc_block("docs/python.md", "* torchrun (tested in", "sh")
    assert torchrun.startswith("python3 -m torch.distributed.run"), torchrun
    run_dir = Path(f"/tmp/odbwheel-{os.getpid()}")  # short: ipc paths must stay under 108 bytes
    try:
        launched = _run(["bash", "-euo", "pipefail", "-c", torchrun], env=dict(in_venv, ODB_RUN_DIR=str(run_dir)),
                        cwd=ROOT, timeout=600)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    assert "No module named" not in launched.stdout + launched.stderr, launched.stderr[-3000:]
    assert not log.exists(), f"the venv's runs called build tools:\n{log.read_text()}"


def test_from_source_install_bundles_the_checkouts_build_without_bazel(pip_venv: Dict[str, Path],
                                                                        tmp_path: Path) -> None:
    """`pip install --no-build-isolation ./client/python` after ./scripts/build.sh: the checkout's
    .build/src/daemon/odbd (newer than its sources) goes into the package as is; Bazel, failing first on
    PATH and as $BAZEL, is never called (before: a Bazel build, ~15 minutes in a fresh clone)."""
    built = ROOT / ".build/src/daemon/odbd"
    assert built.is_file(), "run ./scripts/build.sh"
    shims, log = _failing_tools(tmp_path, ("bazel", "bazelisk"))
    target = tmp_path / "target"
    env = _clean_env(ODB_BUILD_DIR=str(pip_venv["build"]), BAZEL=str(shims / "bazel"),
                     PATH=f"{shims}{os.pathsep}{os.environ['PATH']}")
    p = subprocess.run([str(pip_venv["python"]), "-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps",
                        "--target", str(target), str(ROOT / "client/python")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1200)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert not log.exists(), f"Bazel ran:\n{log.read_text()}"
    assert f"odbd: bundling {built}" in out, ("the checkout's odbd was not reused (is it older than an edited "
                                              "source? run ./scripts/build.sh):\n" + out[-3000:])
    help_text = _run([target / "odb/bin/odbd", "--help"], env={}).stdout
    assert "--rank" in help_text
