"""`pip install --no-build-isolation ./client/python` into a fresh venv of an interpreter that is not Debian's.

The venv (of the `python3` on PATH, e.g. pyenv's) has neither torch, numpy nor
pybind11, and no `wheel` package: setup.py falls back to Debian's pybind11
headers and its own minimal bdist_wheel. The package is built once per session
in a temporary folder (the C++ compile takes a minute or two on 2 cores), then:

* the installed extension's shared libraries resolve inside the package
  (odb/.libs) apart from glibc and the GCC runtime: no system libzmq/libprotobuf;
* a script in the venv imports odb without torch, finds odbd through $ODBD, and
  sends samples with odb.Producer that come back intact through odb.Consumer;
* `pip wheel` makes a wheel holding the extension and its libraries.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import zipfile
from pathlib import Path
from typing import Dict

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
    assert p.returncode == 0, f"{' '.join(map(str, args))} failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p


@pytest.fixture(scope="session")
def pip_venv(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    interp = shutil.which("python3")
    if interp is None:
        pytest.skip("no python3 on PATH")
    real = subprocess.run([interp, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                          env=_clean_env()).stdout.strip()
    if real and os.path.exists("/usr/bin/python3") and os.path.samefile(real, "/usr/bin/python3"):
        pytest.skip(f"python3 on PATH ({interp}) is Debian's /usr/bin/python3: this test needs a second, "
                    f"non-Debian interpreter (e.g. pyenv) to show that the package installs outside Debian's")
    tmp = tmp_path_factory.mktemp("pip")
    venv, build, wheels = tmp / "venv", tmp / "build", tmp / "wheels"
    _run([interp, "-m", "venv", venv], env=_clean_env())
    py = venv / "bin" / "python"
    env = _clean_env(ODB_BUILD_DIR=str(build))
    _run([py, "-m", "pip", "install", "--no-build-isolation", ROOT / "client/python"], env=env, cwd=tmp)
    # Same build folder: the extension is not compiled again.
    _run([py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", wheels, ROOT / "client/python"],
         env=env, cwd=tmp)
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                     env=_clean_env()).stdout.strip())
    return {"python": py, "tmp": tmp, "package": site / "odb", "wheels": wheels}


def test_installed_extension_needs_no_system_zmq_or_protobuf(pip_venv: Dict[str, Path]) -> None:
    package = pip_venv["package"]
    (ext,) = package.glob("_odb_native*.so")
    ldd = _run(["ldd", ext]).stdout
    print(ldd)
    resolved = {}
    for line in ldd.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>":
            resolved[parts[0]] = parts[2]
    assert "not" not in resolved.values(), ldd
    outside = {name: path for name, path in resolved.items()
               if not name.startswith(SYSTEM_LIBS) and Path(path).resolve().parent != (package / ".libs").resolve()}
    assert not outside, f"libraries resolved outside the package: {outside}\n{ldd}"
    for lib in ("libzmq.so", "libprotobuf.so"):
        (path,) = [p for n, p in resolved.items() if n.startswith(lib)]
        assert Path(path).resolve().parent == (package / ".libs").resolve(), ldd
    assert (package / "py.typed").exists()


def test_wheel_holds_the_extension_and_its_libraries(pip_venv: Dict[str, Path]) -> None:
    (wheel,) = pip_venv["wheels"].glob("odb-*.whl")
    tag = wheel.name.split("-", 2)[2]
    assert tag.startswith("cp3") and tag.endswith("linux_x86_64.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("odb/_odb_native") and n.endswith(".so") for n in names), names
    assert "odb/.libs/libzmq.so.5" in names and any(n.startswith("odb/.libs/libprotobuf.so") for n in names), names
    assert any(n.endswith(".dist-info/RECORD") for n in names) and "odb/py.typed" in names


END_TO_END = textwrap.dedent(r'''
    import ctypes, json, os, struct, sys, tempfile, threading, uuid
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
    odbd = odb.find_odbd()
    assert str(odbd) == os.environ["ODBD"], odbd
    run_dir = tempfile.mkdtemp(prefix="odbpip-")
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=f"pip-{uuid.uuid4().hex[:8]}",
                              config={"grouping": {"max_tokens": 64}}, log_level="warn")
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
    print(json.dumps({"errors": errors, "seen": len(seen), "steps": steps, "summary": summary,
                      "loader_error": loader_error, "odbd": str(odbd)}))
''')


def test_producer_to_consumer_through_a_real_odbd_without_torch(pip_venv: Dict[str, Path]) -> None:
    odbd = ROOT / ".build/src/daemon/odbd"
    assert odbd.exists(), "run ./scripts/build.sh"
    script = pip_venv["tmp"] / "end_to_end.py"
    script.write_text(END_TO_END)
    out = _run([pip_venv["python"], script], env=_clean_env(ODBD=str(odbd)), cwd=pip_venv["tmp"], timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == [], result
    assert result["seen"] == 40 and result["steps"] >= 2, result
    assert result["summary"]["received"] == 40 and result["summary"]["emitted"] == 40, result
    assert result["summary"]["rejected"] == 0, result
    assert "torch" in result["loader_error"], result


def test_find_odbd_order_and_error(pip_venv: Dict[str, Path], tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "odbd"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    script = ("import odb\ntry:\n    print(odb.find_odbd())\nexcept FileNotFoundError as e:\n"
              "    print('ERROR', e)\n")
    path = os.environ.get("PATH", "/usr/bin:/bin")
    # An installed package is no source checkout: no $ODBD and no odbd on PATH is an error saying what to do.
    bare = [p for p in path.split(os.pathsep) if not (Path(p) / "odbd").exists()]
    out = _run([pip_venv["python"], "-c", script], env=_clean_env(PATH=os.pathsep.join(bare)),
               cwd=tmp_path).stdout
    assert out.startswith("ERROR") and "$ODBD" in out and "PATH" in out, out
    on_path = _run([pip_venv["python"], "-c", script], env=_clean_env(PATH=f"{fake.parent}{os.pathsep}{path}"),
                   cwd=tmp_path).stdout.strip()
    assert on_path == str(fake), on_path
    env_wins = _run([pip_venv["python"], "-c", script],
                    env=_clean_env(PATH=f"{fake.parent}{os.pathsep}{path}", ODBD=str(ROOT / ".build/src/daemon/odbd")),
                    cwd=tmp_path).stdout.strip()
    assert env_wins == str(ROOT / ".build/src/daemon/odbd"), env_wins
