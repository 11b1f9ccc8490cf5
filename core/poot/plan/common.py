"""Shared helpers of the planner: value keys, shapes and strides under a symbol environment."""

from __future__ import annotations

from collections.abc import Mapping

from ..graph.dims import Dim
from ..graph.ir import Value
from ..kernel.library.elementwise import MAX_RANK

__all__ = ["Env", "key", "shape", "strides", "pad"]

Env = Mapping[str, int]


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


