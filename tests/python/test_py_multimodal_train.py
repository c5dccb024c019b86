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


# Steps whose tensors are each a little larger than the last step's, with small objects kept between
# them (what a training loop leaves: records, logs), after one large tensor was freed (glibc then
# raises its dynamic mmap threshold to that size, so the steps' tensors go to the heap). Prints the
# VmHWM above reset_peak_memory's base, the VmRSS above it after the steps, and the largest step's
# bytes (KiB).
_GROWING_STEPS = r"""
import sys
import torch
import multimodal_train as mt
if sys.argv[1] == "fixed":
    assert mt.fix_malloc_thresholds()
cpu = torch.device("cpu")
big = torch.ones(16 << 20, dtype=torch.uint8)
del big
base = mt.reset_peak_memory(cpu)
kept, largest = [], 0
for step in range(10):
    acts = []
    for _ in range(6):
        acts.append(torch.ones(int((64 << 10) * (1 + 0.5 * step))))
        kept.append(torch.ones(8))
    largest = max(largest, sum(a.numel() * 4 for a in acts))
    del acts
print(mt.peak_memory_kb(cpu) - base, mt._status_kb("VmRSS") - base, largest // 1024)
"""


def test_fixed_malloc_thresholds_make_vmhwm_the_largest_steps_memory() -> None:
    """The example's CPU ranks fix glibc's thresholds (fix_malloc_thresholds, --malloc fixed by
    default, the same for every method): each tensor >= 128 KiB is its own mapping, returned when
    freed, so a rank's VmHWM above its base is its largest step's memory, not the holes earlier
    steps left in the heap (with glibc's dynamic threshold these steps peak at 2-4x the largest
    step, and the resident set stays there: what made one rank of a real run peak 13% above the
    others with even activations, docs/benchmarks.md section 6, "Peak memory the OS sees")."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    assert mt.parse_args([]).malloc == "fixed"
    examples = str(Path(mt.__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([examples, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _GROWING_STEPS, "fixed"], env=env, capture_output=True,
                         text=True, check=True).stdout
    peak_kb, after_kb, largest_kb = (int(x) for x in out.split())
    # (the kernel's resident-set counters are batched per thread: a few hundred KiB either way)
    assert largest_kb - 512 <= peak_kb <= 1.15 * largest_kb + 1024, (peak_kb, largest_kb)
    assert after_kb <= 2048, after_kb  # the steps' memory went back to the OS


# Four steps of 20, 30, 10 and 25 MiB of 256 KiB tensors, small objects kept between them; prints
# each step's step_memory_kb.
_STEP_MEMORY = r"""
import sys
import torch
import multimodal_train as mt
if sys.argv[1] == "fixed":
    assert mt.fix_malloc_thresholds()
kept = []
def step(mib):
    start = mt.step_interval()
    acts = []
    for _ in range(4 * mib):
        acts.append(torch.ones(64 << 10))
        kept.append(torch.ones(8))
    kb = mt.step_memory_kb(start)
    del acts
    return kb
print(*(step(m) for m in (20, 30, 10, 25)))
"""


def test_step_memory_is_each_steps_bytes() -> None:
    """The CPU peak-memory figure is per step (step_interval / step_memory_kb: VmHWM above the step's
    start); with the fixed thresholds each step's figure is its own bytes, whatever the steps before it
    freed (with glibc's dynamic threshold the heap keeps the earlier steps' memory and a step reusing it
    reads as 19, 11, 0, 0 MiB)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    examples = str(Path(mt.__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([examples, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _STEP_MEMORY, "fixed"], env=env, capture_output=True, text=True,
                         check=True).stdout
    got = [int(x) / 1024 for x in out.split()]
    assert all(want - 1 <= g <= want + 2 for want, g in zip((20, 30, 10, 25), got)), got


def test_gpu_step_memory_is_each_steps_allocator_peak(monkeypatch) -> None:
    """On a GPU the per-step figure is the CUDA allocator's peak since the step's start above what it held
    then (step_interval resets the peak): a 10 MiB step after a 20 MiB one reads 10, not the run's 20.
    The allocator is a stand-in with CUDA's four calls (no GPU on the test machines); the figures the
    multimodal example records come from exactly these calls."""
    import torch

    class Allocator:
        held = peak = 0
        resets = 0

        def alloc(self, nbytes: int) -> None:
            self.held += nbytes
            self.peak = max(self.peak, self.held)

    fake = Allocator()

    def reset(device=None) -> None:
        fake.peak = fake.held
        fake.resets += 1

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: fake.held)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: fake.peak)
    gpu = torch.device("cuda", 0)
    fake.alloc(100 << 20)  # parameters and optimizer state
    got = []
    for mib in (20, 10, 30):
        start = mt.step_interval(gpu)
        fake.alloc(mib << 20)
        fake.alloc(-(mib << 20))
        got.append(mt.step_memory_kb(start, gpu) // 1024)
    assert got == [20, 10, 30]
    assert fake.resets == 3


def test_daemon_config_carries_the_memory_llm_slack() -> None:
    """--memory-llm-slack reaches odbd's alignment.memory_llm_slack (the config's by default, recorded in the
    run's args), and --no-memory-plan drops it with the other memory settings."""
    import yaml

    configured = yaml.safe_load(mt.CONFIG.read_text())["alignment"]["memory_llm_slack"]
    assert configured > 0
    default = mt.parse_args([])
    assert default.memory_llm_slack == configured
    assert mt.daemon_config(default, True, 0)["alignment"]["memory_llm_slack"] == configured
    assert mt.daemon_config(mt.parse_args(["--memory-llm-slack", "0"]), True, 0)["alignment"]["memory_llm_slack"] == 0
    assert "memory_llm_slack" not in mt.daemon_config(mt.parse_args(["--no-memory-plan"]), True, 0)["alignment"]
