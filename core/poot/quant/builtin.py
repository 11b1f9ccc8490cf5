"""The core's own quantizations, registered through the same hook a plugin would use.

Block layouts follow ggml's (ggml-common.h): every block starts with its f16 scale(s), then the
packed quants. Quantizers follow ggml's reference rounding so results match it bit for bit.
"""

from __future__ import annotations

import numpy as np

from ..hookspecs import hookimpl
from .descriptor import Quantization

__all__ = ["poot_quantizations"]


def _blocks(raw: np.ndarray, block_bytes: int) -> tuple[np.ndarray, tuple[int, ...]]:
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.shape[-1] % block_bytes:
        raise ValueError(f"row of {raw.shape[-1]} bytes is not whole blocks of {block_bytes}")
    return raw.reshape(-1, block_bytes), raw.shape[:-1]


def _rows(x: np.ndarray, block_size: int) -> tuple[np.ndarray, tuple[int, ...]]:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[-1] % block_size:
        raise ValueError(f"row of {x.shape[-1]} values is not whole blocks of {block_size}")
    return x.reshape(-1, block_size), x.shape[:-1]


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: halves round away from zero (numpy's round is half-to-even)."""
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


# -- plain float storage ----------------------------------------------------------------------------


def _plain(name: str, gguf_type: int, np_dtype: type) -> Quantization:
    size = np.dtype(np_dtype).itemsize

    def deq(raw: np.ndarray) -> np.ndarray:
        b, lead = _blocks(raw, size)
        return b.view(np_dtype).astype(np.float32).reshape(*lead, -1)

    def quant(x: np.ndarray) -> np.ndarray:
        r, lead = _rows(x, 1)
        return r.astype(np_dtype).view(np.uint8).reshape(*lead, -1)

    return Quantization(name, gguf_type, 1, size, deq, quant)


def _deq_bf16(raw: np.ndarray) -> np.ndarray:
    b, lead = _blocks(raw, 2)
    return (b.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(*lead, -1)


def _quant_bf16(x: np.ndarray) -> np.ndarray:
    # ggml_compute_fp32_to_bf16: NaN keeps its sign and becomes quiet; others round to nearest even
    r, lead = _rows(x, 1)
    bits = r.view(np.uint32)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    quiet = (bits >> np.uint32(16)) | np.uint32(64)
    out = np.where(nan, quiet, rounded).astype(np.uint16)
    return out.view(np.uint8).reshape(*lead, -1)


# -- Q8_0: block of 32, f16 scale d, 32 x int8; x = d * q ---------------------------------------------


def _deq_q8_0(raw: np.ndarray) -> np.ndarray:
    b, lead = _blocks(raw, 34)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    q = b[:, 2:].view(np.int8).astype(np.float32)
    return (d * q).reshape(*lead, -1)


def _quant_q8_0(x: np.ndarray) -> np.ndarray:
    r, lead = _rows(x, 32)
    d = np.abs(r).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
    q = _round_half_away(r * inv).astype(np.int8)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(*lead, -1)


# -- Q4_0: block of 32, f16 scale d, 16 bytes of nibbles (low nibbles = first 16 values) -------------


def _deq_q4_0(raw: np.ndarray) -> np.ndarray:
    b, lead = _blocks(raw, 18)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    qs = b[:, 2:]
    q = np.concatenate([qs & np.uint8(0xF), qs >> np.uint8(4)], axis=1).astype(np.float32) - np.float32(8)
    return (d * q).reshape(*lead, -1)


def _quant_q4_0(x: np.ndarray) -> np.ndarray:
    r, lead = _rows(x, 32)
    # the scale maps the value of largest magnitude (with its sign) to -8
    at = np.abs(r).argmax(axis=1)[:, None]
    d = np.take_along_axis(r, at, axis=1) / np.float32(-8)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
    q = np.clip(np.trunc(r * inv + np.float32(8.5)).astype(np.uint8), 0, 15)
    packed_q = q[:, :16] | (q[:, 16:] << np.uint8(4))
    out = np.concatenate([d.astype(np.float16).view(np.uint8), packed_q], axis=1)
    return out.reshape(*lead, -1)


BUILTIN: tuple[Quantization, ...] = (
    _plain("f32", 0, np.float32),
    _plain("f16", 1, np.float16),
    Quantization("bf16", 30, 1, 2, _deq_bf16, _quant_bf16),
    Quantization("q4_0", 2, 32, 18, _deq_q4_0, _quant_q4_0),
    Quantization("q8_0", 8, 32, 34, _deq_q8_0, _quant_q8_0),
)


@hookimpl
def poot_quantizations() -> list[Quantization]:
    return list(BUILTIN)
