"""The k-quants Q2_K .. Q6_K: 256-value super-blocks whose sub-block scales (and mins) are quantized
against f16 super-block scales. Dequantizers match ggml bit for bit; gguf has no k-quant quantizer,
so the quantizers are our own, after ggml's reference ones (a scale search per sub-block)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from .descriptor import Quantization
from .legacy import f16_bytes, join_nibbles, read_f16, reciprocal_or_zero, split_blocks, split_nibbles, split_rows

__all__ = ["QK_K", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "fit_scale", "fit_scale_min", "signed_absmax"]

QK_K = 256


# -- bit planes -------------------------------------------------------------------------------------

_CRUMB_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)


def _split_crumbs(packed: np.ndarray) -> np.ndarray:
    """2-bit fields: byte ``32c + l`` holds values ``128c + 32s + l`` at bit ``2s`` (s = 0..3)."""
    n = packed.shape[0]
    return ((packed.reshape(n, -1, 1, 32) >> _CRUMB_SHIFTS) & np.uint8(3)).reshape(n, -1)


def _join_crumbs(q: np.ndarray) -> np.ndarray:
    n = q.shape[0]
    return np.bitwise_or.reduce(q.reshape(n, -1, 4, 32) << _CRUMB_SHIFTS, axis=2).reshape(n, -1)


def _split_bits(packed: np.ndarray) -> np.ndarray:
    """One bit per value: bit ``j`` of byte ``l`` (of 32) belongs to value ``32j + l``."""
    n = packed.shape[0]
    bits = np.unpackbits(packed, axis=1, bitorder="little").reshape(n, 32, 8)
    return bits.transpose(0, 2, 1).reshape(n, QK_K)


def _join_bits(q: np.ndarray) -> np.ndarray:
    n = q.shape[0]
    planes = np.ascontiguousarray((q & np.uint8(1)).reshape(n, 8, 32).transpose(0, 2, 1))
    return np.packbits(planes, axis=2, bitorder="little").reshape(n, 32)


def _split_nibble_chunks(packed: np.ndarray, chunk: int) -> np.ndarray:
    """Nibbles in runs of ``chunk`` bytes: low nibbles give the run's first values, high the next."""
    n = packed.shape[0]
    return split_nibbles(packed.reshape(n, -1, chunk)).reshape(n, -1)


def _join_nibble_chunks(q: np.ndarray, chunk: int) -> np.ndarray:
    n = q.shape[0]
    return join_nibbles(q.reshape(n, -1, 2 * chunk)).reshape(n, -1)


# -- 6-bit scale packings ---------------------------------------------------------------------------


def _split_scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 8 six-bit scales and 8 six-bit mins in 12 bytes (ggml's get_scale_min_k4).

    Bytes 0-3 and 4-7 hold scales/mins 0-3 in their low 6 bits; bytes 8-11 hold the low nibbles of
    scales/mins 4-7, whose top 2 bits sit in the spare top bits of bytes 0-3 / 4-7.
    """
    a, b, c = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    top = np.uint8(0x3F)
    sc = np.concatenate([a & top, (c & np.uint8(0x0F)) | ((a >> np.uint8(6)) << np.uint8(4))], axis=1)
    mn = np.concatenate([b & top, (c >> np.uint8(4)) | ((b >> np.uint8(6)) << np.uint8(4))], axis=1)
    return sc, mn


def _join_scale_min_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    hi_sc, hi_mn = sc[:, 4:], mn[:, 4:]
    return np.concatenate(
        [
            sc[:, :4] | ((hi_sc >> np.uint8(4)) << np.uint8(6)),
            mn[:, :4] | ((hi_mn >> np.uint8(4)) << np.uint8(6)),
            (hi_sc & np.uint8(0x0F)) | (hi_mn << np.uint8(4)),
        ],
        axis=1,
    )


def _split_scales_q3(s: np.ndarray) -> np.ndarray:
    """Q3_K: 16 six-bit scales in 12 bytes. Bytes 0-7 hold the low nibbles of scales 0-7 (low half)
    and 8-15 (high half); bits 2i..2i+1 of byte 8+k are the top bits of scale 4i+k."""
    n = s.shape[0]
    low = split_nibbles(s[:, :8])
    high = (s[:, 8:12].reshape(n, 1, 4) >> _CRUMB_SHIFTS.reshape(1, 4, 1)) & np.uint8(3)
    return low | (high.reshape(n, 16) << np.uint8(4))


def _join_scales_q3(sc: np.ndarray) -> np.ndarray:
    n = sc.shape[0]
    high = (sc >> np.uint8(4)).reshape(n, 4, 4) << _CRUMB_SHIFTS.reshape(1, 4, 1)
    return np.concatenate([join_nibbles(sc), np.bitwise_or.reduce(high, axis=1)], axis=1)


# -- scale search -----------------------------------------------------------------------------------


def _total(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis (the values of one sub-block), kept as a length-1 axis."""
    return a.sum(axis=-1, keepdims=True, dtype=np.float32)


def signed_absmax(x: np.ndarray) -> np.ndarray:
    """The value of largest magnitude along the last axis, sign kept, with that axis kept as 1."""
    return np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1)


