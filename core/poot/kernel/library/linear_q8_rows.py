"""Q8_0 and Q5_0 weights laid out 16 rows at a time, for the host's integer products.

A row is a run of blocks of 32 values (Q8_0: an f16 scale and 32 int8 quants, 34 bytes; Q5_0: an f16
scale, the 32 fifth bits in a word, and 16 bytes of nibbles, 22 bytes). ``gemv_q8`` reads 16 rows a
block apart: 16 short streams, and words that must be moved into lanes one row at a time. The
``rows16`` layouts store, for each group of 16 rows and each block of 32 columns, one record of the
16 rows' blocks (``RECORD`` bytes):

- bytes 0-31: the 16 rows' f16 scales, row after row;
- Q8_0: bytes 32 + 64 c + 4 r + i (c < 8, r < 16, i < 4): row r's quant 4 c + i plus 128
  (unsigned, as ``dot_bytes`` takes it);
- Q5_0: bytes 32 + 4 r .. 35 + 4 r: row r's word of fifth bits; bytes 96 + 64 c + 4 r + i (c < 4):
  row r's nibble byte 4 c + i (values 4 c + i and 16 + 4 c + i).

Records follow block after block, then group after group: the weight is one sequential stream, a
record's 64-byte chunk is word c of all 16 rows (a row a lane), and each chunk meets x's words
broadcast over the lanes, so a row's integer sum gathers in its lane without any lanes being added
together. The bytes are the stored ones moved (Q8_0's sign bits flipped): the same size, and
``gemv_q8_rows16`` / ``gemm_q8`` give the same bits as ``gemv_q8`` on the stored rows (the same exact
integer sums, the same f32 operations in the same order). ``gather_q8_rows16`` reads embedding rows
back out of a record, for a table the head shares.
"""

from __future__ import annotations

import numpy as np

from ...graph.dtypes import f32, i32, u8
from ..frontend import Const, In, Out, kernel
from .linear_q8_host import _spread

__all__ = ["ROWS16_TYPES", "RECORD", "layout_name", "rows16_applies", "lay_out_rows16", "gemv_q8_rows16", "gather_q8_rows16"]

ROWS16_TYPES = ("q8_0", "q5_0")
RECORD = {"q8_0": 16 * 34, "q5_0": 16 * 22}  # bytes of one record: 16 rows' blocks of 32 values


def layout_name(qtype: str) -> str:
    """The layout's name, as plans and laid-out arrays carry it."""
    return f"{qtype}/rows16"


def rows16_applies(qtype: str, n: int, k: int) -> bool:
    """Whether a weight of ``n`` rows of ``k`` values of type ``qtype`` can be laid out 16 rows a
    record: Q8_0 or Q5_0, whole groups of 16 rows, whole blocks."""
    return qtype in ROWS16_TYPES and n % 16 == 0 and k % 32 == 0 and n > 0


