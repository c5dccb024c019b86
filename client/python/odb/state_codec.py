"""The loader's checkpoint state codec (docs/resume.md): the format tag and version that
OdbDataLoader.state_dict writes and load_state_dict checks, and the compact encoding of an epoch's
consumed sample positions."""
from __future__ import annotations

from typing import Any, Dict, Mapping

import numpy as np

# The loader's checkpoint state (docs/resume.md). Bump on any change that an
# older reader would misread; load_state_dict refuses other versions.
STATE_FORMAT = "odb.OdbDataLoader"
STATE_VERSION = 3  # 2 adds "replay" (alignment.deterministic), 3 "job" (budgets, schedules); 1 and 2 still load


def compress_ints(values: Any) -> Dict[str, Any]:
    """A set of non-negative ints as {"cursor": c, "extra": [...]}: every value
    below c, plus the sorted extras at or above it. Consumed positions of an
    epoch are nearly a prefix (steps take samples roughly in arrival order),
    so the state stays small however far the epoch got."""
    arr = np.unique(np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.int64))
    if arr.size and arr[0] < 0:
        raise ValueError("compress_ints: negative value")
    gaps = np.nonzero(arr != np.arange(arr.size, dtype=np.int64))[0]
    cursor = int(gaps[0]) if gaps.size else int(arr.size)
    return {"cursor": cursor, "extra": [int(v) for v in arr[cursor:]]}


def compress_mask(consumed: np.ndarray) -> Dict[str, Any]:
    """compress_ints for a boolean mask over 0..n-1 (O(n) vector ops, no sort)."""
    missing = np.flatnonzero(~consumed)
    cursor = int(missing[0]) if missing.size else int(consumed.size)
    return {"cursor": cursor, "extra": [int(v) for v in np.flatnonzero(consumed[cursor:]) + cursor]}


def expand_ints(packed: Mapping[str, Any]) -> np.ndarray:
    """The inverse of compress_ints; raises ValueError on a malformed value."""
    try:
        cursor = int(packed["cursor"])
        extra = np.asarray(packed["extra"], dtype=np.int64)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"odb loader state: malformed consumed set ({e!r})") from None
    if cursor < 0 or extra.ndim != 1 or (extra.size and (extra.min() < cursor or np.any(np.diff(extra) <= 0))):
        raise ValueError("odb loader state: malformed consumed set (cursor/extra out of order)")
    return np.concatenate([np.arange(cursor, dtype=np.int64), extra])
