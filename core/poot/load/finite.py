"""Finiteness of checkpoint weights.

One NaN or infinity in a weight makes every answer NaN (sampling then picks an arbitrary token), and
a damaged or badly converted checkpoint is the usual cause. A load therefore reads each float tensor,
and each quantized block's float scales (a NaN scale makes its whole block NaN), and refuses the
first bad one by name. Quantized values themselves are small integers and cannot be NaN, so the
scales are the whole check for packed types; a type that declares no scales is not checked.
The scan reads every weight once, which a CPU run does anyway, in bounded chunks.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..errors import LoadError
from .tensor import LazyTensor

__all__ = ["first_nonfinite", "check_finite"]

_CHUNK = 1 << 24  # elements (or blocks) judged at a time: bounds the scan's temporary memory


def _bad_plain(x: np.ndarray, storage: str) -> np.ndarray:
    if storage == "bf16":  # raw bits: exponent all ones is infinity or NaN
        return (x & np.uint16(0x7F80)) == np.uint16(0x7F80)
    return ~np.isfinite(x)


def _bad_blocks(blocks: np.ndarray, scales: tuple[tuple[int, str], ...]) -> np.ndarray:
    bad = np.zeros(blocks.shape[0], bool)
    for off, kind in scales:
        if kind == "f16":
            bits = blocks[:, off].astype(np.uint16) | (blocks[:, off + 1].astype(np.uint16) << np.uint16(8))
            bad |= (bits & np.uint16(0x7C00)) == np.uint16(0x7C00)
        elif kind == "e8m0":
            bad |= blocks[:, off] == 0xFF  # E8M0's only NaN
        else:
            raise ValueError(f"unknown scale kind {kind!r}")
    return bad


def first_nonfinite(t: LazyTensor) -> int | None:
    """Index of ``t``'s first non-finite value (plain storage) or block (packed storage), or None."""
    raw = t.raw()
    if t.is_packed:
        from ..quant import quantization

        q = quantization(t.storage)
        if not q.scales:
            return None
        flat, step, judge = raw.reshape(-1, q.block_bytes), _CHUNK // 16, lambda c: _bad_blocks(c, q.scales)
    else:
        if raw.dtype.kind not in "fu" or (raw.dtype.kind == "u" and t.storage != "bf16"):
            return None
        flat, step, judge = raw.reshape(-1), _CHUNK, lambda c: _bad_plain(c, t.storage)
    for start in range(0, flat.shape[0], step):
        bad = judge(flat[start : start + step])
        if bad.any():
            return start + int(np.argmax(bad))
    return None


def check_finite(tensors: Iterable[LazyTensor], source: str) -> None:
    """Raise ``LoadError`` naming ``source`` and the first tensor holding a NaN or infinity."""
    for t in tensors:
        at = first_nonfinite(t)
        if at is not None:
            where = f"block {at} (a quantization scale)" if t.is_packed else f"element {at}"
            raise LoadError(
                source,
                f"tensor {t.name} holds NaN or infinity at {where}: the checkpoint is damaged or was converted badly; re-download or re-convert it",
            )
