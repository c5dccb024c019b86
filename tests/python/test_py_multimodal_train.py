"""examples/multimodal_train.py end to end, small: 2 ranks, real odbd daemons, real decoded icons
and espeak-ng audio, Standard and both odb methods at the same recipe; every training sample is
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
                          "--methods", "standard,odb_llm,odb_phases", *TINY])
    result = mt.run(args, keep_raw=True)
    raw, methods = result["raw"], result["methods"]
    specs = mmd.prepare(SAMPLES + HELDOUT, seed=args.seed)
    heldout = set(mt.split_ids(len(specs), args)[0])
    train = [i for i in range(len(specs)) if i not in heldout]
    lengths = [mmd.lengths_of(specs[i]) for i in train]
    want_patches = sorted(p for _, p, _ in lengths if p)
    want_frames = sorted(f for _, _, f in lengths if f)
    assert want_patches and want_frames, "the workload must hold images and audio"
    for method in ("odb_llm", "odb_phases"):
        recs = [rec for rank in raw[method] for rec in rank["records"]]
        # Every training sample exactly once in the LLM phase, and its image / audio in an encoder.
        assert sorted(n for rec in recs for n in rec["items"]["llm"]) == sorted(t for t, _, _ in lengths), method
        assert sorted(u for rec in recs for u in rec["items"]["vision"]) == want_patches, method
        assert sorted(u for rec in recs for u in rec["items"]["audio"]) == want_frames, method
    assert sum(rec.get("moved", 0) for rank in raw["odb_phases"] for rec in rank["records"]) > 0
    for method, s in methods.items():
        if method.startswith("_"):
            continue
        assert math.isfinite(s["heldout_loss"]) and s["heldout_loss"] > 0, method
        assert s["sync_time_s"] > 0 and s["optimizer_steps"] >= 1, method
        assert set(s["max_over_mean"]) == {"vision", "audio", "llm"}, method
    for key in ("speedup_over_llm_only", "speedup_over_standard"):
        assert methods["odb_phases"][key] > 0
    assert set(methods["_fitted_phase_costs"]) == {"vision", "audio", "llm"}
