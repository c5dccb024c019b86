"""The extension's type stubs (client/python/odb/_odb_native.pyi) match the built module, so `py.typed` holds.

* Every class, method, property and module attribute of the stub exists in the
  built `_odb_native`, and every public one of the module is in the stub
  (walking the stub's syntax tree: needs no mypy).
* mypy's stubtest (Debian: python3-mypy) agrees, apart from what pybind11 does
  differently from a Python class (its metaclass; classes without a Python
  constructor).
* mypy --strict accepts a program that uses the API the way docs/python.md does,
  and the odbctl / odb.top modules, and rejects misuse (a misspelt step header
  field, a str sample id, a float weight put in an int): the stubs type the API,
  they are not Any.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "client/python/odb"
STUB = PACKAGE / "_odb_native.pyi"


def _mypy_available() -> None:
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed for this interpreter: apt install python3-mypy (scripts/install_deps.sh)")


def _stub_classes() -> Dict[str, Set[str]]:
    """Public classes of the stub -> their members (methods and properties)."""
    tree = ast.parse(STUB.read_text())
    out: Dict[str, Set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            out[node.name] = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return out


def _stub_names() -> Set[str]:
    tree = ast.parse(STUB.read_text())
    names = set(_stub_classes())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
    return {n for n in names if not n.startswith("_")}


def test_every_stub_name_exists_in_the_extension_and_back() -> None:
    from odb._native import native

    module = native()
    runtime = {n for n in dir(module) if not n.startswith("_")}
    assert _stub_names() == runtime, f"stub only: {_stub_names() - runtime}; extension only: {runtime - _stub_names()}"
    base = set(dir(type("Plain", (), {}))) | set(dir(Exception))
    for cls_name, members in _stub_classes().items():
        cls = getattr(module, cls_name)
        missing = {m for m in members if not hasattr(cls, m)}
        assert not missing, f"{cls_name}: in the stub, not in the extension: {missing}"
        public = {m for m in dir(cls) if not m.startswith("_") and m not in base}
        assert public <= members, f"{cls_name}: in the extension, not in the stub: {public - members}"
        # A stub that declares __init__ promises a Python constructor; pybind11 has one only where bound.
        bound_init = "No constructor defined" not in (getattr(cls.__init__, "__doc__", "") or "")
        if not issubclass(cls, BaseException):
            try:
                cls()
                constructible_without_args = True
            except TypeError as e:
                constructible_without_args = False
                if "No constructor defined" in str(e):
                    bound_init = False
            assert not constructible_without_args, cls_name
            assert ("__init__" in members) == bound_init, f"{cls_name}: __init__ in the stub: {'__init__' in members}"
    properties = {name for name, value in vars(module.StepInfo).items() if isinstance(value, property)}
    assert properties == _stub_classes()["StepInfo"] - {"__getitem__", "get"}, properties
    assert set(module.DTYPES) == {"uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
                                  "float64", "bool"}
    assert issubclass(module.OdbTimeout, module.OdbError) and issubclass(module.OdbError, Exception)


def _split_params(text: str) -> List[str]:
    """`a: int, b: Dict[str, int] = {}` -> the parameters (commas inside brackets kept)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[("
        depth -= ch in "])"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + ([cur.strip()] if cur.strip() else [])


def _runtime_params(func: object) -> List[Tuple[str, bool]]:
    """(name, has default) of a pybind11 function, from the signature line pybind11 writes into __doc__."""
    first = (getattr(func, "__doc__", "") or "").splitlines()[0]
    inner = first[first.index("(") + 1:first.rindex(") ->")]
    return [(p.split(":")[0].strip(), "=" in p) for p in _split_params(inner)][1:]  # without self


def _stub_params(node: ast.FunctionDef) -> List[Tuple[str, bool]]:
    a = node.args
    positional = a.posonlyargs + a.args
    defaults = [False] * (len(positional) - len(a.defaults)) + [True] * len(a.defaults)
    params = list(zip([p.arg for p in positional], defaults))
    params += [(p.arg, d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return params[1:]  # without self


def test_stub_signatures_match_the_bindings() -> None:
    """Parameter names (in order) and which ones have defaults, as pybind11 reports them."""
    from odb._native import native

    module = native()
    tree = ast.parse(STUB.read_text())
    checked = 0
    for cls_node in (n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")):
        cls = getattr(module, cls_node.name)
        overloads: Dict[str, List[ast.FunctionDef]] = {}
        for f in cls_node.body:
            if isinstance(f, ast.FunctionDef) and not any(getattr(d, "id", "") == "property" for d in f.decorator_list):
                if f.name == "__init__" or not f.name.startswith("_"):
                    overloads.setdefault(f.name, []).append(f)
        for name, defs in overloads.items():
            runtime = _runtime_params(getattr(cls, name))
            for f in defs:
                stub = _stub_params(f)
                where = f"{cls_node.name}.{name} (stub line {f.lineno})"
                assert [p for p, _ in stub] == [p for p, _ in runtime], f"{where}: stub {stub}, extension {runtime}"
                if len(defs) == 1:
                    assert stub == runtime, f"{where}: defaults differ: stub {stub}, extension {runtime}"
                else:  # overloads: each may require what the extension defaults, never default what it requires
                    assert all(r or not s for (_, s), (_, r) in zip(stub, runtime)), f"{where}: {stub} vs {runtime}"
                checked += 1
    assert checked >= 15, checked


def _runtime_package(tmp: Path) -> Path:
    """A package folder `odb` whose extension is the built one under the name the stub has (odb._odb_native)."""
    from odb._native import find_built

    pkg = tmp / "odb"
    pkg.mkdir(parents=True)
    for f in PACKAGE.iterdir():
        if f.suffix in (".py", ".pyi") or f.name == "py.typed":
            (pkg / f.name).symlink_to(f)
    (pkg / "_odb_native.so").symlink_to(find_built("client/python/_odb_native.so", "ODB_NATIVE_LIB").resolve())
    return tmp


# odb.daemon imports torch.distributed inside a function; mypy would still read all of torch (minutes).
MYPY_CONFIG = "[mypy]\n[mypy-torch.*]\nfollow_imports = skip\n"


# pybind11 classes have the pybind11_type metaclass, and a bound class without a Python constructor
# (Delivery, StepInfo, Rejection) still has pybind11_object's (*args, **kwargs) __init__ that raises.
STUBTEST_ALLOWLIST = r"""
odb\._odb_native\.\w+\.__init__
odb\._odb_native\.(Consumer|Delivery|Producer|Rejection|StepInfo)
"""


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MYPY", "ODB_NATIVE"))}
    env.update(extra)
    return env


def test_stubtest_agrees_with_the_extension(tmp_path: Path) -> None:
    _mypy_available()
    root = _runtime_package(tmp_path / "pkg")
    allow = tmp_path / "allowlist.txt"
    allow.write_text(STUBTEST_ALLOWLIST)
    config = tmp_path / "mypy.ini"
    config.write_text(MYPY_CONFIG)
    p = subprocess.run([sys.executable, "-m", "mypy.stubtest", "--concise", "--allowlist", str(allow),
                        "--mypy-config-file", str(config), "odb._odb_native"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env=_env(PYTHONPATH=str(root), MYPYPATH=str(root)))
    assert p.returncode == 0, p.stdout + p.stderr
    # The allowlist hides only the pybind11 differences: a method missing from the stub still fails.
    broken = root / "odb" / "_odb_native.pyi"
    broken.unlink()
    broken.write_text(STUB.read_text().replace("    def frame_bytes(self, name: str) -> int: ...\n", ""))
    p = subprocess.run([sys.executable, "-m", "mypy.stubtest", "--concise", "--allowlist", str(allow),
                        "--mypy-config-file", str(config), "odb._odb_native"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env=_env(PYTHONPATH=str(root), MYPYPATH=str(root)))
    assert p.returncode != 0 and "Delivery.frame_bytes" in p.stdout, p.stdout + p.stderr


USAGE = textwrap.dedent('''
    """Uses the native API as docs/python.md shows (type-checked only, never run)."""
    from typing import Dict, List, Optional

    import odb
    from odb._odb_native import DTYPES


    def send(producer: odb.Producer, lengths: Dict[int, int]) -> int:
        producer.start_epoch(0)
        int64 = DTYPES["int64"]
        for sid, n in lengths.items():
            producer.send(sid, 0, n, 0, 0, [("input_ids", int64, (n,), bytes(8 * n))])
            producer.send(sid, 0, n, tensors=[("input_ids", int64, [n], bytearray(8 * n))])
        producer.end_stream(0)
        return producer.sent(0)


    def receive(consumer: odb.Consumer) -> List[int]:
        consumer.start_epoch(0, expected_producers=1)
        ids: List[int] = []
        while True:
            d: odb.Delivery = consumer.next()
            if not d.is_step:
                summary = d.summary
                received: int = summary["received"]
                first: Optional[int] = summary["rejections"][0]["sample_id"] if summary["rejections"] else None
                print(received, first)
                return ids
            info: odb.StepInfo = d.step
            weight: float = info.loss_weight
            ids += info.sample_ids
            for r in info.rejections:
                code: str = r.code
                sample: Optional[int] = r.sample_id
                print(code, sample)
            if "input_ids" in d.tensor_names():
                print(d.frame_address("input_ids"), d.frame_bytes("input_ids"), d.array("input_ids").shape, weight)


    def main() -> None:
        try:
            c = odb.Consumer("ipc:///tmp/x-out.sock", receive_timeout_ms=1000)
            print(receive(c), send(odb.Producer("ipc:///tmp/x-in.sock", "p0", rank=0), {1: 3}))
        except odb.OdbTimeout as e:
            print("timeout", e)
        except odb.OdbError as e:
            print("error", e)
        print(odb.find_odbd())
''')

MISUSE = textwrap.dedent('''
    import odb


    def bad(c: odb.Consumer, p: odb.Producer) -> None:
        d = c.next()
        print(d.step.idel)
        p.send("7", 0, 3, 0, 0, [])
        n: int = d.step.loss_weight
        print(d.summary["recieved"], n)
        d.step.epoch = 3
''')


def _mypy(files: List[Path], cwd: Path) -> subprocess.CompletedProcess:
    config = cwd / "mypy.ini"
    config.write_text(MYPY_CONFIG)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary",
         "--show-error-codes", "--config-file", str(config), "--cache-dir", str(cwd / ".mypy_cache"),
         *map(str, files)],
        capture_output=True, text=True, cwd=cwd, timeout=600, env=_env(MYPYPATH=str(ROOT / "client/python")))


def test_mypy_strict_accepts_the_api_and_rejects_misuse(tmp_path: Path) -> None:
    _mypy_available()
    usage = tmp_path / "usage.py"
    usage.write_text(USAGE)
    ok = _mypy([usage, PACKAGE / "cli.py", PACKAGE / "top.py", PACKAGE / "__init__.py", STUB], tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    misuse = tmp_path / "misuse.py"
    misuse.write_text(MISUSE)
    bad = _mypy([misuse], tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    lines = {int(line.split(":")[1]) for line in bad.stdout.splitlines() if line.startswith(misuse.name + ":")}
    source = MISUSE.splitlines()
    expected = {i + 1 for i, text in enumerate(source)
                if any(k in text for k in ("idel", '"7"', "loss_weight", "recieved", "epoch = 3"))}
    assert expected <= lines, f"mypy missed lines {sorted(expected - lines)}:\n{bad.stdout}"
