#!/usr/bin/python3
"""Checks that the folders under src/ form layers (docs/architecture.md).

Each folder under src/ is a package. A package may use (#include, or name in
a Bazel dep) only packages of its own layer or of a layer below it, and the
package graph must have no cycle. `daemon/` wires the stages: nothing else
may use it. A folder that is in no layer is an error too, so a new folder is
placed deliberately.

Usage: tools/check_layers.py [repo root]; exit status 1 and one line per
violation when the tree breaks a rule.
"""

import re
import sys
from pathlib import Path

# Lowest first. Within a layer, packages may use each other (without cycles).
LAYERS = [
    ("base", ["common", "wire", "shm"]),
    ("algorithms", ["buffer", "grouping", "collate", "align", "balance"]),
    ("shared state", ["state"]),
    ("I/O stages", ["ingest", "emit", "exchange"]),
    ("wiring", ["daemon"]),
]

INCLUDE = re.compile(r'^\s*#\s*include\s+"src/([A-Za-z0-9_]+)/', re.MULTILINE)
BAZEL_DEP = re.compile(r'"//src/([A-Za-z0-9_]+)[:"]')
VISIBILITY = re.compile(r'visibility\s*=\s*\[[^\]]*\]')  # who may use a target, not what it uses


def package_uses(src: Path):
    """Yields (package, used package, file) for every cross-package use."""
    for path in sorted(src.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(src)
        if len(rel.parts) < 2:
            continue
        package = rel.parts[0]
        if path.suffix in (".h", ".cc"):
            pattern = INCLUDE
        elif path.name in ("BUILD", "BUILD.bazel"):
            pattern = BAZEL_DEP
        else:
            continue
        text = path.read_text(errors="replace")
        if pattern is BAZEL_DEP:
            text = VISIBILITY.sub("", text)
        for used in pattern.findall(text):
            if used != package:
                yield package, used, str(Path("src") / rel)


def find_cycle(graph):
    """One cycle of `graph` (package -> set of packages) as a list, or None."""
    state = {}  # 1: on the current path, 2: done
    path = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def check(root: Path):
    """The violations of the layering rules in the tree at `root`, as lines."""
    src = root / "src"
    level = {}
    for index, (_, packages) in enumerate(LAYERS):
        for package in packages:
            level[package] = index
    problems = []
    for folder in sorted(p.name for p in src.iterdir() if p.is_dir()):
        if folder not in level:
            problems.append(f"src/{folder}/ is in no layer: add it to LAYERS in tools/check_layers.py "
                            "and to the layer table in docs/architecture.md")
    graph = {}
    for package, used, where in package_uses(src):
        graph.setdefault(package, set()).add(used)
        if used == "daemon":
            problems.append(f"{where} uses src/daemon/: only the daemon wires the stages; pass the stage "
                            "its own options (or a narrow interface) instead")
        elif package in level and used in level and level[used] > level[package]:
            problems.append(f"{where} ({LAYERS[level[package]][0]}) uses src/{used}/ "
                            f"({LAYERS[level[used]][0]}), a higher layer")
    cycle = find_cycle(graph)
    if cycle:
        problems.append("package cycle: " + " -> ".join(cycle))
    return problems


def main(argv):
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    problems = check(root)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
