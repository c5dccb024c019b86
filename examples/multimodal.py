"""Multimodal example: text tokens plus a variable number of images per sample.

Each sample carries ``input_ids`` [L] and ``pixel_values`` [k, 3, 16, 16] with
k in 0..4 images; every image expands to 64 visual tokens (``vision_patches``).
odbd pads the text, concatenates the images of a step along dim 0 with
``pixel_values_offsets`` [B+1] (sample i's images are rows offsets[i]:offsets[i+1]),
and a vision-patch budget bounds every step next to the token budget.

Run: /usr/bin/python3 examples/multimodal.py   (after ./scripts/build.sh)
"""
from __future__ import annotations

import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client/python"))
import odb  # noqa: E402

PATCHES_PER_IMAGE = 64
MAX_TOKENS = 512
MAX_VISION_PATCHES = 256


class ImageTextDataset(torch.utils.data.Dataset):
    """Deterministic samples: image pixels encode (sample id, image index)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.lengths = rng.integers(8, 200, size=n)
        self.images = rng.integers(0, 5, size=n)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict:
        k = int(self.images[i])
        pixels = np.empty((k, 3, 16, 16), dtype=np.float32)
        for j in range(k):
            pixels[j] = i * 10 + j
        return {"input_ids": np.arange(int(self.lengths[i]), dtype=np.int64) % 1000,
                "pixel_values": pixels, "vision_patches": k * PATCHES_PER_IMAGE}


def daemon_config() -> dict:
    return {"grouping": {"max_tokens": MAX_TOKENS, "max_vision_patches": MAX_VISION_PATCHES},
            "collate": {"fields": [{"name": "pixel_values", "rule": "concat"}]}}


def run(n: int = 300, run_dir: Path | None = None) -> dict:
    """One epoch through a real odbd; checks every step and returns a summary."""
    run_dir = Path(run_dir or tempfile.mkdtemp(prefix="odbmm-"))
    ds = ImageTextDataset(n)
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=f"mm-{uuid.uuid4().hex[:8]}", config=daemon_config())
    seen, steps, images = [], 0, 0
    try:
        loader = odb.OdbDataLoader(ds, rank=0, world_size=1, run_dir=str(run_dir), num_workers=1)
        for step in loader:
            if step.idle:
                continue
            steps += 1
            pixels, offsets = step.batch["pixel_values"], step.batch["pixel_values_offsets"]
            assert offsets.shape[0] == len(step.sample_ids) + 1 and int(offsets[-1]) == pixels.shape[0]
            patches = 0
            for i, sid in enumerate(step.sample_ids):
                lo, hi = int(offsets[i]), int(offsets[i + 1])
                assert hi - lo == int(ds.images[sid]), (sid, hi - lo)
                for j in range(lo, hi):
                    assert torch.all(pixels[j] == sid * 10 + (j - lo)), (sid, j)
                patches += (hi - lo) * PATCHES_PER_IMAGE
            assert patches <= MAX_VISION_PATCHES, patches
            assert step.batch["input_ids"].numel() <= MAX_TOKENS
            images += pixels.shape[0]
            seen.extend(step.sample_ids)
    finally:
        daemon.stop()
    assert sorted(seen) == list(range(n)), "every sample exactly once"
    return {"samples": len(seen), "steps": steps, "images": images,
            "images_expected": int(ds.images.sum())}


if __name__ == "__main__":
    summary = run()
    print(f"multimodal: {summary['samples']} samples, {summary['images']} images in {summary['steps']} steps; "
          f"every step within {MAX_TOKENS} tokens and {MAX_VISION_PATCHES} vision patches")
