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

:func:`check_stack` raises for an unsupported pairing; the loader runs it
when an epoch's iteration starts, on what the code running ``for step in
loader:`` can reach (:func:`check_caller_stack`): the locals of that frame and
of the frames that called it, their modules' globals, and inside those the
submodules of models and the items/attributes of containers and trainer
objects.
"""
from __future__ import annotations

import sys
from itertools import islice
from types import FrameType, FunctionType, ModuleType
from typing import Any, Dict, Iterable, List, Optional, Set

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


# Bounds on the search, so that a huge object graph costs the check a bounded time: the objects
# looked at (submodules of a model included), the items of one container, the frames walked.
_MAX_OBJECTS = 50_000
_MAX_ITEMS = 256
_MAX_FRAMES = 256


def _is_torch_module(obj: Any) -> bool:
    return any(c.__name__ == "Module" and c.__module__ == "torch.nn.modules.module" for c in type(obj).__mro__)


def stack_components(objects: Iterable[Any], globals_: Iterable[Any] = ()) -> List[str]:
    """The stack kinds among `objects`, without duplicates. Looked at too: every
    submodule of a torch module (an FSDP-wrapped layer inside a plain model), and,
    two levels down, the items of lists, tuples, sets and dicts and the attributes
    of objects that are not torch's (a trainer object holding its model and its
    optimizers, a list of optimizers); one level down for `globals_` (a module's
    globals: its global trainer object's model, its global list of optimizers)."""
    found: List[str] = []
    seen: Dict[int, int] = {}  # id -> the most levels it was looked into with
    held: List[Any] = []  # what `seen` names stays alive, so that no id is reused during the walk
    budget = [_MAX_OBJECTS]

    def note(obj: Any) -> None:
        kind = _kind(obj)
        if kind is not None and kind not in found:
            found.append(kind)

    def visit(obj: Any, levels: int) -> None:
        if seen.get(id(obj), -1) >= levels or budget[0] <= 0:
            return
        seen[id(obj)] = levels
        held.append(obj)
        budget[0] -= 1
        try:
            look(obj, levels)
        except Exception:  # noqa: BLE001 - an object that fails when looked at: not a stack component
            pass

    def look(obj: Any, levels: int) -> None:
        if obj is None or isinstance(obj, (type, ModuleType, FunctionType, int, float, complex, str, bytes)):
            return
        if _is_torch_module(obj):
            for sub in obj.modules():  # itself first, then every submodule
                budget[0] -= 1
                if budget[0] <= 0:
                    return
                note(sub)
            return
        note(obj)
        if levels == 0 or _kind(obj) is not None:
            return
        if isinstance(obj, dict):  # (changed by another thread meanwhile: visit() ends it)
            values: List[Any] = list(islice(obj.values(), _MAX_ITEMS))
        elif isinstance(obj, (list, tuple, set, frozenset)):
            values = list(islice(obj, _MAX_ITEMS))
        else:
            attrs = getattr(obj, "__dict__", None)
            if not isinstance(attrs, dict) or type(obj).__module__.startswith("torch"):
                return
            values = list(islice(attrs.values(), _MAX_ITEMS))
        for value in values:
            visit(value, levels - 1)

    for obj in objects:
        visit(obj, 2)
    for obj in globals_:
        visit(obj, 1)
    return found


def check_stack(idle_policy: str, *objects: Any, globals_: Iterable[Any] = ()) -> List[str]:
    """Raises UnsupportedStackError when `idle_policy` cannot run with the
    stack that `objects` (models, optimizers, or objects holding them) and
    `globals_` (module globals) form; returns the stack kinds found."""
    kinds = stack_components(objects, globals_)
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
    """check_stack on what the code that runs the loop can reach: the local
    variables of the frame `depth` levels up (for the loader: the frame that
    runs ``for step in loader:``) and of every frame that called it, and the
    global variables of their modules (a script's model and optimizer at
    module level, its loop in a function; the loop inside a wrapper such as
    tqdm(loader)). odb's own frames and modules are left out."""
    try:
        frame: Optional[FrameType] = sys._getframe(depth)
    except ValueError:
        return []
    objects: List[Any] = []
    globals_: List[Any] = []
    modules: Set[int] = set()
    walked = 0
    while frame is not None and walked < _MAX_FRAMES:
        walked += 1
        module = frame.f_globals.get("__name__", "")
        if not (module == "odb" or module.startswith("odb.")):
            objects.extend(frame.f_locals.values())
            if id(frame.f_globals) not in modules:
                modules.add(id(frame.f_globals))
                globals_.extend(frame.f_globals.values())
        frame = frame.f_back
    return check_stack(idle_policy, *objects, globals_=globals_)
