"""Which samples a rank sends in an epoch: the seeded order of the whole dataset and this rank's share
of it (no sampler), or a custom sampler's list and its positions (:class:`SamplerPlan`), less what a
loaded state counts as trained (docs/resume.md)."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from .resume_state import LoadedState
from .state_codec import decode_rank_positions, list_fingerprint


def global_order(n: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """Every index of the epoch in its (seeded) order, before the rank split."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        return torch.randperm(n, generator=g).numpy().astype(np.int64)
    return np.arange(n, dtype=np.int64)


def rank_share(limit: int, rank: int, world_size: int) -> int:
    """With a sample budget, a rank's share of the epoch's first `limit` samples (every rank's sampler is
    taken to give as many: DistributedSampler does)."""
    return limit // world_size + (1 if rank < limit % world_size else 0)


def distinct(ids: np.ndarray, n: int) -> np.ndarray:
    """The distinct values of `ids` (each in [0, n)), sorted, through a mask (O(n + len(ids)), no sort)."""
    mask = np.zeros(n, dtype=bool)
    mask[ids] = True
    return np.flatnonzero(mask)


class SamplerPlan:
    """A custom sampler's list on this rank for one epoch: `full` (every index the sampler gave, in
    order: a position indexes it), `sent` (the positions sent, in order: their seqs are 0, 1, ...),
    `consumed_before` (the positions a loaded state counts as trained) and the list's fingerprint."""

    def __init__(self, epoch: int, full: np.ndarray, sent: np.ndarray, consumed_before: np.ndarray,
                 fingerprint: str) -> None:
        self.epoch = epoch
        self.full = full
        self.sent = sent
        self.consumed_before = consumed_before
        self.fingerprint = fingerprint
        self._free: Optional[Tuple[np.ndarray, np.ndarray]] = None

    def free(self) -> Tuple[np.ndarray, np.ndarray]:
        """(indices, positions) of the positions sent and not consumed before, sorted by (index,
        position): built once per epoch (O(list) and a sort), then every checkpoint of the epoch
        looks its trained samples up in it."""
        if self._free is None:
            mask = np.zeros(self.full.size, dtype=bool)
            mask[self.sent] = True
            mask[self.consumed_before] = False
            positions = np.flatnonzero(mask)
            ids = self.full[positions]
            order = np.argsort(ids, kind="stable")
            self._free = (ids[order], positions[order])
        return self._free


def consumed_positions(loaded: LoadedState, full: np.ndarray, keys: np.ndarray, fingerprint: str, *, rank: int,
                       world_size: int, epoch: int) -> np.ndarray:
    """The positions of this rank's list `full` that loaded keys name: its own (rank, position) pairs
    when the state's lists are of this world size; otherwise (another world size, or a state of
    odb < 4 keyed by dataset index) every position of an index the state names as consumed."""
    if loaded.rank_list(world_size):
        known = (loaded.fingerprints or [None] * world_size)[rank]
        if known is not None and known != fingerprint:
            raise ValueError(
                f"odb: the loaded state's positions are of another list: rank {rank}'s sampler gives "
                f"epoch {epoch} a different list ({full.size} indices, fingerprint {fingerprint}) than "
                f"when the checkpoint was taken ({known}), so its positions would name other samples. Resume "
                f"with the same sampler, seeded the same way (a torch.Generator with a fixed seed, or "
                f"set_epoch), at the same world size")
        positions = decode_rank_positions(keys, loaded.lists, rank)
        if positions.size and int(positions[-1]) >= full.size:
            raise ValueError(f"odb loader state names position {int(positions[-1])} of rank {rank}'s "
                             f"list, which holds {full.size} indices: resume with the sampler it was taken with")
        return positions
    ids = keys if loaded.key == "id" else loaded.ids
    return np.flatnonzero(np.isin(full, ids))


def rank_indices(order: np.ndarray, rank: int, world_size: int, limit: Optional[int], loaded: Optional[LoadedState],
                 replaying: bool) -> np.ndarray:
    """The indices a rank sends from the epoch's `order` (no custom sampler): its share of the order's
    first `limit` (stop_at_samples), less what a loaded state counts as consumed (split over the current
    ranks); a reproducible resume at the same world size (`replaying`) keeps each rank's list of the
    uninterrupted run, less what the rounds before the checkpoint's round took."""
    if replaying:
        assert loaded is not None and loaded.replay is not None
        done = loaded.replay["before_round"]  # keys consumed in rounds before the replayed one
        positions = np.arange(order.size, dtype=np.int64)[rank::world_size]
        if limit is not None:
            positions = positions[positions < limit]
        gone = np.zeros(order.size, dtype=bool)
        gone[done[done < order.size]] = True
        return order[positions[~gone[positions]]]
    if limit is not None:
        order = order[:limit]
    if loaded is not None:
        keep = np.ones(order.size, dtype=bool)
        keep[loaded.keys[loaded.keys < order.size]] = False
        order = order[keep]
    return order[rank::world_size]


def sampler_plan(full: np.ndarray, epoch: int, rank: int, world_size: int, limit: Optional[int],
                 loaded: Optional[LoadedState], replaying: bool) -> SamplerPlan:
    """A rank's custom-sampler list `full` for the epoch (one draw of the sampler) and the positions of it
    that are sent: all of them, less those a loaded state counts as trained (a reproducible resume at the
    same world size: less those of the rounds before the replayed one), within the rank's share of a
    sample budget `limit`."""
    send = full.size if limit is None else min(full.size, rank_share(limit, rank, world_size))
    fingerprint = list_fingerprint(full)
    consumed = np.zeros(0, dtype=np.int64)
    dropped = consumed
    if loaded is not None:
        consumed = consumed_positions(loaded, full, loaded.keys, fingerprint, rank=rank, world_size=world_size,
                                      epoch=epoch)
        dropped = consumed
        if replaying:
            assert loaded.replay is not None
            dropped = consumed_positions(loaded, full, loaded.replay["before_round"], fingerprint, rank=rank,
                                         world_size=world_size, epoch=epoch)
    keep = np.ones(send, dtype=bool)
    keep[dropped[dropped < send]] = False
    return SamplerPlan(epoch, full, np.flatnonzero(keep), consumed, fingerprint)
