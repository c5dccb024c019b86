"""odb.__version__ is said once (issue 23 item 5): the package metadata's version is read from
odb/__init__.py by setuptools (pyproject.toml: dynamic version, attr odb.__version__), so a
version written there is the one pip records. Shown on a copy of the package's metadata files
with another version in odb/__init__.py: the version setuptools computes follows it. (The
installed wheel's importlib.metadata version == odb.__version__: test_py_pip_install.py.)
"""
from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "client/python"


def _metadata_version(folder: Path) -> str:
    from setuptools.config.pyprojecttoml import read_configuration

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # setuptools calls [tool.setuptools] beta
        config = read_configuration(folder / "pyproject.toml", expand=True)
    return str(config["project"]["version"])


def test_the_metadata_version_is_read_from_odb_init(tmp_path: Path) -> None:
    import odb

    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)?", odb.__version__), odb.__version__
    assert _metadata_version(PACKAGE) == odb.__version__
    # A second place would not follow a change made in the first: change it on a copy.
    (tmp_path / "odb").mkdir()
    shutil.copy(PACKAGE / "pyproject.toml", tmp_path / "pyproject.toml")
    init = (PACKAGE / "odb/__init__.py").read_text()
    assert init.count(f'__version__ = "{odb.__version__}"') == 1, "odb/__init__.py must say the version once"
    (tmp_path / "odb/__init__.py").write_text(init.replace(f'__version__ = "{odb.__version__}"',
                                                           '__version__ = "9.8.7"'))
    assert _metadata_version(tmp_path) == "9.8.7"
    # Nowhere else in the package's build files.
    for name in ("pyproject.toml", "setup.py"):
        text = (PACKAGE / name).read_text()
        assert not re.search(r"^\s*version\s*=\s*[\"']", text, re.M), f"{name} writes a version of its own"
        assert f'"{odb.__version__}"' not in text and f"'{odb.__version__}'" not in text, name
