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


def test_a_raw_lock_under_src_fails_the_check(tmp_path):
    # A copy of the tree's src/ where one real header takes its lock back to
    # std::mutex: the rule names the file, the line and the fix. Mentions in
    # comments or strings, test files and the wrapper itself do not count.
    checker = load_checker()
    src = tmp_path / "src"
    header = "src/emit/credit_queue.h"
    text = (ROOT / header).read_text()
    assert "  mutable Mutex mu_;\n" in text, "the copied header no longer declares its lock as expected"
    (src / "emit").mkdir(parents=True)
    (src / header.removeprefix("src/")).write_text(text.replace("  mutable Mutex mu_;\n", "  mutable std::mutex mu_;\n"))
    line = text[:text.index("  mutable Mutex mu_;\n")].count("\n") + 1
    (src / "common").mkdir()
    (src / "common" / "mutex.h").write_text((ROOT / checker.ANNOTATED).read_text())
    (src / "emit" / "notes.cc").write_text(
        '// Never a std::mutex here.\nconst char* kWhy = "std::condition_variable is banned";\n')
    (src / "emit" / "queue_test.cc").write_text("#include <mutex>\nstd::mutex test_only;\n")
    (src / "emit" / "waits.cc").write_text("#include <shared_mutex>\n\nstd::shared_mutex table_mu;\n")

    problems = checker.raw_locks(tmp_path)
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"{header}:{line}: std::mutex is invisible"), problems[0]
    assert "odb::Mutex" in problems[0]
    assert problems[1].startswith("src/emit/waits.cc:3: std::shared_mutex"), problems[1]
    # And the real tree has none.
    assert checker.raw_locks(ROOT) == []
