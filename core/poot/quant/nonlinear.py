"""The lookup-table types IQ4_NL, IQ4_XS and MXFP4, whose 4-bit codes index a fixed non-uniform grid
scaled per block. Dequantizers and the MXFP4 quantizer match ggml bit for bit; the IQ4 quantizers,
which gguf lacks, search candidate scales as ggml's reference does."""

from __future__ import annotations

import numpy as np

from .descriptor import Quantization
from .kquants import QK_K, fit_scale, signed_absmax
from .legacy import f16_bytes, join_nibbles, read_f16, reciprocal_or_zero, split_blocks, split_nibbles, split_rows

__all__ = ["IQ4_NL", "IQ4_XS", "MXFP4"]

# kvalues_iq4nl in ggml-common.h
_IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
# midpoints between neighbours: a value's nearest grid point is found by binary search among them
_IQ4_EDGES = (_IQ4_GRID[1:] + _IQ4_GRID[:-1]) / np.float32(2)


def _nearest_iq4(v: np.ndarray) -> np.ndarray:
    return np.searchsorted(_IQ4_EDGES, v).astype(np.uint8)


def _snap_iq4(v: np.ndarray) -> np.ndarray:
    return _IQ4_GRID[_nearest_iq4(v)]


def _fit_iq4(x: np.ndarray) -> np.ndarray:
    """Scale (``[..., 1]``) of each group of values in ``x`` for the IQ4 grid.

    As in ggml's quantize_row_iq4_nl_impl: the value of largest magnitude first maps to the grid's
    largest positive point, then to the most negative one (-127) and 7 points either side of it;
    errors are weighted by x², which favours the large values that dominate a matmul.
    """
    inv_max = reciprocal_or_zero(signed_absmax(x))
    low = int(_IQ4_GRID[0])
    candidates = [np.float32(-low) * inv_max] + [np.float32(t + low) * inv_max for t in range(-7, 8)]
    return fit_scale(x, x * x, _snap_iq4, candidates)


# -- IQ4_NL (block_iq4_nl): f16 d, qs[16] (low nibbles are codes 0..15, high 16..31); x = d * grid[q] ----


def _dequantize_iq4_nl(raw: np.ndarray) -> np.ndarray:
    b, shape = split_blocks(raw, "iq4_nl", 18, 32)
    return (read_f16(b, 0) * _IQ4_GRID[split_nibbles(b[:, 2:])]).reshape(shape)


def _quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    r, shape = split_rows(x, "iq4_nl", 32, 18)
    d = _fit_iq4(r).astype(np.float16)
    out = np.empty((r.shape[0], 18), np.uint8)
    out[:, :2] = f16_bytes(d)
    out[:, 2:] = join_nibbles(_nearest_iq4(r * reciprocal_or_zero(d.astype(np.float32))))
    return out.reshape(shape)


# -- IQ4_XS (block_iq4_xs): f16 d, u16 scales_h, scales_l[4], qs[128] -----------------------------------
# 8 sub-blocks of 32, x = d * (ls - 32) * grid[q]; ls is 6 bits: its low nibble in scales_l (sub-block
# 2j in the low nibble of byte j, 2j+1 in the high), its top 2 bits at bit 2i of scales_h


def _dequantize_iq4_xs(raw: np.ndarray) -> np.ndarray:
    b, shape = split_blocks(raw, "iq4_xs", 136, QK_K)
    n = b.shape[0]
    low = np.stack([b[:, 4:8] & np.uint8(0x0F), b[:, 4:8] >> np.uint8(4)], axis=2).reshape(n, 8)
    high = (b[:, 2:4].copy().view("<u2") >> np.arange(0, 16, 2, dtype=np.uint16)) & np.uint16(3)
    ls = (low | (high.astype(np.uint8) << np.uint8(4))).astype(np.int8) - np.int8(32)
    dl = (read_f16(b, 0) * ls.astype(np.float32))[:, :, None]
    q = split_nibbles(b[:, 8:].reshape(n, 8, 16))
    return (dl * _IQ4_GRID[q]).reshape(shape)


