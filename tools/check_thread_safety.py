#!/usr/bin/env python3
"""Clang's thread-safety analysis over the code that shares locked state.

DaemonState's fields are ABSL_GUARDED_BY(mu) and the functions that expect the
lock say ABSL_EXCLUSIVE_LOCKS_REQUIRED (src/common/mutex.h). The Bazel build
uses gcc, which ignores these annotations; this compiles every translation
unit under src/ that includes src/common/mutex.h (directly or through its
headers; tests excluded: they drive one thread and read the state bare) with clang++ -fsyntax-only -Wthread-safety -Werror=thread-safety.
Run from anywhere: `tools/check_thread_safety.py` (exit 1 and the compiler's
messages when an access is unguarded). tests/test_thread_safety.py runs it.
"""

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
ANNOTATED = "src/common/mutex.h"
FLAGS = ["-std=c++20", "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
         "-DSPDLOG_FMT_EXTERNAL", "-DSPDLOG_SHARED_LIB"]


def find_clang():
    for name in ("clang++-14", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    return None


def includes_annotated(root: Path, rel: str, seen: dict) -> bool:
    """Whether `rel` includes the annotated mutex, following quoted includes under `root`."""
    if rel in seen:
        return seen[rel]
    seen[rel] = False  # a cycle does not count
    path = root / rel
    if not path.is_file():
        return False
    found = rel == ANNOTATED or any(
        includes_annotated(root, inc, seen) for inc in INCLUDE.findall(path.read_text(errors="replace")))
    seen[rel] = found
    return found


def units(root: Path):
    seen = {}
    out = []
    for path in sorted((root / "src").rglob("*.cc")):
        rel = path.relative_to(root).as_posix()
        if rel.endswith("_test.cc"):
            continue
        if includes_annotated(root, rel, seen):
            out.append(rel)
    return out


def check(root: Path = ROOT, files=None, jobs: int = 2):
    """Problems found (compiler output per failing unit); empty when the analysis passes."""
    clang = find_clang()
    if clang is None:
        return ["clang++ (clang-14) not found: install it (scripts/install_deps.sh) to run the thread-safety check"]
    files = units(root) if files is None else files
    if not files:
        return [f"no translation unit under {root}/src includes {ANNOTATED}: nothing was checked"]
    with tempfile.TemporaryDirectory() as gen:
        # The protocol's generated header, as Bazel would generate it.
        proto = subprocess.run(["protoc", f"--cpp_out={gen}", "-I", str(ROOT), str(ROOT / "proto" / "odb.proto")],
                               capture_output=True, text=True)
        if proto.returncode != 0:
            return ["protoc failed on proto/odb.proto: " + proto.stderr]

        def compile_one(rel):
            cmd = [clang, *FLAGS, "-I", str(root), "-I", str(ROOT), "-I", gen, str(root / rel)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode == 0:
                return None
            return f"{rel}:\n" + "\n".join(
                line for line in r.stderr.splitlines() if "thread-safety" in line or "error" in line)

        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            return [p for p in pool.map(compile_one, files) if p]


def main():
    jobs = max(1, min(4, os.cpu_count() or 1))
    problems = check(jobs=jobs)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"thread-safety analysis: {len(units(ROOT))} translation units pass")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
