"""odb.exposition, the strict Prometheus text-format parser odb.top reads the daemons'
metrics with (issue 23): checked against the reference parser, Debian's
python3-prometheus-client, on hostile but valid text (label values holding `}`, `"`,
`\\`, newlines, `,` and `=`; NaN and infinities; timestamps; samples with no labels;
HELP and TYPE lines; histograms), both hand-written and generated from a seed, and
shown to refuse what is not the format (each error names the line), where the
reference parser guesses. odb.top on a served exposition: the figures of the rank's
series whatever the valid spelling; a text that is not an exposition is named in its
row, not read as zeros. (The real daemon's endpoint: tests/integration/test_top.py.)
"""
from __future__ import annotations

import http.server
import math
import random
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
from prometheus_client.parser import text_string_to_metric_families

from odb import exposition, top

ROOT = Path(__file__).resolve().parents[2]

Key = Tuple[str, Tuple[Tuple[str, str], ...]]


def reference(text: str) -> Dict[Key, Tuple[float, Optional[float]]]:
    """{(name, sorted labels): (value, timestamp in s)} by prometheus_client's parser."""
    out: Dict[Key, Tuple[float, Optional[float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, key
            out[key] = (float(s.value), s.timestamp)
    return out


def ours(text: str) -> Dict[Key, Tuple[float, Optional[float]]]:
    return {(s.name, tuple(sorted(s.labels.items()))): (s.value, None if s.timestamp_ms is None else
                                                        s.timestamp_ms / 1000)
            for f in exposition.parse(text) for s in f.samples}


def same(a: Dict[Key, Tuple[float, Optional[float]]], b: Dict[Key, Tuple[float, Optional[float]]]) -> bool:
    def norm(v: Tuple[float, Optional[float]]) -> Tuple[str, Optional[float]]:
        return ("nan" if math.isnan(v[0]) else repr(v[0]), v[1])

    return a.keys() == b.keys() and all(norm(a[k]) == norm(b[k]) for k in a)


def esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


HOSTILE = r'''# HELP odb_samples_received_total Samples received; a help text with \\ and \n escapes
# TYPE odb_samples_received_total counter
odb_samples_received_total{rank="0"} 300
# HELP odb_weird A label value may hold } and " and \\ and a newline
# TYPE odb_weird gauge
odb_weird{rank="0",v="}"} 1
odb_weird{rank="0",v="\""} 2
odb_weird{rank="0",v="a}b{c\"d\\e\nf,g=h"} 3
odb_weird{rank="0",v="\\"} 4
odb_weird{rank="0",v="\\\""} 5
odb_weird{rank="0",v="# not a comment",} 6
odb_weird{v="",rank="0"} 7
odb_weird{rank="0",v="ünïcode ✓"} 8
# a plain comment with } and " in it
odb_no_labels 42
odb_nan NaN
odb_inf{rank="0"} +Inf
odb_neginf{rank="0"} -Inf
odb_with_timestamp{rank="0"} 1.5e3 1700000000123
odb_negative_timestamp -0.25 -5

odb_empty_braces{} 9
# TYPE odb_round_microseconds histogram
odb_round_microseconds_bucket{rank="0",le="100"} 1
odb_round_microseconds_bucket{rank="0",le="+Inf"} 3
odb_round_microseconds_sum{rank="0"} 450
odb_round_microseconds_count{rank="0"} 3
# TYPE odb_latency summary
odb_latency{quantile="0.5"} 12
odb_latency_sum 20
odb_latency_count 2
'''


def test_hostile_valid_text_reads_as_the_reference_parser_reads_it() -> None:
    mine = ours(HOSTILE)
    assert same(mine, reference(HOSTILE)), (mine, reference(HOSTILE))
    weird = {dict(k[1])["v"]: v[0] for k, v in mine.items() if k[0] == "odb_weird"}
    assert weird == {"}": 1, '"': 2, 'a}b{c"d\\e\nf,g=h': 3, "\\": 4, '\\"': 5, "# not a comment": 6, "": 7,
                     "ünïcode ✓": 8}
    assert mine[("odb_with_timestamp", (("rank", "0"),))] == (1500.0, 1700000000.123)
    families = {f.name: f for f in exposition.parse(HOSTILE)}
    assert families["odb_samples_received_total"].help == \
        "Samples received; a help text with \\ and \n escapes"
    assert families["odb_samples_received_total"].type == "counter"
    assert families["odb_round_microseconds"].type == "histogram"
    assert len(families["odb_round_microseconds"].samples) == 4
    assert [s.name for s in families["odb_latency"].samples] == ["odb_latency", "odb_latency_sum", "odb_latency_count"]


def _generated(rng: random.Random) -> str:
    alphabet = ['}', '{', '"', '\\', '\n', ',', '=', ' ', '\t', '#', 'a', 'z', '0', 'é', '✓', '_']
    values = ["NaN", "+Inf", "-Inf", "0", "-0.5", "1e-9", "12345678901234", ".5", "7."]
    lines: List[str] = []
    for f in range(rng.randint(1, 6)):
        name = f"m{f}_{rng.choice(['a', 'b:c', '_d'])}"
        kind = rng.choice(["gauge", "counter", "untyped", None])
        if kind == "counter":
            name += "_total"  # prometheus_client renames a counter's samples otherwise
        if rng.random() < 0.5:
            doc = "".join(rng.choices(alphabet, k=8)).replace("\\", "\\\\").replace("\n", "\\n")
            lines.append(f"# HELP {name} help {doc}")
        if kind:
            lines.append(f"# TYPE {name} {kind}")
        for s in range(rng.randint(1, 4)):
            labels = {f"l{j}": "".join(rng.choices(alphabet, k=rng.randint(0, 8))) for j in range(rng.randint(0, 3))}
            labels["series"] = str(s)  # every series once
            body = ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())
            ts = f" {rng.randint(-10**12, 10**13)}" if rng.random() < 0.3 else ""
            lines.append(f"{name}{{{body}}} {rng.choice(values)}{ts}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", range(200))
def test_generated_expositions_read_as_the_reference_parser_reads_them(seed: int) -> None:
    text = _generated(random.Random(seed))
    assert same(ours(text), reference(text)), text
    # HELP texts and types too. prometheus_client names a counter's family without its _total, an
    # untyped one "unknown", and strips each line (a HELP text's trailing blanks go; Go's parser keeps them).
    theirs = {(f.name, f.type, f.documentation) for f in text_string_to_metric_families(text)}
    mine = {(f.name[:-6] if f.type == "counter" else f.name, "unknown" if f.type == "untyped" else f.type,
             (f.help or "").rstrip(" \t")) for f in exposition.parse(text)}
    assert mine == theirs, text


# Not the format; each names its line. The reference parser (lax by its own docstring) takes the
# ones marked lax and guesses a value, which is what a strict reader must not do.
BAD = [
    ('x{a="b"} 1 2 3', "unexpected text after the timestamp", True),
    ("x 1_000", "is not a sample value", True),
    ("x infinity", "is not a sample value", True),
    ('x{a="b",a="c"} 1', "label 'a' appears twice", True),
    ('x{a="\\q"} 1', "invalid escape", True),
    ('x{a="b"} 1\nx{a="b"} 2', "appears twice", True),
    ('x{a="b} 1', "has no closing", False),
    ('x{a=b} 1', "expected '\"'", False),
    ('x{a="b" c="d"} 1', "expected ',' or '}'", True),
    ("x{1a=\"b\"} 1", "expected a label name", True),
    ("x", "expected a blank, then the sample value", False),
    ("x 1 1.5", "is not a timestamp", True),
    ("x{} ", "is not a sample value", False),
    ("1x 1", "expected a metric name", False),
    ("# TYPE x gauge\n# TYPE x counter", "a second TYPE line", True),
    ("# HELP x a\n# HELP x b", "a second HELP line", True),
    ("x 1\n# TYPE x gauge", "comes after its samples", True),
    ("# TYPE x gauges", "must be one word of", False),
    ("x 1\ny 2\nx{a=\"b\"} 3", "are not together", True),
    ("# TYPE h histogram\nh_bucket 1", "has no 'le' label", True),
    ("x 1\r\ny 2", "carriage return", True),
    ("# HELP x bad \\q escape", "invalid escape", True),
]


@pytest.mark.parametrize("text, problem, lax", BAD, ids=[b[0] for b in BAD])
def test_what_is_not_the_format_is_refused_naming_the_line(text: str, problem: str, lax: bool) -> None:
    with pytest.raises(exposition.ExpositionError) as e:
        exposition.parse("# HELP ok fine\nok 1\n" + text + "\n")
    assert problem in str(e.value), str(e.value)
    assert e.value.line >= 3 and f"line {e.value.line}:" in str(e.value)
    if lax:  # the reference takes it (and so would a regex): strictness is this parser's own
        list(text_string_to_metric_families(text + "\n"))


def test_odbds_own_rendering_reads_the_same_in_both() -> None:
    """The shape odbd's RenderPrometheus writes (HELP, TYPE, name{rank="R"} value) for every series
    of its metrics table (src/state/metrics.cc), read the same by both parsers."""
    names = re.findall(r'\{"(odb_[a-z0-9_]+)",', (ROOT / "src/state/metrics.cc").read_text())
    assert len(names) > 30, "the metrics table was not found in src/state/metrics.cc"
    text = "".join(f"# HELP {n} {n} help\n# TYPE {n} {'counter' if n.endswith('_total') else 'gauge'}\n"
                   f'{n}{{rank="3"}} {i * 1.5}\n' for i, n in enumerate(names))
    assert same(ours(text), reference(text))
    series = top.rank_series(text)
    assert series["rank"] == 3 and series[names[-1]] == (len(names) - 1) * 1.5


# ----------------------------------------------------------------- odb.top on a served exposition

class _Server:
    """An HTTP endpoint serving a fixed text at /metrics."""

    def __init__(self, text: str) -> None:
        body = text.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator:
    servers: List[_Server] = []

    def start(text: str) -> str:
        servers.append(_Server(text))
        return servers[-1].url

    yield start
    for s in servers:
        s.close()


def _top(*urls: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "odb.top", "--once", *urls], capture_output=True, text=True,
                          timeout=60, cwd=ROOT / "client/python")


def _row(stdout: str, rank: int) -> List[str]:
    (row,) = [line.split() for line in stdout.splitlines() if line[:4].strip() == str(rank)]
    return row


# Valid spellings a line-by-line regex misreads (timestamps, a trailing comma, blanks in the braces,
# the rank label not alone), around series with hostile label values that must not disturb the row.
SPELLED = '''# HELP odb_samples_received_total samples
# TYPE odb_samples_received_total counter
odb_samples_received_total{rank="2"} 300 1700000000000
odb_samples_received_total{rank="2",phase="vision}\\""} 99999
odb_samples_emitted_total{rank="2",} 280
odb_samples_rejected_total{ rank = "2" } 5
odb_steps_emitted_total{rank="2"}\t17
odb_idle_steps_total{rank="2"} 2
odb_real_tokens_total{rank="2"} 750
odb_padded_tokens_total{rank="2"} 1000
odb_trainer_data_wait_microseconds_total{rank="2"} 2500000
odb_decoy{rank="2",v="} odb_samples_received_total{rank=\\"9\\"} 1"} 12
'''


def test_top_reads_the_ranks_figures_whatever_the_valid_spelling(serve) -> None:
    top_run = _top(serve(SPELLED))
    assert top_run.returncode == 0, top_run.stdout + top_run.stderr
    row = _row(top_run.stdout, 2)
    assert row[1:7] == ["300", "280", "5", "17", "2", "25.0"], top_run.stdout  # in out rej steps idle pad%
    assert row[12] == "2.500", top_run.stdout  # seconds waited on data
    assert "rank 2's trainer waits most on data: 2.500 s" in top_run.stdout


@pytest.mark.parametrize("text, problem", [
    ("<html>not metrics</html>\n", "expected a metric name"),
    ('odb_samples_received_total{rank="0"} 1\nodb_samples_emitted_total{rank="1"} 1\n', "several ranks (0, 1)"),
    ('odb_samples_received_total{rank="zero"} 1\n', "is not a rank"),
    ('odb_samples_received_total{rank="0"} 1 2 3\n', "unexpected text after the timestamp"),
])
def test_top_names_an_endpoint_that_is_not_an_odbd_exposition(serve, text: str, problem: str) -> None:
    good, bad = serve('odb_samples_received_total{rank="0"} 7\n'), serve(text)
    run = _top(good, bad)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert _row(run.stdout, 0)[1] == "7", run.stdout
    (line,) = [ln for ln in run.stdout.splitlines() if bad in ln]
    assert "not an odbd metrics exposition" in line and problem in line, run.stdout


def test_top_shows_nan_and_infinite_figures_without_failing(serve) -> None:
    run = _top(serve('odb_samples_received_total{rank="1"} NaN\nodb_samples_emitted_total{rank="1"} +Inf\n'
                     'odb_trainer_data_wait_microseconds_total{rank="1"} NaN\n'))
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert _row(run.stdout, 1)[1:3] == ["nan", "inf"], run.stdout
