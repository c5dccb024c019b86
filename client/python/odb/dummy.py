"""Dummy batches for IDLE steps: a rank with no samples in an aligned step still runs a forward and
backward (weight 0), so that DDP's collectives match on every rank. One sample of the dataset, in the
layout the daemon's real steps have (padded, or packed with ``cu_seqlens``)."""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import numpy as np
import torch

from .encoding import _LENGTH_KEYS, _to_torch
from .step import Step


class DummyBatches:
    """The loader's dummy batch (built once, from `sample` or the dataset's first index sent) and the
    dummy steps made of it."""

    def __init__(self, dataset: Any, sample: Optional[Mapping[str, Any]]) -> None:
        self._dataset = dataset
        self._sample = sample
        self._padded: Optional[Dict[str, torch.Tensor]] = None

    def batch(self, packed: bool, indices: Optional[Sequence[int]] = None) -> Dict[str, torch.Tensor]:
        """A one-sample batch (same field names as real batches), in the packed layout when `packed`."""
        batch = self._padded_batch(indices)
        if not packed:
            return batch
        # One packed sequence: the padded one-row batch without its mask, and the
        # index tensors the daemon's packed steps carry (dtypes as collate writes them).
        n = int(batch["input_ids"].shape[1]) if batch["input_ids"].dim() >= 2 else 0
        out = {k: v for k, v in batch.items() if k != "attention_mask"}
        out["cu_seqlens"] = torch.tensor([0, n], dtype=torch.int32)
        out["position_ids"] = torch.arange(n, dtype=torch.int64).unsqueeze(0)
        return out

    def step(self, info: Mapping[str, Any], batch: Dict[str, torch.Tensor], window: Optional[int],
             delivery: Any, pin: Callable[[], bool]) -> Step:
        """The IDLE step of header `info` with `batch` (a dummy batch). `pin()`: whether batches are
        page-locked copies."""
        extra: Dict[str, Any] = {} if window is None else {"window": window}
        if delivery is not None and (list(info.get("enc_sample_ids", [])) or list(info.get("audio_sample_ids", []))):
            # Encoder work in a step with no LLM samples for this rank (per-phase
            # plans): other ranks' routes count on its outputs, so the enc.* and
            # audio.* tensors and the header's plan stay with the dummy LLM batch.
            batch = dict(batch)
            enc = {k: v for k, v in _to_torch(delivery).items() if k.startswith(("enc.", "audio."))}
            if pin():  # as for real steps: page-locked copies, the received memory goes back
                enc = {k: v.pin_memory() for k, v in enc.items()}
            else:
                extra["_delivery"] = delivery
            batch.update(enc)
        return Step.from_header(info, batch, loss_weight=0.0, idle=True, dummy=True,
                                sample_ids=[], lengths=[], real_tokens=0, padded_tokens=0, loss_tokens=0,
                                rejections=[], **extra)

    def _padded_batch(self, indices: Optional[Sequence[int]] = None) -> Dict[str, torch.Tensor]:
        if self._padded is None:
            sample = self._sample
            if sample is None:
                index = (indices[0] if indices else 0) if indices is not None else 0
                sample = self._dataset[index]
            batch: Dict[str, torch.Tensor] = {}
            for name, value in sample.items():
                if name in _LENGTH_KEYS and isinstance(value, (int, np.integer)):
                    continue
                t = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
                batch[name] = t.unsqueeze(0).clone()
            if "attention_mask" not in batch and batch["input_ids"].dim() >= 2:
                batch["attention_mask"] = torch.ones(batch["input_ids"].shape[:2], dtype=torch.int64)
            self._padded = batch
        return self._padded
