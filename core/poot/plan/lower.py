"""A first planner: every graph op becomes one synthesized kernel launch (or a view), with grids and
scalar arguments computed from the run's symbol values. No fusion, scheduling or numerics choices
yet: this is the baseline the real planner improves on, and what lets a whole model run compiled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import Refusal
from ..graph import dtypes as dt
from ..graph.dims import Dim
from ..graph.ir import Graph, Node, Value
from ..graph.ops import OPS
from ..kernel import ir as K
from ..kernel.library import attention as attn_lib
from ..kernel.library import gather as gather_lib
from ..kernel.library import linear, linear_host, movement, norms
from ..kernel.library.elementwise import MAX_RANK, fuse_elementwise
from ..quant.bodies import BODIES, LUTS

__all__ = ["Launch", "SimplePlan", "When", "plan_graph"]

Env = Mapping[str, int]


def _key(v: Value) -> tuple[int, int]:
    return (v.node.id, v.index)


def _shape(v: Value, env: Env) -> tuple[int, ...]:
    return tuple(Dim.evaluate(d, env) for d in v.shape)


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.insert(0, acc)
        acc *= d
    return out


def _pad(xs: list[int], fill: int) -> list[int]:
    return [fill] * (MAX_RANK - len(xs)) + xs


@dataclass
class Launch:
    """One kernel launch: buffers by parameter name (graph values or fixed arrays), a grid and scalars
    computed from the symbol environment."""

    node: Node
    kernel: K.Kernel
    buffers: dict[str, tuple[int, int] | np.ndarray]
    grid: Callable[[Env], tuple[int, ...]]
    scalars: Callable[[Env], dict[str, float | int]]
    when: Callable[[Env], bool] | None = None  # a schedule for some shapes only: exactly one of a node's launches runs


@dataclass
class SimplePlan:
    graph: Graph
    launches: list[Launch]
    views: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # value -> the value whose storage it shares
    aliases: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # in-place outputs (cache_write)

    def __str__(self) -> str:
        return "\n".join(f"{i:4d} {l.node.op:12s} -> {l.kernel.name}{'' if l.when is None else '  (' + getattr(l.when, 'doc', 'some shapes') + ')'}"
                         for i, l in enumerate(self.launches))


@dataclass(frozen=True)
class _View:
    """How a kernel reads a value through another's storage: element offset and strides (per env)."""

    base: Value
    offset: Callable[[Env], int]
    strides: Callable[[Env], list[int]]


def _view(v: Value, virtual: set[int]) -> _View:
    """Follow slices, transposes and expands that are not materialised (``virtual``) to the value
    whose storage they read."""
    n = v.node
    if n.id not in virtual:
        return _View(v, lambda env: 0, lambda env: _strides(_shape(v, env)))
    x = n.inputs[0]
    src = _view(x, virtual)
    if n.op == "slice":
        ax, start, step = n.attrs["axis"] % x.rank, n.attrs["start"], n.attrs["step"]
        return _View(src.base, lambda env: src.offset(env) + start * src.strides(env)[ax],
                     lambda env: [st * step if i == ax else st for i, st in enumerate(src.strides(env))])
    if n.op == "transpose":
        perm = n.attrs["perm"]
        return _View(src.base, src.offset, lambda env: [src.strides(env)[p] for p in perm])
    if n.op == "expand":
        def est(env: Env) -> list[int]:
            full = _shape(v, env)
            xs = [1] * (len(full) - x.rank) + list(_shape(x, env))
            st = [0] * (len(full) - x.rank) + src.strides(env)
            return [0 if xs[d] == 1 and full[d] != 1 else st[d] for d in range(len(full))]

        return _View(src.base, src.offset, est)
    raise AssertionError(n.op)


def _virtual_views(graph: Graph, skip: set[int]) -> set[int]:
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
class _Into:
    """An elementwise result written straight into part ``index`` of a concat's output."""

    concat: Node
    index: int


