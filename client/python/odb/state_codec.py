"""The loader's checkpoint state codec (docs/resume.md): the format tag and version that
OdbDataLoader.state_dict writes and load_state_dict checks, the typed fields its versions' dataclasses
are read with (:func:`state_field`, :func:`read_fields`), and the compact encoding of an epoch's
consumed sample positions."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Type, TypeVar

import numpy as np

# The loader's checkpoint state (docs/resume.md). Bump on any change that an
# older reader would misread; load_state_dict refuses other versions.
STATE_FORMAT = "odb.OdbDataLoader"
# One dataclass per version in odb.resume_state (StateV1 to StateV4): 2 adds "replay"
# (alignment.deterministic), 3 "job" (budgets, schedules), 4 the custom sampler's key "rank_position"
# (positions in each rank's list, so a repeated index counts once per position); 1 to 3 still load, with
# their meaning (a custom sampler's "id" key: every position of a consumed index).
STATE_VERSION = 4


def compress_ints(values: Any) -> Dict[str, Any]:
    """A set of non-negative ints as {"cursor": c, "extra": [...]}: every value
    below c, plus the sorted extras at or above it. Consumed positions of an
    epoch are nearly a prefix (steps take samples roughly in arrival order),
    so the state stays small however far the epoch got."""
    arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.int64)
    if arr.size > 1 and not np.all(arr[1:] > arr[:-1]):  # already sorted and unique: no sort
        arr = np.unique(arr)
    if arr.size and arr[0] < 0:
        raise ValueError("compress_ints: negative value")
    gaps = np.nonzero(arr != np.arange(arr.size, dtype=np.int64))[0]
    cursor = int(gaps[0]) if gaps.size else int(arr.size)
    return {"cursor": cursor, "extra": arr[cursor:].tolist()}


def compress_mask(consumed: np.ndarray) -> Dict[str, Any]:
    """compress_ints for a boolean mask over 0..n-1 (O(n) vector ops, no sort)."""
    missing = np.flatnonzero(~consumed)
    cursor = int(missing[0]) if missing.size else int(consumed.size)
    return {"cursor": cursor, "extra": (np.flatnonzero(consumed[cursor:]) + cursor).tolist()}


def is_int(value: Any) -> bool:
    """An integer of the state (Python or numpy), not a bool and not a float that happens to be whole."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(value: Any, name: str, minimum: "int | None") -> int:
    """A state field that must be an integer (at least `minimum`): its value, or ValueError naming it."""
    if not is_int(value):
        raise ValueError(f"odb loader state: {name} must be an integer, got {value!r}")
    if minimum is not None and int(value) < minimum:
        raise ValueError(f"odb loader state: {name} is {int(value)}, below {minimum}")
    return int(value)


# A field's check: (value, the field's name in the state) -> the value read; ValueError naming the field.
Check = Callable[[Any, str], Any]
T = TypeVar("T")


def integer(minimum: "int | None" = None) -> Check:
    """An integer field (check_int), at least `minimum`."""
    return lambda value, name: check_int(value, name, minimum)


def flag(value: Any, name: str) -> bool:
    """A true/false field: bool or numpy bool only (bool("false") would be True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"odb loader state: {name} must be true or false, got {value!r}")
    return bool(value)


def text(value: Any, name: str) -> str:
    """A string field."""
    if not isinstance(value, str):
        raise ValueError(f"odb loader state: {name} must be a string, got {value!r}")
    return value


def anything(value: Any, name: str) -> Any:
    """A field read as it is (a consumed set: checked against the loader that loads it)."""
    return value


def optional(check: Check) -> Check:
    """`check`, or null."""
    return lambda value, name: None if value is None else check(value, name)


def state_field(check: Check, default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field of a state read by :func:`read_fields`: its check, and its value when the state
    lacks it (no default: the state must have it)."""
    return dataclasses.field(default=default, metadata={"check": check})


def read_fields(cls: Type[T], state: Any, prefix: str = "") -> T:
    """`state` (a mapping) read as dataclass `cls`: every field declared with :func:`state_field` present
    (or defaulted) and passing its check; keys `cls` does not declare are ignored. ValueError naming the
    field (with `prefix`, e.g. "replay.") otherwise."""
    if not isinstance(state, Mapping):
        raise ValueError(f"odb loader state: {prefix.rstrip('.')} must be a mapping, got {type(state).__name__}")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    missing = [prefix + f.name for f in fields if f.name not in state and f.default is dataclasses.MISSING]
    if missing:
        raise ValueError(f"odb loader state is truncated: missing {missing}")
    return cls(**{f.name: f.metadata["check"](state[f.name], prefix + f.name) for f in fields if f.name in state})


