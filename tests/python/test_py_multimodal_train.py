"""examples/multimodal_train.py end to end, small: 2 ranks, real odbd daemons, real decoded icons
and espeak-ng audio, Standard and three odb methods (LLM only, per phase, per phase with the LLM
packed) at the same recipe; every training sample is
trained once through odb, every decoded patch and frame reaches an encoder, odb_phases moves
encoder work between ranks, and the summary carries the ablation's figures."""
from __future__ import annotations

import math

import multimodal_data as mmd
import multimodal_train as mt

SAMPLES, HELDOUT = 32, 8
TINY = ["--d-model", "32", "--layers", "1", "--vision-width", "32", "--audio-width", "16", "--enc-layers", "1",
        "--batch", "4", "--global-batch", "16", "--max-tokens", "512", "--workers", "1"]


def test_small_ablation_end_to_end() -> None:
    args = mt.parse_args(["--samples", str(SAMPLES), "--heldout", str(HELDOUT), "--quiet",
                          "--methods", "standard,odb_llm,odb_phases,odb_phases_packed", *TINY])
    result = mt.run(args, keep_raw=True)
    raw, methods = result["raw"], result["methods"]
    specs = mmd.prepare(SAMPLES + HELDOUT, seed=args.seed)
    heldout = set(mt.split_ids(len(specs), args)[0])
    train = [i for i in range(len(specs)) if i not in heldout]
    lengths = [mmd.lengths_of(specs[i]) for i in train]
    want_patches = sorted(p for _, p, _ in lengths if p)
    want_frames = sorted(f for _, _, f in lengths if f)
    assert want_patches and want_frames, "the workload must hold images and audio"
    for method in ("odb_llm", "odb_phases", "odb_phases_packed"):
        recs = [rec for rank in raw[method] for rec in rank["records"]]
        # Every training sample exactly once in the LLM phase, and its image / audio in an encoder.
        assert sorted(n for rec in recs for n in rec["items"]["llm"]) == sorted(t for t, _, _ in lengths), method
        assert sorted(u for rec in recs for u in rec["items"]["vision"]) == want_patches, method
        assert sorted(u for rec in recs for u in rec["items"]["audio"]) == want_frames, method
    for method in ("odb_phases", "odb_phases_packed"):
        assert sum(rec.get("moved", 0) for rank in raw[method] for rec in rank["records"]) > 0, method
    # odb_phases_packed's LLM batches come packed from the daemon (collate.packed): no padding at all,
    # while the padded odb_phases pads some step.
    packed = [rec for rank in raw["odb_phases_packed"] for rec in rank["records"] if rec["items"]["llm"]]
    assert packed and all(rec["llm_padded"] == sum(rec["items"]["llm"]) for rec in packed)
    padded = [rec for rank in raw["odb_phases"] for rec in rank["records"] if rec["items"]["llm"]]
    assert any(rec["llm_padded"] > sum(rec["items"]["llm"]) for rec in padded)
    for method, s in methods.items():
        if method.startswith("_"):
            continue
        assert math.isfinite(s["heldout_loss"]) and s["heldout_loss"] > 0, method
        assert s["sync_time_s"] > 0 and s["optimizer_steps"] >= 1, method
        assert set(s["max_over_mean"]) == {"vision", "audio", "llm"}, method
        assert min(s["act_peak_mb"]) > 0 and s["act_peak_max_over_mean"] >= 1 and s["act_bound_mb"] > 0, method
    for key in ("speedup_over_llm_only", "speedup_over_standard"):
        assert methods["odb_phases"][key] > 0
    assert methods["odb_phases_packed"]["speedup_over_standard"] > 0
    assert set(methods["_fitted_phase_costs"]) == {"vision", "audio", "llm"}


def test_activation_bytes_are_the_saved_tensors_linear_in_units() -> None:
    """PhaseClock's activation memory: the bytes autograd saves, linear in the patches of the step
    (each patch goes through the same tower), parameters not counted (a step that encodes nothing
    holds nothing), and the step's memory in the summary (peak over steps, max/mean, bound)."""
    import torch

    model = mt.MLLM(d=16, layers=1, vision_width=16, audio_width=8, enc_layers=1)
    params = mt.param_storages(model)

    def vision_bytes(units: int) -> int:
        clock = mt.PhaseClock(params)
        with clock("vision"):
            out = model.vision(torch.randn(units, mmd.PATCH_DIM), [units] if units else [])
        assert out.shape[0] == (1 if units else 0)
        return clock.saved["vision"]

    b0, b10, b20, b30 = (vision_bytes(u) for u in (0, 10, 20, 30))
    assert b0 < b10 < b20 < b30
    assert b20 - b10 == b30 - b20  # linear: the same tensors per patch
    per_patch = (b30 - b10) / 20
    assert per_patch >= 4 * (mmd.PATCH_DIM + 16)  # at least the input row and one hidden row (float32)
    assert b0 < sum(p.numel() * 4 for p in model.vision.parameters()) / 10  # parameters are not activations
