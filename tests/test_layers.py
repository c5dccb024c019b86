"""The folders under src/ keep their layers (tools/check_layers.py, docs/architecture.md)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_checker():
    spec = importlib.util.spec_from_file_location("check_layers", ROOT / "tools" / "check_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(root: Path, rel: str, text: str):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_src_keeps_its_layers():
    problems = load_checker().check(ROOT)
    assert problems == [], "\n".join(problems)


def test_a_stage_including_the_daemon_is_caught(tmp_path):
    write(tmp_path, "src/daemon/config.h", "")
    write(tmp_path, "src/ingest/channel.h", '#include "src/daemon/config.h"\n')
    problems = load_checker().check(tmp_path)
    assert any("src/ingest/channel.h uses src/daemon/" in p for p in problems), problems


def test_a_bazel_dep_on_the_daemon_is_caught_but_visibility_is_not(tmp_path):
    write(tmp_path, "src/daemon/BUILD", 'cc_library(name = "d", visibility = ["//src/emit:__pkg__"])\n')
    write(tmp_path, "src/emit/BUILD", 'cc_library(name = "e", deps = ["//src/daemon:config"])\n')
    problems = load_checker().check(tmp_path)
    assert any("src/emit/BUILD uses src/daemon/" in p for p in problems), problems
    assert not any(p.startswith("src/daemon/BUILD") for p in problems), problems


def test_a_package_cycle_within_a_layer_is_caught(tmp_path):
    write(tmp_path, "src/ingest/a.h", '#include "src/exchange/b.h"\n')
    write(tmp_path, "src/exchange/b.h", '#include "src/ingest/a.h"\n')
    problems = load_checker().check(tmp_path)
    assert any(p.startswith("package cycle: ") for p in problems), problems


def test_a_lower_layer_using_a_higher_one_is_caught(tmp_path):
    write(tmp_path, "src/common/x.h", '#include "src/ingest/a.h"\n')
    write(tmp_path, "src/ingest/a.h", "")
    problems = load_checker().check(tmp_path)
    assert any("src/common/x.h (base) uses src/ingest/ (I/O stages)" in p for p in problems), problems


def test_a_folder_in_no_layer_is_caught(tmp_path):
    write(tmp_path, "src/newstage/x.h", "")
    problems = load_checker().check(tmp_path)
    assert any(p.startswith("src/newstage/ is in no layer") for p in problems), problems
