"""The loader's per-epoch progress line (samples, optimizer steps and micro-steps, idle steps,
tokens/s, padding and the trainer's data-wait share)."""
from __future__ import annotations

import time
from typing import Any


class Progress:
    """A progress line for one epoch of this rank: samples trained of the
    epoch's share (ETA by samples), steps, idle steps, real tokens/s and
    padding. With accumulation windows (optimizer.tokens_per_step) a window is
    one optimizer step of several micro-steps: the line counts both ("optimizer
    steps 8, micro-steps 9 (idle 1)"), never micro-steps as optimizer steps.
    Uses tqdm when it is installed, else a line on stderr at most every
    `every_s` seconds."""

    # The data-wait share is printed once the epoch has run this long: on a shorter one the
    # first step's wait (start-up) is all there is, and "99%" would say nothing.
    MIN_SHARE_S = 1.0

    def __init__(self, rank: int, epoch: int, total_samples: int, every_s: float = 5.0,
                 stream: Any = None) -> None:
        import sys

        self.rank, self.epoch, self.total = rank, epoch, total_samples
        self.every_s = every_s
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.monotonic()
        self.last = 0.0
        self.samples = self.steps = self.idle = self.real = self.padded = 0
        self.windows = 0  # optimizer steps (windows closed); counted when windowed is True
        self.windowed = False  # the daemon cuts accumulation windows (window_target > 0)
        self.wait_s = 0.0  # the trainer's time in next(loader): waiting on data
        self.bar: Any = None
        try:
            from tqdm import tqdm  # type: ignore[import-not-found]

            if stream is None:
                self.bar = tqdm(total=total_samples, unit="sample", desc=f"odb rank {rank} epoch {epoch}")
        except ImportError:
            pass

    def update(self, samples: int, real_tokens: int, padded_tokens: int, idle: bool, wait_s: float = 0.0,
                 closes_window: bool = True, windowed: bool = False) -> None:
        """One micro-step; `closes_window`: it ends an optimizer step; `windowed`: the daemon
        cuts accumulation windows (else every step is an optimizer step)."""
        self.steps += 1
        self.windowed = self.windowed or windowed
        self.windows += int(closes_window)
        self.wait_s += wait_s
        self.idle += int(idle)
        self.samples += samples
        self.real += real_tokens
        self.padded += padded_tokens
        if self.bar is not None:
            self.bar.update(samples)
            self.bar.set_postfix_str(self.text(short=True), refresh=False)
            return
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            print(self.text(), file=self.stream, flush=True)

    def text(self, short: bool = False) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.samples / elapsed
        left = max(self.total - self.samples, 0)
        eta = f"{left / rate:.0f}s" if rate > 0 else "?"
        padding = 100.0 * (1 - self.real / self.padded) if self.padded else 0.0
        steps = (f"optimizer steps {self.windows}, micro-steps {self.steps} (idle {self.idle})" if self.windowed
                 else f"steps {self.steps} (idle {self.idle})")
        wait = (f"{100.0 * min(self.wait_s / elapsed, 1.0):.0f}% ({self.wait_s:.1f}s)" if elapsed >= self.MIN_SHARE_S
                else f"{self.wait_s:.1f}s")
        body = f"{steps}, {self.real / elapsed:.0f} real tok/s, padding {padding:.1f}%, data wait {wait}"
        if short:
            return body
        return (f"[odb rank {self.rank} epoch {self.epoch}] samples {self.samples}/{self.total}, {body}, "
                f"ETA {eta}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.steps:
            print(self.text() + " (epoch done)", file=self.stream, flush=True)
