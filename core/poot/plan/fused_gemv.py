"""Products the GPU planner fuses for few rows of x: the gated MLP's two halves in one warp GEMV
(``find_glus``, ``glu_launches``: silu(x wg^T) * (x wu^T), for one row also quantizing its output
for the down projection; beyond a few rows a backend may compute it its own way,
``Schedules.glu_split``) and several products of one x in one launch (``find_siblings``,
``siblings_launches``: q, k and v)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..graph.ir import Graph, Node, Value
from ..kernel.library import linear_gpu
from .common import Limits, between
from .common import key as _key
from .common import shape as _shape
from .matmul import QuantizedX, _gemv_rows, _reading, _warp_gemv_fits, _x_once, gemv_choice
from .plan import Launch
from .schedules import Schedules

__all__ = ["Glu", "find_glus", "glu_launches", "find_siblings", "siblings_launches", "GLU_Q8_WARPS", "PARTS_ONE_ROW_GROUPS"]

# the one-row q/k/v GEMV (several products of one x, 16 warps): registers capped for three
# workgroups an SM, so that Llama 3's 384 workgroups (6144 features) are one wave of 396 rather than
# 1.45 waves of 264 on a GPU of 132 SMs (40 registers a thread)
PARTS_ONE_ROW_GROUPS = 3
# the one-row gated MLP that also quantizes its output (q8): 8-warp workgroups of 32 features (four a
# warp), four an SM by registers: Llama 3's 448 workgroups are one wave of 528 rather than 1.7 of
# 264 at 16 warps (which, capped for three an SM, would spill)
GLU_Q8_WARPS = 8


@dataclass(frozen=True)
class Glu:
    """silu(x @ wg^T) * (x @ wu^T) whose two products feed only the elementwise group ``root``."""

    root: int
    gate: Node
    up: Node


def find_glus(graph: Graph, groups: Mapping[int, list[Node]], limits: Limits) -> dict[int, Glu]:
    """Gated-MLP halves the warp GEMV can compute in one pass (GPU, few rows), by matmul node id."""
    users = graph.users()
    found: dict[int, Glu] = {}
    for root, members in groups.items():
        if sorted(m.op for m in members) != ["mul", "mul", "sigmoid"]:
            continue
        sig = next(m for m in members if m.op == "sigmoid")
        g = sig.inputs[0]
        inner = next((m for m in members if m.op == "mul" and {_key(v) for v in m.inputs} == {_key(g), _key(sig.outputs[0])}), None)
        outer = next((m for m in members if m.op == "mul" and m is not inner), None)
        if inner is None or outer is None or outer.id != root:
            continue
        u = next((v for v in outer.inputs if _key(v) != _key(inner.outputs[0])), None)
        if u is None or {_key(v) for v in outer.inputs} != {_key(u), _key(inner.outputs[0])}:
            continue
        gate, up = g.node, u.node
        if gate.op != "matmul" or up.op != "matmul" or gate is up or _key(gate.inputs[0]) != _key(up.inputs[0]):
            continue
        wg, wu = gate.inputs[1], up.inputs[1]
        if not (
            gate.attrs["transpose_b"]
            and up.attrs["transpose_b"]
            and wg.rank == 2
            and wu.rank == 2
            and wg.dtype == wu.dtype
            and wg.shape == wu.shape
            and _warp_gemv_fits(wg.dtype, wg.shape[1].value, limits)
        ):
            continue
        if len(users[gate.id]) != 2 or len(users[up.id]) != 1:  # the gate feeds the sigmoid and the product only
            continue
        glu = Glu(root, gate, up)
        found[gate.id] = found[up.id] = glu
    return found


def glu_launches(
    glu: Glu,
    out: Value,
    limits: Limits,
    sched: Schedules | None = None,
    qx: QuantizedX | None = None,
    quantizing: dict[Any, tuple[Launch, Any, Any]] | None = None,
) -> list[Launch]:
    """The gated MLP's first half as one warp GEMV over both weights, for few rows of x; ``quantizing``
    gets the one-row launch with its kernel that also writes y quantized (``q8``) and its grid."""
    x, wg = glu.gate.inputs
    nn, kk = wg.shape[0].value, wg.shape[1].value
    rows = lambda env: int(np.prod(_shape(x, env)[:-1]))  # noqa: E731
    bufs = {"x": _key(x), "wg": _key(wg), "wu": _key(glu.up.inputs[1]), "y": _key(out)}
    sc = lambda env: {"m": rows(env), "n": nn}  # noqa: E731
    ss = limits.subgroup != 32
    f = linear_gpu.gemv_warp(wg.dtype.name, kk, 1, glu=True, shared_sums=ss).threads // 32  # features a workgroup
    launches = []
    for mr, lo, hi in _gemv_rows(wg.dtype.name, kk, limits):
        choice = gemv_choice(sched, wg.dtype.name, kk, nn, mr)
        xs, pre = _x_once(glu.gate, x, kk, mr, rows, between(lo, hi, rows), choice, qx)
        make = partial(linear_gpu.gemv_warp, wg.dtype.name, kk, mr, glu=True, shared_sums=ss, wide=choice.wide, staged=bool(xs))
        launches += [
            *pre,
            Launch(
                glu.gate,
                make(),
                _reading(bufs, xs),
                lambda env, mr=mr: (-(-nn // f), -(-rows(env) // mr)),
                sc,
                between(lo, hi, rows),
                label="gated_mlp",
                variant=make,
            ),
        ]
        if quantizing is not None and xs and mr == 1 and nn % 32 == 0:  # the down projection's x quantized here (the kernel's maker)
            q8 = partial(
                linear_gpu.gemv_warp, wg.dtype.name, kk, 1, GLU_Q8_WARPS, glu=True, wide=choice.wide, staged=True, per_warp=32 // GLU_Q8_WARPS, q8=True
            )
            quantizing[_key(out)] = (launches[-1], q8, lambda env: (nn // 32, rows(env)))
    return launches


def find_siblings(graph: Graph, limits: Limits, taken: Mapping[int, Any]) -> dict[int, list[Node]]:
    """Products of one x by several weights of one type (q, k and v) that a single warp-GEMV launch
    can compute for few rows: the first matmul's id -> all of them (in graph order)."""
    if limits.subgroup != 32:
        return {}
    by_x: dict[tuple[int, int], list[Node]] = {}
    for n in graph.nodes:
        if n.op != "matmul" or n.id in taken or not n.attrs["transpose_b"]:
            continue
        w = n.inputs[1]
        if w.rank == 2 and w.dtype.name in linear_gpu.GEMV_TYPES and w.shape[1].value % 256 == 0 and _gemv_rows(w.dtype.name, w.shape[1].value, limits):
            by_x.setdefault(_key(n.inputs[0]), []).append(n)
    out: dict[int, list[Node]] = {}
    for ns in by_x.values():
        first = ns[0].inputs[1]
        same = [m for m in ns if m.inputs[1].dtype == first.dtype and m.inputs[1].shape[1] == first.shape[1]]
        if len(same) >= 2:
            out[same[0].id] = same[:4]
    return out