def packed_top(packed: Any) -> "int | None":
    """One past the largest value a well-formed compress_ints value names (0 when empty), without
    expanding it; None when it is malformed (expand_ints then says how)."""
    if not isinstance(packed, Mapping) or not is_int(packed.get("cursor")):
        return None
    extra = packed.get("extra")
    if not isinstance(extra, (list, tuple)) or not all(is_int(v) for v in extra[-1:]):
        return None
    return max(int(packed["cursor"]), int(extra[-1]) + 1 if len(extra) else 0)


def expand_ints(packed: Mapping[str, Any], name: str = "consumed", limit: "int | None" = None,
                unit: str = "entry") -> np.ndarray:
    """The inverse of compress_ints; raises ValueError naming `name` on a malformed value (not a
    {cursor, extra} of non-negative integers in order) or one at or past `limit` (checked before
    anything is allocated: a hostile cursor must not become a huge array)."""
    if not isinstance(packed, Mapping) or "cursor" not in packed or "extra" not in packed:
        raise ValueError(f"odb loader state: malformed {name} set (a {{cursor, extra}} mapping, got "
                         f"{type(packed).__name__})")
    cursor, extra_list = packed["cursor"], packed["extra"]
    if not is_int(cursor) or not isinstance(extra_list, (list, tuple, np.ndarray)):
        raise ValueError(f"odb loader state: malformed {name} set (cursor {cursor!r} must be an integer, extra "
                         f"a list of integers)")
    if isinstance(extra_list, np.ndarray):
        ok = extra_list.ndim == 1 and (extra_list.size == 0 or np.issubdtype(extra_list.dtype, np.integer))
    else:
        ok = all(is_int(v) for v in extra_list)
    if not ok:
        raise ValueError(f"odb loader state: malformed {name} set (extra must be a flat list of integers)")
    cursor = int(cursor)
    if cursor < 0 or any(int(v) < cursor for v in extra_list[:1]):
        raise ValueError(f"odb loader state: malformed {name} set (negative, or cursor/extra out of order)")
    top = max(cursor, int(extra_list[-1]) + 1 if len(extra_list) else 0)
    if limit is not None and top > limit:
        raise ValueError(f"odb loader state names {unit} {top - 1} in {name}, past the {limit} there are (a state "
                         f"of another dataset or list, or a corrupt one)")
    try:
        extra = np.asarray(extra_list, dtype=np.int64)
    except OverflowError:
        raise ValueError(f"odb loader state: malformed {name} set (a value past int64)") from None
    if extra.size and (extra.min() < cursor or np.any(np.diff(extra) <= 0)):
        raise ValueError(f"odb loader state: malformed {name} set (cursor/extra out of order)")
    try:
        return np.concatenate([np.arange(cursor, dtype=np.int64), extra])
    except MemoryError:
        raise ValueError(f"odb loader state: {name} set of {cursor} entries is too large") from None


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


def take_positions(free_ids: np.ndarray, free_positions: np.ndarray, counts: np.ndarray,
                   skip: "np.ndarray | None" = None) -> np.ndarray:
    """Positions in a rank's list of trained samples given as counts per dataset index: for each index
    i, its free positions number skip[i] to skip[i] + counts[i] - 1 in list order. A step names a sample
    by its index, not by its position, so copies of one index are told apart by order: the copies
    trained first take the index's first free positions. That keeps the multiset exact: every position
    is consumed at most once, each index as often as it was trained. Costs O(len(counts)) and a lookup
    per distinct index: no sort of the trained samples.

    free_ids / free_positions: the list's free (not yet consumed) positions and their indices, sorted
    by (index, position). Returns the positions grouped by index; raises ValueError naming the index
    when one was trained more often than it has free positions."""
    counts = np.asarray(counts, dtype=np.int64)
    index = np.flatnonzero(counts)
    if not index.size:
        return np.zeros(0, dtype=np.int64)
    count = counts[index]
    before = np.zeros(index.size, dtype=np.int64) if skip is None else np.asarray(skip, dtype=np.int64)[index]
    first = np.searchsorted(free_ids, index, side="left")
    free = np.searchsorted(free_ids, index, side="right") - first
    over = before + count > free
    if over.any():
        k = int(np.argmax(over))
        raise ValueError(f"index {int(index[k])} was trained {int(before[k] + count[k])} times but this rank's "
                         f"list holds it at {int(free[k])} free positions")
    within = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    return free_positions[np.repeat(first + before, count) + within]


def list_fingerprint(indices: np.ndarray) -> str:
    """A short digest of a rank's list (its indices in order): a resume by position checks that the
    sampler drew the same list again."""
    import hashlib

    data = np.ascontiguousarray(np.asarray(indices, dtype="<i8")).tobytes()
    return f"{len(indices)}:" + hashlib.blake2b(data, digest_size=12).hexdigest()
