"""What the loader has handed out in the current epoch, for its checkpoint (docs/resume.md): the sample
ids of every real step yielded, the rank whose list each came from, each one's seq (its index among the
positions its owner rank sent) and the step index, plus the last step of any kind (for a reproducible
epoch's replay point). A part of OdbDataLoader with its own state: its state_dict() is the loader state's
consumed part, the samples as keys of the epoch's order (odb.consumed_state), all ranks' when
torch.distributed is initialized."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from .consumed_state import Trained, position_consumed, sampler_consumed

if TYPE_CHECKING:
    from .epoch_order import EpochOrder


def step_seqs(info: Mapping[str, Any], n: int) -> np.ndarray:
    """A step's per-sample seqs (Step.seqs) as int64, -1 for a sample whose seq the step does not give."""
    seqs = info.get("seqs")
    if seqs is None or len(seqs) != n:
        return np.full(n, -1, dtype=np.int64)
    try:
        return np.asarray(seqs, dtype=np.int64)
    except (TypeError, OverflowError):  # None among them (a sample without seq), or past int64
        return np.asarray([-1 if q is None or q >= 1 << 63 else q for q in seqs], dtype=np.int64)


class ConsumedLog:
    """The current epoch's yielded samples, one array per step (appending is O(step))."""

    def __init__(self) -> None:
        self.reset(None)

    def reset(self, epoch: Optional[int]) -> None:
        """Starts the log of `epoch` (None: nothing iterated since a state was loaded)."""
        self.epoch = epoch
        self.ids: List[np.ndarray] = []
        self.owners: List[np.ndarray] = []
        # each sample's seq, -1 where the step did not say (a daemon older than Step.seqs, or a sample
        # sent without seq)
        self.seqs: List[np.ndarray] = []
        self.steps: List[int] = []  # the step index of each ids entry
        # The last step yielded (any kind): (step_index, round, round_first_step, round_steps,
        # deterministic), for a deterministic checkpoint.
        self.last_step: Optional[Tuple[int, int, int, int, bool]] = None

    def add(self, ids: Any, owners: Any = None, seqs: Any = None, step: Optional[int] = None) -> None:
        """One step's samples: `owners` default to rank 0 (a one-rank job), `seqs` to unknown (-1)."""
        ids = np.asarray(ids, dtype=np.int64)
        owners = np.zeros(ids.size, dtype=np.int64) if owners is None else np.asarray(owners, dtype=np.int64)
        seqs = np.full(ids.size, -1, dtype=np.int64) if seqs is None else np.asarray(seqs, dtype=np.int64)
        self.ids.append(ids)
        self.owners.append(owners)
        self.seqs.append(seqs)
        self.steps.append(len(self.steps) if step is None else int(step))

    def add_step(self, info: Mapping[str, Any], rank: int) -> None:
        """A real step yielded on `rank` (its header as the native client gives it)."""
        ids = np.asarray(info["sample_ids"], dtype=np.int64)
        owners = np.asarray(info["owner_ranks"], dtype=np.int64)
        self.add(ids, owners if owners.size == ids.size else np.full(ids.size, rank), step_seqs(info, ids.size),
                 int(info["step_index"]))

    def remember(self, info: Mapping[str, Any]) -> None:
        """The last step yielded, of any kind."""
        self.last_step = (int(info["step_index"]), int(info["round"]), int(info["round_first_step"]),
                          int(info["round_steps"]), bool(info["deterministic"]))

    def replay_point(self, epoch: int) -> Tuple[Optional[Dict[str, int]], Optional[int]]:
        """A reproducible epoch replays from the round of the last step: (its replay entry {round,
        first_step, next_step}, and the round's first step when the checkpoint is inside the round; the
        keys of that round's steps so far are kept apart: they are trained, and the resumed daemons plan
        them again into the same steps, skipped). (None, None) when the last step is not reproducible."""
        last = self.last_step if self.epoch == epoch else None
        if last is None or not last[4]:
            return None, None
        step, rnd, first_step, count, _ = last
        if step + 1 >= first_step + count:  # the round is complete: resume at the next one
            return {"round": rnd + 1, "first_step": step + 1, "next_step": step + 1}, None
        return {"round": rnd, "first_step": first_step, "next_step": step + 1}, first_step

    def arrays(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, owners, seqs, step index of each sample), concatenated over the steps."""
        def cat(parts: List[np.ndarray]) -> np.ndarray:
            return np.concatenate([np.asarray(c, dtype=np.int64) for c in parts]) if parts else np.zeros(0, np.int64)

        ids = cat(self.ids)
        steps = np.repeat(np.asarray(self.steps, dtype=np.int64), [len(c) for c in self.ids]).astype(np.int64)
        owners, seqs = cat(self.owners), cat(self.seqs)
        if seqs.size != ids.size:  # steps recorded without seqs: every seq unknown
            seqs = np.full(ids.size, -1, dtype=np.int64)
        return ids, owners, seqs, steps

    def load_state_dict(self, loaded: Any) -> None:
        """A state was loaded: the log starts empty (what the state counts as consumed stays with the
        order part, EpochOrder.resume, and state_dict() adds it)."""
        self.reset(None)

    def state_dict(self, order: "EpochOrder", epoch: int, complete: bool) -> Dict[str, Any]:
        """The loader state's consumed part (scope, consumed, key, a custom sampler's consumed_ids and
        lists, replay): the samples of every step handed out in `epoch` (every rank's, gathered, when
        torch.distributed is initialized), with what a state loaded into `order` counted before, as keys
        of `order`'s epoch. `complete`: the epoch's summary came (no replay entry then)."""
        ids, owners, seqs, steps = self.arrays()
        replay, first = self.replay_point(epoch)
        loaded = order.resuming(epoch)
        resumed = order.replaying() if epoch == order.epoch else None
        # The loaded state's round goes on only when this run replayed it (same world size): a resume at
        # another world size numbers its rounds from 0 again, and its round R is not the state's.
        loaded_in_round = (first is not None and replay is not None and resumed is not None
                           and resumed.round == replay["round"])
        in_round = steps >= first if first is not None else np.zeros(ids.size, dtype=bool)
        world = order.world_size
        gathering = world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
        trained = Trained(ids, owners, seqs, in_round, order.rank, world, len(order.dataset), epoch)
        if order.sampler is None:
            if epoch != order.epoch:
                raise RuntimeError("odb: state_dict() after set_epoch() moved to another epoch; take it "
                                   "before set_epoch()")
            key, consumed, round_consumed, extra, _ = position_consumed(order.positions(epoch), trained, loaded,
                                                                        loaded_in_round, gathering)
        else:
            key, consumed, round_consumed, extra, exact_replay = sampler_consumed(
                order.plan_of(epoch), trained, loaded, loaded_in_round, replay is not None, gathering)
            if not exact_replay:
                replay = None  # the resume is the ordinary exactly-once one (docs/resume.md)
        return {"scope": "all_ranks" if gathering or world == 1 else "this_rank", "consumed": consumed, "key": key,
                **extra, "replay": (None if replay is None or complete else
                                    dict(replay, world_size=int(world), round_consumed=round_consumed))}
