"""Matrix products on a CPU core in integers: x quantized once per product, weights read as stored.

``quantize_x_host`` writes each row of x as blocks of 32 values, each a record of ``XW`` i32 words:

- words 0-7 and 8-15: two int8 terms per value, x ~ d (q1 + q2 / 256) with d = max|x| / 127 (q1 is
  llama.cpp's Q8_1; q2 rounds the remainder, clamped to [-127, 127]: within half a step of d / 256,
  a step where the clamp cuts, so about 15 bits of each value are kept, as the GPU's dp4a GEMVs
  keep: see docs/NUMERICS.md), four values a word;
- word 16: d / 256 (f32 bits), the scale of X = 256 q1 + q2;
- word 17: (d / 256) * the block's sum of X (f32 bits: the Q4_1 minimums' term);
- word 18: the block's sum of X (i32);
- word 19: the sum of X over the block's first 16 values (i32: Q6_K's halves have scales of their own).

``gemv_q8`` (a token a workgroup: decode) and ``gemm_q8`` (every token: prefill) take the packed
types whose quant byte ``i`` holds values ``i`` and ``i + 16`` (Q4_0, Q4_1, Q5_0 with its fifth
bits) or value ``i`` (Q8_0) straight from the weight, 16 rows a workgroup, and ``dot_bytes`` sums
the quants (unsigned: Q4_0's q, Q5_0's q and Q8_0's q + 128) against x's two terms exactly
(``vpdpbusd`` where the host has VNNI). Per row and block,
``T = sum(256 S1 + S2) - offset * (sum of X)`` is the exact integer dot product of the signed quants
with X; then ``acc = fma(f32(T), d_w * (d / 256), acc)`` block after block, Q4_1's minimums in a
second sum ``macc = fma(m, word 17, macc)``, and y = acc + macc. Every schedule does exactly these
f32 operations in this order for every (token, row), so a row gets the same bits whatever the
thread count, the batch it came in or the number of rows.
"""

from __future__ import annotations

from ...graph.dtypes import f32, i32, u8
from ..frontend import Const, In, Out, inline, kernel

__all__ = ["Q8_TYPES", "Q8K_TYPES", "PREFETCH", "XW", "quantize_x_host", "gemv_q8", "gemm_q8"]

