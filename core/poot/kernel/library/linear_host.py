"""Matrix products scheduled for a CPU core: a workgroup is one thread of work, and the inner loops
are 16 independent lanes that LLVM turns into one SIMD register each (AVX-512: one zmm; narrower
units take several), with the accumulators held in registers across the K loop.

- ``gemv_lanes``: decode, four output features per workgroup. The quant types whose byte ``i`` of a
  block holds elements ``i`` and ``i + 16`` (q4_0, q4_1, and q5_0 with its fifth bits beside them)
  or element ``i`` (q8_0) are read 16 bytes at a time; scales are converted by the hardware (F16C). ``gemv_lanes_any`` takes every other
  packed type through its kernel body.
- ``gemv_lanes_f32``: the same for f32 weights.
- ``gemm_rows``: prefill, ``NR`` output features per workgroup for every token: the rows are
  dequantized once into workgroup memory (any packed type), then tiles of ``TM`` tokens x ``NR``
  features accumulate in ``TM * NR`` lane vectors.

Lane i accumulates the elements k = i (mod 16) in increasing k, each weight dequantized with the
oracle's arithmetic, and the 16 lanes are added in order: every schedule gives a row the same bits,
whatever the thread count, the batch it came in or the GEMV/GEMM choice (tested).
"""

from __future__ import annotations

from ...graph.dtypes import f32, i32, u8
from ..frontend import Const, In, Out, kernel

LANE_TYPES = ("q4_0", "q4_1", "q5_0", "q8_0")


@kernel(workgroup=(1, 1, 1))
def gemv_lanes(x: In[f32], w: In[u8], y: Out[f32], n: i32, k: i32, row_bytes: i32, xs: i32, ws: i32, ys: i32, QTYPE: Const = "q4_1", NR: Const = 1):
    """y[e, m, j] = sum_k x[e, m, k] * dequant(w)[e, j, k] for q4_0 / q4_1 / q5_0 / q8_0; grid
    (ceil(n / NR), m, batch), with batch strides xs (elements, 0 to share x), ws (bytes) and ys
    (elements). ``NR`` rows a workgroup, each with its own 16 lanes: their chains of additions run
    side by side (one row's would wait on each add). Lane i adds the elements k = i (mod 16) in
    order, each weight dequantized as the oracle does: the same arithmetic, in the same order, as
    ``gemm_rows``, so a row's result does not depend on the schedule (nor on the batch it came in)."""
    j0 = group_id(0) * NR
    e = group_id(2)
    xm = group_id(1) * k + e * xs
    acc = shared(f32, 16 * NR)
    for i in range(16 * NR):
        acc[i] = 0.0
    nb = k // 32
    for blk in range(nb):
        xb = xm + blk * 32
        for r in static_range(NR):
            wj = min(j0 + r, n - 1) * row_bytes + e * ws  # (a last workgroup's rows past n repeat row n - 1, unstored)
            a = r * 16
            if QTYPE == "q8_0":
                p = wj + blk * 34
                d = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8))
                for i in range(16):
                    q = i32(w[p + 2 + i])
                    acc[a + i] += x[xb + i] * (d * f32(q - ((q >> 7) << 8)))
                for i in range(16):
                    q = i32(w[p + 18 + i])
                    acc[a + i] += x[xb + 16 + i] * (d * f32(q - ((q >> 7) << 8)))
            elif QTYPE == "q4_1":
                p = wj + blk * 20
                d = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8))
                mn = half_to_f32(i32(w[p + 2]) | (i32(w[p + 3]) << 8))
                for i in range(16):
                    acc[a + i] += x[xb + i] * (d * f32(i32(w[p + 4 + i]) & 15) + mn)
                for i in range(16):
                    acc[a + i] += x[xb + 16 + i] * (d * f32(i32(w[p + 4 + i]) >> 4) + mn)
            elif QTYPE == "q5_0":  # the fifth bits of the block's 32 values in 4 bytes after d
                p = wj + blk * 22
                d = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8))
                qh = i32(w[p + 2]) | (i32(w[p + 3]) << 8) | (i32(w[p + 4]) << 16) | (i32(w[p + 5]) << 24)
                for i in range(16):
                    q = (i32(w[p + 6 + i]) & 15) | (((qh >> i) & 1) << 4)
                    acc[a + i] += x[xb + i] * (d * f32(q - 16))
                for i in range(16):
                    q = (i32(w[p + 6 + i]) >> 4) | (((qh >> (i + 16)) & 1) << 4)
                    acc[a + i] += x[xb + 16 + i] * (d * f32(q - 16))
            else:
                p = wj + blk * 18
                d = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8))
                for i in range(16):
                    acc[a + i] += x[xb + i] * (d * f32((i32(w[p + 2 + i]) & 15) - 8))
                for i in range(16):
                    acc[a + i] += x[xb + 16 + i] * (d * f32((i32(w[p + 2 + i]) >> 4) - 8))
    for r in static_range(NR):
        s = 0.0
        for i in range(16):
            s += acc[r * 16 + i]
        if j0 + r < n:
            y[e * ys + group_id(1) * n + j0 + r] = s


