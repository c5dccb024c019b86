"""What the loader hands the trainer on IDLE steps and on steps without their frames
(issue 23, item 3): the per-phase plan comes from the step header, not from the
received frames (a pinned batch and a dummy step drop them); an IDLE step that
carries encoder work keeps its enc.* tensors; in packed mode the dummy batch is one
packed sequence (cu_seqlens, position_ids), so a packed model runs on it.

Unit level, no daemon: the header is a dict and the received step a stand-in with
the native Delivery's two methods the loader reads (arrays, wire_dtype). The same
paths through real daemons: test_py_phases.py (skewed ranks, both IDLE policies)
and test_py_packed_idle.py."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np
import pytest
import torch

import odb
from odb.loader import Step
from odb.phases import PhasePlan

HEADER: Dict[str, Any] = {
    "epoch": 0, "step_index": 4, "idle": False, "loss_weight": 1.0, "sample_ids": [10, 11],
    "lengths": [3, 2], "real_tokens": 5, "padded_tokens": 6, "global_real_tokens": 9, "rejections": [],
    "llm_src_rank": [1, 0], "enc_sample_ids": [11, 20], "enc_owner_ranks": [0, 1], "enc_dest_rank": [0, 1],
    "enc_dest_index": [1, 0], "audio_sample_ids": [10], "audio_owner_ranks": [0], "audio_dest_rank": [0],
    "audio_dest_index": [0], "llm_audio_src_rank": [0, 1],
}


class _Received:
    """Stands in for a native Delivery: its header and its tensors."""

    def __init__(self, header: Dict[str, Any], arrays: Dict[str, np.ndarray]) -> None:
        self.step = header
        self._arrays = arrays

    def arrays(self) -> Dict[str, np.ndarray]:
        return self._arrays

    def wire_dtype(self, name: str) -> int:
        return -1  # never bfloat16


class _Texts(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Dict[str, Any]:
        return {"input_ids": torch.arange(5 + i), "labels": torch.arange(5 + i), "weight": 1.0}


def _loader(tmp_path, **kwargs: Any) -> odb.OdbDataLoader:
    return odb.OdbDataLoader(_Texts(), rank=0, world_size=1, run_dir=str(tmp_path), **kwargs)


def test_a_step_without_its_frames_keeps_its_phase_plan() -> None:
    # pin_memory copies the batch and lets the received frames go (_delivery None):
    # the plan must still be the header's, or the peers' routes break.
    step = Step.from_header(HEADER, {"input_ids": torch.zeros(2, 3, dtype=torch.int64)})
    assert step._delivery is None
    plan = step.phase_plan
    assert plan == PhasePlan.from_header(HEADER)
    assert plan.enabled and plan.has_audio
    assert plan.enc_dest_rank == [0, 1] and plan.llm_audio_src_rank == [0, 1]


def test_an_idle_step_with_encoder_work_keeps_its_encoder_tensors(tmp_path) -> None:
    header = dict(HEADER, idle=True, sample_ids=[], lengths=[], llm_src_rank=[], llm_audio_src_rank=[],
                  real_tokens=0, padded_tokens=0, loss_weight=0.0)
    pixels = np.arange(2 * 3, dtype=np.float32).reshape(2, 3)
    offsets = np.array([0, 1, 2], dtype=np.int64)
    received = _Received(header, {"enc.pixel_values": pixels, "enc.pixel_values_offsets": offsets})
    loader = _loader(tmp_path)
    step = loader._dummy_step(header, [0], None, received)
    assert step.dummy and step.idle and step.loss_weight == 0.0 and step.sample_ids == []
    assert torch.equal(step.batch["enc.pixel_values"], torch.from_numpy(pixels))
    assert torch.equal(step.batch["enc.pixel_values_offsets"], torch.from_numpy(offsets))
    assert step.batch["input_ids"].shape == (1, 5)  # the dummy LLM batch is still there
    plan = step.phase_plan
    assert plan.enc_sample_ids == [11, 20] and plan.enc_dest_rank == [0, 1] and plan.enc_dest_index == [1, 0]
    assert plan.audio_sample_ids == [10]
    # The cached dummy batch is not changed by one step's encoder tensors.
    assert not any(k.startswith("enc.") for k in loader.dummy_batch())


def test_an_idle_step_without_encoder_work_is_the_plain_dummy(tmp_path) -> None:
    header = dict(HEADER, idle=True, sample_ids=[], lengths=[], llm_src_rank=[], enc_sample_ids=[],
                  enc_owner_ranks=[], enc_dest_rank=[], enc_dest_index=[], audio_sample_ids=[],
                  audio_owner_ranks=[], audio_dest_rank=[], audio_dest_index=[], llm_audio_src_rank=[])
    loader = _loader(tmp_path)
    step = loader._dummy_step(header, [0], None, _Received(header, {}))
    assert step.batch is loader.dummy_batch() and step._delivery is None
    assert not step.phase_plan.enabled


def _check_packed(batch: Dict[str, torch.Tensor]) -> None:
    """What a packed model reads: one row, cu_seqlens over it, positions restarting per sequence."""
    ids, cu, pos = batch["input_ids"], batch["cu_seqlens"], batch["position_ids"]
    assert "attention_mask" not in batch
    assert ids.dim() == 2 and ids.shape[0] == 1 and cu.dtype == torch.int32 and pos.dtype == torch.int64
    assert cu[0] == 0 and int(cu[-1]) == ids.shape[1] and pos.shape == ids.shape
    want = torch.cat([torch.arange(int(b - a)) for a, b in zip(cu[:-1], cu[1:])])
    assert torch.equal(pos[0], want)
    assert batch["labels"].shape == ids.shape


def test_packed_dummy_batch_when_told(tmp_path) -> None:
    batch = _loader(tmp_path, packed=True).dummy_batch([2])
    _check_packed(batch)
    assert batch["cu_seqlens"].tolist() == [0, 7]


def test_packed_dummy_batch_learned_from_the_first_packed_step(tmp_path) -> None:
    loader = _loader(tmp_path)
    assert "attention_mask" in loader.dummy_batch([0]) and "cu_seqlens" not in loader.dummy_batch([0])
    real = {"input_ids": torch.zeros(1, 5, dtype=torch.int64), "cu_seqlens": torch.tensor([0, 2, 5], dtype=torch.int32),
            "position_ids": torch.tensor([[0, 1, 0, 1, 2]])}
    loader._check_layout(real, HEADER)
    _check_packed(loader.dummy_batch([0]))


def test_packed_mismatch_is_a_clear_error(tmp_path) -> None:
    loader = _loader(tmp_path, packed=False)
    packed = {"input_ids": torch.zeros(1, 5, dtype=torch.int64), "cu_seqlens": torch.tensor([0, 5], dtype=torch.int32)}
    with pytest.raises(odb.OdbError, match="packed=False.*step 4.*is packed.*packed=True"):
        loader._check_layout(packed, HEADER)
    with pytest.raises(odb.OdbError, match="packed=True.*is padded"):
        _loader(tmp_path, packed=True)._check_layout({"input_ids": torch.zeros(2, 3)}, HEADER)
