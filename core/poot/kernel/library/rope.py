"""Rotary position embedding in place over [tokens, heads, head_dim], neox or interleaved pairs, partial
rotary (dims past ROT untouched), frequencies from a table (any scaling is folded into it)."""

from __future__ import annotations

from ...graph.dtypes import f32, i32
from ..frontend import Const, In, Out, kernel


@kernel(workgroup=("BLOCK", 1, 1))
def rope(x: Out[f32], positions: In[i32], inv_freq: In[f32], heads: i32, head_dim: i32, attn_factor: f32,
         ROT: Const = 64, NEOX: Const = True, BLOCK: Const = 64):
    """Rotate each (token, head) vector by its token's position; grid (tokens, heads)."""
    t = group_id(0)
    h = group_id(1)
    base = (t * heads + h) * head_dim
    pos = f32(positions[t])
    for i in range(thread_id(0), ROT // 2, BLOCK):
        ang = pos * inv_freq[i]
        cs = cos(ang) * attn_factor
        sn = sin(ang) * attn_factor
        a = base + i if NEOX else base + 2 * i
        b = base + i + ROT // 2 if NEOX else base + 2 * i + 1
        x1 = x[a]
        x2 = x[b]
        x[a] = x1 * cs - x2 * sn
        x[b] = x2 * cs + x1 * sn
