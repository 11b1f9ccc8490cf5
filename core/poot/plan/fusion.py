"""Fusion decisions, made on the graph before kernels are chosen: elementwise chains become one
kernel, RMSNorm is recognised as one op, slices / transposes / expands feeding elementwise kernels
are read through strided views instead of being copied, and elementwise results that only feed a
concat are written into their part of its output."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..graph import dtypes as dt
from ..graph.ir import Graph, Node, Value
from ..graph.ops import OPS
from ..kernel.library.elementwise import MAX_RANK
from .common import Env
from .common import key as _key
from .common import shape as _shape
from .common import strides as _strides

__all__ = [
    "View",
    "Into",
    "RmsNorm",
    "RopeCache",
    "view_of",
    "virtual_views",
    "concat_parts",
    "recognise_rms_norms",
    "residual_adds",
    "recognise_rope_caches",
    "elementwise_groups",
]


@dataclass(frozen=True)
class View:
    """How a kernel reads a value through another's storage: element offset and strides (per env)."""

    base: Value
    offset: Callable[[Env], int]
    strides: Callable[[Env], list[int]]


def view_of(v: Value, virtual: set[int]) -> View:
    """Follow slices, transposes and expands that are not materialised (``virtual``) to the value
    whose storage they read."""
    n = v.node
    if n.id not in virtual:
        return View(v, lambda env: 0, lambda env: _strides(_shape(v, env)))
    x = n.inputs[0]
    src = view_of(x, virtual)
    if n.op == "slice":
        ax, start, step = n.attrs["axis"] % x.rank, n.attrs["start"], n.attrs["step"]
        return View(
            src.base,
            lambda env: src.offset(env) + start * src.strides(env)[ax],
            lambda env: [st * step if i == ax else st for i, st in enumerate(src.strides(env))],
        )
    if n.op == "transpose":
        perm = n.attrs["perm"]
        return View(src.base, src.offset, lambda env: [src.strides(env)[p] for p in perm])
    if n.op == "expand":

        def est(env: Env) -> list[int]:
            full = _shape(v, env)
            xs = [1] * (len(full) - x.rank) + list(_shape(x, env))
            st = [0] * (len(full) - x.rank) + src.strides(env)
            return [0 if xs[d] == 1 and full[d] != 1 else st[d] for d in range(len(full))]

        return View(src.base, src.offset, est)
    raise AssertionError(n.op)


def virtual_views(graph: Graph, skip: set[int]) -> set[int]:
    """Slices, transposes and expands that no launch materialises: every user is an elementwise op
    (which reads through the view with strides) or another such view."""
    users = graph.users()
    outputs = {_key(v) for v in graph.outputs.values()}
    virtual: set[int] = set()
    for n in reversed(graph.nodes):
        if n.op not in ("slice", "transpose", "expand") or _key(n.outputs[0]) in outputs or n.inputs[0].rank > MAX_RANK or n.outputs[0].rank > MAX_RANK:
            continue
        us = users[n.id]
        if us and all((OPS[u.op].category == "elementwise" and u.id not in skip) or u.id in virtual for u in us):
            virtual.add(n.id)
    return virtual


@dataclass(frozen=True)
class Into:
    """An elementwise result written straight into part ``index`` of a concat's output."""

    concat: Node
    index: int


def concat_parts(graph: Graph, roots: set[int]) -> dict[tuple[int, int], Into]:
    users = graph.users()
    outputs = {_key(v) for v in graph.outputs.values()}
    into: dict[tuple[int, int], Into] = {}
    for c in graph.nodes:
        if c.op != "concat" or c.outputs[0].rank > MAX_RANK:
            continue
        for i, part in enumerate(c.inputs):
            p = part.node
            if p.id in roots and len(users[p.id]) == 1 and _key(part) not in outputs and sum(_key(q) == _key(part) for q in c.inputs) == 1:
                into[_key(part)] = Into(c, i)
    return into


@dataclass(frozen=True)
class RmsNorm:
    x: Value
    weight: Value
    unit_offset: bool
    eps: float
    out: Value
    nodes: frozenset[int]


