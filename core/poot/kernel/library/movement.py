"""Data movement: strided copies (transpose, slice, expand, the parts of a concat, non-contiguous
reshapes) over up to four dimensions with run-time shapes, row reductions over the last axis, and the
KV-cache scatter through a slot map."""

from __future__ import annotations

from ...graph.dtypes import f32, i32
from ..frontend import Const, In, Out, kernel


@kernel(workgroup=("BLOCK", 1, 1))
def copy_strided(src: In[f32], dst: Out[f32], n: i32, d0: i32, d1: i32, d2: i32, d3: i32,
                 s0: i32, s1: i32, s2: i32, s3: i32, src_offset: i32, t0: i32, t1: i32, t2: i32, t3: i32, dst_offset: i32, BLOCK: Const = 256):
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
def cache_write(values: In[f32], slots: In[i32], pool: Out[f32], width: i32, BLOCK: Const = 128):
    """pool[slots[t], :] = values[t, :] for each new token t (a negative slot skips it); grid (tokens,)."""
    t = group_id(0)
    s = slots[t]
    if s >= 0:
        for c in range(thread_id(0), width, BLOCK):
            pool[s * width + c] = values[t * width + c]
