"""Plain floats and ggml's first-generation 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), whose
quantizers match ggml's reference byte for byte; also the block and nibble helpers the other layouts share."""

from __future__ import annotations

import numpy as np

from .descriptor import Quantization

__all__ = [
    "BF16",
    "F16",
    "F32",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "f16_bytes",
    "join_nibbles",
    "read_f16",
    "reciprocal_or_zero",
    "split_blocks",
    "split_nibbles",
    "split_rows",
]


# -- shared helpers ---------------------------------------------------------------------------------


def split_blocks(raw: np.ndarray, name: str, block_bytes: int, block_size: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """Packed rows as ``[nblocks, block_bytes]``, and the shape of their dequantized values."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.ndim == 0 or raw.shape[-1] % block_bytes:
        n = raw.shape[-1] if raw.ndim else 0
        raise ValueError(f"{name}: a packed row of {n} bytes is not a whole number of {block_bytes}-byte blocks")
    return raw.reshape(-1, block_bytes), raw.shape[:-1] + (raw.shape[-1] // block_bytes * block_size,)


def split_rows(x: np.ndarray, name: str, block_size: int, block_bytes: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """Float rows as ``[nblocks, block_size]`` float32, and the shape of their packed bytes."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % block_size:
        n = x.shape[-1] if x.ndim else 0
        raise ValueError(f"{name}: row length {n} is not a multiple of the block size {block_size}")
    return x.reshape(-1, block_size), x.shape[:-1] + (x.shape[-1] // block_size * block_bytes,)


def read_f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The f16 field at byte ``offset`` of every block, as float32 ``[nblocks, 1]``."""
    return blocks[:, offset : offset + 2].copy().view(np.float16).astype(np.float32)


def f16_bytes(values: np.ndarray) -> np.ndarray:
    """float32 values ``[n]`` or ``[n, 1]`` rounded to f16, as ``[n, 2]`` little-endian bytes."""
    return values.astype("<f2").reshape(-1, 1).view(np.uint8)


def split_nibbles(packed: np.ndarray) -> np.ndarray:
    """``[..., n]`` bytes to ``[..., 2n]`` values: the low nibbles first, then the high nibbles."""
    return np.concatenate([packed & np.uint8(0x0F), packed >> np.uint8(4)], axis=-1)


def join_nibbles(q: np.ndarray) -> np.ndarray:
    """Inverse of :func:`split_nibbles` for values below 16 (higher bits are dropped)."""
    half = q.shape[-1] // 2
    return (q[..., :half] & np.uint8(0x0F)) | (q[..., half:] << np.uint8(4))


def reciprocal_or_zero(d: np.ndarray) -> np.ndarray:
    """1/d in float32, 0 where d is 0 (ggml's ``id = d ? 1.0f/d : 0.0f``)."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf: halves round away from zero (numpy's rint is half-to-even).

    Written as floor plus a comparison of the exact fraction, since ``floor(|x| + 0.5)`` rounds the
    sum up for the float just below 0.5.
    """
    a = np.abs(x)
    whole = np.floor(a)
    return np.copysign(whole + (a - whole >= np.float32(0.5)), x)


# -- plain float storage ----------------------------------------------------------------------------


def _plain(name: str, gguf_type: int, np_dtype: type) -> Quantization:
    size = np.dtype(np_dtype).itemsize

    def dequantize(raw: np.ndarray) -> np.ndarray:
        b, shape = split_blocks(raw, name, size, 1)
        return b.view(np_dtype).astype(np.float32).reshape(shape)

    def quantize(x: np.ndarray) -> np.ndarray:
        r, shape = split_rows(x, name, 1, size)
        return r.astype(np_dtype).view(np.uint8).reshape(shape)

    return Quantization(name, gguf_type, 1, size, dequantize, quantize)


def _dequantize_bf16(raw: np.ndarray) -> np.ndarray:
    b, shape = split_blocks(raw, "bf16", 2, 1)
    return (b.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(shape)


def _quantize_bf16(x: np.ndarray) -> np.ndarray:
    # ggml_compute_fp32_to_bf16: NaN keeps its sign and becomes quiet; others round to nearest even
    r, shape = split_rows(x, "bf16", 1, 2)
    bits = r.view(np.uint32)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    quiet = (bits >> np.uint32(16)) | np.uint32(64)
    return np.where(nan, quiet, rounded).astype(np.uint16).view(np.uint8).reshape(shape)


F32 = _plain("f32", 0, np.float32)
F16 = _plain("f16", 1, np.float16)
BF16 = Quantization("bf16", 30, 1, 2, _dequantize_bf16, _quantize_bf16)


# -- Q8_0 (block_q8_0): f16 d, 32 x int8; x = d * q ------------------------------------------------


def _dequantize_q8_0(raw: np.ndarray) -> np.ndarray:
    b, shape = split_blocks(raw, "q8_0", 34, 32)
    return (read_f16(b, 0) * b[:, 2:].view(np.int8).astype(np.float32)).reshape(shape)


def _quantize_q8_0(x: np.ndarray) -> np.ndarray:
    r, shape = split_rows(x, "q8_0", 32, 34)
    d = np.abs(r).max(axis=1, keepdims=True) / np.float32(127)
    out = np.empty((r.shape[0], 34), np.uint8)
    out[:, :2] = f16_bytes(d)
    out[:, 2:] = _roundf(r * reciprocal_or_zero(d)).astype(np.int8).view(np.uint8)
    return out.reshape(shape)


# -- Q4_0, Q4_1, Q5_0, Q5_1: 4- or 5-bit codes of 32 values --------------------------------------------
#
# Layout (block_q4_0 / block_q4_1 / block_q5_0 / block_q5_1): f16 d, [f16 m], [u32 qh: bit j is bit 4
# of code j], 16 bytes of nibbles (low nibbles hold codes 0..15, high nibbles codes 16..31).
# Symmetric types decode d * (code - 2^(bits-1)); the ones with a min decode d * code + m.


def _small_block(name: str, gguf_type: int, bits: int, with_min: bool) -> Quantization:
    levels = 1 << bits
    offset = 0 if with_min else levels // 2
    qh_at = 4 if with_min else 2  # the 5-bit high-bit plane follows the f16 field(s)
    qs_at = qh_at + (4 if bits == 5 else 0)
    block_bytes = qs_at + 16

    def dequantize(raw: np.ndarray) -> np.ndarray:
        b, shape = split_blocks(raw, name, block_bytes, 32)
        codes = split_nibbles(b[:, qs_at:])
        if bits == 5:
            codes |= np.unpackbits(b[:, qh_at:qs_at], axis=1, bitorder="little") << np.uint8(4)
        d = read_f16(b, 0)
        if with_min:
            return (d * codes.astype(np.float32) + read_f16(b, 2)).reshape(shape)
        return (d * (codes.astype(np.int8) - np.int8(offset)).astype(np.float32)).reshape(shape)

    def quantize(x: np.ndarray) -> np.ndarray:
        r, shape = split_rows(x, name, 32, block_bytes)
        out = np.empty((r.shape[0], block_bytes), np.uint8)
        if with_min:
            # the range [min, max] maps onto codes 0 .. levels-1
            lo = r.min(axis=1, keepdims=True)
            d = (r.max(axis=1, keepdims=True) - lo) / np.float32(levels - 1)
            scaled = (r - lo) * reciprocal_or_zero(d) + np.float32(0.5)
            out[:, 2:4] = f16_bytes(lo)
        else:
            # the value of largest magnitude, sign included, maps to the lowest code
            at = np.abs(r).argmax(axis=1)[:, None]
            d = np.take_along_axis(r, at, axis=1) / np.float32(-offset)
            scaled = r * reciprocal_or_zero(d) + np.float32(offset + 0.5)
        codes = np.minimum(np.trunc(scaled).astype(np.uint8), np.uint8(levels - 1))
        out[:, :2] = f16_bytes(d)
        if bits == 5:
            out[:, qh_at:qs_at] = np.packbits(codes >> np.uint8(4), axis=1, bitorder="little")
        out[:, qs_at:] = join_nibbles(codes)
        return out.reshape(shape)

    return Quantization(name, gguf_type, 32, block_bytes, dequantize, quantize, ((0, "f16"), (2, "f16")) if with_min else ((0, "f16"),))


Q4_0 = _small_block("q4_0", 2, 4, with_min=False)
Q4_1 = _small_block("q4_1", 3, 4, with_min=True)
Q5_0 = _small_block("q5_0", 6, 5, with_min=False)
Q5_1 = _small_block("q5_1", 7, 5, with_min=True)
Q8_0 = Quantization("q8_0", 8, 32, 34, _dequantize_q8_0, _quantize_q8_0, ((0, "f16"),))