def _scalar_const(v: Value) -> float | None:
    if v.node.op == "constant" and v.node.attrs["value"].array.size == 1:
        return float(v.node.attrs["value"].array.reshape(()))
    return None


def recognise_rms_norms(graph: Graph) -> dict[int, RmsNorm]:
    """RMSNorm as the compositions trace it: mean(x * x, -1) + eps -> rsqrt -> * x -> * w (or
    * (w + 1)), w an f32 value or the cast of a 16-bit weight (then read as stored). Keyed by the id of the node whose output is the normalised value; every matched
    node but that output is used only inside the pattern."""
    users = graph.users()
    outputs = {_key(v) for v in graph.outputs.values()}

    def only_user(n: Node) -> Node | None:
        us = users[n.id]
        return us[0] if len(us) == 1 and _key(n.outputs[0]) not in outputs else None

    def other(n: Node, v: Value) -> Value | None:
        a, b = n.inputs
        return b if _key(a) == _key(v) else (a if _key(b) == _key(v) else None)

    found: dict[int, RmsNorm] = {}
    for m in graph.nodes:
        if m.op != "mean" or not m.attrs["keepdims"]:
            continue
        sq = m.inputs[0]
        if [a % sq.rank for a in m.attrs["axes"]] != [sq.rank - 1] or sq.node.op != "mul" or _key(sq.node.inputs[0]) != _key(sq.node.inputs[1]):
            continue
        x = sq.node.inputs[0]
        if x.dtype != dt.f32 or only_user(sq.node) is not m:
            continue
        add = only_user(m)
        if add is None or add.op != "add" or (eps := _scalar_const(other(add, m.outputs[0]) or add.inputs[0])) is None:
            continue
        rs = only_user(add)
        if rs is None or rs.op != "rsqrt":
            continue
        ym = only_user(rs)
        if ym is None or ym.op != "mul" or other(ym, rs.outputs[0]) is None or _key(other(ym, rs.outputs[0])) != _key(x):
            continue
        wm = only_user(ym)
        if wm is None or wm.op != "mul":
            continue
        w = other(wm, ym.outputs[0])
        cols = x.shape[-1]
        if w is None or w.rank != 1 or w.shape[0] != cols or not cols.is_static:
            continue
        nodes = {sq.node.id, m.id, add.id, rs.id, ym.id}
        unit = False
        reader = wm
        if w.node.op == "add" and _scalar_const(w.node.inputs[1]) == 1.0 and only_user(w.node) is wm and w.node.inputs[0].dtype == dt.f32:
            nodes.add(w.node.id)
            reader = w.node
            w, unit = w.node.inputs[0], True
        src = w.node.inputs[0] if w.node.op == "cast" else None
        if src is not None and src.node.op == "weight" and src.dtype in (dt.f16, dt.bf16) and only_user(w.node) is reader:
            nodes.add(w.node.id)  # the kernel reads the 16-bit weight as stored
            w = src
        elif w.dtype != dt.f32:
            continue
        found[wm.id] = RmsNorm(x, w, unit, eps, wm.outputs[0], frozenset(nodes))
    return found


def residual_adds(
    graph: Graph, norms: Mapping[int, RmsNorm], groups: Mapping[int, list[Node]], virtual: set[int], in_place: Mapping[tuple[int, int], Into]
) -> dict[int, Node]:
    """RMSNorms whose input is a residual add the norm's kernel can compute itself (h = a + b written
    as it is summed): norm id -> that add. The add is an elementwise kernel of its own, adds two f32
    values of its shape (no broadcast, no views), and nothing reads its sum before the norm."""
    users = graph.users()
    found: dict[int, Node] = {}
    for nid, r in norms.items():
        a = r.x.node
        if a.op != "add" or groups.get(a.id) != [a] or _key(r.x) in in_place or a.id in virtual:
            continue
        if any(v.dtype != dt.f32 or v.shape != r.x.shape or v.node.id in virtual or v.node.op == "constant" for v in a.inputs):
            continue
        if all(u.id in r.nodes or u.id == nid or u.id > nid for u in users[a.id]):
            found[nid] = a
    return found


