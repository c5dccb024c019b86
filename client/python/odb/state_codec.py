"""The loader's checkpoint state codec (docs/resume.md): the format tag and version that
OdbDataLoader.state_dict writes and load_state_dict checks, and the compact encoding of an epoch's
consumed sample positions."""
from __future__ import annotations

from typing import Any, Dict, Mapping

import numpy as np

# The loader's checkpoint state (docs/resume.md). Bump on any change that an
# older reader would misread; load_state_dict refuses other versions.
STATE_FORMAT = "odb.OdbDataLoader"
# 2 adds "replay" (alignment.deterministic), 3 "job" (budgets, schedules), 4 the custom sampler's key
# "rank_position" (positions in each rank's list, so a repeated index counts once per position); 1 to 3
# still load, with their meaning (a custom sampler's "id" key: every position of a consumed index).
STATE_VERSION = 4


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


def encode_rank_positions(per_rank: "list[np.ndarray]") -> np.ndarray:
    """(rank, position) pairs of `len(per_rank)` ranks' lists as one int64 array, position * ranks + rank,
    so that set operations (unique, isin, setdiff1d) work on them as on plain positions."""
    ranks = len(per_rank)
    parts = [np.asarray(p, dtype=np.int64) * ranks + r for r, p in enumerate(per_rank)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def decode_rank_positions(codes: np.ndarray, ranks: int, rank: int) -> np.ndarray:
    """The positions of rank `rank` among encode_rank_positions codes of `ranks` lists (sorted)."""
    codes = np.asarray(codes, dtype=np.int64)
    return np.sort(codes[codes % ranks == rank] // ranks)


def assign_positions(free_ids: np.ndarray, free_positions: np.ndarray, taken: np.ndarray) -> np.ndarray:
    """The positions in a rank's list of the samples `taken` (dataset indices, repeats allowed, in the
    order they were trained). A step names a sample by its index, not by its position, so copies of one
    index are told apart by order: the k-th trained copy of index i takes the k-th free position of i
    in list order. That keeps the multiset exact: every position is consumed at most once, and each
    index as often as it was trained.

    free_ids / free_positions: the list's free (not yet consumed) positions and their indices, sorted
    by (index, position). Returns the positions in `taken`'s order; raises ValueError naming the index
    when one came back more often than it has free positions."""
    taken = np.asarray(taken, dtype=np.int64)
    if not taken.size:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(taken, kind="stable")  # stable: copies keep their training order
    t = taken[order]
    occurrence = np.arange(t.size, dtype=np.int64) - np.searchsorted(t, t, side="left")
    slot = np.searchsorted(free_ids, t, side="left") + occurrence
    over = slot >= np.searchsorted(free_ids, t, side="right")
    if over.any():
        index = int(t[np.argmax(over)])
        raise ValueError(f"index {index} was trained {int(np.count_nonzero(t == index))} times but this rank's "
                         f"list holds it at {int(np.count_nonzero(free_ids == index))} free positions")
    out = np.empty(t.size, dtype=np.int64)
    out[order] = free_positions[slot]
    return out


def list_fingerprint(indices: np.ndarray) -> str:
    """A short digest of a rank's list (its indices in order): a resume by position checks that the
    sampler drew the same list again."""
    import hashlib

    data = np.ascontiguousarray(np.asarray(indices, dtype="<i8")).tobytes()
    return f"{len(indices)}:" + hashlib.blake2b(data, digest_size=12).hexdigest()
