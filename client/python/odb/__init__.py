"""odb: PyTorch client of the odbd collation daemon.

    import odb
    loader = odb.OdbDataLoader(dataset, num_workers=2, idle_policy="zero_step")
    for step in loader:
        out = model(step.batch["input_ids"], step.batch["attention_mask"])
        loss = odb.weighted_cross_entropy(out, step.batch["labels"], step.loss_weight, step.real_tokens)
        loss.backward()

See docs/python.md.
"""
from __future__ import annotations

from ._native import native as _native
from .daemon import DaemonProcess, Endpoints, check_reachable, endpoints, spawn_daemon
from .loader import IDLE_POLICIES, OdbDataLoader, OdbWorkerError, Step, encode_sample
from .loss import weighted_cross_entropy, weighted_loss
from . import phases

_lib = _native()
OdbError = _lib.OdbError
OdbTimeout = _lib.OdbTimeout
Producer = _lib.Producer
Consumer = _lib.Consumer

__all__ = [
    "Consumer", "DaemonProcess", "Endpoints", "IDLE_POLICIES", "OdbDataLoader", "OdbError", "OdbTimeout",
    "OdbWorkerError", "Producer", "Step", "check_reachable", "encode_sample", "endpoints", "spawn_daemon",
    "weighted_cross_entropy", "weighted_loss",
]
