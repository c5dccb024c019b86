"""Which samples a rank sends in an epoch: the seeded order of the whole dataset and this rank's share
of it (no sampler), or a custom sampler's list and its positions (:class:`SamplerPlan`), less what a
loaded state counts as trained (docs/resume.md)."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from .resume_state import LoadedState
from .state_codec import decode_rank_positions


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
