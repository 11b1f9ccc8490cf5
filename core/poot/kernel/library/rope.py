"""Rotary position embedding over [tokens, heads, head_dim]: neox pairs (i, i + ROT/2) or interleaved
pairs (2i, 2i + 1), partial rotary (dims past ROT copied), frequencies from a table (any scaling is
folded into it). ``rope_kv_cache`` is the attention block's whole step between the projections and
attention in one launch: q rotated, k rotated into its paged pool, v copied into its pool."""

from __future__ import annotations

from ...graph.dtypes import f32, i32
from ..frontend import Const, In, Out, kernel


@kernel(workgroup=("BLOCK", 1, 1))
def rope(
    x: In[f32],
    positions: In[i32],
    inv_freq: In[f32],
    y: Out[f32],
    heads: i32,
    head_dim: i32,
    attn_factor: f32,
    ROT: Const = 64,
    NEOX: Const = True,
    BLOCK: Const = 64,
):
    """y = x with each (token, head) vector rotated by its token's position; grid (tokens, heads)."""
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
        y[a] = x1 * cs - x2 * sn
        y[b] = x2 * cs + x1 * sn
    for i in range(ROT + thread_id(0), head_dim, BLOCK):
        y[base + i] = x[base + i]


@kernel(workgroup=("BLOCK", 1, 1))
def rope_kv_cache(
    q: In[f32],
    k: In[f32],
    v: In[f32],
    positions: In[i32],
    inv_freq: In[f32],
    slots: In[i32],
    q_out: Out[f32],
    k_pool: Out["PT"],
    v_pool: Out["PT"],
    hq: i32,
    hkv: i32,
    head_dim: i32,
    v_dim: i32,
    attn_factor: f32,
    ROT: Const = 64,
    NEOX: Const = True,
    BLOCK: Const = 64,
    PT: Const = "f32",
):
    """Grid (tokens, hq + 2 hkv): workgroup (t, h) rotates query head h into q_out, key head h - hq
    into the k pool at the token's slot, or copies value head h - hq - hkv into the v pool there (a
    negative slot writes no k or v); the pools hold ``PT`` values (f32, or f16 rounded to nearest
    even, written two at a time so that a thread writes whole 32-bit words: ``ROT`` a multiple of 4,
    head widths even)."""
    t = group_id(0)
    h = group_id(1)
    s = slots[t]
    pos = f32(positions[t])
    if h < hq:
        src = (t * hq + h) * head_dim
        for i in range(thread_id(0), ROT // 2, BLOCK):
            ang = pos * inv_freq[i]
            cs = cos(ang) * attn_factor
            sn = sin(ang) * attn_factor
            a = src + i if NEOX else src + 2 * i
            b = src + i + ROT // 2 if NEOX else src + 2 * i + 1
            x1 = q[a]
            x2 = q[b]
            q_out[a] = x1 * cs - x2 * sn
            q_out[b] = x2 * cs + x1 * sn
        for i in range(ROT + thread_id(0), head_dim, BLOCK):
            q_out[src + i] = q[src + i]
    if PT == "f16" and h >= hq and h < hq + hkv and s >= 0:  # halves: whole words, two rotations a thread
        src = (t * hkv + h - hq) * head_dim
        dst = (s * hkv + h - hq) * head_dim
        for j in range(thread_id(0), ROT // 4, BLOCK):
            i = 2 * j
            ang0 = pos * inv_freq[i]
            ang1 = pos * inv_freq[i + 1]
            c0 = cos(ang0) * attn_factor
            s0 = sin(ang0) * attn_factor
            c1 = cos(ang1) * attn_factor
            s1 = sin(ang1) * attn_factor
            if NEOX:  # pairs (i, i + ROT / 2) and (i + 1, i + 1 + ROT / 2): the words at i and i + ROT / 2
                x1a = k[src + i]
                x1b = k[src + i + 1]
                x2a = k[src + i + ROT // 2]
                x2b = k[src + i + 1 + ROT // 2]
                vstore(k_pool, dst + i, x1a * c0 - x2a * s0, x1b * c1 - x2b * s1)
                vstore(k_pool, dst + i + ROT // 2, x2a * c0 + x1a * s0, x2b * c1 + x1b * s1)
            else:  # pairs (2i, 2i + 1) and (2i + 2, 2i + 3): two words
                x1a = k[src + 2 * i]
                x2a = k[src + 2 * i + 1]
                x1b = k[src + 2 * i + 2]
                x2b = k[src + 2 * i + 3]
                vstore(k_pool, dst + 2 * i, x1a * c0 - x2a * s0, x2a * c0 + x1a * s0)
                vstore(k_pool, dst + 2 * i + 2, x1b * c1 - x2b * s1, x2b * c1 + x1b * s1)
        for i in range(ROT + 2 * thread_id(0), head_dim, 2 * BLOCK):
            vstore(k_pool, dst + i, k[src + i], k[src + i + 1])
    if PT != "f16" and h >= hq and h < hq + hkv and s >= 0:  # flat conditions: SPIR-V wants structured exits
        src = (t * hkv + h - hq) * head_dim
        dst = (s * hkv + h - hq) * head_dim
        for i in range(thread_id(0), ROT // 2, BLOCK):
            ang = pos * inv_freq[i]
            cs = cos(ang) * attn_factor
            sn = sin(ang) * attn_factor
            a = i if NEOX else 2 * i
            b = i + ROT // 2 if NEOX else 2 * i + 1
            x1 = k[src + a]
            x2 = k[src + b]
            k_pool[dst + a] = x1 * cs - x2 * sn
            k_pool[dst + b] = x2 * cs + x1 * sn
        for i in range(ROT + thread_id(0), head_dim, BLOCK):
            k_pool[dst + i] = k[src + i]
    if h >= hq + hkv and s >= 0:
        hv = h - hq - hkv
        if PT == "f16":
            for i in range(2 * thread_id(0), v_dim, 2 * BLOCK):
                vstore(v_pool, (s * hkv + hv) * v_dim + i, v[(t * hkv + hv) * v_dim + i], v[(t * hkv + hv) * v_dim + i + 1])
        else:
            for i in range(thread_id(0), v_dim, BLOCK):
                v_pool[(s * hkv + hv) * v_dim + i] = v[(t * hkv + hv) * v_dim + i]
