"""The loader's resume state read back (docs/resume.md): ``parse_state`` checks a checkpoint's loader
state field by field, for each version it reads, and returns a :class:`LoadedState`; the loader then
only applies it. The versions (state_codec.STATE_VERSION):

* 1: the consumed set and its key ("position" of the epoch's order; a custom sampler's "id": dataset
  indices, every position of a consumed index counts as consumed).
* 2: + "replay" (reproducible epochs, alignment.deterministic: the round to resume at and the keys of
  its steps so far).
* 3: + "job" (the job counters of schedules and budgets: odb.job_counters).
* 4: a custom sampler's key "rank_position" (positions in each rank's list, so a repeated index counts
  once per position), with "consumed_ids" and each list's fingerprint ("lists").
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from .state_codec import (STATE_FORMAT, STATE_VERSION, check_int, encode_rank_positions, expand_ints, is_int,
                          packed_top)

REQUIRED = ("epoch", "epoch_complete", "seed", "shuffle", "custom_sampler", "dataset_len", "world_size", "scope",
            "consumed", "key")


@dataclasses.dataclass
class LoadedState:
    """A loader state, checked: what the resumed loader needs of it."""

    version: int
    epoch: int
    epoch_complete: bool
    key: str  # "position", "id" or "rank_position"
    # "position"/"id": the consumed positions / dataset indices; "rank_position": encode_rank_positions
    # codes of `lists` ranks' lists
    keys: np.ndarray
    lists: int = 0
    ids: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # rank_position
    fingerprints: Optional[List[Optional[str]]] = None  # rank_position: each list's, or None
    # reproducible epochs: round, first_step, next_step, world_size, in_round (keys of the replayed round's
    # steps so far), before_round (keys consumed in the rounds before it)
    replay: Optional[Dict[str, Any]] = None
    job: Any = None  # the "job" entry, for JobCounters.load_state_dict

    def rank_list(self, world_size: int) -> bool:
        """Whether the consumed set is keyed by positions in lists of `world_size` ranks."""
        return self.key == "rank_position" and self.lists == world_size


def parse_state(state: Any, *, dataset_len: int, custom_sampler: bool, seed: int, shuffle: bool) -> LoadedState:
    """`state` (OdbDataLoader.state_dict() of any version this odb reads) checked against the loader that
    loads it: ValueError naming what is wrong for anything corrupt, truncated, of another version, another
    dataset, order or kind of sampler. Every field must have the type state_dict() writes: int() or bool()
    of something else (a float, a string "false") would load a silently different state."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        found = state.get("format") if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"not an odb loader state (format {found!r}, expected {STATE_FORMAT!r})")
    version = state.get("version")
    if not is_int(version) or version not in range(1, STATE_VERSION + 1):
        raise ValueError(f"odb loader state version {version!r} is not supported by this odb "
                         f"(it reads versions 1 to {STATE_VERSION}); resume with the odb that wrote it")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise ValueError(f"odb loader state is truncated: missing {missing}")
    for name, minimum in (("epoch", 0), ("seed", None), ("dataset_len", 0), ("world_size", 1)):
        check_int(state[name], name, minimum)
    for name in ("epoch_complete", "shuffle", "custom_sampler"):
        if not isinstance(state[name], (bool, np.bool_)):
            raise ValueError(f"odb loader state: {name} must be true or false, got {state[name]!r}")
    for name in ("scope", "key"):
        if not isinstance(state[name], str):
            raise ValueError(f"odb loader state: {name} must be a string, got {state[name]!r}")
    n = dataset_len
    if int(state["dataset_len"]) != n:
        raise ValueError(f"odb loader state is for a dataset of {state['dataset_len']} samples, this one has {n}")
    if bool(state["custom_sampler"]) != custom_sampler:
        raise ValueError("odb loader state was taken with" + ("" if state["custom_sampler"] else "out") +
                         " a custom sampler; resume with the same kind of sampler")
    if not custom_sampler and (int(state["seed"]) != seed or bool(state["shuffle"]) != shuffle):
        raise ValueError(f"odb loader state has seed={state['seed']} shuffle={state['shuffle']}, this loader "
                         f"seed={seed} shuffle={shuffle}: the epoch's order would differ")
    if state["scope"] != "all_ranks":
        raise ValueError("odb loader state holds one rank's samples only (torch.distributed was not "
                         "initialized when it was taken): it cannot say what the other ranks consumed")
    key = state["key"]
    keys_for = ("id", "rank_position") if custom_sampler else ("position",)
    if key not in keys_for or (key == "rank_position" and int(version) < 4):
        raise ValueError(f"odb loader state key {key!r} (version {version}) does not go with a loader "
                         f"{'with' if custom_sampler else 'without'} a custom sampler (expected one "
                         f"of {keys_for}): resume with the loader the state was taken with")
    loaded = LoadedState(version=int(version), epoch=int(state["epoch"]), epoch_complete=bool(state["epoch_complete"]),
                         key=key, keys=np.zeros(0, dtype=np.int64), job=state.get("job"))
    if key == "rank_position":
        missing = [k for k in ("consumed_ids", "lists") if k not in state]
        if missing:
            raise ValueError(f"odb loader state is truncated: missing {missing}")
        loaded.lists, loaded.keys = rank_positions(state["consumed"], "consumed", state.get("lists"))
        loaded.ids = expand_ints(state["consumed_ids"], "consumed_ids", n, "dataset index")
        fingerprints = state["lists"]
        if (not isinstance(fingerprints, (list, tuple)) or len(fingerprints) != loaded.lists
                or not all(f is None or isinstance(f, str) for f in fingerprints)):
            raise ValueError(f"odb loader state: malformed lists (one fingerprint or null per rank list, "
                             f"{loaded.lists} of them): {fingerprints!r}")
        loaded.fingerprints = list(fingerprints)
    else:
        loaded.keys = expand_ints(state["consumed"], "consumed", n, "position" if key == "position" else "dataset index")
    if key == "position" and loaded.keys.size and int(loaded.keys.max()) >= n:
        raise ValueError(f"odb loader state names position {int(loaded.keys.max())} in an epoch of {n} samples")
    named = loaded.keys if key == "id" else loaded.ids  # dataset indices
    if named.size and int(named.max()) >= n:
        raise ValueError(f"odb loader state names dataset index {int(named.max())} in a dataset of {n} samples")
    if state.get("replay") is not None:
        loaded.replay = _parse_replay(state["replay"], loaded, n, state.get("lists"))
    return loaded


