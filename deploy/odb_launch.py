#!/usr/bin/env python3
"""Kept for old command lines: the launcher is `python -m odb.launch` (odb/launch.py in the package).

It imports the installed odb; only when none is installed does it use this
checkout's client/python.
"""
import sys
from pathlib import Path

try:
    import odb.launch as launch
except ImportError:
    sys.path.append(str(Path(__file__).resolve().parents[1] / "client/python"))
    import odb.launch as launch

if __name__ == "__main__":
    sys.exit(launch.main())
