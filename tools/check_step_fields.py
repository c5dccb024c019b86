#!/usr/bin/python3
"""Checks that every representation of a step takes its fields from the one list (proto/step_fields.h).

A step travels from the daemon's builder over the wire to the C++ client and
on to Python. Its fields are listed once, in the X-macros of
proto/step_fields.h:

  ODB_STEP_FIELDS        the planned scalars (StepHeader)
  ODB_STEP_JOB_FIELDS    the job's flags, the same on every step
  ODB_STEP_SAMPLE_FIELDS the per-sample lists (X), and per-sample optional
                         values (OPTIONAL: a value list and a `present` list
                         on the wire, std::optional in C++, None in Python)
  ODB_STEP_ROUTE_FIELDS  the per-phase route lists (a vision and an audio name)
  ODB_STEP_OTHER_FIELDS  the few fields with code of their own (epoch, the
                         batch's tensors or arena, the rejections)

The rules, each a way a hand-added field would bypass the list:

 1. proto/odb.proto's `Step` has exactly the listed fields, each with the
    listed type (scalars singular, lists `repeated`; an OPTIONAL's `present`
    list `repeated bool`).
 2. The builder (src/emit/step_builder.cc) expands the four macros and sets,
    adds or mutates no listed field of `step` by hand.
 3. The decoder (client/cpp/src/delivery_decoder.cc) expands them and writes
    no listed field of `d.step` by hand.
 4. StepInfo (client/cpp/include/odb/consumer.h) derives from StepHeader,
    expands the other three, and declares by hand only ODB_STEP_OTHER_FIELDS.
 5. The bindings (client/python/bindings.cc) expand the four macros and bind
    no listed field of StepInfo by hand.
 6. The stub's StepInfo (client/python/odb/_odb_native.pyi) has one property
    per listed field, typed from the list (int, bool, float, List[int],
    List[Optional[int]]), and besides them only StepInfo's own (rule 4).
 7. odb.Step (client/python/odb/step.py), which copies every attribute named
    like a header field: each of its attributes that is not private, `batch`
    or `dummy` is a listed field (or one of rule 4's), typed from the list.
 8. odb.phases.PHASE_FIELDS names the route lists.

So a new per-sample field is one line in step_fields.h, one in odb.proto, one
property in the stub, (optionally) one attribute of odb.Step, and whatever
computes it.

Usage: tools/check_step_fields.py [repo root]; exit status 1 and one line per
violation when the tree breaks a rule.
"""

import ast
import re
import sys
from pathlib import Path

FIELDS_H = "proto/step_fields.h"
PROTO = "proto/odb.proto"
BUILDER = "src/emit/step_builder.cc"
CONSUMER_H = "client/cpp/include/odb/consumer.h"
DECODER = "client/cpp/src/delivery_decoder.cc"
BINDINGS = "client/python/bindings.cc"
STUB = "client/python/odb/_odb_native.pyi"
STEP_PY = "client/python/odb/step.py"
PHASES_PY = "client/python/odb/phases.py"

MACROS = ("ODB_STEP_FIELDS", "ODB_STEP_JOB_FIELDS", "ODB_STEP_SAMPLE_FIELDS", "ODB_STEP_ROUTE_FIELDS")
# Python-only attributes of odb.Step (no header field).
STEP_PY_OWN = {"batch", "dummy"}

PROTO_TYPE = {"uint64_t": "uint64", "uint32_t": "uint32", "int64_t": "int64", "int32_t": "int32",
              "bool": "bool", "double": "double", "float": "float"}
PY_TYPE = {"bool": "bool", "double": "float", "float": "float"}  # the rest are int


