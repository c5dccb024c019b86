"""The consumed set of a loader state (docs/resume.md): positions in the epoch's seeded order
("position", no custom sampler), or a custom sampler's positions in each rank's list ("rank_position",
state version 4, "Custom samplers"). Used by OdbDataLoader.state_dict; all ranks' sets are gathered when
torch.distributed is initialized."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from .epoch_order import SamplerPlan, consumed_positions, distinct
from .resume_state import LoadedState
from .state_codec import compress_ints, compress_mask, decode_rank_positions, take_positions

# (key, consumed, the replayed round's consumed, the extra state keys, whether a replay is exact)
Consumed = Tuple[str, Any, Any, Dict[str, Any], bool]


@dataclasses.dataclass
class Trained:
    """What this rank's loop handed out in the epoch (ConsumedLog.arrays), and the rank it ran on."""

    ids: np.ndarray
    owners: np.ndarray
    seqs: np.ndarray
    in_round: np.ndarray  # the sample belongs to the replayed round's steps so far
    rank: int
    world_size: int
    dataset_len: int
    epoch: int


def position_consumed(position: np.ndarray, trained: Trained, loaded: Optional[LoadedState], loaded_in_round: bool,
                      gathering: bool) -> Consumed:
    """Without a custom sampler: the trained samples as positions in the epoch's order (`position`: each
    dataset index's position), with what a loaded state counted before."""
    ids = trained.ids
    keys = position[ids] if ids.size else ids
    round_keys = keys[trained.in_round]
    if loaded_in_round:
        assert loaded is not None and loaded.replay is not None
        round_keys = np.concatenate([round_keys, loaded.replay.in_round])  # skipped at the resume
    if loaded is not None:
        keys = np.concatenate([keys, loaded.keys])
    if gathering:
        gathered: List[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, (keys, round_keys))
        keys = np.concatenate([np.asarray(g[0], dtype=np.int64) for g in gathered])
        round_keys = np.concatenate([np.asarray(g[1], dtype=np.int64) for g in gathered])
    mask = np.zeros(trained.dataset_len, dtype=bool)
    mask[keys] = True
    return "position", compress_mask(mask), compress_ints(round_keys), {}, True


def sampler_consumed(plan: Optional[SamplerPlan], trained: Trained, loaded: Optional[LoadedState],
                     loaded_in_round: bool, replaying: bool, gathering: bool) -> Consumed:
    """A custom sampler's consumed samples as positions in each rank's list.

    A step names each sample's seq (Step.seqs: the sample's index among the positions its owner rank
    sent), so a rank maps the trained samples of its own list to their positions exactly:
    plan.sent[seq]. Only when a step does not give a seq (a daemon older than the field) are the
    trained copies of an index mapped to its first free positions in list order (take_positions), and
    a replay is then exact only where no other copy of the index was free. With samples moving between
    ranks (global planner) a rank's samples may be trained by another rank: the first all_gather hands
    every rank all trained samples, their owners and seqs, the second each rank's positions.
    `loaded`: the state loaded for this epoch, if any."""
    t = trained
    world = t.world_size
    if plan is None:
        # Not iterated in this epoch since the state was loaded (or at all): nothing was trained
        # here, the state is the loaded one as it is (its lists may be of another world size).
        if loaded is None:
            empty = [compress_ints([])] * world
            return ("rank_position", empty, list(empty),
                    {"consumed_ids": compress_ints([]), "lists": [None] * world}, False)
        if loaded.key == "id":  # an older state's, still with its meaning
            return "id", compress_ints(loaded.keys), compress_ints([]), {}, False
        lists = loaded.lists
        per_rank = [compress_ints(decode_rank_positions(loaded.keys, lists, r)) for r in range(lists)]
        return ("rank_position", per_rank, [compress_ints([])] * lists,
                {"consumed_ids": compress_ints(loaded.ids), "lists": list(loaded.fingerprints or [None] * lists)},
                False)
    ids, owners, in_round, seqs = t.ids, t.owners, t.in_round, t.seqs
    if gathering:
        gathered: List[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, (ids, owners, in_round, seqs))
        ids = np.concatenate([np.asarray(g[0], dtype=np.int64) for g in gathered])
        owners = np.concatenate([np.asarray(g[1], dtype=np.int64) for g in gathered])
        in_round = np.concatenate([np.asarray(g[2], dtype=bool) for g in gathered])
        seqs = np.concatenate([np.asarray(g[3], dtype=np.int64) for g in gathered])
    if owners.size and (owners.min() < 0 or owners.max() >= world):
        raise RuntimeError(f"odb: a step named owner rank {int(owners.max())} in a world of {world}")
    n = t.dataset_len
    mine = owners == t.rank
    loaded_round = np.zeros(0, dtype=np.int64)
    if loaded_in_round:
        assert loaded is not None and loaded.replay is not None
        loaded_round = consumed_positions(loaded, plan.full, loaded.replay.in_round, plan.fingerprint,
                                          rank=t.rank, world_size=world, epoch=t.epoch)
    if not (seqs[mine] < 0).any():
        mine_state = _by_seq(plan, t, ids, mine, in_round, seqs, loaded_round)
        return _rank_position_state(mine_state, t, gathering)
    # Copies trained in the rounds before the replayed one come first in training order, so they
    # take an index's first free positions, the replayed round's copies the next ones.
    before = np.bincount(ids[mine & ~in_round], minlength=n)
    free_ids, free_positions = plan.free()
    try:
        positions = take_positions(free_ids, free_positions, before)
        round_positions = (take_positions(free_ids, free_positions, np.bincount(ids[mine & in_round], minlength=n),
                                          skip=before) if in_round.any() else np.zeros(0, dtype=np.int64))
    except ValueError as e:
        raise RuntimeError(f"odb: rank {t.rank}, epoch {t.epoch}: {e}: did the sampler's list change "
                           f"while the epoch ran?") from None
    taken = np.zeros(plan.full.size, dtype=bool)  # O(list), no sort
    for p in (plan.consumed_before, positions, round_positions):
        taken[p] = True
    consumed = np.flatnonzero(taken)
    round_positions = np.concatenate([round_positions, loaded_round])
    # A replay resends each rank's list less what the rounds before the replayed one took; which copy
    # of an index those took is a guess (the steps do not say), exact only when no other copy of the
    # index is free. Otherwise the resume must be the ordinary one, or the replayed round could differ.
    exact = True
    if replaying:
        index = np.flatnonzero(before)
        free = np.searchsorted(free_ids, index, side="right") - np.searchsorted(free_ids, index, side="left")
        exact = bool(np.all(free == before[index]))
    mine_state = (consumed, round_positions, distinct(plan.full[consumed], n), plan.fingerprint, exact)
    return _rank_position_state(mine_state, t, gathering)


