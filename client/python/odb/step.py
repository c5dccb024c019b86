"""Step: one aligned training step as the trainer iterates it (OdbDataLoader yields these)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional

import torch

from .loss import weighted_loss


_MISSING = object()


@dataclass
class Step:
    """One aligned training step of this rank.

    ``batch`` maps names to torch tensors (zero-copy views of the received
    frames: input_ids [B, Lmax], attention_mask, labels, ... or the packed
    layout with cu_seqlens / position_ids). For an IDLE step under the
    "zero_step" policy, ``batch`` is a small dummy batch and ``dummy`` is True:
    run forward/backward on it anyway; its weight is 0.
    """

    epoch: int
    step_index: int
    batch: Dict[str, torch.Tensor]
    loss_weight: float
    idle: bool
    dummy: bool
    sample_ids: List[int]
    lengths: List[int]
    real_tokens: int
    padded_tokens: int
    global_real_tokens: int
    # native Rejection objects: r.code, r.sample_id (None when unknown),
    # r.producer_id, r.message (r["code"] works too)
    rejections: List[Any] = field(default_factory=list)
    # Each sample's seq (sample_ids order): its position in the list of the rank
    # that sent it (owner rank), which tells copies of a repeated index apart;
    # None for a sample sent without one.
    seqs: List[Optional[int]] = field(default_factory=list)
    owner_ranks: List[int] = field(default_factory=list)  # the rank that received each sample
    _delivery: Any = None
    # The header's per-phase lists (odb.phases.PHASE_FIELDS), kept apart from
    # _delivery: a pinned or dummy step drops its delivery but not its plan.
    _phase_fields: Optional[Dict[str, List[int]]] = None
    # Accumulation windows (optimizer.tokens_per_step, docs/python.md): this
    # rank's loss tokens, the window (optimizer step) this micro-step belongs
    # to, its micro-step count (the same on every rank), all ranks' loss tokens
    # over it, whether this step closes it (run the optimizer after it) and
    # whether the epoch ended it short. Without windows every step closes its own.
    loss_tokens: int = 0
    window: int = 0
    window_steps: int = 1
    window_loss_tokens: int = 0
    closes_window: bool = True
    window_short: bool = False
    window_target: int = 0
    # The daemon's planning round that made this step (identical on every rank): its number, its
    # first step index and its step count (the step header's round / round_first_step / round_steps).
    round: int = 0
    round_first_step: int = 0
    round_steps: int = 0

    @classmethod
    def from_header(cls, info: Any, batch: Dict[str, torch.Tensor], **overrides: Any) -> "Step":
        """The step of a daemon header (StepInfo): every field of Step named like a header field is copied
        from it (the one place Python lists a step's fields is this dataclass), then ``overrides``."""
        values: Dict[str, Any] = {"dummy": False}
        for f in fields(cls):
            if f.name.startswith("_") or f.name in ("batch", "dummy") or f.name in overrides:
                continue
            value = info.get(f.name, _MISSING)
            if value is _MISSING:
                continue  # a header without the field (an older test double): the dataclass default
            values[f.name] = list(value) if isinstance(value, (list, tuple)) else value
        if "_phase_fields" not in overrides:
            from .phases import PHASE_FIELDS

            values["_phase_fields"] = {k: [int(x) for x in info.get(k, [])] for k in PHASE_FIELDS}
        values.update(overrides)
        return cls(batch=batch, **values)

    def weighted_loss(self, per_token_loss: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """:func:`odb.weighted_loss` with this step's weight and loss token count (its window's share of the
        loss with accumulation windows; per_token_loss must be 0 where labels are ignored)."""
        return weighted_loss(per_token_loss, self.loss_weight, self.loss_tokens or self.real_tokens, mask)

    def frame_address(self, name: str) -> int:
        """Address of the received bytes behind ``batch[name]`` (zero-copy check): the ZeroMQ frame, or with
        the step arena (a local daemon, docs/shm.md) the tensor's place in the shared-memory mapping
        (64-byte aligned). The step's arena block goes back to the daemon once this Step and every tensor
        of it are released."""
        if self._delivery is None:
            raise KeyError(f"step {self.step_index} has no received frames (dummy step)")
        return int(self._delivery.frame_address(name))

    @property
    def phase_plan(self) -> "Any":
        """This step's per-phase plan (:class:`odb.phases.PhasePlan`; empty unless
        the daemon runs with ``alignment.phase_plans``)."""
        from .phases import PhasePlan

        return PhasePlan.from_step(self)

    def __len__(self) -> int:
        return len(self.sample_ids)
