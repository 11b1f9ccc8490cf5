"""Embedding gather: rows of a table at token ids, from f32 or packed storage (dequantized)."""

from __future__ import annotations

from ...graph.dtypes import f16, f32, i32, u8
from ..frontend import Const, In, Out, kernel


@kernel(workgroup=("BLOCK", 1, 1))
def gather_f32(table: In[f32], ids: In[i32], out: Out[f32], cols: i32, BLOCK: Const = 128):
    """out[t, :] = table[ids[t], :]; grid (tokens,)."""
    t = group_id(0)
    row = ids[t]
    for c in range(thread_id(0), cols, BLOCK):
        out[t * cols + c] = table[row * cols + c]


@kernel(workgroup=("BLOCK", 1, 1))
def gather_packed(table: In[u8], lut: In[f32], ids: In[i32], out: Out[f32], cols: i32, row_bytes: i32, QTYPE: Const = "q8_0", BLOCK: Const = 128):
    """out[t, :] = dequant(table)[ids[t], :]; grid (tokens,)."""
    t = group_id(0)
    row = ids[t]
    for c in range(thread_id(0), cols, BLOCK):
        out[t * cols + c] = dequant(QTYPE, table, row * row_bytes, c)


@kernel(workgroup=("BLOCK", 1, 1))
def gather_f16(table: In[u8], lut: In[f32], ids: In[i32], out: Out[f16], cols: i32, BLOCK: Const = 128):
    """out[t, :] = table[ids[t], :] for an f16 table (f16 values are stored as they are); grid (tokens,)."""
    t = group_id(0)
    row = ids[t]
    for c in range(thread_id(0), cols, BLOCK):
        out[t * cols + c] = f16(dequant("f16", table, row * cols * 2, c))
