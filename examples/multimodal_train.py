"""A three-modality model trained through odb: Standard vs odb, per phase (OrchMLLM's ablation).

The workload (examples/multimodal_data.py): Debian icons decoded at native
resolution, espeak-ng speech decoded from WAV, README text; 30% text only, 25%
image + caption, 25% speech + transcript, 20% image + speech + question.

The model (MLLM below): a vision encoder over 8x8 patches (a per-patch MLP
tower, mean-pooled to one row per image), an audio encoder over 23 ms
log-spectrum frames (the same shape of tower, one row per clip), each
projected into a small causal LM that reads the text bytes and takes the
encoders' rows at its IMG / AUD placeholder positions. Encoder cost follows
the image's patches and the clip's frames; LLM cost the (padded) text.

Methods, all at the same recipe (the optimizer batch: `--global-batch`
samples' worth of loss tokens; AdamW with the same LR schedule by loss tokens
trained; the same epochs; gradients all-reduced once per optimizer step):
  standard:        fixed micro-batch of --batch samples per rank
                   (DistributedSampler), padded text, accumulation to the
                   global batch; each rank encodes its own samples' media.
  standard_packed: the same, text packed padding-free (attention per sample).
  odb_llm:         OdbDataLoader; the daemons balance the LLM phase (padded
                   cost under --max-tokens, global planner, windows of the
                   same loss tokens); each rank encodes its LLM samples' media
                   (`alignment.phase_plans` off). The daemons' config:
                   configs/multimodal_train.yaml.
  odb_phases:      the same plus `alignment.phase_plans`: the vision and the
                   audio encoder phases are balanced on their own costs; each
                   rank encodes what its plan says and one all-to-all per
                   encoder phase (odb.phases) moves the outputs to the LLM
                   layout; gradients flow back through it.
  odb_llm_packed, odb_phases_packed: the two above with the LLM packed
                   padding-free (`collate.packed`, `grouping.cost_model:
                   packed`: standard_packed's forward, attention per sample;
                   budgets and the planner's step time on real tokens):
                   the fair match for standard_packed.

Measured per rank and step, per phase (vision, audio, llm: forward +
backward; route: the all-to-alls' own CPU): the thread CPU time of the rank
(torch.set_num_threads(1), so oversubscribed cores do not hide imbalance).
Reported: each phase's run total max/mean over ranks; the synchronous step
time (per step the sum over phases of the slowest rank's time, as if each
phase ended in a barrier, which the all-to-alls and the gradient all-reduce
are), summed over the run; peak memory per rank (on a CPU its largest step's
VmHWM above the VmRSS at the step's start, with glibc's thresholds fixed so the
resident set follows the bytes in use; on a GPU the allocator's peak above the
rank's level after warm-up); real tokens/s, patches/s (wall clock); held-out loss.

Run (2 local ranks):  /usr/bin/python3 examples/multimodal_train.py
W = 4: --world-size 4; a GPU: --device cuda; JSON: --json PATH.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, cast

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "client/python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import multimodal_data as mmd  # noqa: E402
import tiny_lm  # noqa: E402

METHODS = ("standard", "standard_packed", "odb_llm", "odb_phases", "odb_llm_packed", "odb_phases_packed")
DEFAULT_METHODS = METHODS  # every method: the README command prints the whole ablation
# odb's LLM phase packed padding-free (collate.packed: [1, T] with cu_seqlens, attention per sample:
# standard_packed's forward), budgets and costs on real tokens (grouping.cost_model: packed).
PACKED_METHODS = ("standard_packed", "odb_llm_packed", "odb_phases_packed")
PHASES = ("vision", "audio", "llm", "route")
COMPUTE_PHASES = ("vision", "audio", "llm")


# ----- the model -----------------------------------------------------------------
class Tower(torch.nn.Module):
    """An encoder: input projection, `layers` residual MLP blocks applied to every unit (patch or
    frame), each sample's units mean-pooled to one row, projected to the LM width."""

    def __init__(self, d_in: int, width: int, layers: int, d_out: int) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(d_in, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                torch.nn.Linear(4 * width, width)) for _ in range(layers))
        self.out = torch.nn.Linear(width, d_out)

    def forward(self, units: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
        """units [sum(counts), d_in]; returns one row per sample with count > 0, in order."""
        h = self.inp(units)
        for block in self.blocks:
            h = h + block(h)
        nonzero = [c for c in counts if c > 0]
        seg = torch.repeat_interleave(torch.arange(len(nonzero), device=units.device),
                                      torch.tensor(nonzero, dtype=torch.long, device=units.device))
        pooled = torch.zeros(len(nonzero), h.shape[1], dtype=h.dtype, device=h.device).index_add(0, seg, h)
        pooled = pooled / torch.tensor(nonzero, dtype=h.dtype, device=h.device).unsqueeze(1)
        return self.out(pooled)


class Block(torch.nn.Module):
    """Pre-LN causal transformer block over a padded [B, L] batch or packed segments."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def attend(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        att = att + bias if bias is not None else att
        return self.proj((att.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d))

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor], segments: Optional[List[int]]) -> torch.Tensor:
        h = self.ln1(x)
        if segments is None:
            x = x + self.attend(h, bias)
        else:  # packed [1, T]: causal attention within each sample, one sample at a time
            parts, start = [], 0
            for n in segments:
                parts.append(self.attend(h[:, start:start + n], _causal(n, x.dtype, x.device)))
                start += n
            x = x + torch.cat(parts, dim=1)
        return x + self.mlp(self.ln2(x))


def _causal(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.full((n, n), float("-inf"), dtype=dtype, device=device).triu(1)


class MLLM(torch.nn.Module):
    """Vision tower + audio tower + projections into a causal byte-level LM."""

    def __init__(self, d: int = 128, layers: int = 2, heads: int = 4, vision_width: int = 256,
                 audio_width: int = 128, enc_layers: int = 3, max_len: int = 512) -> None:
        super().__init__()
        self.vision = Tower(mmd.PATCH_DIM, vision_width, enc_layers, d)
        self.audio = Tower(mmd.AUDIO_BANDS, audio_width, enc_layers, d)
        self.tok = torch.nn.Embedding(mmd.VOCAB, d)
        self.pos = torch.nn.Embedding(max_len, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, 256)  # targets are bytes

    def llm_loss_sum(self, ids: torch.Tensor, labels: torch.Tensor, img: torch.Tensor, aud: torch.Tensor,
                     mask: Optional[torch.Tensor] = None, segments: Optional[List[int]] = None) -> torch.Tensor:
        """Summed cross-entropy over the labels != -100. ids/labels: [B, L] padded (mask [B, L]) or
        [1, T] packed (segments: each sample's length). img / aud: one row per IMG / AUD placeholder,
        in row-major order of the placeholders (= sample order)."""
        b, n = ids.shape
        if segments is None:
            positions = torch.arange(n, device=ids.device).expand(b, n)
        else:
            positions = torch.cat([torch.arange(s, device=ids.device) for s in segments]).unsqueeze(0)
        x = self.tok(ids) + self.pos(positions)
        for token, rows in ((mmd.IMG, img), (mmd.AUD, aud)):
            where = (ids == token).nonzero(as_tuple=True)
            if where[0].numel() != rows.shape[0]:
                raise ValueError(f"{where[0].numel()} placeholders {token} but {rows.shape[0]} encoder rows")
            x = x.index_put(where, rows.to(x.dtype))
        bias = None
        if segments is None:
            bias = _causal(n, x.dtype, x.device).expand(b, 1, n, n)
            if mask is not None:
                bias = bias.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
                bias = bias.masked_fill(mask[:, None, :, None] == 0, 0.0)  # padded queries: no all -inf rows
        for block in self.blocks:
            x = block(x, bias, segments)
        logits = self.head(self.ln(x))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                 ignore_index=-100, reduction="sum")


# ----- batches ---------------------------------------------------------------------
def counts_from_offsets(offsets: Any) -> List[int]:
    o = [int(x) for x in offsets.tolist()]
    return [b - a for a, b in zip(o, o[1:])]


def pad_collate(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Standard's collate: text padded to the batch's longest sample, media concatenated."""
    n = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), n, dtype=torch.long)
    labels = torch.full((len(samples), n), -100, dtype=torch.long)
    mask = torch.zeros(len(samples), n, dtype=torch.long)
    for r, s in enumerate(samples):
        k = len(s["input_ids"])
        ids[r, :k] = torch.as_tensor(s["input_ids"])
        labels[r, :k] = torch.as_tensor(s["labels"])
        mask[r, :k] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask, **_media(samples)}


