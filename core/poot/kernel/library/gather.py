"""Embedding gather: rows of a table at token ids, from f32 or packed storage (dequantized).

An id outside the table's ``rows`` reads the nearest row instead of memory past the table: a step
queued before the last is read takes its tokens from the device's sampler, and a row of logits
that are all NaN leaves the sampler with no token (``vocab``); the engine ends that sequence on
the host, where the id is checked, and the row read for it is never used."""

from __future__ import annotations

from ...graph.dtypes import f16, f32, i32, u8
from ..frontend import Const, In, Out, kernel


@kernel(workgroup=("BLOCK", 1, 1))
def gather_f32(table: In[f32], ids: In[i32], out: Out[f32], cols: i32, rows: i32, BLOCK: Const = 128):
    """out[t, :] = table[ids[t], :] (ids clamped to the ``rows``); grid (tokens,)."""
    t = group_id(0)
    row = min(max(ids[t], 0), rows - 1)
    for c in range(thread_id(0), cols, BLOCK):
        out[t * cols + c] = table[row * cols + c]


@kernel(workgroup=("BLOCK", 1, 1))
def gather_packed(table: In[u8], lut: In[f32], ids: In[i32], out: Out[f32], cols: i32, row_bytes: i32, rows: i32, QTYPE: Const = "q8_0", BLOCK: Const = 128):
    """out[t, :] = dequant(table)[ids[t], :] (ids clamped to the ``rows``); grid (tokens,)."""
    t = group_id(0)
    row = min(max(ids[t], 0), rows - 1)
    for c in range(thread_id(0), cols, BLOCK):
        out[t * cols + c] = dequant(QTYPE, table, row * row_bytes, c)


@kernel(workgroup=("BLOCK", 1, 1))
def gather_f16(table: In[u8], lut: In[f32], ids: In[i32], out: Out[f16], cols: i32, rows: i32, BLOCK: Const = 128):
    """out[t, :] = table[ids[t], :] for an f16 table (f16 values are stored as they are; ids
    clamped to the ``rows``); grid (tokens,)."""
    t = group_id(0)
    row = min(max(ids[t], 0), rows - 1)
    for c in range(thread_id(0), cols, BLOCK):
        out[t * cols + c] = f16(dequant("f16", table, row * cols * 2, c))