def _by_seq(plan: SamplerPlan, t: Trained, ids: np.ndarray, mine: np.ndarray, in_round: np.ndarray,
            seqs: np.ndarray, loaded_round: np.ndarray) -> Tuple[Any, ...]:
    """This rank's entry when every trained sample of its list came with its seq: its position is
    plan.sent[seq], exactly (no per-index sort, no guess), so a replay is always exact."""
    own = seqs[mine]
    if own.size and int(own.max()) >= plan.sent.size:
        raise RuntimeError(f"odb: rank {t.rank}, epoch {t.epoch}: a step names seq {int(own.max())} of this "
                           f"rank's list, which sent {plan.sent.size} samples: did the daemon or the sampler "
                           f"change while the epoch ran?")
    positions = plan.sent[own]
    if own.size and not np.array_equal(plan.full[positions], ids[mine]):
        k = int(np.argmax(plan.full[positions] != ids[mine]))
        raise RuntimeError(f"odb: rank {t.rank}, epoch {t.epoch}: a step names sample {int(ids[mine][k])} at "
                           f"seq {int(own[k])}, where this rank's list holds {int(plan.full[positions[k]])}: did "
                           f"the sampler's list change while the epoch ran?")
    round_positions = plan.sent[seqs[mine & in_round]]
    taken = np.zeros(plan.full.size, dtype=bool)  # O(list), no sort
    taken[plan.consumed_before] = True
    taken[positions] = True
    consumed = np.flatnonzero(taken)
    if consumed.size != plan.consumed_before.size + positions.size:
        raise RuntimeError(f"odb: rank {t.rank}, epoch {t.epoch}: a position of this rank's list was trained "
                           f"twice (the steps name {positions.size} samples of it, "
                           f"{consumed.size - plan.consumed_before.size} distinct new positions)")
    round_positions = np.concatenate([round_positions, loaded_round])
    return consumed, round_positions, distinct(plan.full[consumed], t.dataset_len), plan.fingerprint, True


def _rank_position_state(mine_state: Tuple[Any, ...], t: Trained, gathering: bool) -> Consumed:
    """Every rank's (consumed, round positions, consumed ids, fingerprint, exact) as the state's
    "rank_position" entries (an all_gather when torch.distributed is initialized)."""
    if gathering:
        states: List[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(states, mine_state)
    else:  # one rank (or scope this_rank: refused at load, the other ranks' lists stay empty)
        empty = np.zeros(0, dtype=np.int64)
        states = [mine_state if r == t.rank else (empty, empty, empty, None, True) for r in range(t.world_size)]
    consumed_ids = np.zeros(t.dataset_len, dtype=bool)  # a mask over the dataset: O(n), no sort
    for s in states:
        consumed_ids[np.asarray(s[2], dtype=np.int64)] = True
    return ("rank_position", [compress_ints(s[0]) for s in states], [compress_ints(s[1]) for s in states],
            {"consumed_ids": compress_mask(consumed_ids), "lists": [s[3] for s in states]},
            all(bool(s[4]) for s in states))
