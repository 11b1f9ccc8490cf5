"""Where every value of a plan lives for one set of symbol values (token count, batch, block-table
width): weights and KV pools are bound by the caller and persist; step inputs get buffers of their
own (they are written before each replay); every value a launch produces gets a slot in one
activation arena, slots reused by lifetime. The arena's size is the planned peak, which is all an
executor allocates for activations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..graph import dtypes as dt
from ..graph.dims import Dim
from ..graph.ir import Value
from .plan import Launch, Plan
from .storage import Lifetime, live_peak, plan_arena

__all__ = ["storage_dtype", "weight_dtype", "weight_array", "stored_nbytes", "StoragePlan", "plan_storage"]

Key = tuple[int, int]


def storage_dtype(t: dt.DType) -> np.dtype:
    """How a value of type ``t`` is stored by kernels: packed types as bytes, bool as a byte, bf16
    activations widened to f32."""
    if t.is_packed:
        return np.dtype(np.uint8)
    if t == dt.boolean:
        return np.dtype(np.uint8)
    return np.dtype(np.float32) if t == dt.bf16 else np.dtype(t.numpy)


def weight_dtype(t: dt.DType) -> np.dtype:
    """How a weight of type ``t`` is bound: as the checkpoint stores it (packed blocks as bytes,
    bf16 as its 16-bit patterns, f16 as float16), so kernels read half the bytes of f32."""
    return np.dtype(np.uint16) if t == dt.bf16 else storage_dtype(t)


def stored_nbytes(v: Value) -> int:
    """Bytes a static-shaped value (a weight) takes as bound: packed blocks, or its weight dtype."""
    shape = tuple(d.value for d in v.shape)
    if v.dtype.is_packed:
        from ..quant import quantization

        return int(np.prod(shape[:-1])) * quantization(v.dtype.name).row_bytes(shape[-1])
    return int(np.prod(shape)) * weight_dtype(v.dtype).itemsize


def weight_array(v: Value, a: np.ndarray) -> np.ndarray:
    """``a`` as a weight of ``v``'s type is bound: f16/bf16 values given as float32 (as the oracle
    takes them) become their 16-bit storage; anything else must already be stored that way."""
    a = np.asarray(a)
    if v.dtype == dt.bf16 and a.dtype == np.float32:
        return (np.ascontiguousarray(a).view(np.uint32) >> 16).astype(np.uint16)
    if v.dtype == dt.f16 and a.dtype == np.float32:
        return a.astype(np.float16)
    return a


@dataclass(frozen=True)
class StoragePlan:
    env: dict[str, int]
    launches: list[Launch]  # the launches active for ``env``, in order
    roots: dict[Key, Key]  # every value -> the value whose storage it uses (views and in-place writes)
    shapes: dict[Key, tuple[int, ...]]
    inputs: dict[str, Key]  # step inputs (not pools): name -> value
    pools: dict[str, Key]  # inputs written in place (KV pools): name -> value
    arena_offsets: dict[Key, int]  # activation root -> byte offset in the arena
    arena_bytes: int  # the planned peak: the arena's size
    live_bytes: int  # the most activation bytes alive at once (a lower bound on any arena)
    scratch: frozenset[Key] = frozenset()  # the plan's scratch areas this step uses (f32 words in the arena)

    def nbytes(self, key: Key, dtype: dt.DType | None = None) -> int:
        """Bytes of value ``key`` stored as ``dtype`` (a scratch area: its f32 words)."""
        if key in self.scratch:
            return int(self.shapes[key][0]) * 4
        return int(np.prod(self.shapes[key], dtype=np.int64)) * storage_dtype(dtype).itemsize


def _value_shape(v: Value, env: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(Dim.evaluate(d, env) for d in v.shape)


def plan_storage(plan: Plan, env: Mapping[str, int], alignment: int = 64) -> StoragePlan:
    g = plan.graph
    env = dict(env)
    launches = [l for l in plan.launches if l.when is None or l.when(env)]
    roots: dict[Key, Key] = {}
    shapes: dict[Key, tuple[int, ...]] = {}
    values: dict[Key, Value] = {}
    for n in g.nodes:
        for v in n.outputs:
            k = (n.id, v.index)
            values[k] = v
            shapes[k] = _value_shape(v, env)
            roots[k] = plan.root(k)
    scratch = {r for l in launches for r in l.buffers.values() if isinstance(r, tuple) and r in plan.scratch}
    for k in scratch:
        roots[k] = k
        shapes[k] = (max(1, plan.scratch[k].words(env)),)
    pool_roots = {roots[k] for k in plan.aliases}
    inputs: dict[str, Key] = {}
    pools: dict[str, Key] = {}
    for name, v in g.inputs().items():
        k = (v.node.id, v.index)
        (pools if k in pool_roots else inputs)[name] = k
    fixed = {roots[(n.id, 0)] for n in g.nodes if n.op in ("input", "weight", "constant")}
    first: dict[Key, int] = {}
    last: dict[Key, int] = {}
    for i, l in enumerate(launches):
        for ref in l.buffers.values():
            if isinstance(ref, tuple):
                r = roots[ref]
                if r not in fixed:
                    first.setdefault(r, i)
                    last[r] = i
    for v in g.outputs.values():
        r = roots[(v.node.id, v.index)]
        if r in first:
            last[r] = len(launches)  # read back after the step
    lifetimes = [
        Lifetime(r, max(1, int(np.prod(shapes[r], dtype=np.int64))) * (4 if r in scratch else storage_dtype(values[r].dtype).itemsize), first[r], last[r])
        for r in first
    ]
    arena = plan_arena(lifetimes, alignment)
    return StoragePlan(env, launches, roots, shapes, inputs, pools, arena.offsets, arena.size, live_peak(lifetimes, alignment), frozenset(scratch))