def _concat_parts(graph: Graph, roots: set[int]) -> dict[tuple[int, int], _Into]:
    users = graph.users()
    outputs = {_key(v) for v in graph.outputs.values()}
    into: dict[tuple[int, int], _Into] = {}
    for c in graph.nodes:
        if c.op != "concat" or c.outputs[0].rank > MAX_RANK:
            continue
        for i, part in enumerate(c.inputs):
            p = part.node
            if p.id in roots and len(users[p.id]) == 1 and _key(part) not in outputs and sum(_key(q) == _key(part) for q in c.inputs) == 1:
                into[_key(part)] = _Into(c, i)
    return into


def _elementwise(n: Node, members: list[Node], virtual: set[int], into: _Into | None) -> Launch:
    """One kernel for ``members`` (an elementwise DAG whose only escaping value is ``n``'s output),
    reading inputs through views and writing into a concat's part in place when ``into`` says so."""
    inside = {_key(v) for m in members for v in m.outputs}
    ins: list[Value] = []
    consts: list[Node] = []
    for m in members:
        for v in m.inputs:
            if _key(v) in inside or any(_key(v) == _key(x) for x in ins):
                continue
            if v.node.op == "constant" and v.node.attrs["value"].array.size == 1:
                if v.node not in consts:
                    consts.append(v.node)  # scalars are inlined into the kernel
                continue
            ins.append(v)
    k = fuse_elementwise(f"ew_{'_'.join(m.op for m in members)[:40]}", consts + members, ins, n.outputs[0], block=256)
    out = n.outputs[0]
    views = [_view(v, virtual) for v in ins]
    dest = into.concat.outputs[0] if into else out

    def scalars(env: Env) -> dict[str, int]:
        oshape = _shape(out, env)
        full = _pad(list(oshape), 1)
        sc: dict[str, int] = {"n": int(np.prod(oshape)) if oshape else 1}
        sc.update({f"d{d}": full[d] for d in range(MAX_RANK)})
        for i, (v, vw) in enumerate(zip(ins, views)):
            ishape = _pad(list(_shape(v, env)), 1)
            st = _pad(vw.strides(env), 0)
            for d in range(MAX_RANK):
                sc[f"s{i}_{d}"] = 0 if ishape[d] == 1 and full[d] != 1 else st[d]
            sc[f"o{i}"] = vw.offset(env)
        dst = _strides(_shape(dest, env))
        if into is None:
            sc["o_out"] = 0
        else:
            ax = into.concat.attrs["axis"] % dest.rank
            sc["o_out"] = sum(_shape(q, env)[ax] for q in into.concat.inputs[: into.index]) * dst[ax]
        tp = _pad(dst, 0)
        sc.update({f"ot{d}": tp[d] for d in range(MAX_RANK)})
        return sc

    bufs: dict[str, Any] = {f"in{i}": _key(vw.base) for i, vw in enumerate(views)}
    bufs["out"] = _key(dest)
    return Launch(n, k, bufs, lambda env: (max(1, -(-int(np.prod(_shape(out, env))) // 256)),), scalars)


@dataclass(frozen=True)
class When:
    """A launch's condition on the symbol values, with a readable description."""

    doc: str
    test: Callable[[Env], bool]

    def __call__(self, env: Env) -> bool:
        return self.test(env)


def _matmul(n: Node) -> list[Launch]:
    """x @ w^T against a 2-D weight. Host schedules: a lane GEMV while few rows come (decode), and a
    row-block GEMM that dequantizes weight rows once for every token (prefill); the generic
    baseline kernels where those do not apply."""
    x, w = n.inputs
    if not n.attrs["transpose_b"] or w.rank not in (2, 3) or (w.rank == 3 and x.rank != 3):
        raise Refusal("matmul", "host", "the planner runs x @ w^T with a 2-D weight, or [B, T, K] x [E, N, K] per expert")
    out = n.outputs[0]
    nn, kk = w.shape[-2].value, w.shape[-1].value
    batch = w.shape[0].value if w.rank == 3 else 1
    shared_x = w.rank == 2 or x.shape[0] == 1
    if not shared_x and x.shape[0] != w.shape[0]:
        raise Refusal("matmul", "host", f"batch of x {x.shape[0]} matches neither 1 nor the weight's {w.shape[0]}")
    rows = lambda env: int(np.prod(_shape(x, env)[:-1])) // (1 if shared_x else batch)  # noqa: E731
    few = When("rows <= 2", lambda env: rows(env) <= 2)
    many = When("rows > 2", lambda env: rows(env) > 2)
    packed = w.dtype.name in BODIES
    if not packed and w.dtype != dt.f32:
        raise Refusal("matmul", "host", f"weights of type {w.dtype} need a cast first")
    xk, wk, ok = _key(x), _key(w), _key(out)
    row_bytes = kk // BODIES[w.dtype.name][0] * BODIES[w.dtype.name][1] if packed else kk

    def strides(env: Env) -> dict[str, int]:  # per expert: x (0 when shared), w and y
        return {"xs": 0 if shared_x else rows(env) * kk, "ws": nn * row_bytes if batch > 1 else 0, "ys": rows(env) * nn}

    launches: list[Launch] = []
    if packed:
        bs, bb, _ = BODIES[w.dtype.name]
        lut = LUTS.get(w.dtype.name, np.zeros(1, np.float32))
        if w.dtype.name in linear_host.LANE_TYPES and kk % 32 == 0:
            k = linear_host.gemv_lanes.instantiate(QTYPE=w.dtype.name)
            gemv = Launch(n, k, {"x": xk, "w": wk, "y": ok}, lambda env: (nn, rows(env), batch),
                          lambda env: {"n": nn, "k": kk, "row_bytes": row_bytes, **strides(env)})
        elif batch == 1:
            k = linear.gemv_blocks.instantiate(QTYPE=w.dtype.name, BS=bs, BB=bb, ROWS=4, BLOCK=32)
            gemv = Launch(n, k, {"x": xk, "w": wk, "lut": lut, "y": ok}, lambda env: (-(-nn // 4), rows(env)),
                          lambda env: {"n": nn, "k": kk, "row_bytes": row_bytes})
        else:
            gemv = None
        if kk % 16 or kk % bs:
            if gemv is None:
                raise Refusal("matmul", "host", f"per-expert {w.dtype} weights with rows of {kk} values have no host schedule")
            return [gemv]
        k = linear_host.gemm_rows.instantiate(QTYPE=w.dtype.name, K=kk, BS=bs, BB=bb, NR=4, TM=4)
        gemm = Launch(n, k, {"a": xk, "w": wk, "lut": lut, "c": ok}, lambda env: (-(-nn // 4), batch),
                      lambda env: {"m": rows(env), "n": nn, "row_bytes": row_bytes, **strides(env)}, many)
        if gemv is None:
            gemm.when = None
            return [gemm]
    else:
        k = linear_host.gemv_lanes_f32.instantiate()
        gemv = Launch(n, k, {"x": xk, "w": wk, "y": ok}, lambda env: (nn, rows(env), batch), lambda env: {"n": nn, "k": kk, **strides(env)})
        if kk % 16:
            return [gemv]
        k = linear_host.gemm_rows_f32.instantiate(K=kk, NR=4, TM=4)
        gemm = Launch(n, k, {"a": xk, "w": wk, "c": ok}, lambda env: (-(-nn // 4), batch), lambda env: {"m": rows(env), "n": nn, **strides(env)}, many)
    gemv.when = few
    return [gemv, gemm]


def _gather(n: Node) -> Launch:
    table, ids = n.inputs
    out = n.outputs[0]
    if n.attrs["axis"] != 0 or table.rank != 2:
        raise Refusal("gather", "host", "the baseline planner gathers rows of a 2-D table")
    cols = table.shape[1].value
    tokens = lambda env: max(1, int(np.prod(_shape(ids, env))))  # noqa: E731
    if table.dtype.name in BODIES:
        bs, bb, _ = BODIES[table.dtype.name]
        k = gather_lib.gather_packed.instantiate(QTYPE=table.dtype.name, BLOCK=128)
        return Launch(n, k, {"table": _key(table), "lut": LUTS.get(table.dtype.name, np.zeros(1, np.float32)), "ids": _key(ids), "out": _key(out)},
                      lambda env: (tokens(env),), lambda env: {"cols": cols, "row_bytes": cols // bs * bb})
    k = gather_lib.gather_f32.instantiate(BLOCK=128)
    return Launch(n, k, {"table": _key(table), "ids": _key(ids), "out": _key(out)}, lambda env: (tokens(env),), lambda env: {"cols": cols})


def _reduce(n: Node) -> Launch:
    """Over the last axis: a row reduction; over other adjacent axes: x viewed as [outer, length, inner]."""
    (x,) = n.inputs
    axes = sorted({a % x.rank for a in n.attrs["axes"]})
    if axes != list(range(axes[0], axes[-1] + 1)):
        raise Refusal(n.op, "host", f"reduces over adjacent axes only, got {n.attrs['axes']}")
    out = n.outputs[0]
    if axes == [x.rank - 1]:
        k = movement.reduce_rows.instantiate(OP=n.op, BLOCK=128)
        return Launch(n, k, {"x": _key(x), "y": _key(out)}, lambda env: (max(1, int(np.prod(_shape(x, env)[:-1]))),), lambda env: {"cols": _shape(x, env)[-1]})
    lo, hi = axes[0], axes[-1] + 1

    def split(env: Env) -> tuple[int, int, int]:
        s = _shape(x, env)
        return int(np.prod(s[:lo])), int(np.prod(s[lo:hi])), int(np.prod(s[hi:]))

    k = movement.reduce_axis.instantiate(OP=n.op)
    return Launch(n, k, {"x": _key(x), "y": _key(out)}, lambda env: (max(1, split(env)[0]), max(1, -(-split(env)[2] // 16))),
                  lambda env: dict(zip(("outer", "length", "inner"), split(env))))


def _topk(n: Node) -> Launch:
    (x,) = n.inputs
    if n.attrs["axis"] % x.rank != x.rank - 1:
        raise Refusal("topk", "host", "selects along the last axis only")
    vals, idx = n.outputs
    k = movement.topk_rows.instantiate(K=n.attrs["k"])
    return Launch(n, k, {"x": _key(x), "values": _key(vals), "indices": _key(idx)},
                  lambda env: (max(1, int(np.prod(_shape(x, env)[:-1]))),), lambda env: {"cols": _shape(x, env)[-1]})


def _copy(n: Node, src: Value, dst: Value, src_off: Callable[[Env], int], src_strides: Callable[[Env], list[int]],
          dst_off: Callable[[Env], int], box: Callable[[Env], tuple[int, ...]]) -> Launch:
    k = movement.copy_strided.instantiate(BLOCK=256)

    def scalars(env: Env) -> dict[str, int]:
        b = list(box(env))
        full = _pad(b, 1)
        ss = _pad(src_strides(env), 0)
        ts = _pad(_strides(_shape(dst, env))[-len(b):] if b else [], 0)
        sc = {"n": int(np.prod(b)) if b else 1, "src_offset": src_off(env), "dst_offset": dst_off(env)}
        sc.update({f"d{i}": full[i] for i in range(MAX_RANK)})
        sc.update({f"s{i}": ss[i] for i in range(MAX_RANK)})
        sc.update({f"t{i}": ts[i] for i in range(MAX_RANK)})
        return sc

    return Launch(n, k, {"src": _key(src), "dst": _key(dst)}, lambda env: (max(1, -(-int(np.prod(box(env))) // 256)),), scalars)


def _movement(n: Node, in_place: Mapping[tuple[int, int], _Into]) -> list[Launch]:
    out = n.outputs[0]
    if n.op == "transpose":
        (x,) = n.inputs
        perm = n.attrs["perm"]
        return [_copy(n, x, out, lambda env: 0, lambda env: [_strides(_shape(x, env))[p] for p in perm], lambda env: 0, lambda env: _shape(out, env))]
    if n.op == "slice":
        (x,) = n.inputs
        ax = n.attrs["axis"] % x.rank

        def sst(env: Env) -> list[int]:
            s = _strides(_shape(x, env))
            s[ax] *= n.attrs["step"]
            return s

        return [_copy(n, x, out, lambda env: n.attrs["start"] * _strides(_shape(x, env))[ax], sst, lambda env: 0, lambda env: _shape(out, env))]
    if n.op == "expand":
        (x,) = n.inputs

        def est(env: Env) -> list[int]:
            xs = list(_shape(x, env))
            full = _shape(out, env)
            xs = [1] * (len(full) - len(xs)) + xs
            st = _strides(tuple(xs))
            return [0 if xs[d] == 1 and full[d] != 1 else st[d] for d in range(len(full))]

        return [_copy(n, x, out, lambda env: 0, est, lambda env: 0, lambda env: _shape(out, env))]
    if n.op == "concat":
        ax = n.attrs["axis"] % out.rank
        launches, before = [], []
        for part in n.inputs:
            prev = list(before)
            before.append(part)
            if _key(part) in in_place:
                continue  # its producer writes it into place
            launches.append(_copy(n, part, out, lambda env: 0, lambda env, p=part: _strides(_shape(p, env)),
                                  lambda env, prev=prev: sum(_shape(q, env)[ax] for q in prev) * _strides(_shape(out, env))[ax],
                                  lambda env, p=part: _shape(p, env)))
        return launches
    raise Refusal(n.op, "host", "not a data-movement op")


def _attention(n: Node) -> Launch:
    spec = n.attrs["spec"]
    if not spec.paged:
        raise Refusal("attention", "host", "the baseline planner runs paged attention only")
    from ..graph.attention import attention_operand_names

    ops = dict(zip(attention_operand_names(spec), n.inputs))
    q, k, v = ops["q"], ops["k"], ops["v"]
    hq, hkv, dk, dv, bs = q.shape[1].value, k.shape[2].value, k.shape[3].value, v.shape[3].value, k.shape[1].value
    dr = ops["k_shared"].shape[2].value if spec.k_shared else 0
    scale = spec.scale if spec.scale is not None else 1.0 / float(np.sqrt(dk + dr))
    out = n.outputs[0]
    dummy = np.zeros(1, np.float32)
    bufs: dict[str, Any] = {"q": _key(q), "k_pool": _key(k), "v_pool": _key(v), "ks_pool": _key(ops["k_shared"]) if spec.k_shared else dummy,
                            "positions": _key(ops["positions"]), "seq_ids": _key(ops["seq_ids"]), "ctx_lens": _key(ops["ctx_lens"]),
                            "block_tables": _key(ops["block_tables"]), "out": _key(out)}
    kern = attn_lib.attention_lanes.instantiate(HQ=hq, HKV=hkv, DK=dk, DV=dv, DR=dr, BS=bs, CAUSAL=spec.causal, TILE=16)

    def scalars(env: Env) -> dict[str, float | int]:
        return {"mb": _shape(ops["block_tables"], env)[1], "scale": scale, "window": spec.window or 0, "softcap": spec.softcap or 0.0}

    return Launch(n, kern, bufs, lambda env: (max(1, _shape(q, env)[0]), hq), scalars)


def _cache_write(n: Node) -> Launch:
    pool, vals, slots = n.inputs
    width = int(np.prod([d.value for d in pool.shape[2:]]))
    k = movement.cache_write.instantiate(BLOCK=128)
    return Launch(n, k, {"values": _key(vals), "slots": _key(slots), "pool": _key(n.outputs[0])}, lambda env: (max(1, _shape(slots, env)[0]),), lambda env: {"width": width})


@dataclass(frozen=True)
class _RmsNorm:
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


def _recognise_rms_norms(graph: Graph) -> dict[int, _RmsNorm]:
    """RMSNorm as the compositions trace it: mean(x * x, -1) + eps -> rsqrt -> * x -> * w (or
    * (w + 1)). Keyed by the id of the node whose output is the normalised value; every matched
    node but that output is used only inside the pattern."""
    users = graph.users()
    outputs = {_key(v) for v in graph.outputs.values()}

    def only_user(n: Node) -> Node | None:
        us = users[n.id]
        return us[0] if len(us) == 1 and _key(n.outputs[0]) not in outputs else None

    def other(n: Node, v: Value) -> Value | None:
        a, b = n.inputs
        return b if _key(a) == _key(v) else (a if _key(b) == _key(v) else None)

    found: dict[int, _RmsNorm] = {}
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
        if w.node.op == "add" and (one := _scalar_const(w.node.inputs[1])) == 1.0 and only_user(w.node) is wm and w.node.inputs[0].dtype == dt.f32:
            nodes.add(w.node.id)
            w, unit = w.node.inputs[0], True
        if w.dtype != dt.f32:
            continue
        found[wm.id] = _RmsNorm(x, w, unit, eps, wm.outputs[0], frozenset(nodes))
    return found


def _rms_norm(n: Node, r: _RmsNorm) -> Launch:
    k = norms.rms_norm_lanes.instantiate(UNIT_OFFSET=r.unit_offset)
    cols = r.x.shape[-1].value
    return Launch(n, k, {"x": _key(r.x), "w": _key(r.weight), "y": _key(r.out)},
                  lambda env: (max(1, int(np.prod(_shape(r.x, env)[:-1]))),), lambda env: {"cols": cols, "eps": r.eps})


def _elementwise_groups(graph: Graph, skip: set[int] = frozenset()) -> dict[int, list[Node]]:  # type: ignore[assignment]
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


def plan_graph(graph: Graph, fuse: bool = True) -> SimplePlan:
    """Lower every node of ``graph`` to kernel launches for the host target (a Refusal names what
    cannot be run). With ``fuse``, chains of elementwise ops become one kernel each."""
    plan = SimplePlan(graph, [])
    norms_at = _recognise_rms_norms(graph) if fuse else {}
    inside = {i for r in norms_at.values() for i in r.nodes} | set(norms_at)
    groups = _elementwise_groups(graph, inside) if fuse else {n.id: [n] for n in graph.nodes if OPS[n.op].category == "elementwise"}
    virtual = _virtual_views(graph, inside) if fuse else set()
    in_place = _concat_parts(graph, set(groups)) if fuse else {}
    for n in graph.nodes:
        cat = OPS[n.op].category
        if n.op in ("input", "weight", "constant") or n.id in virtual:
            continue
        if n.id in norms_at:
            plan.launches.append(_rms_norm(n, norms_at[n.id]))
            continue
        if n.id in inside:
            continue
        if n.op == "reshape":
            plan.views[_key(n.outputs[0])] = plan.views.get(_key(n.inputs[0]), _key(n.inputs[0]))
        elif n.op == "cache_write":
            plan.aliases[_key(n.outputs[0])] = plan.aliases.get(_key(n.inputs[0]), _key(n.inputs[0]))
            plan.launches.append(_cache_write(n))
        elif cat == "elementwise":
            if n.id in groups:  # the group's root: its escaping value is computed here
                plan.launches.append(_elementwise(n, groups[n.id], virtual, in_place.get(_key(n.outputs[0]))))
        elif n.op == "matmul":
            plan.launches.extend(_matmul(n))
        elif n.op == "gather":
            plan.launches.append(_gather(n))
        elif n.op in ("sum", "mean", "max", "min"):
            plan.launches.append(_reduce(n))
        elif n.op in ("transpose", "slice", "expand", "concat"):
            plan.launches.extend(_movement(n, in_place))
        elif n.op == "attention":
            plan.launches.append(_attention(n))
        elif n.op == "topk":
            plan.launches.append(_topk(n))
        else:
            raise Refusal(n.op, "host", "the baseline planner has no kernel for this op yet")
    return plan
