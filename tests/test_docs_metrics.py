"""docs/architecture.md names every series of the metrics table (src/state/metrics.cc)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_architecture_doc_lists_every_metric():
    table = (ROOT / "src" / "state" / "metrics.cc").read_text()
    names = re.findall(r'\{"(odb_[a-z0-9_]+)",', table)
    assert len(names) > 30, "the metrics table was not found in src/state/metrics.cc"
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = [n for n in names if f"`{n}`" not in doc]
    assert missing == [], f"docs/architecture.md does not list: {missing}"