Q8_TYPES = ("q4_0", "q4_1", "q5_0", "q8_0")  # blocks of 32
Q8K_TYPES = ("q4_k", "q6_k")  # super-blocks of 256 (SUPER 8: sub-blocks of 32)
# gemv_q8's PF: twice the bytes 16 rows hold for a block of 32 values, in whole 64-byte lines (rounded
# down), at most 16 lines: the requests run ahead of the next workgroup's rows and reach into the one
# after it, so a workgroup that starts finds its rows in the L2 (requests that only kept pace left
# a core reading from memory well below the speed it reads the L3 at)
PREFETCH = {t: min(1024, 2 * (int(16 * b) // 64 * 64)) for t, b in {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q8_0": 34, "q4_k": 18, "q6_k": 26.25}.items()}
XW = 20  # i32 words of one quantized block of 32 values of x


@kernel(workgroup=(1, 1, 1))
def quantize_x_host(x: In[f32], xq: Out[i32], k: i32):
    """Row ``group_id(0)`` of x (k values, a multiple of 32) into ``k / 32`` records of ``XW``
    words (the module's layout); grid (rows,)."""
    nb = k // 32
    xb = group_id(0) * k
    ob = group_id(0) * nb * 20
    q1 = shared(i32, 32)
    q2 = shared(i32, 32)
    for blk in range(nb):
        p = xb + blk * 32
        amax = 0.0
        for i in range(32):
            amax = max(amax, abs(x[p + i]))
        d = amax / 127.0
        inv = select(amax > 0.0, 127.0 / amax, 0.0)
        back = select(amax > 0.0, 256.0 / d, 0.0)
        for i in range(32):
            v = x[p + i]
            a = min(max(i32(rint(v * inv)), -127), 127)
            q1[i] = a
            q2[i] = min(max(i32(rint((v - d * f32(a)) * back)), -127), 127)
        o = ob + blk * 20
        for j in range(8):
            xq[o + j] = (q1[4 * j] & 255) | ((q1[4 * j + 1] & 255) << 8) | ((q1[4 * j + 2] & 255) << 16) | ((q1[4 * j + 3] & 255) << 24)
            xq[o + 8 + j] = (q2[4 * j] & 255) | ((q2[4 * j + 1] & 255) << 8) | ((q2[4 * j + 2] & 255) << 16) | ((q2[4 * j + 3] & 255) << 24)
        first = 0
        for i in range(16):
            first += 256 * q1[i] + q2[i]
        total = first
        for i in range(16, 32):
            total += 256 * q1[i] + q2[i]
        xq[o + 18] = total
        xq[o + 19] = first
        xd = d / 256.0
        xq[o + 16] = as_i32(xd)
        xq[o + 17] = as_i32(xd * f32(total))


@inline
def _spread(v: i32) -> i32:
    """Bits 0-3 of ``v`` into bit 4 of each of the four bytes (Q5_0's fifth bits beside their nibbles)."""
    return (((v & 15) * 2113665) & 16843009) << 4  # v * 0x204081 puts bit i at 8i (no carries); & 0x01010101


@inline
def _k4_scale_min(s: i32, s4: i32, s_4: i32, upper: i32) -> i32:
    """Q4_K sub-block b's 6-bit scale | its minimum << 8, from its scale bytes s[b], s[b + 4] and
    s[b - 4] (``upper``: b >= 4, whose six bits are split across them)."""
    return select(upper > 0, ((s4 & 15) | ((s_4 >> 6) << 4)) | (((s4 >> 4) | ((s >> 6) << 4)) << 8), (s & 63) | ((s4 & 63) << 8))


@kernel(workgroup=(1, 1, 1), loop_vectorize=False)
def gemv_q8(xq: In[i32], w: In[u8], y: Out[f32], n: i32, k: i32, row_bytes: i32, QTYPE: Const = "q4_1", SUPER: Const = 1, PF: Const = 0):
    """y[t, j] = sum_k x[t, k] * dequant(w)[j, k] for x quantized by ``quantize_x_host``; grid
    (ceil(n / 16), rows of x): 16 weight rows and one token a workgroup, x's blocks of 32 one by
    one (``SUPER`` 8 for the K-quants: the eight sub-blocks of a super-block, whose scales are its
    own). A block's quants fill four 16-lane groups as they lie in the rows (lane 4r + j: row r's
    values 4j..4j+3 and 16+4j..16+4j+3), and a row's four lanes are added after the products. Q6_K's
    halves of 16 values have scales of their own: their sums are kept apart. With ``PF`` (bytes:
    ``PREFETCH``) each block asks for that much more of the rows after its own, into the L2 (not the
    L1, whose few miss buffers the block's own loads need): 16 rows a block apart are 16 short
    streams, which a core's own prefetchers hardly follow."""
    j0 = group_id(0) * 16
    t = group_id(1)
    nb = k // 32
    wl = shared(i32, 64)
    wh = shared(i32, 64)
    scl = shared(f32, 16)
    sch = shared(f32, 16)
    mnl = shared(f32, 16)
    qhs = shared(i32, 16)
    xv = shared(i32, 64)
    s1 = shared(i32, 64)
    s2 = shared(i32, 64)
    s3 = shared(i32, 64)
    s4 = shared(i32, 64)
    u = shared(i32, 64)
    uh = shared(i32, 64)
    acc = shared(f32, 16)
    macc = shared(f32, 16)
    off = 0  # the quants' offset: dot_bytes takes them unsigned
    if QTYPE == "q4_0":
        off = 8
    elif QTYPE == "q5_0":
        off = 16
    elif QTYPE == "q8_0":
        off = 128
    elif QTYPE == "q6_k":
        off = 32
    for i in static_range(16):
        acc[i] = 0.0
        macc[i] = 0.0
    ahead = (j0 + 16) * row_bytes  # the next workgroup's rows, asked for a block's worth at a time
    last = (n - 1) * row_bytes
    for sb in range(nb // SUPER):
        for b in static_range(SUPER):
            blk = sb * SUPER + b
            if PF:
                prefetch(w, min(ahead + blk * PF, last), PF)
            for r in static_range(16):  # row r's quants: lanes 4r..4r+3 of wl (values 0-15) and wh (16-31)
                p = min(j0 + r, n - 1) * row_bytes
                if QTYPE == "q8_0":
                    p = p + blk * 34
                    scl[r] = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8))
                    for jj in static_range(4):
                        wl[4 * r + jj] = load_word(w, p + 2 + 4 * jj) ^ -2139062144  # 0x80808080: q + 128
                        wh[4 * r + jj] = load_word(w, p + 18 + 4 * jj) ^ -2139062144
                elif QTYPE == "q4_k":  # d, dmin, 12 bytes of 6-bit scales and minimums, 128 bytes of nibbles
                    p = p + sb * 144
                    sm = _k4_scale_min(i32(w[p + 4 + b]), i32(w[p + 8 + b]), i32(w[p + b]), b // 4)
                    sc = sm & 255
                    mn = sm >> 8
                    scl[r] = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8)) * f32(sc)
                    mnl[r] = -(half_to_f32(i32(w[p + 2]) | (i32(w[p + 3]) << 8)) * f32(mn))
                    for jj in static_range(4):  # sub-block b: the low (even b) or high nibbles of bytes 32 (b / 2) ..
                        wl[4 * r + jj] = (load_word(w, p + 16 + 32 * (b // 2) + 4 * jj) >> (4 * (b % 2))) & 0x0F0F0F0F
                        wh[4 * r + jj] = (load_word(w, p + 32 + 32 * (b // 2) + 4 * jj) >> (4 * (b % 2))) & 0x0F0F0F0F
                elif QTYPE == "q6_k":  # 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, d
                    p = p + sb * 210
                    d = half_to_f32(i32(w[p + 208]) | (i32(w[p + 209]) << 8))
                    sa = i32(w[p + 192 + 8 * (b // 4) + 2 * (b % 4)])
                    sz = i32(w[p + 193 + 8 * (b // 4) + 2 * (b % 4)])
                    scl[r] = d * f32(sa - ((sa >> 7) << 8))
                    sch[r] = d * f32(sz - ((sz >> 7) << 8))
                    ql = p + 64 * (b // 4) + 32 * (b % 2)
                    qh = p + 128 + 32 * (b // 4)
                    for jj in static_range(4):
                        wl[4 * r + jj] = ((load_word(w, ql + 4 * jj) >> (4 * ((b % 4) // 2))) & 0x0F0F0F0F) | (
                            ((load_word(w, qh + 4 * jj) >> (2 * (b % 4))) & 0x03030303) << 4
                        )
                        wh[4 * r + jj] = ((load_word(w, ql + 16 + 4 * jj) >> (4 * ((b % 4) // 2))) & 0x0F0F0F0F) | (
                            ((load_word(w, qh + 16 + 4 * jj) >> (2 * (b % 4))) & 0x03030303) << 4
                        )
                else:  # nibbles after d (Q4_1: and m; Q5_0: and the fifth bits)
                    head = 2
                    if QTYPE == "q4_1":
                        head = 4
                    elif QTYPE == "q5_0":
                        head = 6
                    p = p + blk * (16 + head)
                    scl[r] = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8))
                    if QTYPE == "q4_1":
                        mnl[r] = half_to_f32(i32(w[p + 2]) | (i32(w[p + 3]) << 8))
                    if QTYPE == "q5_0":
                        qhs[r] = load_word(w, p + 2)
                    for jj in static_range(4):
                        q = load_word(w, p + head + 4 * jj)
                        wl[4 * r + jj] = q & 0x0F0F0F0F
                        wh[4 * r + jj] = (q >> 4) & 0x0F0F0F0F
            if QTYPE == "q5_0":  # the fifth bits of four rows at a time: lane 4r + j's bytes are bits 4j.. of row r's low (wl) or high (wh) half
                for g in static_range(4):
                    a = 4 * g
                    spread_bits(wl, 16 * g, (qhs[a] & 0xFFFF) | (qhs[a + 1] << 16), (qhs[a + 2] & 0xFFFF) | (qhs[a + 3] << 16), 4)
                    spread_bits(wh, 16 * g, ((qhs[a] >> 16) & 0xFFFF) | (qhs[a + 1] & -65536), ((qhs[a + 2] >> 16) & 0xFFFF) | (qhs[a + 3] & -65536), 4)
            xb = (t * nb + blk) * 20
            for i in static_range(16):
                xv[i] = xq[xb + i % 4]
                xv[16 + i] = xq[xb + 4 + i % 4]
                xv[32 + i] = xq[xb + 8 + i % 4]
                xv[48 + i] = xq[xb + 12 + i % 4]
            for i in static_range(64):
                s1[i] = 0
                s2[i] = 0
                s3[i] = 0
                s4[i] = 0
            for g in static_range(4):
                dot_bytes(s1, 16 * g, wl, 16 * g, xv, 0, 16)
                dot_bytes(s2, 16 * g, wl, 16 * g, xv, 32, 16)
                if QTYPE == "q6_k":
                    dot_bytes(s3, 16 * g, wh, 16 * g, xv, 16, 16)
                    dot_bytes(s4, 16 * g, wh, 16 * g, xv, 48, 16)
                else:
                    dot_bytes(s1, 16 * g, wh, 16 * g, xv, 16, 16)
                    dot_bytes(s2, 16 * g, wh, 16 * g, xv, 48, 16)
            for i in static_range(64):
                u[i] = (s1[i] << 8) + s2[i]
                uh[i] = (s3[i] << 8) + s4[i]
            xd = as_f32(xq[xb + 16])
            xds = as_f32(xq[xb + 17])
            fix = xq[xb + 18] * off
            if QTYPE == "q6_k":
                fix = xq[xb + 19] * off
            fixh = (xq[xb + 18] - xq[xb + 19]) * off
            for r in static_range(16):
                acc[r] = fma(f32((u[4 * r] + u[4 * r + 1]) + (u[4 * r + 2] + u[4 * r + 3]) - fix), scl[r] * xd, acc[r])
                if QTYPE == "q6_k":
                    acc[r] = fma(f32((uh[4 * r] + uh[4 * r + 1]) + (uh[4 * r + 2] + uh[4 * r + 3]) - fixh), sch[r] * xd, acc[r])
                if QTYPE == "q4_1" or QTYPE == "q4_k":
                    macc[r] = fma(mnl[r], xds, macc[r])
    for r in static_range(16):
        if j0 + r < n:
            y[t * n + j0 + r] = acc[r] + macc[r]


@kernel(workgroup=(1, 1, 1), loop_vectorize=False)
def gemm_q8(
    xq: In[i32],
    w: In[u8],
    y: Out[f32],
    m: i32,
    n: i32,
    row_bytes: i32,
    QTYPE: Const = "q4_1",
    K: Const = 64,
    TM: Const = 4,
    SUPER: Const = 1,
    ROWS16: Const = False,
):
    """The same products for every token; grid (ceil(n / 16),): 16 weight rows a workgroup, their
    quants and scales first laid out once in workgroup memory a row a lane (word j of a block: its
    values 4j..4j+3, then 16+4j.., of the 16 rows side by side), then ``TM`` tokens at a time each
    meet a block's eight words, x's words broadcast over the lanes. ``K`` (a multiple of 32, of 256
    with ``SUPER`` 8) is the rows' length. A row's block sums are ``gemv_q8``'s integers, scaled by
    the same f32 operations in the same order. ``ROWS16`` (Q8_0, Q5_0): the weight is laid out as
    ``linear_q8_rows`` describes, whose records hold the words in this order already."""
    j0 = group_id(0) * 16
    nb = K // 32
    wt = shared(i32, 4 * K)
    dws = shared(f32, K // 2)
    dwh = shared(f32, K // 2)
    mws = shared(f32, K // 2)
    xb1 = shared(i32, 16 * TM)
    xb2 = shared(i32, 16 * TM)
    s1 = shared(i32, 16 * TM)
    s2 = shared(i32, 16 * TM)
    s3 = shared(i32, 16 * TM)
    s4 = shared(i32, 16 * TM)
    acc = shared(f32, 16 * TM)
    macc = shared(f32, 16 * TM)
    off = 0
    if QTYPE == "q4_0":
        off = 8
    elif QTYPE == "q5_0":
        off = 16
    elif QTYPE == "q8_0":
        off = 128
    elif QTYPE == "q6_k":
        off = 32
    for sb in range(nb // SUPER):
        for b in static_range(SUPER):
            blk = sb * SUPER + b
            if ROWS16:  # a record: the 16 scales, then word jj of the 16 rows side by side
                rec = 544
                if QTYPE == "q5_0":
                    rec = 352
                p = (group_id(0) * nb + blk) * rec
                for r in static_range(16):
                    dws[blk * 16 + r] = half_to_f32(i32(w[p + 2 * r]) | (i32(w[p + 2 * r + 1]) << 8))
                if QTYPE == "q8_0":
                    for i in static_range(128):
                        wt[blk * 128 + i] = load_word(w, p + 32 + 4 * i)
                else:  # Q5_0: the words of nibbles, their fifth bits spread in as for stored rows
                    for r in static_range(16):
                        qh5 = load_word(w, p + 32 + 4 * r)
                        for jj in static_range(4):
                            q = load_word(w, p + 96 + 64 * jj + 4 * r)
                            wt[blk * 128 + 16 * jj + r] = (q & 0x0F0F0F0F) | _spread(qh5 >> (4 * jj))
                            wt[blk * 128 + 16 * (4 + jj) + r] = ((q >> 4) & 0x0F0F0F0F) | _spread(qh5 >> (16 + 4 * jj))
            else:
                for r in range(16):
                    p = min(j0 + r, n - 1) * row_bytes
                    o = blk * 128 + r
                    if QTYPE == "q8_0":
                        p = p + blk * 34
                        dws[blk * 16 + r] = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8))
                        for jj in static_range(8):
                            wt[o + 16 * jj] = load_word(w, p + 2 + 4 * jj) ^ -2139062144
                    elif QTYPE == "q4_k":
                        p = p + sb * 144
                        sm = _k4_scale_min(i32(w[p + 4 + b]), i32(w[p + 8 + b]), i32(w[p + b]), b // 4)
                        sc = sm & 255
                        mn = sm >> 8
                        dws[blk * 16 + r] = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8)) * f32(sc)
                        mws[blk * 16 + r] = -(half_to_f32(i32(w[p + 2]) | (i32(w[p + 3]) << 8)) * f32(mn))
                        for jj in static_range(8):
                            wt[o + 16 * jj] = (load_word(w, p + 16 + 32 * (b // 2) + 4 * jj) >> (4 * (b % 2))) & 0x0F0F0F0F
                    elif QTYPE == "q6_k":
                        p = p + sb * 210
                        d = half_to_f32(i32(w[p + 208]) | (i32(w[p + 209]) << 8))
                        sa = i32(w[p + 192 + 8 * (b // 4) + 2 * (b % 4)])
                        sz = i32(w[p + 193 + 8 * (b // 4) + 2 * (b % 4)])
                        dws[blk * 16 + r] = d * f32(sa - ((sa >> 7) << 8))
                        dwh[blk * 16 + r] = d * f32(sz - ((sz >> 7) << 8))
                        ql = p + 64 * (b // 4) + 32 * (b % 2)
                        qh = p + 128 + 32 * (b // 4)
                        for jj in static_range(8):
                            wt[o + 16 * jj] = ((load_word(w, ql + 4 * jj) >> (4 * ((b % 4) // 2))) & 0x0F0F0F0F) | (
                                ((load_word(w, qh + 4 * jj) >> (2 * (b % 4))) & 0x03030303) << 4
                            )
                    else:
                        head = 2
                        if QTYPE == "q4_1":
                            head = 4
                        elif QTYPE == "q5_0":
                            head = 6
                        p = p + blk * (16 + head)
                        dws[blk * 16 + r] = half_to_f32(i32(w[p]) | (i32(w[p + 1]) << 8))
                        if QTYPE == "q4_1":
                            mws[blk * 16 + r] = half_to_f32(i32(w[p + 2]) | (i32(w[p + 3]) << 8))
                        qh5 = 0
                        if QTYPE == "q5_0":
                            qh5 = load_word(w, p + 2)
                        for jj in static_range(4):
                            q = load_word(w, p + head + 4 * jj)
                            wt[o + 16 * jj] = (q & 0x0F0F0F0F) | _spread(qh5 >> (4 * jj))
                            wt[o + 16 * (4 + jj)] = ((q >> 4) & 0x0F0F0F0F) | _spread(qh5 >> (16 + 4 * jj))
    for t0 in range(0, m, TM):
        for i in static_range(16 * TM):
            acc[i] = 0.0
            macc[i] = 0.0
        for blk in range(nb):
            for i in static_range(16 * TM):
                s1[i] = 0
                s2[i] = 0
                s3[i] = 0
                s4[i] = 0
            for jj in static_range(8):
                for tt in static_range(TM):
                    xb = (min(t0 + tt, m - 1) * nb + blk) * 20
                    for i in static_range(16):
                        xb1[16 * tt + i] = xq[xb + jj]
                        xb2[16 * tt + i] = xq[xb + 8 + jj]
                    if QTYPE == "q6_k" and jj >= 4:
                        dot_bytes(s3, 16 * tt, wt, blk * 128 + 16 * jj, xb1, 16 * tt, 16)
                        dot_bytes(s4, 16 * tt, wt, blk * 128 + 16 * jj, xb2, 16 * tt, 16)
                    else:
                        dot_bytes(s1, 16 * tt, wt, blk * 128 + 16 * jj, xb1, 16 * tt, 16)
                        dot_bytes(s2, 16 * tt, wt, blk * 128 + 16 * jj, xb2, 16 * tt, 16)
            for tt in static_range(TM):
                xb = (min(t0 + tt, m - 1) * nb + blk) * 20
                xd = as_f32(xq[xb + 16])
                xds = as_f32(xq[xb + 17])
                fix = xq[xb + 18] * off
                if QTYPE == "q6_k":
                    fix = xq[xb + 19] * off
                fixh = (xq[xb + 18] - xq[xb + 19]) * off
                for r in static_range(16):
                    a = 16 * tt + r
                    acc[a] = fma(f32((s1[a] << 8) + s2[a] - fix), dws[blk * 16 + r] * xd, acc[a])
                    if QTYPE == "q6_k":
                        acc[a] = fma(f32((s3[a] << 8) + s4[a] - fixh), dwh[blk * 16 + r] * xd, acc[a])
                    if QTYPE == "q4_1" or QTYPE == "q4_k":
                        macc[a] = fma(mws[blk * 16 + r], xds, macc[a])
        for tt in static_range(TM):
            for r in static_range(16):
                if t0 + tt < m and j0 + r < n:
                    y[(t0 + tt) * n + j0 + r] = acc[16 * tt + r] + macc[16 * tt + r]