class Field:
    """One listed field: its name, group, C++ type and whether it is a list (optional: of Optional)."""

    def __init__(self, name, group, ctype, repeated, optional=False):
        self.name, self.group, self.ctype, self.repeated, self.optional = name, group, ctype, repeated, optional

    def proto_type(self):
        return ("repeated " if self.repeated else "") + PROTO_TYPE.get(self.ctype, self.ctype)

    def py_type(self):
        scalar = PY_TYPE.get(self.ctype, "int")
        if self.optional:
            return f"List[Optional[{scalar}]]"
        return f"List[{scalar}]" if self.repeated else scalar


def split_args(text):
    """The top-level comma-separated arguments of a macro call's text (quotes and parentheses respected)."""
    args, depth, quote, current = [], 0, None, ""
    for i, ch in enumerate(text):
        if quote:
            current += ch
            if ch == quote and text[i - 1] != "\\":
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
            continue
        current += ch
    args.append(current.strip())
    return args


def macro_calls(body):
    """[(callee, [args])] of the X(...) entries in a macro's body."""
    calls, i = [], 0
    for m in re.finditer(r"\b(\w+)\(", body):
        if m.start() < i:
            continue
        depth, j, quote = 1, m.end(), None
        while j < len(body) and depth:
            ch = body[j]
            if quote:
                if ch == quote and body[j - 1] != "\\":
                    quote = None
            elif ch in "\"'":
                quote = ch
            elif ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            j += 1
        calls.append((m.group(1), split_args(body[m.end(): j - 1])))
        i = j
    return calls


def macro_body(text, name):
    """The body of `#define name(...)` (its continuation lines joined), or None."""
    m = re.search(rf"^#define {name}\((\w+(?:, \w+)*)\)((?:.*\\\n)*.*)$", text, re.M)
    if not m:
        return None
    return m.group(1).split(", "), m.group(2).replace("\\\n", " ")


def read_list(root: Path, problems):
    """(fields by name, other field names) of proto/step_fields.h."""
    text = (root / FIELDS_H).read_text()
    fields, others = {}, set()

    def add(field):
        if field.name in fields:
            problems.append(f"{FIELDS_H}: {field.name} is listed twice")
        fields[field.name] = field

    for macro in MACROS + ("ODB_STEP_OTHER_FIELDS",):
        found = macro_body(text, macro)
        if found is None:
            problems.append(f"{FIELDS_H}: no #define {macro}(...): the one list of step fields lives there")
            continue
        params, body = found
        for callee, args in macro_calls(body):
            if macro == "ODB_STEP_OTHER_FIELDS":
                others.add(args[0])
            elif macro in ("ODB_STEP_FIELDS", "ODB_STEP_JOB_FIELDS"):
                add(Field(args[1], macro, args[0], repeated=False))
            elif macro == "ODB_STEP_SAMPLE_FIELDS" and callee == params[-1] and len(params) > 1:
                add(Field(args[1], macro, args[0], repeated=True, optional=True))
                add(Field(args[2], macro, "bool", repeated=True))
                fields[args[2]].present_of = args[1]
            elif macro == "ODB_STEP_SAMPLE_FIELDS":
                add(Field(args[1], macro, args[0], repeated=True))
            else:  # ODB_STEP_ROUTE_FIELDS: X(type, vision, audio, llm_order, value, doc)
                add(Field(args[1], macro, args[0], repeated=True))
                add(Field(args[2], macro, args[0], repeated=True))
    return fields, others


def code_lines(text):
    """(line number, line) of a C++ file outside #define blocks (their continuation lines included)."""
    in_define = False
    for number, line in enumerate(text.splitlines(), 1):
        starts = line.lstrip().startswith("#define")
        if not (in_define or starts):
            yield number, line
        in_define = (in_define or starts) and line.rstrip().endswith("\\")


def proto_step(text):
    """{name: (type with 'repeated ', line)} of the Step message."""
    m = re.search(r"^message Step \{\n(.*?)^\}", text, re.S | re.M)
    if not m:
        return None
    first = text[: m.start(1)].count("\n") + 1
    out = {}
    for offset, line in enumerate(m.group(1).splitlines()):
        f = re.match(r"^\s*(repeated\s+)?(\w+)\s+(\w+)\s*=\s*\d+;", line)
        if f:
            out[f.group(3)] = (("repeated " if f.group(1) else "") + f.group(2), first + offset)
    return out