def fit_scale(x: np.ndarray, w: np.ndarray, snap: Callable[[np.ndarray], np.ndarray], inv_scales: Iterable[np.ndarray]) -> np.ndarray:
    """The scale ``d`` (``[..., 1]``) that best fits ``x ≈ d * snap(x * inv)`` over candidate ``inv``.

    For fixed levels ``l`` the weighted least-squares scale is ``Σwlx / Σwl²``, which lowers the
    squared error by ``(Σwlx)² / Σwl²``; the candidate that lowers it most wins.
    """
    best_gain = np.zeros(x.shape[:-1] + (1,), np.float32)
    best = np.zeros_like(best_gain)
    for inv in inv_scales:
        l = snap(x * inv)
        wl = w * l
        sxl, sl2 = _total(wl * x), _total(wl * l)
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = np.where(sl2 > 0, sxl * sxl / sl2, np.float32(0))
            better = gain > best_gain
            best = np.where(better, sxl / sl2, best)
        best_gain = np.where(better, gain, best_gain)
    return best


def _uniform(lo: int, hi: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda v: np.clip(np.rint(v), lo, hi)


def _fit_symmetric(x: np.ndarray, w: np.ndarray, nmax: int) -> np.ndarray:
    """Scale for levels ``-nmax .. nmax-1`` (ggml's make_qx_quants): the largest value goes to
    ``-nmax``, the extra negative level, and to 9 points either side of it 0.1 levels apart."""
    inv_max = reciprocal_or_zero(signed_absmax(x))
    candidates = (np.float32(-(nmax + 0.1 * i)) * inv_max for i in range(-9, 10))
    return fit_scale(x, w, _uniform(-nmax, nmax - 1), candidates)


def fit_scale_min(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """Scale ``d`` and min ``m >= 0`` (both ``[..., 1]``) fitting ``x ≈ d * l - m``, ``l`` in 0..nmax.

    ggml's make_qkx2_quants: the range [min(x, 0), max(x)] is stretched over ``nmax + rmin + k*rdelta``
    levels for k = 0..nstep; for each set of levels, scale and min are solved by weighted least squares
    (the min clamped at zero), and the pair with the smallest weighted squared error is kept.
    """
    lo = np.minimum(x.min(axis=-1, keepdims=True), np.float32(0))
    inv_span = reciprocal_or_zero(x.max(axis=-1, keepdims=True) - lo)
    shifted = x - lo
    sw, swx = _total(w), _total(w * x)

    def error(d: np.ndarray, m: np.ndarray, l: np.ndarray) -> np.ndarray:
        diff = d * l + m - x
        return _total(w * diff * diff)

    best_l = np.clip(np.rint(np.float32(nmax) * inv_span * shifted), 0, nmax)
    best_d, best_m = reciprocal_or_zero(inv_span) / np.float32(nmax), lo
    best_err = error(best_d, best_m, best_l)
    for k in range(nstep + 1):
        l = np.clip(np.rint(np.float32(rmin + rdelta * k + nmax) * inv_span * shifted), 0, nmax)
        wl = w * l
        sl, sl2, sxl = _total(wl), _total(wl * l), _total(wl * x)
        det = sw * sl2 - sl * sl
        with np.errstate(divide="ignore", invalid="ignore"):
            d = (sw * sxl - swx * sl) / det
            m = (sl2 * swx - sl * sxl) / det
            positive = m > 0  # the layout only subtracts a min: refit the scale alone
            d = np.where(positive, sxl / sl2, d)
        solved = det > 0
        d = np.where(solved, d, np.float32(0))
        m = np.where(solved & ~positive, m, np.float32(0))
        err = error(d, m, l)
        better = solved & (err < best_err)
        best_d, best_m = np.where(better, d, best_d), np.where(better, m, best_m)
        best_err = np.where(better, err, best_err)
    return best_d, -best_m


def _to_codes(x: np.ndarray, d: np.ndarray, m: np.ndarray | None, lo: int, hi: int) -> np.ndarray:
    """Levels of ``x`` under the stored (already rounded) sub-block scale ``d`` and min ``m``."""
    v = x if m is None else x + m
    return np.clip(np.rint(v * reciprocal_or_zero(d)), lo, hi)


def _rms_weights(g: np.ndarray) -> np.ndarray:
    """ggml's Q4_K/Q5_K weights: |x| plus the super-block's RMS, so small values still count."""
    rms = np.sqrt((g * g).mean(axis=(1, 2), keepdims=True, dtype=np.float32))
    return rms + np.abs(g)


def _super_scale(s: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative sub-block values ``s`` as integers 0..top against one f16 scale: (codes, stored scale)."""
    peak = s.max(axis=1, keepdims=True)
    codes = np.clip(np.rint(s * (np.float32(top) * reciprocal_or_zero(peak))), 0, top).astype(np.uint8)
    return codes, peak / np.float32(top)


def _signed_super_scale(s: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Signed sub-block scales as integers lo..hi; the largest in magnitude maps to ``lo``."""
    peak = signed_absmax(s)
    inv = np.float32(lo) * reciprocal_or_zero(peak)
    return np.clip(np.rint(s * inv), lo, hi).astype(np.int8), reciprocal_or_zero(inv)


# -- Q2_K (block_q2_K): scales[16] (low nibble scale, high nibble min), qs[64], f16 d, f16 dmin ------
# x = d * sc * q - dmin * m per 16 values, q in 0..3


def _dequantize_q2_k(raw: np.ndarray) -> np.ndarray:
    b, shape = split_blocks(raw, "q2_k", 84, QK_K)
    n, s = b.shape[0], b[:, :16]
    dl = (read_f16(b, 80) * (s & np.uint8(0x0F)).astype(np.float32))[:, :, None]
    ml = (read_f16(b, 82) * (s >> np.uint8(4)).astype(np.float32))[:, :, None]
    q = _split_crumbs(b[:, 16:80]).reshape(n, 16, 16).astype(np.float32)
    return (dl * q - ml).reshape(shape)


def _quantize_q2_k(x: np.ndarray) -> np.ndarray:
    r, shape = split_rows(x, "q2_k", QK_K, 84)
    n = r.shape[0]
    g = r.reshape(n, 16, 16)
    d, m = fit_scale_min(g, np.abs(g), 3, -0.5, 0.1, 15)
    sc, d_all = _super_scale(d[..., 0], 15)
    mn, m_all = _super_scale(m[..., 0], 15)
    d_all, m_all = d_all.astype(np.float16), m_all.astype(np.float16)
    dl = (d_all.astype(np.float32) * sc)[:, :, None]
    ml = (m_all.astype(np.float32) * mn)[:, :, None]
    q = _to_codes(g, dl, ml, 0, 3).astype(np.uint8).reshape(n, QK_K)
    out = np.empty((n, 84), np.uint8)
    out[:, :16] = sc | (mn << np.uint8(4))
    out[:, 16:80] = _join_crumbs(q)
    out[:, 80:82] = f16_bytes(d_all)
    out[:, 82:84] = f16_bytes(m_all)
    return out.reshape(shape)


# -- Q3_K (block_q3_K): hmask[32], qs[64], scales[12], f16 d -----------------------------------------
# x = d * (sc - 32) * q per 16 values; q = low 2 bits - 4, plus 4 when the hmask bit is set


def _dequantize_q3_k(raw: np.ndarray) -> np.ndarray:
    b, shape = split_blocks(raw, "q3_k", 110, QK_K)
    n = b.shape[0]
    sc = _split_scales_q3(b[:, 96:108]).astype(np.int8) - np.int8(32)
    dl = (read_f16(b, 108) * sc.astype(np.float32))[:, :, None]
    no_high = np.uint8(1) - _split_bits(b[:, :32])
    q = _split_crumbs(b[:, 32:96]).astype(np.int8) - (no_high << np.uint8(2)).astype(np.int8)
    return (dl * q.reshape(n, 16, 16).astype(np.float32)).reshape(shape)


def _quantize_q3_k(x: np.ndarray) -> np.ndarray:
    r, shape = split_rows(x, "q3_k", QK_K, 110)
    n = r.shape[0]
    g = r.reshape(n, 16, 16)
    sc, d = _signed_super_scale(_fit_symmetric(g, g * g, 4)[..., 0], -32, 31)
    d = d.astype(np.float16)
    q = _to_codes(g, (d.astype(np.float32) * sc)[:, :, None], None, -4, 3).astype(np.int8) + np.int8(4)
    q = q.astype(np.uint8).reshape(n, QK_K)
    out = np.empty((n, 110), np.uint8)
    out[:, :32] = _join_bits(q >> np.uint8(2))
    out[:, 32:96] = _join_crumbs(q & np.uint8(3))
    out[:, 96:108] = _join_scales_q3((sc + np.int8(32)).astype(np.uint8))
    out[:, 108:110] = f16_bytes(d)
    return out.reshape(shape)


# -- Q4_K (block_q4_K) and Q5_K (block_q5_K): f16 d, f16 dmin, scales[12], [qh[32]], qs[128] --------
# x = d * sc * q - dmin * m per 32 values; 6-bit sc and m; q of 4 bits, or 5 with the qh plane


def _k4_layout(name: str, gguf_type: int, bits: int, rmin: float, nstep: int) -> Quantization:
    nmax = (1 << bits) - 1
    qs_at = 16 if bits == 4 else 48
    block_bytes = qs_at + 128

    def dequantize(raw: np.ndarray) -> np.ndarray:
        b, shape = split_blocks(raw, name, block_bytes, QK_K)
        n = b.shape[0]
        sc, mn = _split_scale_min_k4(b[:, 4:16])
        dl = (read_f16(b, 0) * sc.astype(np.float32))[:, :, None]
        ml = (read_f16(b, 2) * mn.astype(np.float32))[:, :, None]
        q = _split_nibble_chunks(b[:, qs_at:], 32)
        if bits == 5:
            q |= _split_bits(b[:, 16:48]) << np.uint8(4)
        q = q.reshape(n, 8, 32).astype(np.float32)
        np.multiply(dl, q, out=q)
        np.subtract(q, ml, out=q)
        return q.reshape(shape)

    def quantize(x: np.ndarray) -> np.ndarray:
        r, shape = split_rows(x, name, QK_K, block_bytes)
        n = r.shape[0]
        g = r.reshape(n, 8, 32)
        d, m = fit_scale_min(g, _rms_weights(g), nmax, rmin, 0.1, nstep)
        sc, d_all = _super_scale(d[..., 0], 63)
        mn, m_all = _super_scale(m[..., 0], 63)
        d_all, m_all = d_all.astype(np.float16), m_all.astype(np.float16)
        dl = (d_all.astype(np.float32) * sc)[:, :, None]
        ml = (m_all.astype(np.float32) * mn)[:, :, None]
        q = _to_codes(g, dl, ml, 0, nmax).astype(np.uint8).reshape(n, QK_K)
        out = np.empty((n, block_bytes), np.uint8)
        out[:, 0:2] = f16_bytes(d_all)
        out[:, 2:4] = f16_bytes(m_all)
        out[:, 4:16] = _join_scale_min_k4(sc, mn)
        if bits == 5:
            out[:, 16:48] = _join_bits(q >> np.uint8(4))
        out[:, qs_at:] = _join_nibble_chunks(q, 32)
        return out.reshape(shape)

    return Quantization(name, gguf_type, QK_K, block_bytes, dequantize, quantize, ((0, "f16"), (2, "f16")))


# -- Q6_K (block_q6_K): ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], f16 d ----------
# x = d * sc * (q - 32) per 16 values


def _dequantize_q6_k(raw: np.ndarray) -> np.ndarray:
    b, shape = split_blocks(raw, "q6_k", 210, QK_K)
    n = b.shape[0]
    dl = (read_f16(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32))[:, :, None]
    q = _split_nibble_chunks(b[:, :128], 64) | (_split_crumbs(b[:, 128:192]) << np.uint8(4))
    q = (q.astype(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(np.float32)
    np.multiply(dl, q, out=q)
    return q.reshape(shape)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    r, shape = split_rows(x, "q6_k", QK_K, 210)
    n = r.shape[0]
    g = r.reshape(n, 16, 16)
    sc, d = _signed_super_scale(_fit_symmetric(g, g * g, 32)[..., 0], -128, 127)
    d = d.astype(np.float16)
    q = _to_codes(g, (d.astype(np.float32) * sc)[:, :, None], None, -32, 31).astype(np.int8) + np.int8(32)
    q = q.astype(np.uint8).reshape(n, QK_K)
    out = np.empty((n, 210), np.uint8)
    out[:, :128] = _join_nibble_chunks(q, 64)
    out[:, 128:192] = _join_crumbs(q >> np.uint8(4))
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = f16_bytes(d)
    return out.reshape(shape)


Q2_K = Quantization("q2_k", 10, QK_K, 84, _dequantize_q2_k, _quantize_q2_k, ((80, "f16"), (82, "f16")))
Q3_K = Quantization("q3_k", 11, QK_K, 110, _dequantize_q3_k, _quantize_q3_k, ((108, "f16"),))
Q4_K = _k4_layout("q4_k", 12, 4, rmin=-1.0, nstep=20)
Q5_K = _k4_layout("q5_k", 13, 5, rmin=-0.5, nstep=15)
Q6_K = Quantization("q6_k", 14, QK_K, 210, _dequantize_q6_k, _quantize_q6_k, ((208, "f16"),))
