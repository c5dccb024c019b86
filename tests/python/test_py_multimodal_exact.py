"""The multimodal example's model (examples/multimodal_train.py: vision tower over native-resolution
patches, audio tower over frames, causal LM) on real decoded icons and speech, split over 2 gloo
ranks with per-phase layouts (the vision, audio and LLM phases each on their own ranks, one routed
all-to-all per encoder phase, odb.phases) gives the loss and the gradients of one process running
the whole batch (float64, 1e-10), also with an IDLE rank in the step that still encodes for the
other rank."""
from __future__ import annotations

import datetime
import traceback
from typing import Any, Dict, List

import torch

import multimodal_data as mmd
import multimodal_train as mt
from odb.phases import PhasePlan
from test_py_phases import free_port, headers, run_ranks_spawned

TOL = 1e-10
N = 10


def _samples() -> List[Dict[str, Any]]:
    """N real samples: every kind, decoded from the Debian icons and espeak-ng audio."""
    ds = mmd.MixedModalDataset(mmd.prepare(40, seed=5))
    kinds = mmd.KINDS * 3
    picked, want = [], list(kinds)
    for i in range(len(ds)):
        if want and ds.specs[i].kind == want[0]:
            picked.append(i)
            want.pop(0)
    picked = (picked + [i for i in range(len(ds)) if i not in picked])[:N]
    return [ds[i] for i in picked]


def _model() -> mt.MLLM:
    torch.manual_seed(7)
    return mt.MLLM(d=16, layers=1, heads=2, vision_width=16, audio_width=8, enc_layers=1).double()


def _cat(samples: List[Dict[str, Any]], ids: List[int], key: str, dim: int) -> Dict[str, torch.Tensor]:
    """An odbd concat field: the rows of the listed samples and offsets [n+1]."""
    parts = [torch.as_tensor(samples[s][key]).double() for s in ids]
    offsets = [0]
    for p in parts:
        offsets.append(offsets[-1] + p.shape[0])
    return {key: torch.cat(parts) if parts else torch.zeros(0, dim, dtype=torch.float64),
            key + "_offsets": torch.tensor(offsets)}


def rank_batch(samples: List[Dict[str, Any]], header: Dict[str, List[int]]) -> Dict[str, Any]:
    """What odbd delivers with phase plans: the LLM batch of sample_ids, enc.* and audio.* fields."""
    batch: Dict[str, Any] = {}
    if header["sample_ids"]:
        batch.update({k: v for k, v in mt.pad_collate([samples[s] for s in header["sample_ids"]]).items()
                      if k in ("input_ids", "labels", "attention_mask")})
    for key, ids, dim, prefix in (("pixel_patches", header["enc_sample_ids"], mmd.PATCH_DIM, "enc."),
                                  ("audio_features", header["audio_sample_ids"], mmd.AUDIO_BANDS, "audio.")):
        if ids:
            batch.update({prefix + k: v for k, v in _cat(samples, ids, key, dim).items()})
    return batch


def total_loss_tokens(samples: List[Dict[str, Any]]) -> int:
    return sum(int(s["loss_tokens"]) for s in samples)


def reference(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One process, the whole batch: the Standard path of the example."""
    model = _model()
    batch = mt.pad_collate(samples)
    batch["pixel_patches"] = batch["pixel_patches"].double()
    batch["audio_features"] = batch["audio_features"].double()
    loss, tokens, _ = mt.run_step(model, batch, mt.PhaseClock(), torch.device("cpu"),
                                  1.0 / total_loss_tokens(samples))
    return {"loss": loss, "tokens": tokens,
            "grads": [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]}


def run_rank(samples: List[Dict[str, Any]], header: Dict[str, List[int]]) -> Dict[str, Any]:
    import torch.distributed as dist

    model = _model()
    plan = PhasePlan.from_header(header)
    loss, tokens, _ = mt.run_step(model, rank_batch(samples, header), mt.PhaseClock(), torch.device("cpu"),
                                  1.0 / total_loss_tokens(samples), plan=plan, llm_idle=not header["sample_ids"])
    sums = torch.tensor([loss, float(tokens)], dtype=torch.float64)
    if dist.is_initialized():
        mt.all_reduce_grads(model)
        dist.all_reduce(sums)
    return {"loss": float(sums[0]), "tokens": int(sums[1]),
            "grads": [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]}


def compare(got: Dict[str, Any], want: Dict[str, Any]) -> Dict[str, float]:
    return {"loss": abs(got["loss"] - want["loss"]), "tokens": abs(got["tokens"] - want["tokens"]),
            "grad": max(float((g - w).abs().max()) for g, w in zip(got["grads"], want["grads"]))}


def scenarios() -> Dict[str, List[Dict[str, List[int]]]]:
    """Each: the three layouts (LLM, vision, audio) over the 2 ranks."""
    ids = list(range(N))
    return {
        # every phase on its own ranks
        "three-layouts": headers([ids[0::2], ids[1::2]], [ids[3:], ids[:3]], [ids[::-1][:5], ids[::-1][5:]]),
        # rank 1 is IDLE in the LLM phase and still encodes images and audio for rank 0
        "idle-rank-encodes": headers([ids, []], [ids[:4], ids[4:]], [ids[6:], ids[:6]]),
    }


def _rank_main(rank: int, port: int, q: Any) -> None:
    try:
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=60))
        samples = _samples()
        want = reference(samples)
        out = {name: compare(run_rank(samples, hdrs[rank]), want) for name, hdrs in scenarios().items()}
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, "ok", out))
    except BaseException:  # reported to the parent, which fails the test
        q.put((rank, "error", traceback.format_exc()))


def test_model_through_phase_routes_equals_one_process() -> None:
    results = run_ranks_spawned(_rank_main, free_port(), timeout=120)
    for rank in range(2):
        for name, err in results[rank].items():
            assert err["tokens"] == 0, (rank, name, err)
            assert err["loss"] < TOL and err["grad"] < TOL, (rank, name, err)


def test_world_size_one_reordered_phases_equal_one_process() -> None:
    """Without torch.distributed: the encoder layouts in another order than the LLM's."""
    samples = _samples()
    ids = list(range(N))
    hdr = headers([ids], [ids[::-1]], [ids[3:] + ids[:3]])[0]
    err = compare(run_rank(samples, hdr), reference(samples))
    assert err["tokens"] == 0 and err["loss"] < TOL and err["grad"] < TOL, err
    # A wrong route (two image rows swapped) is seen: the comparison can fail.
    with_images = [i for i in ids if samples[i]["vision_patches"] > 0]
    a, b = with_images[0], with_images[1]
    hdr["enc_dest_index"][hdr["enc_sample_ids"].index(a)], hdr["enc_dest_index"][hdr["enc_sample_ids"].index(b)] = (
        hdr["enc_dest_index"][hdr["enc_sample_ids"].index(b)], hdr["enc_dest_index"][hdr["enc_sample_ids"].index(a)])
    assert compare(run_rank(samples, hdr), reference(samples))["grad"] > 1e-6