def expands(text, macros):
    """The macros of `macros` that `text` does not expand (a call outside its #define lines)."""
    code = "\n".join(line for _, line in code_lines(text))
    return [m for m in macros if not re.search(rf"^\s*{m}\(", code, re.M)]


def hand_uses(root, rel, pattern, listed):
    """(line, name) of each listed field that `pattern` (group 1: the name) finds outside #define blocks."""
    out = []
    for number, line in code_lines((root / rel).read_text()):
        for m in re.finditer(pattern, line):
            if m.group(1) in listed:
                out.append((f"{rel}:{number}", m.group(1)))
    return out


def struct_members(text, name):
    """(base list, [(line, member name)]) of the members a C++ struct declares by hand."""
    m = re.search(rf"^struct {name}\s*(?::\s*([^{{]*))?\{{\n(.*?)^\}};", text, re.S | re.M)
    if not m:
        return None, []
    first = text[: m.start(2)].count("\n") + 1
    members = []
    body_lines = m.group(2).splitlines()
    for number, line in code_lines(m.group(2)):
        stripped = line.strip()
        if not stripped or stripped.startswith(("//", "#", "ODB_")):
            continue
        f = re.match(r"^[\w:<>, ]+?\s+(\w+)(?:\s*=[^;]*)?;", stripped)
        if f:
            members.append((f"{CONSUMER_H}:{first + number - 1}", f.group(1)))
    del body_lines
    return (m.group(1) or "").strip(), members


def annotation(node):
    return ast.unparse(node).replace("typing.", "") if node is not None else ""


def stub_properties(text):
    """{property: return annotation} of the stub's StepInfo, or None without the class."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == "StepInfo":
            return {f.name: annotation(f.returns) for f in node.body
                    if isinstance(f, ast.FunctionDef) and not f.name.startswith("_") and f.name not in ("get",)}
    return None


def dataclass_fields(text, name):
    """{attribute: annotation} of a class's annotated attributes, or None without the class."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {s.target.id: annotation(s.annotation) for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return None


