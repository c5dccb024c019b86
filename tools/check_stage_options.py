#!/usr/bin/python3
"""Checks that each I/O stage owns its config knobs (docs/config.md, "Which stage reads which key").

A stage's options live in src/<stage>/*_options.h, for each package of the
"I/O stages" layer of tools/check_layers.py. The comment of each field (the
comment lines right above it, else the one after it) starts with where its
value comes from:

  "<key>:"   a knob that only this stage reads, parsed from config key <key>
             straight into the stage's member of DaemonConfig; its default is
             the one in the struct.
  "derived"  config that several parts of the daemon read: it stays at
             DaemonConfig's top level and src/daemon/stage_options.cc copies it
             in.

So adding a knob that one stage reads touches that stage's options, one row
of the settings table (src/daemon/settings.cc, from which the parser, the
defaults and configs/odbd.yaml come) and docs/config.md's table, and nothing
else. The rules:

 1. Every options struct is a member of DaemonConfig (src/daemon/config.h),
    declared without an initializer: the defaults live in the struct only.
 2. Every field says "<key>:" or "derived".
 3. A "<key>:" field: the key is in configs/odbd.yaml (which
    tests/python/test_py_docs.py holds equal to `odbd --print-default-config`)
    and on the struct's row of the table in docs/config.md, and the settings
    table's row for the key reads it straight into the field
    (`Field("ingest_hwm", kRank, ODB_FIELD(ingest.hwm), ...)` in one
    statement, or a row function naming the key that writes
    `c.ingest.hwm`). stage_options.cc does not assign it.
    The table lists no key the struct does not parse.
 4. A "derived" field: assigned once in stage_options.cc, by the function
    that builds its struct (starting from a copy of the member), from
    DaemonConfig's top-level fields only; the parser and the rest of the
    daemon never touch it in DaemonConfig's member (it is unset there).
 5. No single-stage knob kept as a flat field: a top-level field that a
    derived field reads feeds two or more stages, or the daemon itself reads
    it (src/daemon/ other than config.*, stage_options.*, main.cc, tests).
 6. Only stage_options.cc builds stage options in src/daemon/.
 7. A setting's default is written once. The planner's and the Gloo peer
    group's option structs (PlannerConfig, GlobalPlannerConfig,
    GlooPeerGroupOptions) are not stage options but keep defaults of their
    own for the code that builds them without a daemon: a DaemonConfig field
    the daemon copies into one of their fields as it is takes its default
    from that struct (`window = align::PlannerConfig{}.window`), never a
    literal that could disagree.

Usage: tools/check_stage_options.py [repo root]; exit status 1 and one line
per violation when the tree breaks a rule.
"""

import importlib.util
import re
import sys
from pathlib import Path

import yaml

CONFIG_H = "src/daemon/config.h"
CONFIG_CC = "src/daemon/config.cc"
SETTINGS_CC = "src/daemon/settings.cc"
BUILDER = "src/daemon/stage_options.cc"
ODBD_YAML = "configs/odbd.yaml"
CONFIG_MD = "docs/config.md"

KEY = re.compile(r"^([a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*):")
DERIVED = re.compile(r"^derived\b")
STRUCT = re.compile(r"^struct (\w+) \{\n(.*?)^\};", re.S | re.M)
FIELD = re.compile(r"^\s*(?P<type>[\w:<>, ]+?)\s+(?P<name>\w+)\s*(?:=[^;]*|\{[^;]*\})?;\s*(?://\s*(?P<trail>.*))?$")


