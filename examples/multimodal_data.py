"""A three-modality workload made only of data that ships in Debian packages.

Samples mix the modalities unevenly, as OrchMLLM (Zheng et al., 2025,
"OrchMLLM: Orchestrate Multimodal Data with Batch Post-Balancing to Accelerate
Multimodal Large Language Model Training") describes for real MLLM data:

* 30% text only: a chunk of a document from /usr/share/doc (README files),
  long-tailed in length;
* 25% image + caption: a PNG icon from /usr/share/icons (8 to 512 px), its
  caption made from the icon's name;
* 25% speech + transcript: espeak-ng speaking a real sentence from those
  documents, the sentence as the transcript;
* 20% image + speech + question: an icon, a spoken sentence, and a text that
  asks for both.

The data loading is real: the workers (``__getitem__``) decode the PNG with
PIL at its native resolution (capped at ``MAX_SIDE`` px, like an MLLM's
maximum pixels) into 8x8 patches, so an image's patch count follows its size,
and decode the cached WAV into log-spectrum frames (one per 512 samples at
22.05 kHz, ~23 ms), so a clip's frame count follows its length. Audio is
synthesised once by :func:`prepare` into a cache directory (espeak-ng is not
called from the workers), keyed by the sentence, so later runs reuse it.

Text is byte-level: token ids 0..255 are bytes, BOS / IMG / AUD are
specials; the IMG and AUD placeholders are where the LLM reads the encoders'
outputs (one row per image, one per clip). Labels are pre-shifted (position t
predicts token t+1) and ignore the placeholders, so ``loss_tokens`` counts the
text targets only.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import wave
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

ICON_ROOT = Path("/usr/share/icons")
DOC_ROOT = Path("/usr/share/doc")
PATCH = 8  # vision patch side (px); a patch is 3 * 8 * 8 = 192 values
PATCH_DIM = 3 * PATCH * PATCH
MAX_SIDE = 256  # larger icons are downscaled to this side (an MLLM's max resolution)
HOP = 512  # audio samples per frame (22.05 kHz: ~23 ms)
AUDIO_BANDS = 32  # log-spectrum bands per frame
BOS, IMG, AUD = 256, 257, 258
VOCAB = 259
MIX = (("text", 0.30), ("image", 0.25), ("speech", 0.25), ("image_speech", 0.20))
KINDS = tuple(k for k, _ in MIX)


def default_cache_dir() -> Path:
    """$ODB_MM_CACHE, else <tmp>/odb-mm-cache: where synthesised audio is kept between runs."""
    return Path(os.environ.get("ODB_MM_CACHE") or Path(tempfile.gettempdir()) / "odb-mm-cache")


def _read_text(path: Path) -> str:
    try:
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError):
        return ""
    return raw[:200_000].decode("utf-8", errors="replace")


def load_documents(limit: int = 400) -> List[str]:
    """README files of /usr/share/doc (plain or gzip), sorted by path, whitespace collapsed."""
    paths = sorted(p for p in DOC_ROOT.glob("*/README*") if p.is_file())[:limit]
    docs = []
    for p in paths:
        text = " ".join(_read_text(p).split())
        if len(text) >= 200:
            docs.append(text)
    if not docs:
        raise RuntimeError(f"no README documents under {DOC_ROOT}")
    return docs


def sentences_of(docs: Sequence[str], min_chars: int = 30, max_chars: int = 160) -> List[str]:
    """Sentence-like spans of the documents: split at '. ', mostly letters, within the length bounds."""
    out = []
    for doc in docs:
        for s in doc.split(". "):
            s = s.strip()
            letters = sum(c.isalpha() or c == " " for c in s)
            if min_chars <= len(s) <= max_chars and letters >= 0.85 * len(s) and s.isascii():
                out.append(s + ".")
    if not out:
        raise RuntimeError("no sentences found in the documents")
    return out


def list_icons() -> List[Path]:
    """Every PNG under /usr/share/icons, sorted (thousands, 8 to 512 px on Debian 12 with the default themes)."""
    icons = sorted(ICON_ROOT.rglob("*.png"))
    if not icons:
        raise RuntimeError(f"no PNG icons under {ICON_ROOT} (install adwaita-icon-theme / hicolor-icon-theme)")
    return icons


def caption_of(icon: Path) -> str:
    """The icon's name as words: 'document-save-as-symbolic.png' -> 'document save as'."""
    words = icon.stem.replace("_", "-").replace(".", "-").split("-")
    return " ".join(w for w in words if w and w != "symbolic") or "icon"


