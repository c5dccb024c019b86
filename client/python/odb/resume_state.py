"""The loader's resume state, one dataclass per version (docs/resume.md, "What is saved"): each
version's fields with their types (:func:`odb.state_codec.state_field`), read by one reader that checks
them all (:meth:`StateV1.read`); a later version adds fields with defaults, so an older state reads as
the current one (:meth:`StateV1.current`) with the meaning it had. :func:`parse_state` then checks the
state against the loader that loads it and returns what that loader applies (:class:`LoadedState`);
:func:`write_state` writes the current version. The versions (state_codec.STATE_VERSION):

* 1 (:class:`StateV1`): the consumed set and its key ("position" of the epoch's order; a custom
  sampler's "id": dataset indices, every position of a consumed index counts as consumed).
* 2 (:class:`StateV2`): + "replay" (reproducible epochs, alignment.deterministic: the round to resume at
  and the keys of its steps so far).
* 3 (:class:`StateV3`): + "job" (the job counters of schedules and budgets: odb.job_counters.JobState).
* 4 (:class:`StateV4`): a custom sampler's key "rank_position" (positions in each rank's list, so a
  repeated index counts once per position), with "consumed_ids" and each list's fingerprint ("lists").

Adding a version: a dataclass StateV<n+1>(StateV<n>) with the new fields (each with a default: what an
older state means), an entry in VERSIONS, STATE_VERSION bumped, and LoadedState/write_state for its use.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple, Type

import numpy as np

from .job_counters import JobState, read_job
from .state_codec import (STATE_FORMAT, STATE_VERSION, anything, encode_rank_positions, expand_ints, flag, integer,
                          is_int, packed_top, read_fields, state_field, text)


@dataclasses.dataclass(frozen=True)
class StateV1:
    """Version 1: the epoch, what fixes its order, and the consumed set ("consumed", keyed by "key")."""

    VERSION: ClassVar[int] = 1
    KEYS: ClassVar[Tuple[str, ...]] = ("position", "id")  # the keys this version's consumed set may have

    epoch: int = state_field(integer(0))
    epoch_complete: bool = state_field(flag)
    seed: int = state_field(integer())
    shuffle: bool = state_field(flag)
    custom_sampler: bool = state_field(flag)
    dataset_len: int = state_field(integer(0))
    world_size: int = state_field(integer(1))
    scope: str = state_field(text)  # "all_ranks" or "this_rank"
    consumed: Any = state_field(anything)  # compress_ints sets: read against the loader (parse_state)
    key: str = state_field(text)

    @classmethod
    def read(cls, state: Mapping[str, Any]) -> "StateV1":
        """`state` as this version: every field present and of the type state_dict() writes, the key
        one of this version's (ValueError naming the field otherwise)."""
        read = read_fields(cls, state)
        if read.key not in cls.KEYS:
            raise ValueError(f"odb loader state key {read.key!r} (version {cls.VERSION}) is not a key of "
                             f"version {cls.VERSION} (one of {cls.KEYS})")
        return read

    def current(self) -> "StateV4":
        """This state as the current version: the fields added since take their defaults."""
        return StateV4(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


@dataclasses.dataclass(frozen=True)
class ReplayEntry:
    """A state's "replay" entry as written (version 2 on)."""

    round: int = state_field(integer(0))  # the planning round to replay
    first_step: int = state_field(integer(0))  # its first step index
    next_step: int = state_field(integer(0))  # the first step not yet trained
    world_size: int = state_field(integer(0))
    round_consumed: Any = state_field(anything)  # keys of the round's steps so far (as "consumed")


def read_replay(value: Any, name: str) -> Optional[ReplayEntry]:
    """A "replay" entry (null: none) checked; ValueError naming the field otherwise."""
    if value is None:
        return None
    try:
        entry = read_fields(ReplayEntry, value, name + ".")
    except ValueError as e:
        raise ValueError(f"odb loader state: malformed replay entry ({e!r})") from None
    if entry.next_step < entry.first_step or entry.world_size < 1:
        raise ValueError(f"odb loader state: replay entry out of range (round {entry.round}, first_step "
                         f"{entry.first_step}, next_step {entry.next_step}, world_size {entry.world_size})")
    return entry


@dataclasses.dataclass(frozen=True)
class StateV2(StateV1):
    """Version 2: + "replay" (null, or where a reproducible epoch resumes step for step)."""

    VERSION: ClassVar[int] = 2
    replay: Optional[ReplayEntry] = state_field(read_replay, None)


@dataclasses.dataclass(frozen=True)
class StateV3(StateV2):
    """Version 3: + "job" (the job counters; absent: zeros)."""

    VERSION: ClassVar[int] = 3
    job: Optional[JobState] = state_field(read_job, None)


@dataclasses.dataclass(frozen=True)
class StateV4(StateV3):
    """Version 4: + a custom sampler's key "rank_position": "consumed" (and replay.round_consumed) per rank
    list, with "consumed_ids" (the dataset indices at the consumed positions) and "lists" (each list's
    fingerprint "<len>:<hex>", or null)."""

    VERSION: ClassVar[int] = 4
    KEYS: ClassVar[Tuple[str, ...]] = ("position", "id", "rank_position")
    consumed_ids: Any = state_field(anything, None)
    lists: Any = state_field(anything, None)

    @classmethod
    def read(cls, state: Mapping[str, Any]) -> "StateV4":
        read = super().read(state)
        missing = [k for k in ("consumed_ids", "lists") if read.key == "rank_position" and k not in state]
        if missing:
            raise ValueError(f"odb loader state is truncated: missing {missing}")
        return read  # type: ignore[return-value]


VERSIONS: Dict[int, Type[StateV1]] = {1: StateV1, 2: StateV2, 3: StateV3, 4: StateV4}
assert all(cls.VERSION == v for v, cls in VERSIONS.items()) and VERSIONS[STATE_VERSION] is StateV4


def read_state(state: Any) -> StateV1:
    """`state` read as the dataclass of its version (format and version checked first)."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        found = state.get("format") if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"not an odb loader state (format {found!r}, expected {STATE_FORMAT!r})")
    version: Any = state.get("version")
    if not is_int(version) or int(version) not in VERSIONS:
        raise ValueError(f"odb loader state version {version!r} is not supported by this odb "
                         f"(it reads versions 1 to {STATE_VERSION}); resume with the odb that wrote it")
    return VERSIONS[int(version)].read(state)


def write_state(*, replay: Optional[Mapping[str, Any]], job: Mapping[str, Any], **fields: Any) -> Dict[str, Any]:
    """The current version's state as the plain dict state_dict() returns: format and version, StateV4's
    fields (`fields`: every one named, none unknown; a custom sampler's consumed_ids and lists only with
    its key), then the replay entry (ReplayEntry's fields) and the job counters (JobState's)."""
    state = StateV4(**fields)
    out: Dict[str, Any] = {"format": STATE_FORMAT, "version": STATE_VERSION}
    out.update((f.name, getattr(state, f.name)) for f in dataclasses.fields(state)
               if f.name not in ("replay", "job") and (state.key == "rank_position" or f.name not in
                                                       ("consumed_ids", "lists")))
    out.update(replay=replay, job=job)
    return out


@dataclasses.dataclass
class Replay:
    """A loaded replay entry: where a reproducible epoch resumes, and its keys read."""

    round: int
    first_step: int
    next_step: int
    world_size: int
    in_round: np.ndarray  # keys of the replayed round's steps trained before the checkpoint
    before_round: np.ndarray  # keys consumed in the rounds before it


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
    replay: Optional[Replay] = None  # reproducible epochs
    job: Optional[JobState] = None  # for JobCounters.load_state_dict

    def rank_list(self, world_size: int) -> bool:
        """Whether the consumed set is keyed by positions in lists of `world_size` ranks."""
        return self.key == "rank_position" and self.lists == world_size


def parse_state(state: Any, order: Mapping[str, Any]) -> LoadedState:
    """`state` (OdbDataLoader.state_dict() of any version this odb reads) checked against the loader
    that loads it (`order`: its EpochOrder.state_dict()): ValueError naming what is wrong for anything
    corrupt, truncated, of another version, another dataset, order or kind of sampler. Every field must
    have the type state_dict() writes: int() or bool() of something else (a float, a string "false")
    would load a silently different state."""
    read = read_state(state)
    s, version, n = read.current(), read.VERSION, int(order["dataset_len"])
    custom_sampler = bool(order["custom_sampler"])
    if s.dataset_len != n:
        raise ValueError(f"odb loader state is for a dataset of {s.dataset_len} samples, this one has {n}")
    if s.custom_sampler != custom_sampler:
        raise ValueError("odb loader state was taken with" + ("" if s.custom_sampler else "out") +
                         " a custom sampler; resume with the same kind of sampler")
    if not custom_sampler and (s.seed != order["seed"] or s.shuffle != order["shuffle"]):
        raise ValueError(f"odb loader state has seed={s.seed} shuffle={s.shuffle}, this loader "
                         f"seed={order['seed']} shuffle={order['shuffle']}: the epoch's order would differ")
    if s.scope != "all_ranks":
        raise ValueError("odb loader state holds one rank's samples only (torch.distributed was not "
                         "initialized when it was taken): it cannot say what the other ranks consumed")
    keys_for = ("id", "rank_position") if custom_sampler else ("position",)
    if s.key not in keys_for:
        raise ValueError(f"odb loader state key {s.key!r} (version {version}) does not go with a loader "
                         f"{'with' if custom_sampler else 'without'} a custom sampler (expected one "
                         f"of {keys_for}): resume with the loader the state was taken with")
    loaded = LoadedState(version=version, epoch=s.epoch, epoch_complete=s.epoch_complete, key=s.key,
                         keys=np.zeros(0, dtype=np.int64), job=s.job)
    if s.key == "rank_position":
        loaded.lists, loaded.keys = rank_positions(s.consumed, "consumed", s.lists)
        loaded.ids = expand_ints(s.consumed_ids, "consumed_ids", n, "dataset index")
        if (not isinstance(s.lists, (list, tuple)) or len(s.lists) != loaded.lists
                or not all(f is None or isinstance(f, str) for f in s.lists)):
            raise ValueError(f"odb loader state: malformed lists (one fingerprint or null per rank list, "
                             f"{loaded.lists} of them): {s.lists!r}")
        loaded.fingerprints = list(s.lists)
    else:
        loaded.keys = expand_ints(s.consumed, "consumed", n, "position" if s.key == "position" else "dataset index")
    if s.key == "position" and loaded.keys.size and int(loaded.keys.max()) >= n:
        raise ValueError(f"odb loader state names position {int(loaded.keys.max())} in an epoch of {n} samples")
    named = loaded.keys if s.key == "id" else loaded.ids  # dataset indices
    if named.size and int(named.max()) >= n:
        raise ValueError(f"odb loader state names dataset index {int(named.max())} in a dataset of {n} samples")
    if s.replay is not None:
        loaded.replay = _replay(s.replay, loaded, n, s.lists)
    return loaded


def _replay(entry: ReplayEntry, loaded: LoadedState, n: int, fingerprints: Any) -> Replay:
    """A state's replay entry with its round's keys read against its consumed set."""
    try:
        if loaded.key == "rank_position":
            round_lists, in_round = rank_positions(entry.round_consumed, "replay.round_consumed", fingerprints)
            if round_lists != loaded.lists:
                raise ValueError(f"{round_lists} rank lists, the consumed set has {loaded.lists}")
        else:
            in_round = expand_ints(entry.round_consumed, "replay.round_consumed", n)
    except ValueError as e:
        raise ValueError(f"odb loader state: malformed replay entry ({e!r})") from None
    consumed_set = np.zeros(0, dtype=np.int64) if not loaded.keys.size else np.unique(loaded.keys)
    if in_round.size and not np.isin(in_round, consumed_set).all():
        raise ValueError("odb loader state: the replayed round's samples are not all in the consumed set")
    return Replay(entry.round, entry.first_step, entry.next_step, entry.world_size, in_round,
                  np.setdiff1d(consumed_set, in_round))


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