def siblings_launches(ns: list[Node], limits: Limits, sched: Schedules | None = None, qx: QuantizedX | None = None) -> list[Launch]:
    x, w = ns[0].inputs
    kk = w.shape[1].value
    parts = tuple(m.inputs[1].shape[0].value for m in ns)
    rows = lambda env: int(np.prod(_shape(x, env)[:-1]))  # noqa: E731
    bufs: dict[str, Any] = {"x": _key(x)}
    for i, m in enumerate(ns):
        bufs[f"w{i}"], bufs[f"y{i}"] = _key(m.inputs[1]), _key(m.outputs[0])
    total = sum(parts)
    f = linear_gpu.gemv_warp(w.dtype.name, kk, 1, parts=parts).threads // 32  # features a workgroup
    launches = []
    for mr, lo, hi in _gemv_rows(w.dtype.name, kk, limits):
        choice = gemv_choice(sched, w.dtype.name, kk, total, mr)
        xs, pre = _x_once(ns[0], x, kk, mr, rows, between(lo, hi, rows), choice, qx)
        make = partial(linear_gpu.gemv_warp, w.dtype.name, kk, mr, parts=parts, wide=choice.wide, staged=bool(xs), min_groups=PARTS_ONE_ROW_GROUPS if xs else 0)
        launches += [
            *pre,
            Launch(
                ns[0],
                make(),
                _reading(bufs, xs),
                lambda env, mr=mr: (-(-total // f), -(-rows(env) // mr)),
                lambda env: {"m": rows(env), "n": total},
                between(lo, hi, rows),
                label=f"{len(ns)} matmuls",
                variant=make,
            ),
        ]
    return launches
