"""Matrix products against checkpoint weights stored [N, K] (rows are output features):
GEMV for decode (one workgroup per output feature and row of x, threads split K) and a tiled GEMM for
prefill (16x16 output tiles through shared memory, f32 accumulation). Packed weights are dequantized
in registers element by element with the quantization's kernel body."""

from __future__ import annotations

from ...graph.dtypes import f32, i32, u8
from ..frontend import Const, In, Out, kernel


@kernel(workgroup=("BLOCK", 1, 1))
def gemv_f32(x: In[f32], w: In[f32], y: Out[f32], n: i32, k: i32, BLOCK: Const = 128):
    """y[m, j] = sum_k x[m, k] * w[j, k]; grid (n, m)."""
    j = group_id(0)
    m = group_id(1)
    t = thread_id(0)
    part = shared(f32, BLOCK)
    acc = 0.0
    for kk in range(t, k, BLOCK):
        acc += x[m * k + kk] * w[j * k + kk]
    part[t] = acc
    reduce_shared(part, "add")
    if t == 0:
        y[m * n + j] = part[0]


@kernel(workgroup=("BLOCK", 1, 1))
def gemv_packed(x: In[f32], w: In[u8], lut: In[f32], y: Out[f32], n: i32, k: i32, row_bytes: i32, QTYPE: Const = "q8_0", BLOCK: Const = 128):
    """y[m, j] = sum_k x[m, k] * dequant(w)[j, k]; grid (n, m)."""
    j = group_id(0)
    m = group_id(1)
    t = thread_id(0)
    part = shared(f32, BLOCK)
    acc = 0.0
    for kk in range(t, k, BLOCK):
        acc += x[m * k + kk] * dequant(QTYPE, w, j * row_bytes, kk)
    part[t] = acc
    reduce_shared(part, "add")
    if t == 0:
        y[m * n + j] = part[0]


@kernel(workgroup=("BLOCK", 1, 1))
def gemv_blocks(
    x: In[f32],
    w: In[u8],
    lut: In[f32],
    y: Out[f32],
    n: i32,
    k: i32,
    row_bytes: i32,
    QTYPE: Const = "q4_1",
    BS: Const = 32,
    BB: Const = 20,
    ROWS: Const = 4,
    BLOCK: Const = 64,
):
    """GEMV by whole quant blocks: each thread takes blocks of ROWS output features, so a block's
    scales are decoded once and x is read once per block for all ROWS rows; grid (ceil(n/ROWS), m)."""
    j0 = group_id(0) * ROWS
    m = group_id(1)
    t = thread_id(0)
    part = shared(f32, BLOCK * ROWS)
    nb = k // BS
    for r in static_range(ROWS):
        part[r * BLOCK + t] = 0.0
    for blk in range(t, nb, BLOCK):
        for r in static_range(ROWS):
            if j0 + r < n:
                acc = 0.0
                p = (j0 + r) * row_bytes + blk * BB
                for jj in range(BS):
                    acc += x[m * k + blk * BS + jj] * dequant_in_block(QTYPE, w, p, jj)
                part[r * BLOCK + t] += acc
    barrier()
    s = BLOCK // 2
    for _ in static_range(ilog2(BLOCK)):
        if t < s:
            for r in static_range(ROWS):
                part[r * BLOCK + t] += part[r * BLOCK + t + s]
        barrier()
        s = s // 2
    if t < ROWS and j0 + t < n:
        y[m * n + j0 + t] = part[t * BLOCK]


@kernel(workgroup=(16, 16, 1))
def gemm_packed(a: In[f32], w: In[u8], lut: In[f32], c: Out[f32], m: i32, n: i32, k: i32, row_bytes: i32, QTYPE: Const = "q8_0"):
    """c[i, j] = sum_k a[i, k] * dequant(w)[j, k]; 16x16 tiles, grid (ceil(n/16), ceil(m/16))."""
    tx = thread_id(0)
    ty = thread_id(1)
    col = group_id(0) * 16 + tx
    row = group_id(1) * 16 + ty
    at = shared(f32, 256)
    bt = shared(f32, 256)
    acc = 0.0
    for k0 in range(0, k, 16):
        ar = group_id(1) * 16 + ty
        ac = k0 + tx
        at[ty * 16 + tx] = 0.0
        if ar < m and ac < k:  # a conditional expression would load both sides: guard with if
            at[ty * 16 + tx] = a[ar * k + ac]
        br = group_id(0) * 16 + ty
        bt[ty * 16 + tx] = 0.0
        if br < n and ac < k:
            bt[ty * 16 + tx] = dequant(QTYPE, w, br * row_bytes, ac)
        barrier()
        for kk in range(16):
            acc += at[ty * 16 + kk] * bt[tx * 16 + kk]
        barrier()
    if row < m and col < n:
        c[row * n + col] = acc


@kernel(workgroup=(16, 16, 1))
def gemm_f32(a: In[f32], w: In[f32], c: Out[f32], m: i32, n: i32, k: i32):
    """c[i, j] = sum_k a[i, k] * w[j, k]; 16x16 tiles, grid (ceil(n/16), ceil(m/16))."""
    tx = thread_id(0)
    ty = thread_id(1)
    col = group_id(0) * 16 + tx
    row = group_id(1) * 16 + ty
    at = shared(f32, 256)
    bt = shared(f32, 256)
    acc = 0.0
    for k0 in range(0, k, 16):
        ar = group_id(1) * 16 + ty
        ac = k0 + tx
        at[ty * 16 + tx] = 0.0
        if ar < m and ac < k:
            at[ty * 16 + tx] = a[ar * k + ac]
        br = group_id(0) * 16 + ty
        bt[ty * 16 + tx] = 0.0
        if br < n and ac < k:
            bt[ty * 16 + tx] = w[br * k + ac]
        barrier()
        for kk in range(16):
            acc += at[ty * 16 + kk] * bt[tx * 16 + kk]
        barrier()
    if row < m and col < n:
        c[row * n + col] = acc
