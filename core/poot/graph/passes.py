"""Graph transform passes and the pass manager that verifies the graph after each one.

Passes are functions ``Graph -> Graph``; they never mutate their input. ``Rewriter`` is the one
mechanism they share: it copies nodes in order, substituting values, renumbering ids.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import GraphError, VerifyError
from .dims import numel
from .ir import ConstData, Graph, Node, Value
from .ops import OPS, infer

__all__ = [
    "Pass",
    "PassManager",
    "PassRecord",
    "verify",
    "infer_types",
    "eliminate_dead_code",
    "eliminate_common_subexpressions",
    "fold_constants",
    "Rewriter",
    "DEFAULT_PASSES",
]

Pass = Callable[[Graph], Graph]
FOLD_LIMIT = 1 << 16  # constants larger than this many elements stay computed


def _key(v: Value) -> tuple[int, int]:
    return (v.node.id, v.index)


class Rewriter:
    """Builds a new graph from an old one: copy, drop or replace nodes in order, renumbering ids."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._subst: dict[tuple[int, int], Value] = {}

    def inputs(self, n: Node) -> list[Value]:
        """``n``'s operands as values of the new graph."""
        return [self._subst[_key(v)] for v in n.inputs]

    def emit(self, op: str, inputs: Sequence[Value], attrs: Mapping, types: Sequence | None = None) -> Node:
        if types is None:
            types = infer(op, [v.type for v in inputs], attrs)
        m = Node(len(self.nodes), op, tuple(inputs), dict(attrs))
        m.outputs = tuple(Value(m, i, t) for i, t in enumerate(types))
        self.nodes.append(m)
        return m

    def bind(self, old: Node, new_values: Sequence[Value]) -> None:
        for v, w in zip(old.outputs, new_values):
            self._subst[_key(v)] = w

    def copy(self, n: Node) -> Node:
        m = self.emit(n.op, self.inputs(n), n.attrs, [v.type for v in n.outputs])
        self.bind(n, m.outputs)
        return m

    def finish(self, old: Graph) -> Graph:
        return Graph(self.nodes, {name: self._subst[_key(v)] for name, v in old.outputs.items()})


def verify(graph: Graph) -> None:
    """Check SSA form, topological order, unique source names, and every stored type against inference."""
    seen: set[int] = set()
    names: dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        if n.id != i:
            raise VerifyError(f"node %{n.id} sits at position {i}: ids must equal positions")
        if n.op not in OPS:
            raise VerifyError(f"node %{n.id}: unknown op '{n.op}'")
        for v in n.inputs:
            if v.node.id not in seen or graph.nodes[v.node.id] is not v.node:
                raise VerifyError(f"node %{n.id} ({n.op}) reads %{v.node.id}, which is not defined before it in this graph")
        if n.op in ("input", "weight"):
            nm = n.attrs["name"]
            if nm in names:
                raise VerifyError(f"{n.op} '{nm}' is defined twice (%{names[nm]} and %{n.id})")
            names[nm] = n.id
        try:
            types = infer(n.op, [v.type for v in n.inputs], n.attrs)
        except GraphError as e:
            raise VerifyError(f"node %{n.id}: {e}") from None
        if [v.type for v in n.outputs] != types or [v.index for v in n.outputs] != list(range(len(types))):
            raise VerifyError(f"node %{n.id} ({n.op}) holds types {[str(v.type) for v in n.outputs]} but its operands give {[str(t) for t in types]}")
        seen.add(n.id)
    if not graph.outputs:
        raise VerifyError("graph has no outputs")
    for name, v in graph.outputs.items():
        if v.node.id not in seen or graph.nodes[v.node.id] is not v.node:
            raise VerifyError(f"output '{name}' is not a value of this graph")


def infer_types(graph: Graph) -> Graph:
    """Recompute every node's result types from its operands (after a pass changed operands)."""
    rw = Rewriter()
    for n in graph.nodes:
        try:
            rw.bind(n, rw.emit(n.op, rw.inputs(n), n.attrs).outputs)
        except GraphError as e:
            raise GraphError(f"node %{n.id}: {e}") from None
    return rw.finish(graph)


def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop nodes no output depends on. Graph inputs stay: they are the step's interface."""
    live: set[int] = set()
    stack = [v.node for v in graph.outputs.values()]
    while stack:
        n = stack.pop()
        if n.id not in live:
            live.add(n.id)
            stack.extend(v.node for v in n.inputs)
    rw = Rewriter()
    for n in graph.nodes:
        if n.id in live or n.op == "input":
            rw.copy(n)
    return rw.finish(graph)


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """Merge pure nodes with the same op, operands and attributes."""
    rw = Rewriter()
    seen: dict[tuple, Node] = {}
    for n in graph.nodes:
        if not OPS[n.op].pure:
            rw.copy(n)
            continue
        key = (n.op, tuple(_key(v) for v in rw.inputs(n)), n.attr_key())
        if key in seen:
            rw.bind(n, seen[key].outputs)
        else:
            seen[key] = rw.copy(n)
    return rw.finish(graph)


def fold_constants(graph: Graph) -> Graph:
    """Evaluate pure nodes whose operands are all constants (and static iotas) with the oracle."""
    from ..eval.oracle import Oracle

    oracle = Oracle()
    rw = Rewriter()
    for n in graph.nodes:
        ins = rw.inputs(n)
        small = all(d.is_static for v in n.outputs for d in v.shape) and all(numel(v.shape).value <= FOLD_LIMIT for v in n.outputs)
        fed = n.op == "iota" or (bool(ins) and all(v.node.op == "constant" for v in ins))
        if not (OPS[n.op].pure and n.op not in ("constant", "cache_write") and small and fed):
            rw.copy(n)
            continue
        args = [oracle.store(v.node.attrs["value"].array, v.dtype) for v in ins]
        results = oracle.op(Node(n.id, n.op, tuple(ins), n.attrs, n.outputs), args, {}, {}, {})
        consts = [
            rw.emit("constant", (), {"value": ConstData(np.asarray(r, dtype=v.dtype.numpy)), "dtype": v.dtype}, [v.type]).out
            for v, r in zip(n.outputs, results)
        ]
        rw.bind(n, consts)
    return eliminate_dead_code(rw.finish(graph))


@dataclass(frozen=True)
class PassRecord:
    name: str
    nodes_before: int
    nodes_after: int


@dataclass
class PassManager:
    """Runs passes in order and verifies the graph after each; a broken invariant names the pass."""

    passes: Sequence[tuple[str, Pass]]
    records: list[PassRecord] = field(default_factory=list)

    def run(self, graph: Graph) -> Graph:
        verify(graph)
        for name, p in self.passes:
            before = len(graph)
            graph = p(graph)
            try:
                verify(graph)
            except VerifyError as e:
                raise VerifyError(f"after pass '{name}': {e}") from None
            self.records.append(PassRecord(name, before, len(graph)))
        return graph


DEFAULT_PASSES: tuple[tuple[str, Pass], ...] = (
    ("fold-constants", fold_constants),
    ("cse", eliminate_common_subexpressions),
    ("dce", eliminate_dead_code),
)
