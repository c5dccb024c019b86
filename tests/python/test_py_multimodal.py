"""The multimodal example end to end: images concatenated with offsets, vision budget per step."""
from __future__ import annotations

import multimodal


def test_multimodal_example_epoch(run_dir) -> None:
    summary = multimodal.run(n=200, run_dir=run_dir)
    assert summary["samples"] == 200
    assert summary["images"] == summary["images_expected"] > 0
    # The vision budget (256 patches = 4 images) forces more steps than text alone would.
    assert summary["steps"] >= summary["images_expected"] // 4
