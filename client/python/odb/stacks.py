"""Which distributed training stacks each IDLE policy supports (docs/python.md, "Stacks").

An IDLE step is a step where this rank has no sample while others do. Both
policies keep every rank running the same collectives:

* ``zero_step``: the IDLE step comes as a dummy batch with loss weight 0; the
  rank runs forward, backward and the optimizer step like any other. Works
  with every stack whose collectives are issued by forward/backward/step: DDP,
  ``ZeroRedundancyOptimizer`` and FSDP.
* ``join``: once this rank's own samples are all trained, its loop ends and
  the rest of the epoch is *joined*: ``torch.distributed.algorithms.Join``
  shadows the collectives of the ranks still training. DDP supports it
  (``with ddp.join():``). FSDP does not (it has no ``join()``: the others
  would wait in its all-gather). ``ZeroRedundancyOptimizer`` is a Joinable,
  but not an exact one: its join hook steps the joined rank's shard of the
  parameters with the gradients that rank computed last (DDP's join hook
  all-reduces zeros for the others and discards the result), so the shard a
  joined rank owns drifts from the unsharded run
  (tests/python/test_py_zero.py measures it). Both are refused with ``join``;
  ``zero_step`` is exact with them, and with a planner that moves samples
  (the global planner) ``join`` drops nothing anyway.

:func:`check_stack` raises for an unsupported pairing; the loader runs it on
the caller's frame when an epoch's iteration starts (``for step in
loader:`` is written where the model and the optimizer are in scope).
"""
from __future__ import annotations

import sys
from types import FrameType
from typing import Any, Iterable, List, Optional

# Class names (anywhere in an object's MRO), so that nothing here imports
# torch.distributed's optional parts.
_FSDP = "FullyShardedDataParallel"
_DDP = "DistributedDataParallel"
_ZERO = "ZeroRedundancyOptimizer"
_KINDS = (_FSDP, _DDP, _ZERO)


class UnsupportedStackError(ValueError):
    """An IDLE policy paired with a training stack that cannot run it."""


def _kind(obj: Any) -> Optional[str]:
    try:
        names = {c.__name__ for c in type(obj).__mro__}
    except Exception:  # noqa: BLE001 - exotic objects: not a stack component
        return None
    for kind in _KINDS:
        if kind in names:
            return kind
    return None


def stack_components(objects: Iterable[Any]) -> List[str]:
    """The stack kinds among `objects` and, one level down, their attributes
    (a trainer object holding its model and optimizer), without duplicates."""
    found: List[str] = []

    def note(obj: Any) -> bool:
        kind = _kind(obj)
        if kind is not None and kind not in found:
            found.append(kind)
        return kind is not None

    for obj in objects:
        if note(obj) or isinstance(obj, (type, int, float, str, bytes)):
            continue
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict) and not type(obj).__module__.startswith("torch"):
            for value in list(attrs.values())[:256]:
                note(value)
    return found


def check_stack(idle_policy: str, *objects: Any) -> List[str]:
    """Raises UnsupportedStackError when `idle_policy` cannot run with the
    stack that `objects` (models, optimizers, or objects holding them) form;
    returns the stack kinds found."""
    kinds = stack_components(objects)
    if idle_policy == "join" and _ZERO in kinds:
        raise UnsupportedStackError(
            "idle_policy='join' is not exact with ZeroRedundancyOptimizer: once a rank has joined, ZeRO's join "
            "hook updates the parameter shard that rank owns with the gradients it computed last (DDP's join "
            "hook does not hand it the other ranks' gradients), so its shard drifts from the unsharded run. "
            "Use idle_policy='zero_step' with ZeRO (IDLE steps come as dummy batches with loss weight 0 and every "
            "rank steps the optimizer); see docs/python.md, \"Stacks\"")
    if idle_policy == "join" and _FSDP in kinds:
        raise UnsupportedStackError(
            "idle_policy='join' needs every module that issues collectives to be joinable "
            "(torch.distributed.algorithms.Join), and FullyShardedDataParallel is not (it has no join()): "
            "a rank that left the epoch early would leave the others waiting in FSDP's all-gather. "
            "Use idle_policy='zero_step' with FSDP (IDLE steps come as dummy batches with loss weight 0, "
            "so every rank runs the same forward/backward collectives); see docs/python.md, \"Stacks\"")
    return kinds


def check_caller_stack(idle_policy: str, depth: int = 2) -> List[str]:
    """check_stack on the local variables of the frame `depth` levels up (for
    the loader: the frame that runs ``for step in loader:``)."""
    try:
        frame: Optional[FrameType] = sys._getframe(depth)
    except ValueError:
        return []
    if frame is None:
        return []
    return check_stack(idle_policy, *list(frame.f_locals.values()))