@kernel(workgroup=(1, 1, 1))
def gemv_lanes_any(
    x: In[f32],
    w: In[u8],
    lut: In[f32],
    y: Out[f32],
    n: i32,
    k: i32,
    row_bytes: i32,
    xs: i32,
    ws: i32,
    ys: i32,
    QTYPE: Const = "q4_k",
    BS: Const = 256,
    BB: Const = 144,
):
    """The same GEMV for any packed type (block size a multiple of 16), each element through the
    type's kernel body: slower than ``gemv_lanes``, bit-identical to ``gemm_rows``. Grid (n, m, batch)."""
    j = group_id(0)
    e = group_id(2)
    xm = group_id(1) * k + e * xs
    wj = j * row_bytes + e * ws
    acc = shared(f32, 16)
    for i in range(16):
        acc[i] = 0.0
    for blk in range(k // BS):
        p = wj + blk * BB
        for c in static_range(BS // 16):
            for i in range(16):
                acc[i] += x[xm + blk * BS + c * 16 + i] * dequant_in_block(QTYPE, w, p, c * 16 + i)
    s = 0.0
    for i in range(16):
        s += acc[i]
    y[e * ys + group_id(1) * n + j] = s


@kernel(workgroup=(1, 1, 1))
def gemv_lanes_f32(x: In[f32], w: In[f32], y: Out[f32], n: i32, k: i32, xs: i32, ws: i32, ys: i32):
    """y[e, m, j] = sum_k x[e, m, k] * w[e, j, k]; grid (n, m, batch). Any k (a scalar tail after the lanes)."""
    j = group_id(0)
    e = group_id(2)
    xm = group_id(1) * k + e * xs
    wj = j * k + e * ws
    acc = shared(f32, 16)
    for i in range(16):
        acc[i] = 0.0
    k16 = k // 16 * 16
    for c in range(0, k16, 16):
        for i in range(16):
            acc[i] += x[xm + c + i] * w[wj + c + i]
    s = 0.0
    for i in range(16):
        s += acc[i]
    for c in range(k16, k):
        s += x[xm + c] * w[wj + c]
    y[e * ys + group_id(1) * n + j] = s


@kernel(workgroup=(1, 1, 1), loop_vectorize=False)  # its 16-lane loops are unrolled and packed by SLP; the loop vectorizer quadrupled its compile time
def gemm_rows(
    a: In[f32],
    w: In[u8],
    lut: In[f32],
    c: Out[f32],
    m: i32,
    n: i32,
    row_bytes: i32,
    xs: i32,
    ws: i32,
    ys: i32,
    QTYPE: Const = "q4_1",
    K: Const = 64,
    BS: Const = 32,
    BB: Const = 20,
    NR: Const = 4,
    TM: Const = 4,
):
    """c[e, t, j] = sum_k a[e, t, k] * dequant(w)[e, j, k] for all m tokens; grid (ceil(n / NR), batch).
    K (a multiple of 16 and of the block size) is the weight's static row length."""
    j0 = group_id(0) * NR
    e = group_id(1)
    ab = e * xs
    cb = e * ys
    wt = shared(f32, NR * K)
    acc = shared(f32, TM * NR * 16)
    for r in static_range(NR):
        jr = min(j0 + r, n - 1)
        for blk in range(K // BS):
            p = e * ws + jr * row_bytes + blk * BB
            o = r * K + blk * BS
            if QTYPE == "q4_1":  # the lane types unpack 16 bytes at a time (the same values as their kernel bodies)
                d = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8))
                mn = half_to_f32(i32(w[p + 2]) | (i32(w[p + 3]) << 8))
                for i in range(16):
                    wt[o + i] = d * f32(i32(w[p + 4 + i]) & 15) + mn
                for i in range(16):
                    wt[o + 16 + i] = d * f32(i32(w[p + 4 + i]) >> 4) + mn
            elif QTYPE == "q4_0":
                d = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8))
                for i in range(16):
                    wt[o + i] = d * f32((i32(w[p + 2 + i]) & 15) - 8)
                for i in range(16):
                    wt[o + 16 + i] = d * f32((i32(w[p + 2 + i]) >> 4) - 8)
            elif QTYPE == "q8_0":
                d = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8))
                for i in range(32):
                    q = i32(w[p + 2 + i])
                    wt[o + i] = d * f32(q - ((q >> 7) << 8))
            else:
                for jj in range(BS):
                    wt[o + jj] = dequant_in_block(QTYPE, w, p, jj)
    for t0 in range(0, m, TM):
        for i in range(TM * NR * 16):
            acc[i] = 0.0
        for kc in range(0, K, 16):
            for t in static_range(TM):
                tt = min(t0 + t, m - 1)
                for r in static_range(NR):
                    for i in range(16):
                        acc[(t * NR + r) * 16 + i] += a[ab + tt * K + kc + i] * wt[r * K + kc + i]
        for t in static_range(TM):
            for r in static_range(NR):
                s = 0.0
                for i in range(16):
                    s += acc[(t * NR + r) * 16 + i]
                if t0 + t < m and j0 + r < n:
                    c[cb + (t0 + t) * n + j0 + r] = s


