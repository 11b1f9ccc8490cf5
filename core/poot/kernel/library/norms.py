"""Row reductions: RMSNorm, LayerNorm, softmax and argmax. One workgroup per row; threads stride over
the row and combine through a shared-memory tree (BLOCK is a power of two)."""

from __future__ import annotations

from ...graph.dtypes import f32, i32
from ..frontend import Const, In, Out, kernel


@kernel(workgroup=("BLOCK", 1, 1))
def rms_norm(x: In[f32], w: In["WT"], y: Out[f32], cols: i32, eps: f32, BLOCK: Const = 128, UNIT_OFFSET: Const = False, WT: Const = "f32", SUBGROUP: Const = 0):
    """y = x / sqrt(mean(x^2) + eps) * w (Gemma: * (1 + w)), row by row; the weight as stored (WT:
    f32, f16 or bf16). SUBGROUP (32 on NVIDIA GPUs, 0 elsewhere): the sum of squares by subgroup
    reductions (``reduce_shared``'s third argument) instead of a tree of log2(BLOCK) steps."""
    row = group_id(0)
    t = thread_id(0)
    part = shared(f32, BLOCK)
    acc = 0.0
    for c in range(t, cols, BLOCK):
        v = x[row * cols + c]
        acc += v * v
    part[t] = acc
    reduce_shared(part, "add", SUBGROUP)
    scale = rsqrt(part[0] / f32(cols) + eps)
    for c in range(t, cols, BLOCK):
        g = f32(w[c]) + 1.0 if UNIT_OFFSET else f32(w[c])
        y[row * cols + c] = x[row * cols + c] * scale * g


@kernel(workgroup=("BLOCK", 1, 1))
def add_rms_norm(
    a: In[f32],
    b: In[f32],
    w: In["WT"],
    h: Out[f32],
    y: Out[f32],
    cols: i32,
    eps: f32,
    BLOCK: Const = 128,
    UNIT_OFFSET: Const = False,
    WT: Const = "f32",
    SUBGROUP: Const = 0,
):
    """A residual add and the RMSNorm of its sum in one pass: h = a + b, y = rms_norm(h) * w; each
    thread reads back only the values it wrote. SUBGROUP as for ``rms_norm``."""
    row = group_id(0)
    t = thread_id(0)
    part = shared(f32, BLOCK)
    acc = 0.0
    for c in range(t, cols, BLOCK):
        v = a[row * cols + c] + b[row * cols + c]
        h[row * cols + c] = v
        acc += v * v
    part[t] = acc
    reduce_shared(part, "add", SUBGROUP)
    scale = rsqrt(part[0] / f32(cols) + eps)
    for c in range(t, cols, BLOCK):
        g = f32(w[c]) + 1.0 if UNIT_OFFSET else f32(w[c])
        y[row * cols + c] = h[row * cols + c] * scale * g


@kernel(workgroup=("BLOCK", 1, 1))
def layer_norm(x: In[f32], w: In[f32], b: In[f32], y: Out[f32], cols: i32, eps: f32, BLOCK: Const = 128):
    """y = (x - mean) / sqrt(var + eps) * w + b, row by row (two passes: mean, then variance)."""
    row = group_id(0)
    t = thread_id(0)
    part = shared(f32, BLOCK)
    acc = 0.0
    for c in range(t, cols, BLOCK):
        acc += x[row * cols + c]
    part[t] = acc
    reduce_shared(part, "add")
    mean = part[0] / f32(cols)
    barrier()
    acc2 = 0.0
    for c in range(t, cols, BLOCK):
        d = x[row * cols + c] - mean
        acc2 += d * d
    part[t] = acc2
    reduce_shared(part, "add")
    scale = rsqrt(part[0] / f32(cols) + eps)
    for c in range(t, cols, BLOCK):
        y[row * cols + c] = (x[row * cols + c] - mean) * scale * w[c] + b[c]


