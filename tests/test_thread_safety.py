"""Clang's -Wthread-safety over the units sharing DaemonState (tools/check_thread_safety.py)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_checker():
    spec = importlib.util.spec_from_file_location("check_thread_safety", ROOT / "tools" / "check_thread_safety.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_annotated_unit_passes_the_analysis():
    checker = load_checker()
    units = checker.units(ROOT)
    assert "src/ingest/ingest_channel.cc" in units and "src/daemon/daemon.cc" in units, units
    problems = checker.check(ROOT)
    assert problems == [], "\n".join(problems)


def test_an_unguarded_access_is_caught(tmp_path):
    # A unit that reads and writes DaemonState without its mutex, beside one
    # that holds it: only the first is reported, naming the field.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "bare.cc").write_text(
        '#include "src/state/daemon_state.h"\n'
        "namespace odb {\n"
        "bool Guarded(DaemonState& s) { MutexLock lock(s.mu); return s.current_epoch.has_value(); }\n"
        "void Bare(DaemonState& s) { s.requested_epochs.push_back(1); }\n"
        "}  // namespace odb\n")
    problems = load_checker().check(tmp_path, files=["src/bare.cc"])
    assert len(problems) == 1, problems
    assert "requested_epochs" in problems[0] and "requires holding mutex" in problems[0], problems[0]
    assert "current_epoch" not in problems[0], problems[0]
