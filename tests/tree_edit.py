"""Copies of the tree with one edit each, for the tests of the tree's static checks (tools/check_*.py)."""

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType
from typing import Iterable

ROOT = Path(__file__).resolve().parent.parent


def load_tool(name: str) -> ModuleType:
    """tools/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_paths(tmp_path: Path, paths: Iterable[str], ignore=None) -> Path:
    """The tree's `paths` (files or folders, relative to the root) copied under `tmp_path`."""
    for rel in paths:
        src, dst = ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore)
        else:
            shutil.copy(src, dst)
    return tmp_path


def edit(root: Path, rel: str, old: str, new: str) -> None:
    """Replaces the one occurrence of `old` in root/rel (the test is stale if there is not exactly one)."""
    path = root / rel
    text = path.read_text()
    assert text.count(old) == 1, f"{rel}: {old!r} found {text.count(old)} times (the tree changed: update the test)"
    path.write_text(text.replace(old, new))