def lay_out_rows16(raw: np.ndarray, n: int, k: int, qtype: str = "q8_0") -> np.ndarray:
    """The stored bytes of an ``[n, k]`` Q8_0 or Q5_0 weight (``n / 16`` groups of rows) 16 rows a
    record, as the module says: a new uint8 array of the same size."""
    nb, bb, rec = k // 32, RECORD[qtype] // 16, RECORD[qtype]
    b = np.asarray(raw).reshape(-1).view(np.uint8)
    if b.size != n * nb * bb:
        raise ValueError(f"a {qtype.upper()} weight of {n} x {k} holds {n * nb * bb} bytes, got {b.size}")
    b = b.reshape(n // 16, 16, nb, bb)
    out = np.empty((n // 16, nb, rec), np.uint8)
    out[:, :, :32] = b[:, :, :, :2].transpose(0, 2, 1, 3).reshape(n // 16, nb, 32)
    if qtype == "q8_0":
        q = (b[:, :, :, 2:] ^ np.uint8(0x80)).reshape(n // 16, 16, nb, 8, 4)  # group, row, block, word, byte
        out[:, :, 32:] = q.transpose(0, 2, 3, 1, 4).reshape(n // 16, nb, 512)
    else:
        out[:, :, 32:96] = b[:, :, :, 2:6].transpose(0, 2, 1, 3).reshape(n // 16, nb, 64)
        q = b[:, :, :, 6:].reshape(n // 16, 16, nb, 4, 4)
        out[:, :, 96:] = q.transpose(0, 2, 3, 1, 4).reshape(n // 16, nb, 256)
    return out.reshape(-1)


@kernel(workgroup=(1, 1, 1), loop_vectorize=False)
def gemv_q8_rows16(xq: In[i32], w: In[u8], y: Out[f32], n: i32, k: i32, QTYPE: Const = "q8_0", PF: Const = 0):
    """y[t, j] = sum_k x[t, k] * dequant(w)[j, k] for a weight laid out 16 rows a record and x
    quantized by ``linear_q8_host.quantize_x_host``; grid (n / 16, rows of x): a group of 16 rows
    and one token a workgroup. Per block, lane r sums row r's quants (unsigned) against x's two
    int8 terms (16 ``dot_bytes`` of 16 lanes), then
    ``acc = fma(f32(256 S1 + S2 - offset * sum X), d_w * (d / 256), acc)`` as ``gemv_q8`` does.
    ``PF`` bytes ahead are asked for into the L2 a record at a time."""
    j0 = group_id(0) * 16
    t = group_id(1)
    nb = k // 32
    rec = 544
    off = 128
    if QTYPE == "q5_0":
        rec = 352
        off = 16
    wv = shared(i32, 16)
    lo = shared(i32, 16)
    hi = shared(i32, 16)
    qh = shared(i32, 16)
    x1 = shared(i32, 16)
    x2 = shared(i32, 16)
    x3 = shared(i32, 16)
    x4 = shared(i32, 16)
    s1 = shared(i32, 16)
    s2 = shared(i32, 16)
    sw = shared(i32, 8)
    acc = shared(f32, 16)
    for i in static_range(16):
        acc[i] = 0.0
    base = group_id(0) * nb * rec
    last = (n // 16) * nb * rec - rec
    for blk in range(nb):
        p = base + blk * rec
        if PF:
            prefetch(w, min(p + PF, last), rec)
        xb = (t * nb + blk) * 20
        for i in static_range(16):
            s1[i] = 0
            s2[i] = 0
        if QTYPE == "q8_0":
            for c in static_range(8):
                for i in static_range(16):
                    wv[i] = load_word(w, p + 32 + 64 * c + 4 * i)
                    x1[i] = xq[xb + c]
                    x2[i] = xq[xb + 8 + c]
                dot_bytes(s1, 0, wv, 0, x1, 0, 16)
                dot_bytes(s2, 0, wv, 0, x2, 0, 16)
        else:  # word c of the nibbles: values 4c.. (low) and 16 + 4c.. (high), their fifth bits beside them
            for i in static_range(16):
                qh[i] = load_word(w, p + 32 + 4 * i)
            for c in static_range(4):
                for i in static_range(16):
                    wv[i] = load_word(w, p + 96 + 64 * c + 4 * i)
                    lo[i] = (wv[i] & 0x0F0F0F0F) | _spread(qh[i] >> (4 * c))
                    hi[i] = ((wv[i] >> 4) & 0x0F0F0F0F) | _spread(qh[i] >> (16 + 4 * c))
                    x1[i] = xq[xb + c]
                    x2[i] = xq[xb + 8 + c]
                    x3[i] = xq[xb + 4 + c]
                    x4[i] = xq[xb + 12 + c]
                dot_bytes(s1, 0, lo, 0, x1, 0, 16)
                dot_bytes(s2, 0, lo, 0, x2, 0, 16)
                dot_bytes(s1, 0, hi, 0, x3, 0, 16)
                dot_bytes(s2, 0, hi, 0, x4, 0, 16)
        xd = as_f32(xq[xb + 16])
        fix = xq[xb + 18] * off
        for i in static_range(8):
            sw[i] = load_word(w, p + 4 * i)
        for r in static_range(16):
            d = half_to_f32((sw[r // 2] >> (16 * (r % 2))) & 65535)
            acc[r] = fma(f32(((s1[r] << 8) + s2[r]) - fix), d * xd, acc[r])
    for r in static_range(16):
        y[t * n + j0 + r] = acc[r] + 0.0  # as gemv_q8 adds its (zero) minimums' term: a sum of -0 is written +0 by both


@kernel(workgroup=("BLOCK", 1, 1))
def gather_q8_rows16(table: In[u8], ids: In[i32], out: Out[f32], cols: i32, rows: i32, QTYPE: Const = "q8_0", BLOCK: Const = 128):
    """out[t, :] = dequant(table)[ids[t], :] for a table laid out 16 rows a record (the stored
    gather's values: the f16 scale times the quant; ids clamped to the ``rows``, as
    ``gather.gather_packed``); grid (tokens,)."""
    t = group_id(0)
    row = min(max(ids[t], 0), rows - 1)
    nb = cols // 32
    rec = 544
    if QTYPE == "q5_0":
        rec = 352
    g = (row // 16) * nb * rec
    r = row % 16
    for c in range(thread_id(0), cols, BLOCK):
        p = g + (c // 32) * rec
        d = half_to_f32(i32(table[p + 2 * r]) | (i32(table[p + 2 * r + 1]) << 8))
        v = c % 32
        q = 0
        if QTYPE == "q8_0":
            q = i32(table[p + 32 + 64 * (v // 4) + 4 * r + v % 4]) - 128
        else:
            nib = (i32(table[p + 96 + 64 * ((v % 16) // 4) + 4 * r + v % 4]) >> (4 * (v // 16))) & 15
            q = (nib | (((load_word(table, p + 32 + 4 * r) >> v) & 1) << 4)) - 16
        out[t * cols + c] = d * f32(q)