def check(root: Path):
    """The violations of the one-list rules in the tree at `root`, as lines."""
    problems = []
    fields, others = read_list(root, problems)
    listed = set(fields)
    add_here = f"list it in {FIELDS_H} instead (the builder, the decoder, StepInfo and the bindings take it from there)"

    # 1. The wire.
    wire = proto_step((root / PROTO).read_text())
    if wire is None:
        problems.append(f"{PROTO}: no `message Step`")
        wire = {}
    for name, (ptype, line) in sorted(wire.items()):
        if name in others:
            continue
        if name not in fields:
            problems.append(f"{PROTO}:{line}: Step.{name} is not in the one list of step fields: {add_here}")
        elif ptype != fields[name].proto_type():
            problems.append(f"{PROTO}:{line}: Step.{name} is `{ptype}`, the list says `{fields[name].proto_type()}` "
                            f"({FIELDS_H})")
    for name in sorted(listed - set(wire)):
        problems.append(f"{PROTO}: Step has no field {name}, which {FIELDS_H} lists: add "
                        f"`{fields[name].proto_type()} {name} = <next number>;`")
    for name in sorted(others - set(wire)):
        problems.append(f"{PROTO}: Step has no field {name}, which ODB_STEP_OTHER_FIELDS names")

    # 2, 3, 5. The code that copies fields: through the macros only.
    for rel, macros, pattern, what in (
            (BUILDER, MACROS, r"\bstep\.(?:set|add|mutable)_(\w+)\(", "sets"),
            (DECODER, MACROS, r"\bd\.step\.(\w+)\b", "writes"),
            (BINDINGS, MACROS, r"&StepInfo::(\w+)\b", "binds")):
        for macro in expands((root / rel).read_text(), macros):
            problems.append(f"{rel}: does not expand {macro}: its step fields come from {FIELDS_H}")
        for where, name in hand_uses(root, rel, pattern, listed):
            problems.append(f"{where}: {what} step field {name} by hand; the {macros_of(fields, name)} expansion "
                            "does it")

    # 4. StepInfo.
    bases, members = struct_members((root / CONSUMER_H).read_text(), "StepInfo")
    if bases is None:
        problems.append(f"{CONSUMER_H}: no struct StepInfo")
    else:
        if "StepHeader" not in bases:
            problems.append(f"{CONSUMER_H}: StepInfo does not derive from StepHeader (ODB_STEP_FIELDS)")
        m = re.search(r"^struct StepInfo\b.*?^\};", (root / CONSUMER_H).read_text(), re.S | re.M)
        for macro in expands(m.group(0) if m else "", MACROS[1:]):
            problems.append(f"{CONSUMER_H}: StepInfo does not expand {macro}: its members come from {FIELDS_H}")
    hand = set()
    for where, name in members:
        hand.add(name)
        if name in listed:
            problems.append(f"{where}: StepInfo declares {name} by hand; the {macros_of(fields, name)} "
                            "expansion declares it")
        elif name not in others:
            problems.append(f"{where}: StepInfo::{name} is in no list of step fields: {add_here}")

    # 6. The stub.
    python_fields = {n: f for n, f in fields.items() if not hasattr(f, "present_of")}
    props = stub_properties((root / STUB).read_text())
    if props is None:
        problems.append(f"{STUB}: no class StepInfo")
        props = {}
    for name in sorted(set(python_fields) - set(props)):
        problems.append(f"{STUB}: StepInfo has no property {name} ({FIELDS_H} lists it): add "
                        f"`@property def {name}(self) -> {python_fields[name].py_type()}: ...`")
    for name, returns in sorted(props.items()):
        if name in python_fields:
            if returns != python_fields[name].py_type():
                problems.append(f"{STUB}: StepInfo.{name} returns {returns}, the list says "
                                f"{python_fields[name].py_type()} ({FIELDS_H})")
        elif name not in hand:
            problems.append(f"{STUB}: StepInfo.{name} is not a step field ({FIELDS_H} does not list it, "
                            "StepInfo does not declare it)")

    # 7. odb.Step.
    step = dataclass_fields((root / STEP_PY).read_text(), "Step")
    if step is None:
        problems.append(f"{STEP_PY}: no class Step")
        step = {}
    for name, ann in sorted(step.items()):
        if name.startswith("_") or name in STEP_PY_OWN:
            continue
        if name in python_fields:
            if ann != python_fields[name].py_type():
                problems.append(f"{STEP_PY}: Step.{name} is {ann}, the list says {python_fields[name].py_type()} "
                                f"({FIELDS_H})")
        elif name not in hand:
            problems.append(f"{STEP_PY}: Step.{name} is not a step field: {add_here}, or make it private "
                            f"(_{name}) or Python's own ({', '.join(sorted(STEP_PY_OWN))})")

    # 8. The route lists Python reads.
    routes = {n for n, f in fields.items() if f.group == "ODB_STEP_ROUTE_FIELDS"}
    m = re.search(r"^PHASE_FIELDS = (\(.*?\))$", (root / PHASES_PY).read_text(), re.S | re.M)
    phase_fields = set(ast.literal_eval(m.group(1))) if m else set()
    if phase_fields != routes:
        problems.append(f"{PHASES_PY}: PHASE_FIELDS {sorted(phase_fields)} differs from ODB_STEP_ROUTE_FIELDS "
                        f"{sorted(routes)} ({FIELDS_H})")
    return problems


def macros_of(fields, name):
    return fields[name].group


def main(argv):
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    problems = check(root)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
