"""The graph IR: typed SSA values produced by op nodes, kept in topological order.

A ``Graph`` has named inputs (per-step data such as token ids, positions, slot maps), named weights
(tensors of the checkpoint, possibly packed-quantized), constants, and named outputs. Nodes are
immutable once built; passes build new node lists.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dims import Shape, shape_str
from .dtypes import DType

__all__ = ["TensorType", "Value", "Node", "Graph", "ConstData"]


@dataclass(frozen=True)
class TensorType:
    """The type of a value: element dtype and (possibly symbolic) shape."""

    dtype: DType
    shape: Shape

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}{shape_str(self.shape)}"


class ConstData:
    """A constant's array, hashable by content so equal constants are one for CSE."""

    __slots__ = ("array", "_key")

    def __init__(self, array: np.ndarray) -> None:
        self.array = np.array(array, order="C", copy=True)
        self.array.setflags(write=False)
        self._key = (self.array.dtype.str, self.array.shape, self.array.tobytes())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConstData) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        a = self.array
        if a.size <= 4:
            return f"const({a.tolist()})"
        return f"const({a.dtype}{list(a.shape)})"


class Value:
    """One SSA value: output ``index`` of ``node``."""

    __slots__ = ("node", "index", "type")

    def __init__(self, node: "Node", index: int, type: TensorType) -> None:
        self.node, self.index, self.type = node, index, type

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self) -> Shape:
        return self.type.shape

    @property
    def rank(self) -> int:
        return len(self.type.shape)

    def __repr__(self) -> str:
        return f"%{self.node.id}" + (f".{self.index}" if len(self.node.outputs) > 1 else "") + f":{self.type}"


@dataclass(eq=False)
class Node:
    """An op applied to input values, with attributes; produces one or more values."""

    id: int
    op: str
    inputs: tuple[Value, ...]
    attrs: Mapping[str, Any]
    outputs: tuple[Value, ...] = field(default=())

    @property
    def out(self) -> Value:
        if len(self.outputs) != 1:
            raise ValueError(f"node %{self.id} ({self.op}) has {len(self.outputs)} outputs")
        return self.outputs[0]

    def attr_key(self) -> tuple:
        return tuple(sorted(self.attrs.items()))

    def __repr__(self) -> str:
        outs = ", ".join(repr(o) for o in self.outputs)
        ins = ", ".join(f"%{v.node.id}" + (f".{v.index}" if len(v.node.outputs) > 1 else "") for v in self.inputs)
        attrs = ", ".join(f"{k}={v!r}" for k, v in sorted(self.attrs.items()))
        return f"{outs} = {self.op}({ins}{'; ' if attrs and ins else ''}{attrs})"


@dataclass
class Graph:
    """Nodes in topological order plus the named outputs. Build one with ``GraphBuilder``."""

    nodes: list[Node]
    outputs: dict[str, Value]

    def inputs(self) -> dict[str, Value]:
        return {n.attrs["name"]: n.out for n in self.nodes if n.op == "input"}

    def weights(self) -> dict[str, Value]:
        return {n.attrs["name"]: n.out for n in self.nodes if n.op == "weight"}

    def symbols(self) -> frozenset[str]:
        return frozenset(s for n in self.nodes for v in n.outputs for d in v.shape for s in d.symbols)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def users(self) -> dict[int, list[Node]]:
        """Node id -> nodes that read any of its outputs."""
        out: dict[int, list[Node]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for v in n.inputs:
                out[v.node.id].append(n)
        return out

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def __str__(self) -> str:
        lines = [repr(n) for n in self.nodes]
        lines += [f"return {name} = %{v.node.id}" for name, v in self.outputs.items()]
        return "\n".join(lines)
