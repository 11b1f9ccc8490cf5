"""Shared helpers of the planner: what a device lets plans use, value keys, shapes and strides under a
symbol environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..graph.dims import Dim
from ..graph.ir import Value
from ..kernel.library.elementwise import MAX_RANK

__all__ = ["Env", "Limits", "key", "shape", "strides", "pad"]

Env = Mapping[str, int]


@dataclass(frozen=True)
class Limits:
    """What a plan's kernels may use on a device (from its ``Capabilities``)."""

    max_workgroup: int = 1024
    shared_bytes: int = 1 << 20
    dtypes: frozenset[str] = frozenset({"f32", "f16", "bf16", "i8", "u8", "i32", "i64", "bool"})
    subgroup: int = 1
    matrix: frozenset[str] = frozenset()
    max_buffer_bytes: int | None = None  # the largest buffer a kernel may bind (None: no limit)


def key(v: Value) -> tuple[int, int]:
    return (v.node.id, v.index)


def shape(v: Value, env: Env) -> tuple[int, ...]:
    return tuple(Dim.evaluate(d, env) for d in v.shape)


def strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.insert(0, acc)
        acc *= d
    return out


def pad(xs: list[int], fill: int) -> list[int]:
    return [fill] * (MAX_RANK - len(xs)) + xs


