"""odb: PyTorch client of the odbd collation daemon.

    import odb
    loader = odb.OdbDataLoader(dataset, num_workers=2, idle_policy="zero_step")
    for step in loader:
        out = model(step.batch["input_ids"], step.batch["attention_mask"])
        loss = odb.weighted_cross_entropy(out, step.batch["labels"], step.loss_weight, step.real_tokens)
        loss.backward()

`import odb`, `odb.Producer`, `odb.Consumer`, the errors and the daemon helpers
(`spawn_daemon`, `endpoints`, `find_odbd`) need neither torch nor numpy. The
PyTorch parts (`OdbDataLoader`, `Step`, the loss helpers, `odb.phases`) are
imported on first use and raise ImportError naming torch when it is missing.
See docs/python.md.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, List

# The one place the version is written: pyproject.toml reads it (tool.setuptools.dynamic) for the metadata.
__version__ = "0.1.0"

from . import _native  # the submodule, so that `odb._native.native()` works (never shadowed)
from ._native import find_odbd
from .daemon import DaemonProcess, Endpoints, check_reachable, endpoints, spawn_daemon

if TYPE_CHECKING:  # typed by the extension's stubs, odb/_odb_native.pyi
    from ._odb_native import Consumer, Delivery, OdbError, OdbTimeout, Producer, Rejection, StepInfo
else:
    _lib = _native.native()
    OdbError, OdbTimeout = _lib.OdbError, _lib.OdbTimeout
    Producer, Consumer = _lib.Producer, _lib.Consumer
    Delivery, StepInfo, Rejection = _lib.Delivery, _lib.StepInfo, _lib.Rejection

# Attribute -> submodule, imported on first access (they import torch).
_LAZY: Dict[str, str] = {
    "IDLE_POLICIES": "loader", "OdbDataLoader": "loader", "OdbWorkerError": "loader", "Step": "loader",
    "encode_sample": "loader", "weighted_cross_entropy": "loss", "weighted_loss": "loss",
    "report": "epoch_report", "window_loss": "loss", "window_sync": "loss",
    "lr_by_tokens": "schedule",
}
_LAZY_MODULES = ("loader", "loss", "phases", "top", "cli", "schedule")


def __getattr__(name: str) -> Any:
    if name not in _LAZY and name not in _LAZY_MODULES:
        raise AttributeError(f"module 'odb' has no attribute {name!r}")
    module_name = _LAZY.get(name, name)
    try:
        module = importlib.import_module(f".{module_name}", __name__)
    except ImportError as e:
        if e.name not in ("torch", "numpy") and not (e.name or "").startswith(("torch.", "numpy.")):
            raise
        raise ImportError(
            f"odb.{name} needs PyTorch (and numpy), which this interpreter cannot import ({e}): "
            f"{_native.install_hint('torch numpy', 'python3-torch')}. odb.Producer, odb.Consumer and "
            f"the daemon helpers work without it.", name=e.name) from e
    value = getattr(module, name) if name in _LAZY else module
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_MODULES))


__all__ = [
    "Consumer", "DaemonProcess", "Delivery", "Endpoints", "IDLE_POLICIES", "OdbDataLoader", "OdbError", "OdbTimeout",
    "OdbWorkerError", "Producer", "Rejection", "Step", "StepInfo", "check_reachable", "encode_sample", "endpoints",
    "find_odbd", "spawn_daemon", "weighted_cross_entropy", "weighted_loss", "window_loss", "window_sync",
    "lr_by_tokens",
]