def packed_collate(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Standard packed: the text of the batch concatenated, no padding; `segments` the lengths."""
    return {"input_ids": torch.cat([torch.as_tensor(s["input_ids"]) for s in samples]).unsqueeze(0),
            "labels": torch.cat([torch.as_tensor(s["labels"]) for s in samples]).unsqueeze(0),
            "segments": [len(s["input_ids"]) for s in samples], **_media(samples)}


def _media(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    return {"pixel_patches": torch.cat([torch.as_tensor(s["pixel_patches"]) for s in samples]),
            "pixel_counts": [int(s["vision_patches"]) for s in samples],
            "audio_features": torch.cat([torch.as_tensor(s["audio_features"]) for s in samples]),
            "audio_counts": [int(s["audio_frames"]) for s in samples]}


CONFIG = HERE.parent / "configs/multimodal_train.yaml"


# The packed LLM's step time in the planner's units (one real token = 1; only ratios change a plan):
# per step ~57 tokens' worth and per token^2 ~0.0015 of a token, from the LLM fits of the 2026-12-05
# W = 4 seed runs (seconds per step 0.022-0.036, per token 4.6e-4-5.5e-4, per token^2 6.2e-7-8.6e-7).
# The packed-only fit of later runs (`_fitted_phase_costs` llm) is steeper and adds ~0.03 s per
# sample (the attention loop runs per sample), which grouping.step_time cannot express; with these
# figures the plans were already at 0.97 of the LLM's bound (docs/benchmarks.md, section 6).
PACKED_STEP_TIME = {"per_step": 60.0, "per_padded_token": 1.0, "per_len_sq": 0.0014}


def daemon_config(args: argparse.Namespace, phases: bool, window_tokens: int, packed: bool = False) -> Dict[str, Any]:
    """odbd's config for the odb methods: configs/multimodal_train.yaml with this run's budget,
    seed, window, (odb_llm*) without the per-phase plan and (packed) the LLM packed padding-free
    (`collate.packed`, `grouping.cost_model: packed`, PACKED_STEP_TIME)."""
    import yaml

    config: Dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    if packed:
        config["collate"]["packed"] = True
        # mix_lengths true: the packed LLM's groups of mixed lengths, as every recorded packed run had them
        # (the daemon's `auto` deals length-sorted groups into steps since 2026-12-06; this example runs
        # without windows, where the two cost the same: docs/config.md, "Length-mixed steps").
        config["grouping"].update(cost_model="packed", step_time=dict(PACKED_STEP_TIME), mix_lengths=True)
    config["grouping"]["max_tokens"] = args.max_tokens
    config["alignment"].update(seed=args.seed, phase_plans=phases)
    config["optimizer"]["tokens_per_step"] = window_tokens
    if args.phase_costs:  # bench/phase_calibrate.py --json: the fitted per-phase cost models
        fits = json.loads(Path(args.phase_costs).read_text())["fits"]
        for phase in ("vision", "audio"):
            f = fits[phase]
            config["alignment"][f"{phase}_cost"] = {"per_sample": f["per_item"], "per_unit": f["per_unit"],
                                                    "per_unit_sq": f["per_unit_sq"]}
    if args.llm_step_time:  # fit_llm_step_time's figures (the JSON's _fitted_llm_step_time)
        per_step, per_token, per_len_sq = (float(v) for v in args.llm_step_time.split(","))
        config["grouping"]["step_time"] = {"per_step": per_step, "per_padded_token": per_token,
                                           "per_len_sq": per_len_sq}
    if getattr(args, "memory_peak_round", None) is not None:  # the round rule (docs/balancing.md, "Peak ratio")
        config["alignment"]["memory_peak_round"] = bool(args.memory_peak_round)
    if getattr(args, "memory_time_floor", None) is not None:  # the encoders' time budget over the run
        config["alignment"]["memory_time_floor"] = float(args.memory_time_floor)
    if getattr(args, "memory_llm_slack", None) is not None:  # LLM samples moved off the highest peak's rank
        config["alignment"]["memory_llm_slack"] = float(args.memory_llm_slack)
    if not args.memory_plan:
        for key in ("vision_memory", "audio_memory", "llm_memory", "memory_slack", "memory_time_floor",
                    "memory_llm_slack"):
            config["alignment"].pop(key, None)
    if not phases or not args.phase_steps:  # steps composed on the LLM's cost only
        config["alignment"].pop("llm_cost_seconds", None)
    if not phases:
        for key in ("encoder_fields", "audio_fields"):
            config["collate"].pop(key, None)
    return config


# ----- measurement -------------------------------------------------------------------
class PhaseClock:
    """Thread CPU time per phase of one step (time.thread_time: this rank's own compute), and the
    activation memory each phase holds for its backward: the bytes of the tensors autograd saves
    (torch.autograd.graph.saved_tensors_hooks), each storage counted once, parameters left out.
    Every phase's saved tensors live until the step's last backward (the encoders' runs after the
    LLM's), so their sum is the step's activation peak; unlike VmHWM it does not depend on what the
    allocator kept from earlier steps or on the load (what a GPU's allocator peak measures)."""

    def __init__(self, param_storages: Optional[set] = None, probe: Optional["MemProbe"] = None) -> None:
        self.probe = probe
        self.t = dict.fromkeys(PHASES, 0.0)
        self.saved = dict.fromkeys(PHASES, 0)
        self._phase: Optional[str] = None
        self._start = 0.0
        self._seen: set = set(param_storages or ())

    def __call__(self, phase: str) -> "PhaseClock":
        self._phase = phase
        return self

    def __enter__(self) -> None:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        self._start = time.thread_time()

    def __exit__(self, *exc: Any) -> None:
        assert self._phase is not None, "use the clock as `with clock(phase):`"
        self.t[self._phase] += time.thread_time() - self._start
        self._hooks.__exit__(*exc)
        if self.probe is not None:
            self.probe.sample(self._phase)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.storage()
        key = storage.data_ptr()
        if key not in self._seen:
            self._seen.add(key)
            self.saved[cast(str, self._phase)] += storage.nbytes()
        return t


def param_storages(model: torch.nn.Module) -> set:
    """The storages of the model's parameters (saved for backward, but not activations)."""
    return {p.storage().data_ptr() for p in model.parameters()}


def _status_kb(key: str) -> int:
    return _status_kbs(key)[0]


def _status_kbs(*keys: str) -> List[int]:
    """/proc/self/status's figures (KiB) for `keys`, in one read (0 where absent)."""
    found: Dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in keys:
            found[key] = int(line.split()[1])
    return [found.get(k, 0) for k in keys]


def reset_peak_memory(device: torch.device) -> int:
    """Resets the peak (VmHWM via /proc/self/clear_refs, or CUDA's allocator peak); returns the base in KiB.
    On a CPU the allocator first gives its free memory back to the OS (glibc's malloc_trim), so the base
    is what the rank holds (parameters, optimizer state, buffers) and not what its warm-up steps left
    in the heap: VmHWM above it is then the largest step's own memory, as the OS sees it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) // 1024
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the base keeps what the heap holds
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status_kb("VmRSS")


def step_interval(device: Optional[torch.device] = None) -> Optional[Tuple[int, int]]:
    """Starts a step's memory interval: on a CPU VmHWM reset to the current VmRSS (/proc/self/clear_refs
    5), returns (that level, RssFile) in KiB, or None where the peak cannot be reset; on a GPU the
    allocator's peak reset to what it holds now (torch.cuda.reset_peak_memory_stats), returns
    (memory_allocated, 0) in KiB. See step_memory_kb."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) // 1024, 0
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    rss, files = _status_kbs("VmRSS", "RssFile")
    return rss, files


def step_memory_kb(start: Tuple[int, int], device: Optional[torch.device] = None) -> int:
    """A step's own memory since step_interval gave `start`. CPU: VmHWM above the level then, less the
    file pages the step mapped in (RssFile's growth: library code run for the first time, e.g. an
    operator's first backward; not data). What is left is the anonymous and shared memory the step
    used at its peak: the batch's pages it reads, activations, gradients, temporaries (the per-step
    figure the activation bytes are; docs/benchmarks.md section 6, "Peak memory the OS sees"). GPU:
    the allocator's peak since then above what it held then (the step's tensors at their peak)."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) // 1024 - start[0])
    hwm, files = _status_kbs("VmHWM", "RssFile")
    return max(0, hwm - start[0] - max(0, files - start[1]))


# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 128 * 1024  # glibc's own initial threshold, kept fixed


def fix_malloc_thresholds(mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Makes a CPU rank's resident set follow the bytes it uses, so VmHWM measures a step's memory
    and not the heap's history: every allocation of `mmap_threshold` bytes or more (a tensor of
    32K floats: the activations, gradients and batch tensors that make up a step's memory) gets
    its own mapping, unmapped when freed, and free memory at the heap's top above the same
    threshold goes back to the OS. glibc's default is dynamic instead: each freed mapping raises
    the threshold to its size (up to 32 MiB), so after the first steps the tensors go to the heap,
    whose free chunks stay resident (holes between live chunks are never returned), and a rank's
    VmHWM depends on the order of its past allocations (measured: docs/benchmarks.md section 6,
    "Peak memory the OS sees"). Set once per rank, before any method, so every method runs with
    the same allocator. Returns whether it applied (glibc only)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, mmap_threshold))
    except (OSError, AttributeError):
        return False


def peak_memory_kb(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) // 1024
    return _status_kb("VmHWM")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


class MemProbe:
    """Per step, where the resident set goes (--mem-trace): at each phase's end the interval's VmHWM,
    the resident set split (RssAnon: heap and mmaps; RssShmem: the odb arenas' pages this process
    touched; RssFile) and glibc's mallinfo2 (bytes in use: heap chunks + mmapped chunks; free in
    the heap). VmHWM since the step's start (step_interval resets it after the "fetched" sample,
    which reads the previous step's interval: its optimizer step and this step's fetch)."""

    def __init__(self) -> None:
        self.rows: List[Dict[str, Any]] = []
        try:
            self._mi = ctypes.CDLL("libc.so.6").mallinfo2
            self._mi.restype = _MallInfo2
        except (OSError, AttributeError):
            self._mi = None

    def sample(self, tag: str) -> None:
        keys = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")
        st: Dict[str, Any] = dict(zip(keys, _status_kbs(*keys)))
        if self._mi is not None:
            m = self._mi()
            st["used_kb"] = (m.uordblks + m.hblkhd) // 1024
            st["mmap_kb"] = m.hblkhd // 1024
            st["heap_kb"] = m.arena // 1024
            st["free_kb"] = m.fordblks // 1024
        st["tag"] = tag
        self.rows.append(st)

    def take(self) -> List[Dict[str, Any]]:
        rows, self.rows = self.rows, []
        return rows


_LENGTHS: Dict[Tuple[int, int], List[int]] = {}


def sample_lengths(dataset: Any, i: int) -> List[int]:
    """[tokens, vision patches, audio frames] of sample i (read from the files' headers once)."""
    key = (id(dataset), i)
    if key not in _LENGTHS:
        _LENGTHS[key] = list(mmd.lengths_of(dataset.specs[i]))
    return _LENGTHS[key]


# ----- one training step, shared by all methods ------------------------------------------
def run_step(model: MLLM, batch: Dict[str, Any], clock: PhaseClock, device: torch.device, loss_scale: float,
             plan: Any = None, llm_idle: bool = False) -> Tuple[float, int, Dict[str, List[int]]]:
    """Forward + backward of one micro-step, timed per phase; returns (loss sum, loss tokens, items):
    items[phase] = the units (patches, frames, tokens) of each item this rank ran in that phase.

    The encoders' outputs are cut from the graph (detach) before the LLM, so the LLM's backward and
    each encoder's backward run (and are timed) separately; the gradients are the same as one
    backward through the whole graph. With a phase plan the encoders run on the plan's samples
    (``enc.*`` / ``audio.*`` fields) and their outputs are routed to the LLM layout."""
    enc_key, aud_key = ("enc.pixel_patches", "audio.audio_features") if plan is not None else (
        "pixel_patches", "audio_features")
    outs = []
    items: Dict[str, List[int]] = {"llm": []}
    for phase, tower, key, counts_key, dim in (
            ("vision", model.vision, enc_key, "pixel_counts", mmd.PATCH_DIM),
            ("audio", model.audio, aud_key, "audio_counts", mmd.AUDIO_BANDS)):
        with clock(phase):
            # An IDLE step's dummy batch holds no encoder work (with a phase plan: its lists are empty).
            if key in batch and not (llm_idle and plan is None):
                units = batch[key].to(device, non_blocking=True)
                # Standard's collate gives the counts; odbd's concat rule gives offsets [B+1].
                counts = (batch[counts_key] if plan is None and counts_key in batch
                          else counts_from_offsets(batch[key + "_offsets"]))
            else:  # no encoder work this step on this rank
                units, counts = torch.zeros(0, dim, device=device), []
            out = tower(units, counts)
            rows = [1 if c > 0 else 0 for c in counts]
        det = out.detach().requires_grad_()
        outs.append((phase, out, det, rows))
        items[phase] = [int(c) for c in counts if c > 0]
    routed = []
    with clock("route"):
        for (phase, _, det, rows) in outs:
            if plan is None:
                routed.append(det)
            elif phase == "vision":
                routed.append(plan.route(det, rows)[0])
            else:
                routed.append(plan.route_audio(det, rows)[0])
    with clock("llm"):
        if llm_idle:
            loss = sum(r.sum() for r in routed) * 0.0
            loss_sum, loss_tokens = 0.0, 0
        else:
            ids = batch["input_ids"].to(device)
            labels = batch["labels"].to(device)
            mask = batch["attention_mask"].to(device) if "attention_mask" in batch else None
            ce = model.llm_loss_sum(ids, labels, routed[0], routed[1], mask, batch.get("segments"))
            loss = ce * loss_scale + sum(r.sum() for r in routed) * 0.0
            loss_sum, loss_tokens = float(ce.detach()), int((labels != -100).sum())
            items["llm"] = (list(batch["segments"]) if "segments" in batch else
                            [int(x) for x in batch["attention_mask"].sum(1).tolist()])
        loss.backward()
    for (phase, out, det, _) in outs:
        with clock(phase):
            if det.grad is not None and out.numel():
                out.backward(det.grad)
    return loss_sum, loss_tokens, items


def all_reduce_grads(model: torch.nn.Module) -> None:
    """One flat all-reduce (sum) of every gradient (what DDP does, without overlap)."""
    params = [p for p in model.parameters()]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    k = 0
    for p in params:
        n = p.numel()
        p.grad = flat[k:k + n].view_as(p).clone()
        k += n


def lr_factor(tokens_done: int, job_tokens: int, warmup_tokens: int) -> float:
    """The same schedule for every method, by loss tokens trained: linear warmup, cosine to 0.1."""
    if tokens_done < warmup_tokens:
        return (tokens_done + 1) / max(1, warmup_tokens)
    progress = min(1.0, (tokens_done - warmup_tokens) / max(1, job_tokens - warmup_tokens))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


# ----- the methods' step streams ---------------------------------------------------------
def standard_steps(method: str, dataset: Any, train_ids: List[int], rank: int, world: int, args: Any,
                   epoch: int) -> Iterator[Dict[str, Any]]:
    """Micro-steps of Standard: groups of `accumulate` micro-batches; the loss tokens of the group on
    all ranks are all-reduced first (token-level loss over the optimizer batch)."""
    sampler: Any = torch.utils.data.distributed.DistributedSampler(cast(Any, train_ids), num_replicas=world, rank=rank,
                                                              shuffle=True, seed=args.seed)
    sampler.set_epoch(epoch)
    subset = torch.utils.data.Subset(dataset, train_ids)
    loader = torch.utils.data.DataLoader(subset, batch_size=args.batch, sampler=sampler,
                                         num_workers=args.workers,
                                         collate_fn=packed_collate if method == "standard_packed" else pad_collate)
    accumulate = max(1, round(args.global_batch / (args.batch * world)))
    it = iter(loader)
    while True:
        group = [b for _, b in zip(range(accumulate), it)]
        if not group:
            return
        tokens = torch.tensor([float(sum(int((b["labels"] != -100).sum()) for b in group))], dtype=torch.float64)
        dist.all_reduce(tokens)
        for k, b in enumerate(group):
            yield {"batch": b, "scale": 1.0 / float(tokens), "closes": k + 1 == len(group),
                   "window_tokens": int(tokens.item()), "plan": None, "idle": False}


def odb_steps(loader: Any, world: int, phases: bool, epoch: int) -> Iterator[Dict[str, Any]]:
    loader.set_epoch(epoch)
    for s in loader:
        total = int(getattr(s, "window_loss_tokens", 0) or 0)
        # odb.window_loss's weight (w_r / t_r) divided by W: gradients are summed, not averaged.
        scale = (float(s.loss_weight) / (world * float(s.loss_tokens))) if (s.loss_tokens and not s.idle) else 0.0
        batch = s.batch
        if "cu_seqlens" in batch:  # collate.packed: [1, T] with each sample's bounds
            batch = {**batch, "segments": counts_from_offsets(batch["cu_seqlens"])}
        yield {"batch": batch, "scale": scale, "closes": s.closes_window, "window_tokens": total,
               "plan": s.phase_plan if phases else None, "idle": s.idle or not s.sample_ids,
               "ids": [] if s.idle else [int(i) for i in s.sample_ids], "round": step_round(loader, s)}


def step_round(loader: Any, step: Any) -> Optional[List[int]]:
    """[round, its first step index, its step count] of the daemon's planning round that made `step`
    (odb.Step's round / round_first_step / round_steps), or None where the client does not say."""
    if not getattr(step, "round_steps", 0):
        return None
    return [int(step.round), int(step.round_first_step), int(step.round_steps)]


# ----- one rank ----------------------------------------------------------------------------
def train_method(method: str, rank: int, world: int, args: Any, dataset: Any, train_ids: List[int],
                 heldout_ids: List[int], run_dir: str, device: torch.device, window_tokens: int,
                 job_tokens: int) -> Dict[str, Any]:
    import odb

    torch.manual_seed(args.seed)
    model = MLLM(d=args.d_model, layers=args.layers, vision_width=args.vision_width, audio_width=args.audio_width,
                 enc_layers=args.enc_layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    daemon = loader = None
    if method.startswith("odb"):
        phases = method.startswith("odb_phases")
        job = f"mm-{method}-{uuid.uuid4().hex[:6]}" if rank == 0 else None
        box = [job]
        dist.broadcast_object_list(box)
        daemon = odb.spawn_daemon(rank, world, run_dir, job_id=box[0], wait=False, log_level="warn",
                                  config=daemon_config(args, phases, window_tokens, method in PACKED_METHODS))
        daemon.wait_ready(120)
        order = list(np.random.default_rng(args.seed).permutation(train_ids))
        loader = odb.OdbDataLoader(dataset, sampler=[int(i) for i in order[rank::world]], num_workers=args.workers,
                                   idle_policy="zero_step", timeout_s=300)
    records: List[Dict[str, Any]] = []
    tokens_done = optimizer_steps = 0
    base_kb = peak_kb = 0
    warm = args.warmup_record_steps
    probe = MemProbe() if args.mem_trace and device.type == "cpu" else None
    # Each step's peak above the level at its start (CPU: VmHWM above VmRSS; CUDA: the allocator's
    # peak above what it holds), from its batch in hand to the end of its backward (the gradient
    # all-reduce and the optimizer step are the same on every rank; the first one allocates AdamW's
    # state), every step (the warm-up's too, as the activation figure); without clear_refs (a CPU
    # that cannot reset VmHWM) VmHWM above the rank's level after the warm-up steps.
    per_step = step_interval(device) is not None
    try:
        dist.barrier()
        start = time.perf_counter()
        for epoch in range(args.epochs):
            steps = (standard_steps(method, dataset, train_ids, rank, world, args, epoch) if loader is None
                     else odb_steps(loader, world, method.startswith("odb_phases"), epoch))
            params = param_storages(model)
            for st in steps:
                if probe is not None:
                    probe.sample("fetched")
                level_kb = step_interval(device) if per_step else None
                clock = PhaseClock(params, probe)
                b = st["batch"]
                _, loss_tokens, items = run_step(model, b, clock, device, st["scale"], st["plan"],
                                                 llm_idle=st["idle"])
                step_kb = None if level_kb is None else step_memory_kb(level_kb, device)
                rec = {"t": clock.t, "tokens": 0 if st["idle"] else int(b["input_ids"].numel() if "segments" in b
                                                                          else b["attention_mask"].sum()),
                       "patches": 0, "frames": 0, "loss_tokens": loss_tokens, "items": items,
                       "llm_padded": 0 if st["idle"] else int(b["input_ids"].numel()),
                       "act": {p: clock.saved[p] for p in COMPUTE_PHASES}}
                if not st["idle"]:
                    rec["patches"] = int((b.get("pixel_patches") if st["plan"] is None else
                                          b.get("enc.pixel_patches", torch.zeros(0))).shape[0])
                    rec["frames"] = int((b.get("audio_features") if st["plan"] is None else
                                         b.get("audio.audio_features", torch.zeros(0))).shape[0])
                elif st["plan"] is not None:
                    rec["patches"] = int(b.get("enc.pixel_patches", torch.zeros(0)).shape[0])
                    rec["frames"] = int(b.get("audio.audio_features", torch.zeros(0)).shape[0])
                if st.get("round") is not None:  # the daemon's round (bench/phase_replay --recorded-rounds)
                    rec["round"] = st["round"]
                if st.get("ids"):  # this rank's LLM samples (bench/phase_replay.py replays the plans on them)
                    rec["samples"] = [sample_lengths(dataset, i) for i in st["ids"]]
                if st["plan"] is not None:  # encoder samples whose output leaves this rank
                    rec["moved"] = (sum(d != rank for d in st["plan"].enc_dest_rank) +
                                    sum(d != rank for d in st["plan"].audio_dest_rank))
                records.append(rec)
                if st["closes"]:
                    all_reduce_grads(model)
                    for g in opt.param_groups:
                        g["lr"] = args.lr * lr_factor(tokens_done, job_tokens, args.warmup_batches * window_tokens)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    tokens_done += st["window_tokens"]
                    optimizer_steps += 1
                if probe is not None:
                    probe.sample("opt")
                    rec["mem"] = probe.take()
                if step_kb is not None:
                    rec["mem_kb"] = step_kb
                elif len(records) == warm:
                    base_kb = reset_peak_memory(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        wall = time.perf_counter() - start
        peak_kb = peak_memory_kb(device)
    finally:
        if daemon is not None:
            daemon.stop()
    heldout = heldout_loss(model, dataset, heldout_ids, rank, world, device)
    if per_step:
        steps_kb = [rec["mem_kb"] for rec in records]
        return {"records": records, "wall_s": wall, "optimizer_steps": optimizer_steps, "peak_kb": max(steps_kb),
                "peak_kb_after_warmup": max(steps_kb[warm:], default=None), "heldout_loss": heldout}
    return {"records": records, "wall_s": wall, "optimizer_steps": optimizer_steps,
            "peak_kb": max(0, peak_kb - base_kb) if len(records) >= warm else None, "heldout_loss": heldout}


def heldout_loss(model: MLLM, dataset: Any, ids: List[int], rank: int, world: int, device: torch.device) -> float:
    """Token-level mean cross-entropy over the held-out samples (each rank its share, all-reduced)."""
    sums = torch.zeros(2, dtype=torch.float64)
    mine = ids[rank::world]
    with torch.no_grad():
        for k in range(0, len(mine), 16):
            b = pad_collate([dataset[i] for i in mine[k:k + 16]])
            img = model.vision(b["pixel_patches"].to(device), b["pixel_counts"])
            aud = model.audio(b["audio_features"].to(device), b["audio_counts"])
            ce = model.llm_loss_sum(b["input_ids"].to(device), b["labels"].to(device), img, aud,
                                    b["attention_mask"].to(device))
            sums += torch.tensor([float(ce), float((b["labels"] != -100).sum())], dtype=torch.float64)
    dist.all_reduce(sums)
    return float(sums[0] / sums[1])


def split_ids(n: int, args: Any) -> Tuple[List[int], List[int]]:
    """(held-out ids, training ids): a seeded permutation of the n samples, the first --heldout held out."""
    ids = [int(i) for i in np.random.default_rng(args.seed + 1).permutation(n)]
    return ids[:args.heldout], ids[args.heldout:]


def rank_main(rank: int, world: int, args: Any, run_dir: str, out_path: str, parent: int) -> None:
    tiny_lm.die_with_parent(parent)
    torch.set_num_threads(1)
    if args.device == "cpu" and args.malloc == "fixed":
        fix_malloc_thresholds()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), ODB_RUN_DIR=run_dir)
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", init_method=f"file://{run_dir}/pg-init", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    if rank == 0:  # rank 0 synthesises the audio; the others then find it in the cache
        specs = mmd.prepare(args.samples + args.heldout, seed=args.seed, cache=args.cache)
    dist.barrier()
    if rank != 0:
        specs = mmd.prepare(args.samples + args.heldout, seed=args.seed, cache=args.cache)
    dataset = mmd.MixedModalDataset(specs)
    heldout_ids, train_ids = split_ids(len(specs), args)
    loss_tokens = [len(s.text.encode()) for s in specs]  # every text byte is a target (BOS/IMG/AUD are not)
    mean_loss = sum(loss_tokens[i] for i in train_ids) / len(train_ids)
    window_tokens = round(args.global_batch * mean_loss)
    job_tokens = sum(loss_tokens[i] for i in train_ids) * args.epochs
    results: Dict[str, Any] = {}
    for method in args.methods:
        r = train_method(method, rank, world, args, dataset, train_ids, heldout_ids, run_dir, device,
                         window_tokens, job_tokens)
        gathered: List[Any] = [None] * world
        dist.all_gather_object(gathered, r)
        results[method] = gathered
        if rank == 0 and not args.quiet:
            print(f"[{method}] done in {r['wall_s']:.1f} s", flush=True)
    if rank == 0:
        Path(out_path).write_text(json.dumps({"results": results, "window_tokens": window_tokens,
                                              "mix": mmd.mix_counts(specs)}))
    dist.barrier()
    dist.destroy_process_group()
    tiny_lm.exit_rank()


# ----- the summary -----------------------------------------------------------------------------
def summarize(per_rank: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One method's figures from its ranks' records (steps aligned by index)."""
    world = len(per_rank)
    n = max(len(r["records"]) for r in per_rank)
    totals = {p: [sum(rec["t"][p] for rec in r["records"]) for r in per_rank] for p in PHASES}
    sync = 0.0
    sync_by_phase = dict.fromkeys(PHASES, 0.0)
    for k in range(n):
        for p in PHASES:
            m = max(r["records"][k]["t"][p] if k < len(r["records"]) else 0.0 for r in per_rank)
            sync_by_phase[p] += m
            sync += m
    out: Dict[str, Any] = {"steps": n, "optimizer_steps": per_rank[0]["optimizer_steps"],
                           "sync_time_s": sync, "sync_by_phase_s": sync_by_phase,
                           "phase_total_s": {p: sum(v) / world for p, v in totals.items()},
                           "max_over_mean": {p: (max(v) / (sum(v) / world) if sum(v) > 0 else 1.0)
                                             for p, v in totals.items() if p in COMPUTE_PHASES},
                           "per_rank_s": totals}
    compute = sum(out["phase_total_s"][p] for p in COMPUTE_PHASES)
    out["encoder_share"] = (out["phase_total_s"]["vision"] + out["phase_total_s"]["audio"]) / compute if compute else 0
    wall = max(r["wall_s"] for r in per_rank)
    out["wall_s"] = wall
    tokens = sum(rec["tokens"] for r in per_rank for rec in r["records"])
    out["real_tokens_per_s"] = sum(rec["loss_tokens"] for r in per_rank for rec in r["records"]) / wall
    out["padded_tokens"] = tokens
    out["patches_per_s"] = sum(rec["patches"] for r in per_rank for rec in r["records"]) / wall
    out["frames_per_s"] = sum(rec["frames"] for r in per_rank for rec in r["records"]) / wall
    peaks = [r["peak_kb"] for r in per_rank if r["peak_kb"] is not None]
    out["peak_mem_mb"] = [p / 1024 for p in peaks]
    out["peak_mem_max_over_mean"] = (max(peaks) / (sum(peaks) / len(peaks))) if peaks and sum(peaks) else None
    warm = [r["peak_kb_after_warmup"] for r in per_rank if r.get("peak_kb_after_warmup") is not None]
    if len(warm) == len(per_rank) and sum(warm):  # the steps after the warm-up only (the figure before 2026-12-06)
        out["peak_mem_after_warmup_mb"] = [p / 1024 for p in warm]
        out["peak_mem_after_warmup_max_over_mean"] = max(warm) / (sum(warm) / len(warm))
    out["heldout_loss"] = per_rank[0]["heldout_loss"]
    if all("act" in rec for r in per_rank for rec in r["records"]):
        act = [max((sum(rec["act"].values()) for rec in r["records"]), default=0) for r in per_rank]
        out["act_peak_mb"] = [a / 2**20 for a in act]
        out["act_peak_max_over_mean"] = max(act) / (sum(act) / world) if sum(act) else None
    return out


def _features(units: Sequence[int]) -> List[float]:
    return [1.0, float(len(units)), float(sum(units)), float(sum(u * u for u in units))]


def fit_phase_costs(raw: Dict[str, Any], value: str = "t") -> Dict[str, List[float]]:
    """Per compute phase, a least-squares fit of a rank's step time (value "t"; "act": its
    activation bytes) on [1, items, sum(units), sum(units^2)] (units: patches, frames, tokens of
    each item), coefficients kept >= 0 (a term that fits negative is dropped and the rest refitted).
    The LLM's is fitted on the methods whose LLM is packed (PACKED_METHODS; a padded batch costs its
    longest sample times its size: another shape, fit_llm_step_time), or, in a run without them,
    on every method but Standard. Returns `per_step, per_item, per_unit, per_unit_sq` (seconds or bytes): the
    shape of balance::PhaseCost (alignment.vision_cost / audio_cost take per_item as per_sample;
    per_step changes no plan)."""
    fits = {}
    any_packed = any(m in PACKED_METHODS for m in raw["results"])
    for phase in COMPUTE_PHASES:
        xs, ys = [], []
        for method, per_rank in raw["results"].items():
            if phase == "llm" and (llm_pads(method) if any_packed else method == "standard"):
                continue
            for r in per_rank:
                for rec in r["records"]:
                    units = rec["items"].get(phase, [])
                    if units and value in rec:
                        xs.append(_features(units))
                        ys.append(rec[value][phase])
        coef = nonnegative_lstsq(np.array(xs), np.array(ys)) if len(xs) >= 8 else np.zeros(4)
        fits[phase] = [float(c) for c in coef]
    return fits


def bound_fractions(per_rank: List[Dict[str, Any]], fits: Dict[str, List[float]]) -> Dict[str, float]:
    """Per phase: sum over steps of the step's bound, max(largest item, mean over ranks), over the
    sum of the slowest rank's time (1.0 = every step at its bound). The mean is measured; the
    largest item's time is the fitted cost of that item alone."""
    return _bound_fractions(per_rank, fits, lambda record, phase, c, units: record["t"][phase])


def _bound_fractions(per_rank: List[Dict[str, Any]], fits: Dict[str, List[float]],
                     step_time: Any, item_time: Any = None) -> Dict[str, float]:
    """bound_fractions with each rank's time in a step and phase from `step_time(record, phase, fit,
    items)` (a rank without the step: 0) and an item's alone from `item_time(phase, units)`
    (default: item_cost under the phase's fit)."""
    item_time = item_time or (lambda phase, x: item_cost(fits[phase], x))
    out = {}
    n = max(len(r["records"]) for r in per_rank)
    for phase in COMPUTE_PHASES:
        c = fits[phase]
        bound = slowest = 0.0
        for k in range(n):
            records = [r["records"][k] if k < len(r["records"]) else None for r in per_rank]
            units = [rec["items"].get(phase, []) if rec is not None else [] for rec in records]
            ts = [step_time(rec, phase, c, u) if rec is not None else 0.0 for rec, u in zip(records, units)]
            largest = max((item_time(phase, x) for u in units for x in u), default=0.0)
            slowest += max(ts)
            bound += max(largest, sum(ts) / len(per_rank))
        out[phase] = bound / slowest if slowest else 1.0
    return out


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: a term that fits negative is dropped and the rest
    refitted (the columns are few and positive, so this is the active-set answer in practice)."""
    coef = np.zeros(x.shape[1])
    keep = list(range(x.shape[1]))
    while keep:
        c, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if (c >= 0).all():
            coef[keep] = c
            break
        keep.pop(int(np.argmin(c)))
    return coef


def fit_llm_step_time(raw: Dict[str, Any]) -> Optional[Dict[str, float]]:
    """The LLM's cost in the shape the daemon's planner balances (`grouping.step_time`, padded cost
    model): a rank's measured LLM time per step on [1, padded tokens, sum(len^2)], fitted on the padded odb
    methods' steps (their LLM batches are the daemon's padded groups), scaled so per_padded_token =
    1 (the planner's unit; only the ratios change a plan). None without odb steps."""
    xs, ys = [], []
    for method, per_rank in raw["results"].items():
        if not method.startswith("odb") or not llm_pads(method):
            continue
        for r in per_rank:
            for rec in r["records"]:
                lens = rec["items"].get("llm", [])
                if lens and rec.get("llm_padded"):
                    xs.append([1.0, float(rec["llm_padded"]), float(sum(n * n for n in lens))])
                    ys.append(rec["t"]["llm"])
    if len(xs) < 8:
        return None
    c = nonnegative_lstsq(np.array(xs), np.array(ys))
    if c[1] <= 0:
        return None
    return {"per_step": float(c[0] / c[1]), "per_padded_token": 1.0, "per_len_sq": float(c[2] / c[1]),
            "seconds_per_padded_token": float(c[1])}


def fit_llm_memory(raw: Dict[str, Any]) -> Optional[Dict[str, float]]:
    """The LLM's activation bytes of a rank's step on the padded batch's shape (n samples at the
    longest length L: [1, n, n L, n L^2]), fitted on the padded odb methods' steps: alignment.llm_memory's
    per_sample / per_unit / per_unit_sq (the daemon charges each sample at the rank's longest under
    cost_model padded). None without odb steps."""
    xs, ys = [], []
    for method, per_rank in raw["results"].items():
        if method.startswith("odb") and llm_pads(method):
            for r in per_rank:
                for rec in r["records"]:
                    lens = rec["items"].get("llm", [])
                    if lens and "act" in rec:
                        n, top = len(lens), max(lens)
                        xs.append([1.0, float(n), float(n * top), float(n * top * top)])
                        ys.append(rec["act"]["llm"])
    if len(xs) < 8:
        return None
    c = nonnegative_lstsq(np.array(xs), np.array(ys))
    return dict(zip(("per_step", "per_sample", "per_unit", "per_unit_sq"), (float(v) for v in c)))


def item_cost(c: Sequence[float], u: int) -> float:
    """One item of u units alone on a rank, under a fit from fit_phase_costs."""
    return c[0] + c[1] + c[2] * u + c[3] * u * u


def activation_bound(per_rank: List[Dict[str, Any]], fits: Dict[str, List[float]]) -> float:
    """A lower bound (bytes) on the largest per-rank activation peak any assignment of the run's
    steps could reach: per step max(the mean over ranks of the step's bytes, the largest single
    item's bytes under the activation fit), the maximum over steps. A rank that holds a 1024-patch
    icon holds at least that icon's activations, however the rest is placed."""
    bound = 0.0
    n = max(len(r["records"]) for r in per_rank)
    for k in range(n):
        recs = [r["records"][k] for r in per_rank if k < len(r["records"])]
        mean = sum(sum(rec["act"].values()) for rec in recs) / len(per_rank)
        largest = max((item_cost(fits[p], u) for rec in recs for p in COMPUTE_PHASES
                       for u in rec["items"].get(p, [])), default=0.0)
        bound = max(bound, mean, largest)
    return bound


def llm_pads(method: str) -> bool:
    """Whether the method's LLM runs padded batches (its cost follows the padded shape)."""
    return method not in PACKED_METHODS


def modelled_step_time(record: Dict[str, Any], phase: str, fits: Dict[str, List[float]],
                       padded_llm: Optional[Dict[str, float]] = None) -> float:
    """A rank's modelled time in one step and phase: its items through the phase's fit; with
    padded_llm (a fit_llm_step_time result) the LLM phase on its padded batch's shape."""
    u = record["items"].get(phase, [])
    if not u:
        return 0.0
    if phase == "llm" and padded_llm is not None:
        return padded_llm["seconds_per_padded_token"] * (padded_llm["per_step"] + record["llm_padded"] +
                                                         padded_llm["per_len_sq"] * sum(x * x for x in u))
    c = fits[phase]
    return c[0] + c[1] * len(u) + c[2] * sum(u) + c[3] * sum(x * x for x in u)


def modelled_bound_fractions(per_rank: List[Dict[str, Any]], fits: Dict[str, List[float]],
                             padded_llm: Optional[Dict[str, float]] = None) -> Dict[str, float]:
    """bound_fractions of the run's actual plans under the fitted costs (each rank's step time in a
    phase modelled from its items, the LLM's on the padded shape with padded_llm): how close the
    plans are to each phase's bound, free of the noise a loaded machine adds to measured per-step
    maxima."""
    return _bound_fractions(per_rank, fits, lambda record, phase, c, u: modelled_step_time(record, phase, fits,
                                                                                            padded_llm),
                            lambda phase, x: modelled_step_time({"items": {phase: [x]}, "llm_padded": x}, phase,
                                                                fits, padded_llm))


def modelled_sync_time(per_rank: List[Dict[str, Any]], fits: Dict[str, List[float]],
                       padded_llm: Optional[Dict[str, float]] = None) -> float:
    """The synchronous step time of the run's actual plans under the fitted costs: per step and
    compute phase the slowest rank's modelled time (modelled_step_time), summed. Free of the
    measurement noise a shared machine adds to every per-step maximum. padded_llm (a
    fit_llm_step_time result): the LLM phase on its padded batch's shape (the methods whose LLM
    pads)."""
    total = 0.0
    n = max(len(r["records"]) for r in per_rank)
    for k in range(n):
        for phase in COMPUTE_PHASES:
            total += max(modelled_step_time(r["records"][k], phase, fits, padded_llm) if k < len(r["records"])
                         else 0.0 for r in per_rank)
    return total


# Each per-phase method, with the LLM-only method of the same LLM layout.
PHASE_METHODS = {"odb_phases": "odb_llm", "odb_phases_packed": "odb_llm_packed"}


def report(raw: Dict[str, Any], world: int) -> Dict[str, Any]:
    summary: Dict[str, Any] = {m: summarize(rs) for m, rs in raw["results"].items()}
    fits = fit_phase_costs(raw)
    padded = fit_llm_step_time(raw)
    for m, rs in raw["results"].items():
        summary[m]["bound_fraction"] = bound_fractions(rs, fits)
        # A padded LLM on the padded fit (fitted on odb's padded steps); none without one.
        model = padded if llm_pads(m) else None
        ok = model is not None or not llm_pads(m)
        summary[m]["modelled_sync_time_s"] = modelled_sync_time(rs, fits, model) if ok else None
        summary[m]["modelled_bound_fraction"] = modelled_bound_fractions(rs, fits, model) if ok else None
        # The machine's speed during this method's run: its measured compute over the same steps priced
        # with the fit (1 = as fast as the run's methods on average; other jobs' load moves it).
        modelled = sum(modelled_step_time(rec, p, fits, model) for r in rs for rec in r["records"]
                       for p in COMPUTE_PHASES) if ok else 0.0
        measured = sum(rec["t"][p] for r in rs for rec in r["records"] for p in COMPUTE_PHASES)
        summary[m]["measured_over_modelled"] = measured / modelled if modelled else None
    summary["_fitted_phase_costs"] = {p: dict(zip(("per_step", "per_item", "per_unit", "per_unit_sq"), c))
                                      for p, c in fits.items()}
    summary["_fitted_llm_step_time"] = padded
    if all("act_peak_mb" in summary[m] for m in raw["results"]):
        act_fits = fit_phase_costs(raw, "act")
        for m, rs in raw["results"].items():
            bound = activation_bound(rs, act_fits)
            summary[m]["act_bound_mb"] = bound / 2**20
            summary[m]["act_peak_over_bound"] = max(summary[m]["act_peak_mb"]) * 2**20 / bound if bound else None
        summary["_fitted_llm_memory"] = fit_llm_memory(raw)
        summary["_fitted_activation_bytes"] = {p: dict(zip(("per_step", "per_item", "per_unit", "per_unit_sq"), c))
                                               for p, c in act_fits.items()}
    for method, llm_only in PHASE_METHODS.items():
        ph = summary.get(method)
        if not ph:
            continue
        # Speedups in synchronous step time (the run's sum), measured and modelled.
        for base, key in ((llm_only, "speedup_over_llm_only"), ("standard", "speedup_over_standard"),
                          ("standard_packed", "speedup_over_standard_packed")):
            if base in summary:
                ph[key] = summary[base]["sync_time_s"] / ph["sync_time_s"]
                if summary[base]["modelled_sync_time_s"] and ph["modelled_sync_time_s"]:
                    ph["modelled_" + key] = summary[base]["modelled_sync_time_s"] / ph["modelled_sync_time_s"]
    return summary


def table(summary: Dict[str, Any], world: int) -> str:
    head = (f"W={world}  method             sync s  vision m/m audio m/m llm m/m  enc%  bound v/a/l     "
            f"peakMB m/m  actMB m/m /bnd   tok/s  patch/s  opt  heldout")
    lines = [head]
    for m, s in summary.items():
        if m.startswith("_"):
            continue
        mm = s["max_over_mean"]
        pm = s["peak_mem_max_over_mean"]
        bf = s["bound_fraction"]
        lines.append(f"      {m:18s} {s['sync_time_s']:7.2f}  {mm['vision']:9.3f} {mm['audio']:9.3f} "
                     f"{mm['llm']:7.3f}  {100 * s['encoder_share']:4.0f}  "
                     f"{bf['vision']:.2f}/{bf['audio']:.2f}/{bf['llm']:.2f}  "
                     f"{max(s['peak_mem_mb'] or [0]):6.1f} {pm or 0:4.2f}  "
                     f"{max(s.get('act_peak_mb') or [0]):5.1f} {s.get('act_peak_max_over_mean') or 0:4.2f} "
                     f"{s.get('act_peak_over_bound') or 0:4.2f}  {s['real_tokens_per_s']:6.0f}  "
                     f"{s['patches_per_s']:7.0f}  {s['optimizer_steps']:3d}  {s['heldout_loss']:.4f}")
    for method in PHASE_METHODS:
        ph = summary.get(method, {})
        extra = [f"{k} {ph[k]:.2f}x" for k in ("speedup_over_llm_only", "speedup_over_standard",
                                                "speedup_over_standard_packed") if k in ph]
        if extra:
            lines.append(f"{method} synchronous step time: " + ", ".join(extra))
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=480, help="training samples (all ranks)")
    p.add_argument("--heldout", type=int, default=96)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--batch", type=int, default=8, help="Standard's micro-batch per rank (samples)")
    p.add_argument("--global-batch", type=int, default=32, help="optimizer batch in samples (odb: its loss tokens)")
    p.add_argument("--max-tokens", type=int, default=1024, help="odb's padded-token budget per rank and step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-batches", type=int, default=3, help="LR warmup, in optimizer batches of tokens")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vision-width", type=int, default=256)
    p.add_argument("--audio-width", type=int, default=128)
    p.add_argument("--enc-layers", type=int, default=3)
    p.add_argument("--workers", type=int, default=1, help="data workers per rank")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS), help=f"comma list of {', '.join(METHODS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--cache", default=None, help="audio cache (default $ODB_MM_CACHE or <tmp>/odb-mm-cache)")
    p.add_argument("--warmup-record-steps", type=int, default=3,
                   help="steps before the memory baseline (GPU; a CPU's per-step figure also reports the "
                        "steps after these: peak_mem_after_warmup_*)")
    p.add_argument("--phase-costs", default=None,
                   help="bench/phase_calibrate.py --json output: the daemons balance each encoder phase on "
                        "these fitted costs (alignment.vision_cost / audio_cost; default: the ones in "
                        "configs/multimodal_train.yaml)")
    p.add_argument("--no-memory-plan", dest="memory_plan", action="store_false",
                   help="odb_phases: place encoder items by time only (drop the config's alignment.*_memory)")
    p.add_argument("--no-phase-steps", dest="phase_steps", action="store_false",
                   help="odb_phases*: the round planner composes steps on the LLM's cost only (drop the "
                        "config's alignment.llm_cost_seconds: large images no longer gathered into shared steps)")
    p.add_argument("--memory-peak-round", nargs="?", const="on", choices=("on", "off"), default=None,
                   help="odb_phases*: alignment.memory_peak_round (the peak ratio judged over each planning "
                        "round's steps together instead of the per-step forecast): on (bare flag) or off; "
                        "default: configs/multimodal_train.yaml's (on)")
    p.add_argument("--memory-time-floor", type=float, default=None, metavar="F",
                   help="odb_phases*: alignment.memory_time_floor (the encoder time spent on memory kept as a "
                        "budget over the run: each encoder phase's slowest rank summed over the steps within "
                        "its bounds' sum / F; 0: memory_slack per step); default: configs/multimodal_train.yaml's")
    p.add_argument("--memory-llm-slack", type=float, default=None, metavar="S",
                   help="odb_phases*: alignment.memory_llm_slack (where the encoder caps cannot keep the round's "
                        "memory peaks within the ratio, LLM samples move off the highest peak's rank, each "
                        "receiving rank's LLM time within 1 + S of the step's slowest; 0: the round plan's LLM "
                        "layout); default: configs/multimodal_train.yaml's")
    p.add_argument("--llm-step-time", default=None, metavar="PER_STEP,PER_PADDED_TOKEN,PER_LEN_SQ",
                   help="the odb methods' grouping.step_time (the LLM's cost model the planner balances; "
                        "default: configs/multimodal_train.yaml's); a run's JSON fits it in "
                        "_fitted_llm_step_time")
    p.add_argument("--malloc", default="fixed", choices=("fixed", "dynamic"),
                   help="CPU ranks' glibc thresholds: fixed (default: allocations >= 128 KiB mapped and "
                        "unmapped, so VmHWM follows the bytes in use; fix_malloc_thresholds) or dynamic "
                        "(glibc's default: the heap keeps freed memory, VmHWM carries its history)")
    p.add_argument("--mem-trace", action="store_true",
                   help="CPU: record per step and phase the resident set's parts and glibc's heap figures "
                        "(records' \"mem\")")
    p.add_argument("--json", default=None, help="write the summary (and the raw per-rank records) here")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    import yaml

    alignment = yaml.safe_load(CONFIG.read_text())["alignment"]
    if args.memory_peak_round is None:  # the config's, recorded as the run's (bench/phase_replay.py reads it)
        args.memory_peak_round = bool(alignment.get("memory_peak_round"))
    else:
        args.memory_peak_round = args.memory_peak_round == "on"
    if args.memory_time_floor is None:  # likewise
        args.memory_time_floor = float(alignment.get("memory_time_floor", 0.0))
    if args.memory_llm_slack is None:  # likewise
        args.memory_llm_slack = float(alignment.get("memory_llm_slack", 0.0))
    args.methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in args.methods if m not in METHODS]
    if bad:
        p.error(f"unknown methods {bad}; choose from {METHODS}")
    return args