@kernel(workgroup=("BLOCK", 1, 1))
def softmax(x: In[f32], y: Out[f32], cols: i32, scale: f32, BLOCK: Const = 128, SOFTCAP: Const = 0.0):
    """y = softmax(scale * x) per row (with SOFTCAP > 0: of softcap * tanh(scale * x / softcap))."""
    row = group_id(0)
    t = thread_id(0)
    part = shared(f32, BLOCK)
    m = -3.0e38
    for c in range(t, cols, BLOCK):
        v = x[row * cols + c] * scale
        if SOFTCAP > 0.0:
            v = tanh(v / SOFTCAP) * SOFTCAP
        m = max(m, v)
    part[t] = m
    reduce_shared(part, "max")
    rmax = part[0]
    barrier()
    acc = 0.0
    for c in range(t, cols, BLOCK):
        v = x[row * cols + c] * scale
        if SOFTCAP > 0.0:
            v = tanh(v / SOFTCAP) * SOFTCAP
        e = exp(v - rmax)
        y[row * cols + c] = e
        acc += e
    part[t] = acc
    reduce_shared(part, "add")
    inv = 1.0 / part[0]
    for c in range(t, cols, BLOCK):
        y[row * cols + c] = y[row * cols + c] * inv


@kernel(workgroup=("BLOCK", 1, 1))
def argmax(x: In[f32], out: Out[i32], cols: i32, BLOCK: Const = 128):
    """out[row] = index of the row's largest value (the lowest index on ties)."""
    row = group_id(0)
    t = thread_id(0)
    best_v = shared(f32, BLOCK)
    best_i = shared(i32, BLOCK)
    bv = -3.0e38
    bi = cols
    for c in range(t, cols, BLOCK):
        v = x[row * cols + c]
        if v > bv:
            bv = v
            bi = c
    best_v[t] = bv
    best_i[t] = bi
    reduce_argmax(best_v, best_i)
    if t == 0:
        out[row] = best_i[0]


@kernel(workgroup=(1, 1, 1))
def rms_norm_lanes(x: In[f32], w: In["WT"], y: Out[f32], cols: i32, eps: f32, UNIT_OFFSET: Const = False, WT: Const = "f32"):
    """RMSNorm scheduled for a CPU core: one workgroup per row, the sum of squares in 16 lanes (then a
    fixed tree), the scaling vectorised; grid (rows,)."""
    row = group_id(0)
    base = row * cols
    lanes = shared(f32, 16)
    for i in range(16):
        lanes[i] = 0.0
    c16 = cols // 16 * 16
    for c in range(0, c16, 16):
        for i in range(16):
            v = x[base + c + i]
            lanes[i] += v * v
    for c in range(c16, cols):
        v = x[base + c]
        lanes[0] += v * v
    for s in static_range(4):
        for i in range(8 >> s):
            lanes[i] += lanes[i + (8 >> s)]
    scale = rsqrt(lanes[0] / f32(cols) + eps)
    for c in range(cols):
        g = f32(w[c]) + 1.0 if UNIT_OFFSET else f32(w[c])
        y[base + c] = x[base + c] * scale * g


@kernel(workgroup=(1, 1, 1))
def add_rms_norm_lanes(a: In[f32], b: In[f32], w: In["WT"], h: Out[f32], y: Out[f32], cols: i32, eps: f32, UNIT_OFFSET: Const = False, WT: Const = "f32"):
    """``add_rms_norm`` scheduled for a CPU core: h = a + b written while its squares are summed in
    16 lanes, then y = h scaled; grid (rows,)."""
    row = group_id(0)
    base = row * cols
    lanes = shared(f32, 16)
    for i in range(16):
        lanes[i] = 0.0
    c16 = cols // 16 * 16
    for c in range(0, c16, 16):
        for i in range(16):
            v = a[base + c + i] + b[base + c + i]
            h[base + c + i] = v
            lanes[i] += v * v
    for c in range(c16, cols):
        v = a[base + c] + b[base + c]
        h[base + c] = v
        lanes[0] += v * v
    for s in static_range(4):
        for i in range(8 >> s):
            lanes[i] += lanes[i + (8 >> s)]
    scale = rsqrt(lanes[0] / f32(cols) + eps)
    for c in range(cols):
        g = f32(w[c]) + 1.0 if UNIT_OFFSET else f32(w[c])
        y[base + c] = h[base + c] * scale * g