@dataclass(frozen=True)
class RopeCache:
    """The rotations of q and k and the writes of k and v into their pools, one launch between the
    projections and attention."""

    rope_q: Node
    rope_k: Node
    write_k: Node
    write_v: Node

    @property
    def nodes(self) -> frozenset[int]:
        return frozenset({self.rope_q.id, self.rope_k.id, self.write_k.id, self.write_v.id})

    @property
    def at(self) -> int:
        """The node whose place in the order the launch takes (the last of the four)."""
        return max(self.nodes)


def recognise_rope_caches(graph: Graph) -> dict[int, RopeCache]:
    """k = rope(k) written into a pool (f32 or f16: the kernel rounds as it writes), v written into
    a pool of the same type by the same slot map, q rotated by the same rope just before: keyed by
    ``RopeCache.at``. Every other reader of the four outputs comes after that point."""
    users = graph.users()
    found: dict[int, RopeCache] = {}
    ropes = [n for n in graph.nodes if n.op == "rope"]
    writes = [n for n in graph.nodes if n.op == "cache_write"]
    taken: set[int] = set()
    for wk in writes:
        pool, vals, slots = wk.inputs
        rk = vals.node
        if rk.op != "rope" or pool.dtype not in (dt.f32, dt.f16) or vals.dtype != dt.f32 or pool.rank != 4 or [u.id for u in users[rk.id]] != [wk.id]:
            continue
        rq = next(
            (
                r
                for r in reversed(ropes)
                if r.id < rk.id
                and r.id not in taken
                and r.attrs == rk.attrs
                and _key(r.inputs[1]) == _key(rk.inputs[1])
                and r.inputs[0].shape[2] == rk.inputs[0].shape[2]
                and not any(u.op == "cache_write" for u in users[r.id])
            ),
            None,
        )
        wv = next(
            (
                w
                for w in writes
                if w.id > wk.id
                and w.id not in taken
                and _key(w.inputs[2]) == _key(slots)
                and w.inputs[0].dtype == pool.dtype
                and w.inputs[1].dtype == dt.f32
                and w.inputs[0].rank == 4
                and w.inputs[0].shape[2] == pool.shape[2]
                and w.inputs[1].node.op != "rope"
            ),
            None,
        )
        if rq is None or wv is None:
            continue
        if pool.dtype == dt.f16 and (rk.attrs["dim"] % 4 or pool.shape[3].value % 2 or wv.inputs[0].shape[3].value % 2):
            continue  # halves are written two at a time: the rotation in pairs of pairs, whole words
        rc = RopeCache(rq, rk, wk, wv)
        if all(u.id in rc.nodes or u.id > rc.at for m in (rq, wk, wv) for u in users[m.id]):
            found[rc.at] = rc
            taken |= rc.nodes
    return found


def elementwise_groups(graph: Graph, skip: set[int] = frozenset()) -> dict[int, list[Node]]:  # type: ignore[assignment]
    """Fuse elementwise chains: a node joins its consumer's kernel when that consumer is elementwise
    and its only user, and its value is not a graph output. Returns root node id -> members in order."""
    users = graph.users()
    outputs = {_key(v) for v in graph.outputs.values()}
    root: dict[int, int] = {}
    for n in reversed(graph.nodes):
        if OPS[n.op].category != "elementwise" or n.id in skip:
            continue
        us = users[n.id]
        if len(us) == 1 and OPS[us[0].op].category == "elementwise" and us[0].id not in skip and _key(n.outputs[0]) not in outputs and len(n.outputs) == 1:
            root[n.id] = root.get(us[0].id, us[0].id)
        else:
            root[n.id] = n.id
    groups: dict[int, list[Node]] = {}
    for n in graph.nodes:
        if n.id in root:
            groups.setdefault(root[n.id], []).append(n)
    return groups
