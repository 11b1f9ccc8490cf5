"""Where each buffer a captured step's launches read or write lives, for backends that bind buffers
by (buffer, offset, size) (Vulkan descriptor sets, WebGPU bind groups): the backend-neutral half of
capturing a step. A backend maps each ``Region`` to one of its buffers.

Values live in one of: a weight, constant or pool (bound once, whole buffers), a step input (a
buffer per input), the step's activation arena (at the value's slot), or a small array a launch
names itself (a lookup table). Scalars of all the step's launches are packed into one block of
32-bit words, each launch's at an aligned offset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import PootError
from ..graph.ir import Value
from ..kernel.ir import Kernel
from ..plan.layouts import WeightLayout, as_read
from ..plan.memory import StoragePlan, storage_dtype, stored_nbytes, weight_array

__all__ = ["Region", "value_region", "scalar_block", "computed_outputs", "require_pools", "checked_weight", "checked_pool", "EAGER_READBACK"]

EAGER_READBACK = 256 << 10  # outputs up to this size (tokens, log-probabilities) are copied back by the step itself; larger ones when read

Key = tuple[int, int]


@dataclass(frozen=True)
class Region:
    """``kind``: 'bound' (a weight, constant or pool: ``key``), 'input' (``key``), 'arena' or
    'fixed' (``array``); ``offset`` and ``nbytes`` within it (``nbytes`` None: all of it)."""

    kind: str
    key: Key | None = None
    offset: int = 0
    nbytes: int | None = None
    array: np.ndarray | None = None


def value_region(sp: StoragePlan, values: Mapping[Key, Value], bound: set[Key] | frozenset[Key], ref: Key | np.ndarray) -> Region:
    """The storage of the value ``ref`` (or the launch's own array) in a captured step; sizes are
    rounded up to whole 32-bit words."""
    if isinstance(ref, np.ndarray):
        return Region("fixed", array=ref)
    root = sp.roots[ref]
    if root in bound:
        return Region("bound", root)
    if root in sp.inputs.values():
        return Region("input", root)
    size = max(4, sp.nbytes(root, None if root in sp.scratch else values[root].dtype))
    return Region("arena", root, sp.arena_offsets[root], (size + 3) // 4 * 4)


def require_pools(sp: StoragePlan, bound: Mapping[Key, object]) -> None:
    """Every pool the step updates must have been bound."""
    for name, k in sp.pools.items():
        if k not in bound:
            raise PootError(f"pool '{name}' is not bound: bind(weights, pools={{'{name}': ...}}) first")


def computed_outputs(graph_outputs: Mapping[str, Value], sp: StoragePlan, bound: set[Key] | frozenset[Key]) -> dict[str, Key]:
    """The graph outputs this step has storage for, by name (a conditional launch may leave some out)."""
    out = {}
    for name, v in graph_outputs.items():
        k = (v.node.id, v.index)
        root = sp.roots[k]
        if root in bound or root in sp.inputs.values() or root in sp.arena_offsets:
            out[name] = k
    return out


def scalar_block(
    kernels: Sequence[Kernel], scalars: Sequence[Mapping[str, float | int]], words: Callable[[Kernel, dict], np.ndarray], align: int
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Every launch's scalar words in one uint32 block: (the block, (byte offset, bytes) per launch;
    (0, 0) for a kernel without scalars)."""
    parts, at, top = [], [], 0
    for k, sc in zip(kernels, scalars):
        if not k.scalars:
            at.append((0, 0))
            continue
        w = words(k, dict(sc))
        parts.append((top, w))
        at.append((top, w.nbytes))
        top += -(-w.nbytes // align) * align
    block = np.zeros(max(top, 16) // 4, np.uint32)
    for off, w in parts:
        block[off // 4 : off // 4 + w.size] = w
    return block, at


def checked_weight(name: str, v: Value, a: np.ndarray, layout: WeightLayout | None = None) -> np.ndarray:
    """``a`` as weight ``v`` is bound (16-bit floats given as float32 become their storage; laid
    out when the plan reads it in ``layout``, and refused when laid out for another plan), its size
    checked against the plan's."""
    a = np.ascontiguousarray(weight_array(v, as_read(name, a, layout)))
    want = stored_nbytes(v)
    if a.nbytes != want:
        raise PootError(f"weight '{name}': the plan reads {want} bytes, got an array of {a.nbytes} ({a.shape})")
    return a


def checked_pool(name: str, v: Value, a: np.ndarray) -> np.ndarray:
    """A pool array as the plan reads it: writeable (steps update it) and of the value's storage type."""
    if not a.flags.writeable:
        raise PootError(f"pool '{name}' is updated in place and must be writeable")
    if a.dtype != storage_dtype(v.dtype):
        raise PootError(f"pool '{name}': the plan reads {storage_dtype(v.dtype)}, got {a.dtype}")
    return a