def stage_packages(tools: Path):
    """The packages of the I/O-stage layer, from tools/check_layers.py (one table of layers)."""
    spec = importlib.util.spec_from_file_location("check_layers", tools / "check_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.LAYERS)["I/O stages"]


class Field:
    def __init__(self, name, key, derived, line):
        self.name, self.key, self.derived, self.line = name, key, derived, line


def read_structs(root: Path, path: Path, problems):
    """{struct name: [Field]} of an options header."""
    structs = {}
    text = path.read_text()
    rel = path.relative_to(root)
    for match in STRUCT.finditer(text):
        name, body = match.group(1), match.group(2)
        first_line = text[: match.start(2)].count("\n") + 1
        fields, block = [], []
        for offset, line in enumerate(body.splitlines()):
            where = f"{rel}:{first_line + offset}"
            stripped = line.strip()
            if not stripped:
                block = []
            elif stripped.startswith("//"):
                block.append(stripped[2:].strip())
            else:
                field = FIELD.match(line)
                if not field:
                    problems.append(f"{where}: cannot read this line of {name} as a field (one field per line)")
                    block = []
                    continue
                source = block[0] if block else (field.group("trail") or "")
                key = KEY.match(source)
                derived = bool(DERIVED.match(source))
                if not key and not derived:
                    problems.append(f"{where}: {name}::{field.group('name')} says neither where it is parsed "
                                    "from ('<config key>: ...') nor that it is 'derived' (shared config the "
                                    "daemon copies in, src/daemon/stage_options.cc)")
                fields.append(Field(field.group("name"), key.group(1) if key else None, derived, where))
                block = []
        structs[name] = fields
    return structs


def flatten(node, prefix=""):
    out = set()
    for key, value in (node or {}).items():
        path = f"{prefix}{key}"
        out |= flatten(value, path + ".") if isinstance(value, dict) else {path}
    return out


def builders(text):
    """{struct name: (config variable, body)} of the `X XFor(const DaemonConfig& c) { ... }` functions."""
    found = {}
    for m in re.finditer(r"^\w+::(\w+) \w+\(const DaemonConfig& (\w+)\) \{\n(.*?)^\}", text, re.S | re.M):
        found[m.group(1)] = (m.group(2), m.group(3))
    return found


def daemon_sources(root: Path):
    """src/daemon/ files that use the config for behaviour (not the parser, the builder, main or tests)."""
    for path in sorted((root / "src/daemon").glob("*")):
        if path.suffix not in (".cc", ".h") or path.name.endswith("_test.cc"):
            continue
        if path.name in ("config.cc", "config.h", "settings.cc", "stage_options.cc", "stage_options.h", "main.cc"):
            continue
        yield path


def check(root: Path):
    """The violations of the stage-options rules in the tree at `root`, as lines."""
    problems = []
    stages = {}  # struct name -> (package, header, fields)
    packages = stage_packages(Path(__file__).resolve().parent)
    for package in packages:
        headers = sorted((root / "src" / package).glob("*_options.h"))
        if not headers:
            problems.append(f"src/{package}/ has no *_options.h: a stage declares the options it reads "
                            "there, beside it")
        for header in headers:
            for name, fields in read_structs(root, header, problems).items():
                stages[name] = (package, header.relative_to(root), fields)

    config_h = (root / CONFIG_H).read_text()
    config_cc = (root / CONFIG_CC).read_text() + (root / SETTINGS_CC).read_text()
    settings_cc = (root / SETTINGS_CC).read_text()
    builder_text = (root / BUILDER).read_text()
    keys = flatten(yaml.safe_load((root / ODBD_YAML).read_text()))
    doc_rows = [ln for ln in (root / CONFIG_MD).read_text().splitlines() if ln.startswith("|")]
    built = builders(builder_text)
    # A stage's options declared anywhere but its *_options.h would escape every rule below.
    for name in sorted(set(built) - set(stages)):
        problems.append(f"{BUILDER} builds {name}, which no src/<stage>/*_options.h declares: declare a "
                        "stage's options in its *_options.h")
    stage_type = "|".join(packages)
    for m in re.finditer(rf"^\s*(?:{stage_type})::(\w+)\s+\w+[^;(]*;", config_h, re.M):
        if m.group(1) not in stages:
            problems.append(f"{CONFIG_H}: DaemonConfig holds {m.group(1)}, which no src/<stage>/*_options.h "
                            "declares: declare a stage's options in its *_options.h")

    members = {}
    for name, (package, header, _) in stages.items():
        m = re.search(rf"^\s*{package}::{name}\s+(\w+)\s*([^;]*);", config_h, re.M)
        if not m:
            problems.append(f"{CONFIG_H}: DaemonConfig has no {package}::{name} member: the parser writes "
                            f"{name}'s knobs ({header}) into it")
            continue
        if m.group(2).strip():
            problems.append(f"{CONFIG_H}: DaemonConfig::{m.group(1)} is initialized ({m.group(2).strip()}): "
                            f"a stage knob's default lives in {header} only")
        members[name] = m.group(1)

    feeds = {}  # top-level DaemonConfig field -> structs it feeds
    for name, (package, header, fields) in stages.items():
        member = members.get(name)
        if member is None:
            continue
        rows = [r for r in doc_rows if f"`{package}::{name}`" in r]
        if len(rows) != 1:
            problems.append(f"{CONFIG_MD}: the table of which stage reads which key needs one row naming "
                            f"`{package}::{name}` (found {len(rows)})")
        row = rows[0] if len(rows) == 1 else ""
        written = re.compile(rf"\bc\.{member}\.(\w+)\b")
        own_keys = set()
        for f in fields:
            ref = re.compile(rf"\bc\.{member}\.{f.name}\b")
            if f.key:
                own_keys.add(f.key)
                if f.key not in keys:
                    problems.append(f"{f.line}: {name}::{f.name} names config key '{f.key}', which "
                                    f"{ODBD_YAML} does not list (add it there with its default and a comment)")
                if row and f"`{f.key}`" not in row:
                    problems.append(f"{CONFIG_MD}: the row of `{package}::{name}` does not list `{f.key}` "
                                    f"({name}::{f.name})")
                key = re.escape(f.key)
                in_row = rf'"{key}"[^;]*\bODB_FIELD\(\s*{member}\.{f.name}\s*\)'
                in_row_function = rf'"{key}"(?:(?!\n\S).)*?\bc\.{member}\.{f.name}\b'
                if not (re.search(in_row, settings_cc) or re.search(in_row_function, settings_cc, re.S)):
                    problems.append(f"{SETTINGS_CC}: the settings table does not read '{f.key}' straight into "
                                    f"c.{member}.{f.name} ({f.line}); give it a row there, not a flat field")
            elif f.derived and (ref.search(config_cc) or
                                re.search(rf"ODB_FIELD\(\s*{member}\.{f.name}\b", config_cc)):
                problems.append(f"{CONFIG_CC} or {SETTINGS_CC} uses c.{member}.{f.name}, which is derived (unset in "
                                f"DaemonConfig::{member}): use the top-level field it is copied from")
        if row:
            listed = {k for k in re.findall(r"`([a-z0-9_.]+)`", row) if k in keys}
            for stale in sorted(listed - own_keys):
                problems.append(f"{CONFIG_MD}: the row of `{package}::{name}` lists `{stale}`, which "
                                f"{name} does not parse")
        for path in daemon_sources(root):
            for m in re.finditer(rf"\b(?:config_?|c|cfg)\s*(?:\.|->)\s*{member}\.(\w+)\b", path.read_text()):
                if any(f.name == m.group(1) and f.derived for f in fields):
                    problems.append(f"src/daemon/{path.name} reads {member}.{m.group(1)} of DaemonConfig, "
                                    "which is derived (unset there): read the top-level field")
        for m in written.finditer(builder_text):
            problems.append(f"{BUILDER} reads c.{member}.{m.group(1)}: a stage's member is copied whole; "
                            "assign derived fields from DaemonConfig's top level only")

        if name not in built:
            problems.append(f"{BUILDER}: no function builds {package}::{name} from DaemonConfig")
            continue
        cvar, body = built[name]
        copy = re.search(rf"^\s*{package}::{name} (\w+) = {cvar}\.{member};", body, re.M)
        if not copy:
            problems.append(f"{BUILDER}: the builder of {name} must start from a copy of its member "
                            f"({package}::{name} o = {cvar}.{member};)")
            continue
        ovar = copy.group(1)
        assigned = {}
        for m in re.finditer(rf"\b{ovar}\.(\w+)\s*=\s*([^;]*);", body):
            field, rhs = m.group(1), m.group(2)
            assigned[field] = assigned.get(field, 0) + 1
            known = {f.name: f for f in fields}
            if field not in known:
                problems.append(f"{BUILDER} assigns {name}::{field}, which {header} does not declare")
            elif not known[field].derived:
                problems.append(f"{BUILDER} assigns {name}::{field}, a knob of its own ({known[field].line}): "
                                f"it arrives with the copy of DaemonConfig::{member}; copy nothing else in")
            for source in re.findall(rf"\b{cvar}\.(\w+)", rhs):
                if source in members.values():
                    problems.append(f"{BUILDER}: {name}::{field} reads another stage's member "
                                    f"({cvar}.{source}); config two stages read belongs at the top level")
                else:
                    feeds.setdefault(source, set()).add(name)
        for f in fields:
            if f.derived and assigned.get(f.name, 0) != 1:
                problems.append(f"{BUILDER}: {name}::{f.name} is derived ({f.line}) and must be assigned "
                                f"exactly once in the builder of {name} (found {assigned.get(f.name, 0)})")

    daemon_text = "\n".join(p.read_text() for p in daemon_sources(root))
    for source, fed in sorted(feeds.items()):
        if len(fed) > 1:
            continue
        if re.search(rf"\b(?:config_?|c|cfg)\s*(?:\.|->)\s*{source}\b", daemon_text):
            continue
        (only,) = fed
        problems.append(f"DaemonConfig::{source} feeds {only} only and nothing else in the daemon reads it: "
                        f"a knob of one stage is a field of {only}, parsed straight into DaemonConfig::"
                        f"{members.get(only, '?')} (not a flat field copied in)")

    for path in sorted((root / "src/daemon").glob("*.cc")):
        if path.name == "stage_options.cc" or path.name.endswith("_test.cc"):
            continue
        for name in stages:
            if re.search(rf"\b{name}\b(?!For)", path.read_text()):
                problems.append(f"src/daemon/{path.name} builds {name} itself: stage options come from "
                                f"{BUILDER} only")
    return problems + check_defaults_written_once(root)


# Where the daemon copies settings into option structs that keep defaults of
# their own (rule 7): file -> {variable: (struct, header)}.
COPIED_INTO = {
    "src/daemon/aligned_round_runner.cc": {"p": ("PlannerConfig", "src/align/planner.h"),
                                           "g": ("GlobalPlannerConfig", "src/balance/global_planner.h")},
    "src/daemon/peers.cc": {"o": ("GlooPeerGroupOptions", "src/align/gloo_peer_group.h")},
}


# Resolved from the launcher's environment (-1: unset) before anything is copied: not defaults.
IDENTITY = {"rank", "world_size", "local_rank", "local_world_size"}


def initializer(text: str, field: str):
    """The default written for `field` in a struct body (`T field = x;` or `T field{x};`), None without one."""
    m = re.search(rf"^\s*[\w:<>, ]+?\s+{field}\s*(?:=\s*([^;]*)|\{{([^;]*)\}})\s*;", text, re.M)
    return None if m is None else (m.group(1) if m.group(1) is not None else m.group(2)).strip()


def check_defaults_written_once(root: Path):
    """Rule 7: the problems, as lines."""
    problems = []
    config_h = (root / CONFIG_H).read_text()
    for rel, variables in COPIED_INTO.items():
        for var, (struct, header) in variables.items():
            body = STRUCT.search("\n".join(m.group(0) for m in STRUCT.finditer((root / header).read_text())
                                           if m.group(1) == struct))
            if body is None:
                problems.append(f"{header}: no struct {struct} (tools/check_stage_options.py COPIED_INTO)")
                continue
            for m in re.finditer(rf"\b{var}\.(\w+)\s*=\s*(?:[\w:]+\()?config\.(\w+)\)?;", (root / rel).read_text()):
                field, setting = m.group(1), m.group(2)
                if setting in IDENTITY:
                    continue
                theirs, ours = initializer(body.group(2), field), initializer(config_h, setting)
                if theirs is not None and ours is not None and f"{struct}{{}}.{field}" not in ours:
                    problems.append(f"{CONFIG_H}: DaemonConfig::{setting} has its own default ({ours}) and {rel} "
                                    f"copies it into {struct}::{field}, whose default is {theirs} ({header}): "
                                    f"write the default once, as `{setting} = ...{struct}{{}}.{field}`")
    return problems


def main(argv):
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    problems = check(root)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
