"""Data movement: strided copies (transpose, slice, expand, the parts of a concat, non-contiguous
reshapes) over up to four dimensions with run-time shapes, row reductions over the last axis, the
KV-cache scatter through a slot map, and a plain copy of 32-bit words (which a device executor uses to
move a step's inputs in from, and its small outputs out to, host memory the device can address)."""

from __future__ import annotations

from ...graph.dtypes import f32, i32
from ..frontend import Const, In, Out, kernel


@kernel(workgroup=("BLOCK", 1, 1))
def copy_strided(
    src: In[f32],
    dst: Out[f32],
    n: i32,
    d0: i32,
    d1: i32,
    d2: i32,
    d3: i32,
    s0: i32,
    s1: i32,
    s2: i32,
    s3: i32,
    src_offset: i32,
    t0: i32,
    t1: i32,
    t2: i32,
    t3: i32,
    dst_offset: i32,
    BLOCK: Const = 256,
):
    """dst[dst_offset + sum(c_i * t_i)] = src[src_offset + sum(c_i * s_i)] for every coordinate c of the
    [d0, d1, d2, d3] box (strides in elements; 0 broadcasts); grid ceil(n / BLOCK)."""
    i = group_id(0) * BLOCK + thread_id(0)
    if i < n:
        c3 = i % d3
        r = i // d3
        c2 = r % d2
        r = r // d2
        c1 = r % d1
        c0 = r // d1
        dst[dst_offset + c0 * t0 + c1 * t1 + c2 * t2 + c3 * t3] = src[src_offset + c0 * s0 + c1 * s1 + c2 * s2 + c3 * s3]


@kernel(workgroup=("BLOCK", 1, 1))
def copy_words(src: In[i32], dst: Out[i32], n: i32, BLOCK: Const = 256):
    """dst[i] = src[i] for i < n (32-bit words of any type); grid ceil(n / BLOCK)."""
    i = group_id(0) * BLOCK + thread_id(0)
    if i < n:
        dst[i] = src[i]


@kernel(workgroup=("BLOCK", 1, 1))
def reduce_rows(x: In[f32], y: Out[f32], cols: i32, OP: Const = "sum", BLOCK: Const = 128):
    """y[row] = sum / mean / max / min of x[row, :]; grid (rows,)."""
    row = group_id(0)
    t = thread_id(0)
    part = shared(f32, BLOCK)
    acc = 0.0 if OP == "sum" or OP == "mean" else (-3.0e38 if OP == "max" else 3.0e38)
    for c in range(t, cols, BLOCK):
        v = x[row * cols + c]
        if OP == "sum" or OP == "mean":
            acc += v
        elif OP == "max":
            acc = max(acc, v)
        else:
            acc = min(acc, v)
    part[t] = acc
    reduce_shared(part, "add" if OP == "sum" or OP == "mean" else OP)
    if t == 0:
        y[row] = part[0] / f32(cols) if OP == "mean" else part[0]


@kernel(workgroup=("BLOCK", 1, 1))
def cache_write(values: In["VT"], slots: In[i32], pool: Out["PT"], width: i32, BLOCK: Const = 128, PT: Const = "f32", VT: Const = "f32"):
    """pool[slots[t], :] = values[t, :] for each new token t (a negative slot skips it), converted
    from ``VT`` to the pool's type ``PT`` (f32 or f16: rounded to nearest even); grid (tokens,).
    Halves are written two at a time (``width`` even), so a thread writes whole 32-bit words."""
    t = group_id(0)
    s = slots[t]
    if s >= 0:
        if PT == "f16":
            for c in range(2 * thread_id(0), width, 2 * BLOCK):
                vstore(pool, s * width + c, f32(values[t * width + c]), f32(values[t * width + c + 1]))
        else:
            for c in range(thread_id(0), width, BLOCK):
                pool[s * width + c] = f32(values[t * width + c])


@kernel(workgroup=(1, 1, 1))
def reduce_axis(x: In[f32], y: Out[f32], outer: i32, length: i32, inner: i32, OP: Const = "sum"):
    """y[o, i] = sum / mean / max / min over r of x[o, r, i] (x viewed as [outer, length, inner]):
    any single axis, or adjacent axes merged; grid (outer, ceil(inner / 16)), 16 lanes of i each."""
    o = group_id(0)
    i0 = group_id(1) * 16
    acc = shared(f32, 16)
    for i in range(16):
        acc[i] = 0.0 if OP == "sum" or OP == "mean" else (-3.0e38 if OP == "max" else 3.0e38)
    n = min(16, inner - i0)
    for r in range(length):
        base = (o * length + r) * inner + i0
        for i in range(n):
            v = x[base + i]
            if OP == "sum" or OP == "mean":
                acc[i] += v
            elif OP == "max":
                acc[i] = max(acc[i], v)
            else:
                acc[i] = min(acc[i], v)
    for i in range(n):
        y[o * inner + i0 + i] = acc[i] / f32(length) if OP == "mean" else acc[i]


@kernel(workgroup=(1, 1, 1))
def topk_rows(x: In[f32], values: Out[f32], indices: Out[i32], cols: i32, K: Const = 2):
    """The K largest of each row of x, largest first, ties to the lower index (a stable descending
    sort's first K); grid (rows,). Each pick is the best (value, -index) strictly below the last."""
    row = group_id(0)
    pv = 0.0
    pi = -1
    for r in static_range(K):
        bv = 0.0
        bi = -1
        for c in range(cols):
            v = x[row * cols + c]
            below = pi < 0 or v < pv or (v == pv and c > pi)
            if below and (bi < 0 or v > bv):
                bv = v
                bi = c
        values[row * K + r] = bv
        indices[row * K + r] = bi
        pv = bv
        pi = bi
