#!/usr/bin/env python3
"""Clang's thread-safety analysis over the code that shares locked state.

Every lock in the daemon is an odb::Mutex (src/common/mutex.h); the fields it
guards say ABSL_GUARDED_BY and the functions that expect it (or must not hold
it) ABSL_EXCLUSIVE_LOCKS_REQUIRED / ABSL_LOCKS_EXCLUDED. The Bazel build uses
gcc, which ignores these annotations; this compiles every translation unit
under src/ that includes src/common/mutex.h (directly or through its headers;
tests excluded: they drive one thread and read the state bare) with
clang++ -fsyntax-only -Wthread-safety -Werror=thread-safety.

A lock the analysis cannot see would escape it, so a second rule fails when a
non-test file under src/ names a raw lock type (std::mutex and its kin,
std::condition_variable, pthread mutexes): use odb::Mutex / MutexLock /
CondVar. Only src/common/mutex.h, which wraps them, may.

Run from anywhere: `tools/check_thread_safety.py` (exit 1 and the messages
when an access is unguarded or a raw lock is declared).
tests/test_thread_safety.py runs it.
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


# Lock types that carry no thread-safety annotations.
RAW_LOCK = re.compile(
    r"\bstd::(?:recursive_timed_|recursive_|timed_|shared_timed_|shared_)?mutex\b"
    r"|\bstd::condition_variable(?:_any)?\b"
    r"|\bpthread_(?:mutex|rwlock|spinlock|cond)_t\b")
SOURCE_SUFFIXES = (".h", ".cc", ".hpp", ".cpp", ".inc")


def is_test_file(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(("_test.cc", "_test.h")) or "/testdata/" in rel


def code_only(text: str) -> str:
    """`text` with comments and string/character literals blanked (newlines kept, so lines still count)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            # Raw string R"delim( ... )delim".
            open_paren = text.find("(", i + 2)
            delim = text[i + 2:open_paren] if open_paren >= 0 else ""
            end = text.find(")" + delim + '"', open_paren + 1) if open_paren >= 0 else -1
            j = n if end < 0 else end + len(delim) + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def raw_locks(root: Path):
    """`path:line: ...` for every raw lock type named in a non-test file under src/ (but mutex.h)."""
    problems = []
    for path in sorted((root / "src").rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or not rel.endswith(SOURCE_SUFFIXES) or is_test_file(rel) or rel == ANNOTATED:
            continue
        code = code_only(path.read_text(errors="replace"))
        for number, line in enumerate(code.splitlines(), start=1):
            for m in RAW_LOCK.finditer(line):
                problems.append(
                    f"{rel}:{number}: {m.group(0)} is invisible to the thread-safety analysis: use odb::Mutex, "
                    f"MutexLock and CondVar ({ANNOTATED}) with ABSL_GUARDED_BY on the fields it guards")
    return problems


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
    """Problems found (raw locks; compiler output per failing unit); empty when both rules pass.
    With `files`, only the analysis of those units runs."""
    if files is None:
        locks = raw_locks(root)
        return locks + analyse(root, None, jobs)
    return analyse(root, files, jobs)


def analyse(root: Path, files, jobs: int):
    """Compiler output per unit that fails clang's thread-safety analysis."""
    clang = find_clang()
    if clang is None:
        return ["clang++ (clang-14) not found: install it (scripts/install_deps.sh) to run the thread-safety check"]
    files = units(root) if files is None else files
    if not files:
        return [f"no translation unit under {root}/src includes {ANNOTATED}: nothing was checked"]
    with tempfile.TemporaryDirectory() as gen:
        # The protocols' generated headers (odb.proto, peer.proto), as Bazel would generate them.
        for name in ("odb.proto", "peer.proto"):
            proto = subprocess.run(["protoc", f"--cpp_out={gen}", "-I", str(ROOT), str(ROOT / "proto" / name)],
                                   capture_output=True, text=True)
            if proto.returncode != 0:
                return [f"protoc failed on proto/{name}: " + proto.stderr]

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
        print(f"thread-safety analysis: {len(units(ROOT))} translation units pass; no raw lock under src/")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
