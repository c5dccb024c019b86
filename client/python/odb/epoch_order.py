"""Which samples a rank sends in an epoch: the seeded order of the whole dataset and this rank's share
of it (no sampler), or a custom sampler's list and its positions (:class:`SamplerPlan`), less what a
loaded state counts as trained (docs/resume.md). :class:`EpochOrder` is the loader's part that keeps
this: the epoch, the loaded resume state and the sampler plan of the epoch being iterated."""
from __future__ import annotations

from typing import Any, Dict, Generic, List, Optional, Tuple, TypeVar, overload

import numpy as np
import torch

from .budgets import Budgets
from .resume_state import LoadedState, Replay, parse_state
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
        done = loaded.replay.before_round  # keys consumed in rounds before the replayed one
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
            dropped = consumed_positions(loaded, full, loaded.replay.before_round, fingerprint, rank=rank,
                                         world_size=world_size, epoch=epoch)
    keep = np.ones(send, dtype=bool)
    keep[dropped[dropped < send]] = False
    return SamplerPlan(epoch, full, np.flatnonzero(keep), consumed, fingerprint)


class EpochOrder:
    """The loader's epoch order and sampler plan, a part with its own state: the epoch; the loaded
    state while its epoch resumes (what it counts as consumed, and for a reproducible epoch where it
    replays); this rank's custom-sampler list of the epoch being iterated (:class:`SamplerPlan`). Its
    state_dict() is what fixes the order (a state of another order is refused at load)."""

    def __init__(self, dataset: Any, sampler: Any, shuffle: bool, seed: int, rank: int, world_size: int,
                 budgets: Budgets) -> None:
        self.dataset, self.sampler, self.shuffle, self.seed = dataset, sampler, shuffle, seed
        self.rank, self.world_size, self.budgets = rank, world_size, budgets
        self.epoch = 0
        self.resume: Optional[LoadedState] = None  # a loaded state whose epoch resumes
        self.plan: Optional[SamplerPlan] = None  # custom sampler: the list of the epoch being iterated
        self._positions: Optional[Tuple[int, np.ndarray]] = None  # (epoch, dataset index -> position)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)

    def samples_per_epoch(self) -> int:
        """The samples of one epoch over all ranks: len(dataset), or with a sampler its length x world size."""
        if self.sampler is None:
            return len(self.dataset)
        try:
            n = len(self.sampler)
        except TypeError:
            n = sum(1 for _ in self.sampler)
        return int(n) * self.world_size

    def sample_limit(self, epoch: int) -> Optional[int]:
        """stop_at_samples: how many of the epoch's samples (its order's first) the job still trains."""
        return self.budgets.sample_limit(epoch, self.samples_per_epoch()) if self.budgets.stop_at_samples else None

    def global_order(self) -> np.ndarray:
        """Every index of the epoch in its (seeded) order, before the rank split."""
        return global_order(len(self.dataset), self.shuffle, self.seed, self.epoch)

    def positions(self, epoch: int) -> np.ndarray:
        """Each dataset index's position in the epoch's order (one O(n) pass per epoch, then reused)."""
        if self._positions is None or self._positions[0] != epoch:
            order = self.global_order()
            position = np.empty(order.size, dtype=np.int64)
            position[order] = np.arange(order.size, dtype=np.int64)
            self._positions = (epoch, position)
        return self._positions[1]

    def resuming(self, epoch: int) -> Optional[LoadedState]:
        """The loaded state when `epoch` is the one it resumes."""
        return self.resume if self.resume is not None and self.resume.epoch == epoch else None

    def replaying(self) -> Optional[Replay]:
        """The replay entry when a deterministic state is loaded for this epoch at the same world size:
        the epoch resumes at the round of its checkpoint, step for step."""
        loaded = self.resuming(self.epoch)
        if (loaded is None or loaded.replay is None or loaded.replay.world_size != self.world_size
                or (loaded.key == "rank_position" and loaded.lists != self.world_size)):
            return None
        return loaded.replay

    def draw(self) -> SamplerPlan:
        """This rank's custom-sampler list for the epoch (one draw of the sampler) and what of it is sent."""
        full = np.asarray([int(i) for i in self.sampler], dtype=np.int64)
        return sampler_plan(full, self.epoch, self.rank, self.world_size, self.sample_limit(self.epoch),
                            self.resuming(self.epoch), self.replaying() is not None)

    def indices(self) -> List[int]:
        """The sample indices this rank sends in the current epoch (OdbDataLoader.indices)."""
        if self.sampler is not None:
            plan = self.draw()
            return plan.full[plan.sent].tolist()
        return rank_indices(self.global_order(), self.rank, self.world_size, self.sample_limit(self.epoch),
                            self.resuming(self.epoch), self.replaying() is not None).tolist()

    def start_epoch(self) -> List[int]:
        """The current epoch's iteration begins: the indices it sends (a custom sampler is drawn once: what
        is sent, and what state_dict() maps positions in)."""
        self.plan = self.draw() if self.sampler is not None else None
        return self.plan.full[self.plan.sent].tolist() if self.plan is not None else self.indices()

    def plan_of(self, epoch: int) -> Optional[SamplerPlan]:
        """The sampler plan of `epoch` when it is the one iterated (None: not iterated since a load)."""
        return self.plan if self.plan is not None and self.plan.epoch == epoch else None

    def state_dict(self) -> Dict[str, Any]:
        """What fixes the epoch's order (a loader state's seed, shuffle, custom_sampler, dataset_len, world_size)."""
        return {"seed": int(self.seed), "shuffle": bool(self.shuffle), "custom_sampler": self.sampler is not None,
                "dataset_len": len(self.dataset), "world_size": int(self.world_size)}

    def read_state(self, state: Any) -> LoadedState:
        """A loader state checked against this order (parse_state); nothing applied yet."""
        return parse_state(state, self.state_dict())

    def load_state_dict(self, loaded: LoadedState) -> None:
        """Applies a loaded state: its epoch resumes, or the next one starts when it had ended."""
        self.set_epoch(loaded.epoch + 1 if loaded.epoch_complete else loaded.epoch)
        self.resume = None if loaded.epoch_complete else loaded
        self.plan = None


T = TypeVar("T")


class OrderAttribute(Generic[T]):
    """An attribute of OdbDataLoader that its EpochOrder part (``_order``) keeps: dataset, sampler,
    shuffle, seed, rank, world_size and epoch, read and set on the loader as attributes."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, loader: None, owner: type) -> "OrderAttribute[T]": ...

    @overload
    def __get__(self, loader: Any, owner: Optional[type] = None) -> T: ...

    def __get__(self, loader: Any, owner: Optional[type] = None) -> Any:
        return self if loader is None else getattr(loader._order, self.name)

    def __set__(self, loader: Any, value: T) -> None:
        setattr(loader._order, self.name, value)
