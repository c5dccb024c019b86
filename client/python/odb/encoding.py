"""Sample encoding: a sample dict to the (lengths, tensors) a Producer sends, a sample's
loss-bearing tokens, and a received delivery's frames back to torch tensors (dtype codes from the
extension's DTYPES)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ._native import native

# Sample keys that carry lengths, not tensors.
# The label value that counts no token, as odbd pads labels by default (collate.fields: labels, pad_value)
# and torch.nn.CrossEntropyLoss ignores; test_py_docs checks that it agrees with odbd's default.
IGNORE_INDEX = -100
# odbd's default collate.length_field: the tensor whose dim 0 is a sample's token length (the daemon tells its own).
LENGTH_FIELD = "input_ids"
_LENGTH_KEYS = ("tokens", "vision_patches", "audio_frames", "loss_tokens")


def _dtype_codes() -> Dict[str, int]:
    return dict(native().DTYPES)


def encode_sample(sample: Mapping[str, Any],
                  lengths_fn: Optional[Callable[[Mapping[str, Any]], Tuple[int, int, int]]] = None,
                  length_field: str = LENGTH_FIELD
                  ) -> Tuple[Tuple[int, int, int], List[Tuple[str, int, Tuple[int, ...], Any]]]:
    """Turns a sample dict into ((tokens, vision_patches, audio_frames), tensors).

    Values may be torch tensors, numpy arrays or lists. `length_field` (the
    daemon's collate.length_field, "input_ids" by default) is required and its
    dim 0 is the token length unless `lengths_fn` or an int "tokens" entry says
    otherwise; int "vision_patches" / "audio_frames" entries are lengths, not
    tensors.
    """
    if length_field not in sample:
        raise ValueError(f"an odb sample needs '{length_field}' (odbd's collate.length_field); "
                         f"got keys {sorted(sample)}")
    codes = _dtype_codes()
    tensors: List[Tuple[str, int, Tuple[int, ...], Any]] = []
    meta: Dict[str, int] = {}
    for name, value in sample.items():
        if name in _LENGTH_KEYS and isinstance(value, (int, np.integer)):
            meta[name] = int(value)
            continue
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            if t.dtype == torch.bfloat16:
                arr, code = t.view(torch.int16).numpy(), codes["bfloat16"]
            else:
                arr = t.numpy()
                code = codes.get(str(arr.dtype))
        else:
            arr = np.ascontiguousarray(np.asarray(value))
            code = codes.get(str(arr.dtype))
        if code is None:
            raise TypeError(f"sample field '{name}': dtype {arr.dtype} is not supported by odb")
        arr = np.ascontiguousarray(arr)
        tensors.append((name, code, tuple(arr.shape), arr))
    if lengths_fn is not None:
        lengths = tuple(int(x) for x in lengths_fn(sample))
        while len(lengths) < 3:
            lengths = lengths + (0,)
    else:
        ids = next((t for t in tensors if t[0] == length_field), None)
        if ids is None:
            raise ValueError(f"an odb sample's '{length_field}' (odbd's collate.length_field) must be a tensor "
                             f"whose dim 0 is its token length, not {type(sample[length_field]).__name__}")
        tokens = meta.get("tokens", ids[2][0] if ids[2] else 1)
        lengths = (int(tokens), meta.get("vision_patches", 0), meta.get("audio_frames", 0))
    return lengths, tensors  # type: ignore[return-value]


def sample_loss_tokens(sample: Mapping[str, Any], labels: Optional[str], ignore_index: int = IGNORE_INDEX) -> Optional[int]:
    """A sample's loss-bearing tokens: an int "loss_tokens" entry, else (``labels`` named) the positions of
    that tensor not equal to ``ignore_index`` (prompt-masked SFT), else None (every token bears loss)."""
    given = sample.get("loss_tokens")
    if isinstance(given, (int, np.integer)):
        return int(given)
    if labels is None:
        return None
    if labels not in sample:
        raise ValueError(f"loss_tokens_from={labels!r}: the sample has no such field (keys {sorted(sample)})")
    value = sample[labels]
    if isinstance(value, torch.Tensor):
        return int((value != ignore_index).sum().item())
    return int((np.asarray(value) != ignore_index).sum())


def _to_torch(delivery: Any) -> Dict[str, torch.Tensor]:
    codes = _dtype_codes()
    out: Dict[str, torch.Tensor] = {}
    for name, arr in delivery.arrays().items():
        t = torch.from_numpy(arr)
        if delivery.wire_dtype(name) == codes["bfloat16"]:
            t = t.view(torch.bfloat16)
        out[name] = t
    return out