def summarize_file(path: str) -> Dict[str, Any]:
    """Recomputes the summary of a recorded run (--json with its per-step records)."""
    data = json.loads(Path(path).read_text())
    data["methods"] = report({"results": data["raw"]}, data["world_size"])
    return data


def run(args: argparse.Namespace, keep_raw: bool = False) -> Dict[str, Any]:
    """Runs every method on --world-size local ranks; returns the summary (and prints the table);
    keep_raw: also every rank's per-step records (``result["raw"][method][rank]``)."""
    run_dir = tempfile.mkdtemp(prefix="odbmm-")
    out_path = os.path.join(run_dir, "raw.json")
    try:
        mp.start_processes(rank_main, args=(args.world_size, args, run_dir, out_path, os.getpid()),
                           nprocs=args.world_size, start_method="spawn")
        raw = json.loads(Path(out_path).read_text())
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    summary = report(raw, args.world_size)
    result = {"world_size": args.world_size, "device": args.device, "mix": raw["mix"],
              "window_tokens": raw["window_tokens"], "args": {k: v for k, v in vars(args).items() if k != "json"},
              "methods": summary}
    if not args.quiet:
        print(table(summary, args.world_size))
    if args.json:  # the per-step records too: figures can be recomputed from the file
        Path(args.json).write_text(json.dumps({**result, "raw": raw["results"]}))
    if keep_raw:
        result["raw"] = raw["results"]
    return result


if __name__ == "__main__":
    run(parse_args())