def _parse_replay(replay: Any, loaded: LoadedState, n: int, fingerprints: Any) -> Dict[str, Any]:
    """A state's "replay" entry (version 2 on), checked against its consumed set."""
    try:
        if not isinstance(replay, Mapping):
            raise TypeError(f"a mapping or null, got {type(replay).__name__}")
        parsed: Dict[str, Any] = {k: check_int(replay[k], f"replay.{k}", 0)
                                  for k in ("round", "first_step", "next_step", "world_size")}
        if loaded.key == "rank_position":
            round_lists, in_round = rank_positions(replay["round_consumed"], "replay.round_consumed", fingerprints)
            if round_lists != loaded.lists:
                raise ValueError(f"{round_lists} rank lists, the consumed set has {loaded.lists}")
        else:
            in_round = expand_ints(replay["round_consumed"], "replay.round_consumed", n)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"odb loader state: malformed replay entry ({e!r})") from None
    if min(parsed.values()) < 0 or parsed["next_step"] < parsed["first_step"] or parsed["world_size"] < 1:
        raise ValueError(f"odb loader state: replay entry out of range {parsed}")
    consumed_set = np.zeros(0, dtype=np.int64) if not loaded.keys.size else np.unique(loaded.keys)
    if in_round.size and not np.isin(in_round, consumed_set).all():
        raise ValueError("odb loader state: the replayed round's samples are not all in the consumed set")
    parsed["in_round"] = in_round
    parsed["before_round"] = np.setdiff1d(consumed_set, in_round)
    return parsed


def rank_positions(value: Any, name: str, fingerprints: Any = None) -> Tuple[int, np.ndarray]:
    """A "rank_position" state's per-rank packed positions: (the number of rank lists, their
    encode_rank_positions codes); ValueError naming `name` when malformed, or when a rank's positions
    go past its list's length (the fingerprint "<len>:<hex>" says it; checked again against the
    list the sampler draws)."""
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, Mapping) for v in value):
        raise ValueError(f"odb loader state: malformed {name} (a list of one {{cursor, extra}} per rank list, "
                         f"got {type(value).__name__})")
    limit = (1 << 62) // len(value)
    per_rank = []
    for r, v in enumerate(value):
        known = fingerprints[r] if isinstance(fingerprints, (list, tuple)) and len(fingerprints) == len(value) \
            else None
        length = known.partition(":")[0] if isinstance(known, str) else ""
        top = packed_top(v)  # checked before expanding: a hostile cursor must not become a huge array
        if top is not None and top > limit:
            raise ValueError(f"odb loader state: {name} names a position past any list ({limit} or more)")
        if top is not None and length.isdigit() and top > int(length):
            raise ValueError(f"odb loader state: {name}[{r}] names position {top - 1} of rank {r}'s list, "
                             f"which held {int(length)} indices when the state was taken (its lists "
                             f"fingerprint): a corrupt state")
        per_rank.append(expand_ints(v, f"{name}[{r}]", limit, f"rank {r}'s list position"))
    return len(per_rank), encode_rank_positions(per_rank)