@kernel(workgroup=(1, 1, 1))
def gemm_rows_f32(a: In[f32], w: In[f32], c: Out[f32], m: i32, n: i32, xs: i32, ws: i32, ys: i32, K: Const = 64, NR: Const = 4, TM: Const = 4):
    """c[e, t, j] = sum_k a[e, t, k] * w[e, j, k] for all m tokens; grid (ceil(n / NR), batch); K a multiple of 16."""
    j0 = group_id(0) * NR
    e = group_id(1)
    ab = e * xs
    cb = e * ys
    acc = shared(f32, TM * NR * 16)
    for t0 in range(0, m, TM):
        for i in range(TM * NR * 16):
            acc[i] = 0.0
        for kc in range(0, K, 16):
            for t in static_range(TM):
                tt = min(t0 + t, m - 1)
                for r in static_range(NR):
                    jr = min(j0 + r, n - 1)
                    for i in range(16):
                        acc[(t * NR + r) * 16 + i] += a[ab + tt * K + kc + i] * w[e * ws + jr * K + kc + i]
        for t in static_range(TM):
            for r in static_range(NR):
                s = 0.0
                for i in range(16):
                    s += acc[(t * NR + r) * 16 + i]
                if t0 + t < m and j0 + r < n:
                    c[cb + (t0 + t) * n + j0 + r] = s