@dataclass(frozen=True)
class SampleSpec:
    """What a sample is made of (no decoded data): its kind, text, icon and audio file."""

    kind: str
    text: str
    icon: Optional[str] = None
    audio: Optional[str] = None  # cached WAV path
    transcript: Optional[str] = None


def audio_path(cache: Path, sentence: str) -> Path:
    return cache / "audio" / (hashlib.sha1(("espeak-ng:s160:" + sentence).encode()).hexdigest() + ".wav")


def _synthesise(args: Tuple[str, Path]) -> None:
    sentence, path = args
    if path.exists():
        return
    tmp = path.with_name(f"{path.stem}.{os.getpid()}-{threading.get_ident()}.tmp.wav")
    # The text on stdin: a sentence starting with '-' is not an option.
    subprocess.run(["espeak-ng", "-s", "160", "-w", str(tmp), "--stdin"], input=sentence.encode(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.replace(tmp, path)


def prepare(n: int, seed: int = 0, cache: Optional[Path] = None, jobs: int = 4) -> List[SampleSpec]:
    """The specs of `n` samples (deterministic in `seed`), synthesising the audio not in the cache yet."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed (scripts/install_deps.sh installs it)")
    cache = Path(cache or default_cache_dir())
    (cache / "audio").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    docs = load_documents()
    sentences = sentences_of(docs)
    icons = list_icons()
    kinds = rng.choice(len(MIX), size=n, p=[p for _, p in MIX])
    specs = []
    for k in kinds:
        kind = KINDS[k]
        icon = str(icons[rng.integers(len(icons))]) if "image" in kind else None
        sentence = sentences[rng.integers(len(sentences))] if "speech" in kind else None
        if kind == "text":
            doc = docs[rng.integers(len(docs))]
            length = int(np.clip(rng.lognormal(np.log(96), 0.8), 16, 384))
            start = int(rng.integers(0, max(1, len(doc) - length)))
            text = doc[start:start + length]
        else:
            caption, said = caption_of(Path(icon)) if icon else "", sentence or ""
            text = {"image": "a picture of " + caption, "speech": said,
                    "image_speech": "what is shown and said? " + caption + ": " + said}[kind]
        specs.append(SampleSpec(kind, text, icon, str(audio_path(cache, sentence)) if sentence else None, sentence))
    todo = sorted({(s.transcript or "", Path(s.audio)) for s in specs if s.audio and not Path(s.audio).exists()})
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(_synthesise, todo))
    return specs


def image_patches(path: str) -> np.ndarray:
    """The icon decoded at native resolution (longest side capped at MAX_SIDE), alpha over white,
    padded to a multiple of PATCH, as [patches, 3*PATCH*PATCH] float32 in [-1, 1]."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGBA")
        if max(im.size) > MAX_SIDE:
            scale = MAX_SIDE / max(im.size)
            im = im.resize((max(1, round(im.size[0] * scale)), max(1, round(im.size[1] * scale))),
                           Image.BILINEAR)
        white = Image.new("RGBA", im.size, (255, 255, 255, 255))
        rgb = np.asarray(Image.alpha_composite(white, im).convert("RGB"), dtype=np.float32)
    h, w = rgb.shape[:2]
    hp, wp = -(-h // PATCH), -(-w // PATCH)
    padded = np.full((hp * PATCH, wp * PATCH, 3), 255.0, dtype=np.float32)
    padded[:h, :w] = rgb
    patches = padded.reshape(hp, PATCH, wp, PATCH, 3).transpose(0, 2, 4, 1, 3).reshape(hp * wp, PATCH_DIM)
    return patches / 127.5 - 1.0


def audio_frames(path: str) -> np.ndarray:
    """The WAV decoded into [frames, AUDIO_BANDS] float32: log magnitude spectrum of each HOP-sample
    frame, averaged into AUDIO_BANDS bands."""
    with wave.open(path) as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16-bit PCM")
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
        if w.getnchannels() > 1:
            pcm = pcm.reshape(-1, w.getnchannels()).mean(axis=1)
    x = pcm.astype(np.float32) / 32768.0
    n = max(1, len(x) // HOP)
    windows = np.pad(x, (0, max(0, n * HOP - len(x))))[:n * HOP].reshape(n, HOP) * np.hanning(HOP).astype(np.float32)
    mag = np.abs(np.fft.rfft(windows, axis=1))[:, :HOP // 2]  # 256 bins
    bands = mag.reshape(n, AUDIO_BANDS, -1).mean(axis=2)
    return np.log1p(10.0 * bands).astype(np.float32)


def tokens_of(spec: SampleSpec) -> np.ndarray:
    """[BOS] [IMG]? [AUD]? text bytes."""
    head = [BOS] + ([IMG] if spec.icon else []) + ([AUD] if spec.audio else [])
    return np.array(head + list(spec.text.encode("utf-8")), dtype=np.int64)


def lengths_of(spec: SampleSpec) -> Tuple[int, int, int]:
    """(tokens, vision_patches, audio_frames) of a sample without decoding it (image size from the
    PNG header, frames from the WAV header): the same counts ``__getitem__`` produces."""
    patches = frames = 0
    if spec.icon:
        from PIL import Image

        with Image.open(spec.icon) as im:
            w, h = im.size
        if max(w, h) > MAX_SIDE:
            scale = MAX_SIDE / max(w, h)
            w, h = max(1, round(w * scale)), max(1, round(h * scale))
        patches = -(-h // PATCH) * -(-w // PATCH)
    if spec.audio:
        with wave.open(spec.audio) as wav:
            frames = max(1, wav.getnframes() // HOP)
    return len(tokens_of(spec)), patches, frames


class MixedModalDataset:
    """Map-style dataset over prepared specs; ``__getitem__`` decodes (runs in the loader's workers).

    A sample dict: ``input_ids`` [L], ``labels`` [L] (pre-shifted, -100 on the
    last position and where the next token is a placeholder), ``pixel_patches``
    [P, 192] (P = 0 without an image), ``audio_features`` [F, 32] (F = 0
    without audio), and the ints ``vision_patches`` = P, ``audio_frames`` = F,
    ``loss_tokens`` (the labels that count).
    """

    def __init__(self, specs: Sequence[SampleSpec]) -> None:
        self.specs = list(specs)

    def __len__(self) -> int:
        return len(self.specs)

    def __getitem__(self, i: int) -> Dict[str, object]:
        spec = self.specs[int(i)]
        ids = tokens_of(spec)
        labels = np.full_like(ids, -100)
        nxt = ids[1:]
        labels[:-1] = np.where(nxt < 256, nxt, -100)
        patches = image_patches(spec.icon) if spec.icon else np.zeros((0, PATCH_DIM), np.float32)
        frames = audio_frames(spec.audio) if spec.audio else np.zeros((0, AUDIO_BANDS), np.float32)
        return {"input_ids": ids, "labels": labels, "pixel_patches": patches, "audio_features": frames,
                "vision_patches": int(patches.shape[0]), "audio_frames": int(frames.shape[0]),
                "loss_tokens": int((labels != -100).sum())}


def mix_counts(specs: Sequence[SampleSpec]) -> Dict[str, int]:
    """How many samples of each kind."""
    return {k: sum(s.kind == k for s in specs) for k in KINDS}
