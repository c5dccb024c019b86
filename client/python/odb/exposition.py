"""A strict parser of the Prometheus text exposition format (version 0.0.4), the
format of odbd's metrics endpoint, for `odb.top` without prometheus_client
(a pip-only venv has none).

What it reads (https://prometheus.io/docs/instrumenting/exposition_formats/):

* ``# HELP name text`` (``\\\\`` and ``\\n`` escaped in the text) and
  ``# TYPE name counter|gauge|histogram|summary|untyped``; any other ``#``
  line is a comment; blank lines are skipped;
* samples ``name{label="value",...} value [timestamp]``: the braces are
  optional (a sample with no labels), a trailing comma in them is allowed,
  label values escape ``\\\\``, ``\\"`` and ``\\n`` (so they may hold ``}``,
  ``,``, ``=``, ``#`` and ``"``); the value is a decimal float, ``NaN``,
  ``+Inf`` or ``-Inf``; the timestamp is an integer of milliseconds.

Strict where a lax parser guesses: a malformed line, an unknown escape, a
label named twice, the same series twice, a second HELP or TYPE for a
family, a TYPE after the family's samples, a family whose lines are not
together, a histogram bucket without ``le`` each raise ExpositionError naming
the line (1-based) and what is wrong. Needs nothing outside the standard
library.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
# Sample names a family of each type holds, as suffixes of the family's name.
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_SPECIAL = {"nan": math.nan, "+inf": math.inf, "inf": math.inf, "-inf": -math.inf}
_TIMESTAMP = re.compile(r"[+-]?[0-9]+\Z")
_LABEL_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_HELP_ESCAPES = {"\\": "\\", "n": "\n"}

Labels = Tuple[Tuple[str, str], ...]  # sorted (name, value) pairs


class ExpositionError(ValueError):
    """Text that is not a valid Prometheus text exposition."""

    def __init__(self, line: int, text: str, problem: str) -> None:
        shown = text if len(text) <= 200 else text[:200] + "..."
        super().__init__(f"metrics exposition, line {line}: {problem}: {shown!r}")
        self.line = line
        self.problem = problem


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Dict[str, str]
    value: float
    timestamp_ms: Optional[int] = None


@dataclass
class Family:
    name: str
    type: str = "untyped"
    help: Optional[str] = None
    samples: List[Sample] = field(default_factory=list)
    typed: bool = field(default=False, repr=False)  # a TYPE line was read


def parse_value(token: str) -> float:
    """A sample value: a decimal float, NaN, +Inf or -Inf (the spellings Go's
    ParseFloat takes for them, any case). ValueError otherwise."""
    special = _SPECIAL.get(token.lower())
    if special is not None:
        return special
    if not _FLOAT.match(token):  # float() alone would take '1_0', ' 1', 'infinity'...
        raise ValueError(f"not a sample value: {token!r}")
    return float(token)


def _unescape(text: str, escapes: Dict[str, str], what: str, number: int, line: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 == len(text) or text[i + 1] not in escapes:
                allowed = ", ".join(repr("\\" + k) for k in escapes)
                raise ExpositionError(number, line, f"{what}: invalid escape {text[i:i + 2]!r} (only {allowed})")
            out.append(escapes[text[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


class _Line:
    """A cursor over one line."""

    def __init__(self, text: str, number: int) -> None:
        self.text, self.number, self.pos = text, number, 0

    def fail(self, problem: str) -> ExpositionError:
        return ExpositionError(self.number, self.text, f"{problem} (column {self.pos + 1})")

    def blanks(self) -> bool:
        """Skips spaces and tabs; whether there were any."""
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1
        return self.pos > start

    def token(self, pattern: "re.Pattern[str]", what: str) -> str:
        m = pattern.match(self.text, self.pos)
        if not m:
            raise self.fail(f"expected {what}")
        self.pos = m.end()
        return m.group(0)

    def peek(self) -> str:
        return self.text[self.pos:self.pos + 1]

    def rest(self) -> str:
        r, self.pos = self.text[self.pos:], len(self.text)
        return r

    def word(self) -> str:
        """The text up to the next blank or the end."""
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in " \t":
            self.pos += 1
        return self.text[start:self.pos]


def _labels(cur: _Line) -> Dict[str, str]:
    """`{name="value",...}` from the cursor at the `{`."""
    labels: Dict[str, str] = {}
    cur.pos += 1
    while True:
        cur.blanks()
        if cur.peek() == "}":
            cur.pos += 1
            return labels
        name = cur.token(_LABEL_NAME, "a label name or '}'")
        cur.blanks()
        if cur.peek() != "=":
            raise cur.fail(f"expected '=' after label name {name!r}")
        cur.pos += 1
        cur.blanks()
        if cur.peek() != '"':
            raise cur.fail(f"expected '\"' opening the value of label {name!r}")
        start = cur.pos + 1
        end = start
        while True:  # the closing quote: the first one not escaped
            if end >= len(cur.text):
                cur.pos = end
                raise cur.fail(f"the value of label {name!r} has no closing '\"'")
            c = cur.text[end]
            if c == "\\":
                end += 2
                continue
            if c == '"':
                break
            end += 1
        if name in labels:
            raise cur.fail(f"label {name!r} appears twice")
        labels[name] = _unescape(cur.text[start:end], _LABEL_ESCAPES, f"the value of label {name!r}", cur.number,
                                 cur.text)
        cur.pos = end + 1
        cur.blanks()
        if cur.peek() == ",":
            cur.pos += 1
        elif cur.peek() != "}":
            raise cur.fail("expected ',' or '}' after a label value")


def _sample(cur: _Line) -> Sample:
    name = cur.token(_METRIC_NAME, "a metric name")
    labels: Dict[str, str] = {}
    if cur.peek() == "{":
        labels = _labels(cur)
    if not cur.blanks():
        raise cur.fail("expected a blank, then the sample value")
    token = cur.word()
    try:
        value = parse_value(token)
    except ValueError:
        raise cur.fail(f"{token!r} is not a sample value (a float, NaN, +Inf or -Inf)") from None
    timestamp = None
    cur.blanks()
    if cur.pos < len(cur.text):
        token = cur.word()
        if not _TIMESTAMP.match(token):
            raise cur.fail(f"{token!r} is not a timestamp (integer milliseconds)")
        timestamp = int(token)
        cur.blanks()
        if cur.pos < len(cur.text):
            raise cur.fail("unexpected text after the timestamp")
    return Sample(name, labels, value, timestamp)


def parse(text: str) -> List[Family]:
    """The families of an exposition, in order; each family's samples in order.
    ExpositionError (a ValueError) on anything invalid."""
    families: List[Family] = []
    by_name: Dict[str, Family] = {}
    seen: Set[Tuple[str, Labels]] = set()  # each series once
    current: Optional[Family] = None

    def enter(name: str, number: int, line: str) -> Family:
        """The family `name`, which this line continues or starts."""
        nonlocal current
        if current is not None and current.name == name:
            return current
        if name in by_name:
            raise ExpositionError(number, line, f"the lines of metric family {name!r} are not together "
                                                f"(another family's lines came between)")
        current = by_name[name] = Family(name)
        families.append(current)
        return current

    def family_name(sample_name: str) -> str:
        """The family a sample belongs to: a declared histogram/summary whose name plus one of its
        type's suffixes the sample's name is (x_bucket, x_sum, x_count), else its own name."""
        for suffix in ("_bucket", "_sum", "_count"):
            if sample_name.endswith(suffix):
                fam = by_name.get(sample_name[:-len(suffix)])
                if fam is not None and suffix in _SUFFIXES.get(fam.type, ()):
                    return fam.name
        return sample_name

    for number, raw in enumerate(text.split("\n"), start=1):
        if raw.endswith("\r"):
            raise ExpositionError(number, raw, "a carriage return ends the line (lines end with '\\n' only)")
        cur = _Line(raw, number)
        cur.blanks()
        if cur.pos == len(raw):
            continue  # a blank line
        if cur.peek() == "#":
            cur.pos += 1
            cur.blanks()
            keyword = cur.word()
            if keyword not in ("HELP", "TYPE"):
                continue  # a comment
            if not cur.blanks():
                raise cur.fail(f"expected a metric name after # {keyword}")
            name = cur.token(_METRIC_NAME, f"a metric name after # {keyword}")
            if cur.pos < len(raw) and not cur.blanks():
                raise cur.fail(f"expected a blank after the metric name {name!r}")
            fam = enter(name, number, raw)
            if keyword == "HELP":
                if fam.help is not None:
                    raise ExpositionError(number, raw, f"a second HELP line for {name!r}")
                fam.help = _unescape(cur.rest(), _HELP_ESCAPES, f"the HELP text of {name!r}", number, raw)
                continue
            kind = cur.word()
            cur.blanks()
            if kind not in TYPES or cur.pos < len(raw):
                raise ExpositionError(number, raw, f"the TYPE of {name!r} must be one word of {', '.join(TYPES)}")
            if fam.typed:
                raise ExpositionError(number, raw, f"a second TYPE line for {name!r}")
            if fam.samples:
                raise ExpositionError(number, raw, f"the TYPE line of {name!r} comes after its samples")
            fam.type, fam.typed = kind, True
            continue
        sample = _sample(cur)
        fam = enter(family_name(sample.name), number, raw)
        key = (sample.name, tuple(sorted(sample.labels.items())))
        if key in seen:
            raise ExpositionError(number, raw, f"series {sample.name}{dict(key[1])} appears twice")
        seen.add(key)
        if fam.type == "histogram" and sample.name == fam.name:
            raise ExpositionError(number, raw, f"histogram {fam.name!r} has samples {fam.name}_bucket, _sum and "
                                               f"_count, not {fam.name}")
        if fam.type == "histogram" and sample.name == fam.name + "_bucket" and "le" not in sample.labels:
            raise ExpositionError(number, raw, f"a bucket of histogram {fam.name!r} has no 'le' label")
        fam.samples.append(sample)
    return families


def samples(text: str) -> Dict[Tuple[str, Labels], float]:
    """{(sample name, sorted labels): value} of an exposition (parse())."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in parse(text) for s in f.samples}