def _quantize_iq4_xs(x: np.ndarray) -> np.ndarray:
    r, shape = split_rows(x, "iq4_xs", QK_K, 136)
    n = r.shape[0]
    g = r.reshape(n, 8, 32)
    scales = _fit_iq4(g)[..., 0]
    # the sub-block scale of largest magnitude becomes -32 steps of the f16 super-block scale
    d = (signed_absmax(scales) / np.float32(-32)).astype(np.float16)
    ls = np.clip(np.rint(scales * reciprocal_or_zero(d.astype(np.float32))), -32, 31)
    dl = (d.astype(np.float32) * ls)[:, :, None]
    q = _nearest_iq4(g * reciprocal_or_zero(dl))
    stored = (ls + 32).astype(np.uint16)
    out = np.empty((n, 136), np.uint8)
    out[:, 0:2] = f16_bytes(d)
    high = ((stored >> np.uint16(4)) << np.arange(0, 16, 2, dtype=np.uint16)).sum(axis=1, dtype=np.uint16)
    out[:, 2:4] = high.astype("<u2").reshape(n, 1).view(np.uint8)
    out[:, 4:8] = (stored[:, 0::2] & np.uint16(0x0F)) | (stored[:, 1::2] & np.uint16(0x0F)) << np.uint16(4)
    out[:, 8:] = join_nibbles(q).reshape(n, 128)
    return out.reshape(shape)


# -- MXFP4 (block_mxfp4): E8M0 exponent e, qs[16] (low nibbles codes 0..15, high 16..31) ---------------
# x = 2^(e-128) * fp4[q]: the grid holds E2M1 values doubled (so integers), hence the extra halving

_FP4_GRID = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)


def _half_e8m0(e: np.ndarray) -> np.ndarray:
    """2^(e - 127) / 2 as float32: exact, and subnormal for e < 2."""
    return np.ldexp(np.float32(1), e.astype(np.int32) - 128).astype(np.float32)


def _dequantize_mxfp4(raw: np.ndarray) -> np.ndarray:
    b, shape = split_blocks(raw, "mxfp4", 17, 32)
    return (_half_e8m0(b[:, :1]) * _FP4_GRID[split_nibbles(b[:, 1:])]).reshape(shape)


def _quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    # ggml's quantize_row_mxfp4_ref: the shared exponent is floor(log2(amax)) - 2, so the largest
    # magnitude lands in [4, 8) units (E2M1 reaches 6); each value then takes the nearest grid point,
    # the first one on ties
    r, shape = split_rows(x, "mxfp4", 32, 17)
    amax = np.abs(r).max(axis=1, keepdims=True)
    exponent = np.floor(np.log2(np.where(amax > 0, amax, np.float32(1)))) + np.float32(125)
    e = np.where(amax > 0, np.clip(exponent, 0, 255), 0).astype(np.uint8)
    d = _half_e8m0(e)
    best = np.zeros(r.shape, np.uint8)
    best_err = np.abs(d * _FP4_GRID[0] - r)
    for code in range(1, 16):
        err = np.abs(d * _FP4_GRID[code] - r)
        closer = err < best_err
        best[closer] = code
        best_err = np.where(closer, err, best_err)
    out = np.empty((r.shape[0], 17), np.uint8)
    out[:, :1] = e
    out[:, 1:] = join_nibbles(best)
    return out.reshape(shape)


IQ4_NL = Quantization("iq4_nl", 20, 32, 18, _dequantize_iq4_nl, _quantize_iq4_nl, ((0, "f16"),))
IQ4_XS = Quantization("iq4_xs", 23, QK_K, 136, _dequantize_iq4_xs, _quantize_iq4_xs, ((0, "f16"),))
MXFP4 = Quantization("mxfp4", 39, 32, 17, _dequantize_mxfp4, _quantize_mxfp4, ((0, "e8m0"),))
