"""How the planner runs a matrix product on a device: host schedules (lane GEMVs, row-block GEMMs),
the warp GEMVs and register-tiled GEMMs GPUs share, each for the row counts it suits, and what a
device's backend brings beyond them (``Schedules``: its own kernels for many rows, how its GEMVs
read x)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from ..errors import Refusal
from ..graph import dtypes as dt
from ..graph.ir import Graph, Node, Value
from ..kernel.library import linear, linear_gpu, linear_host, linear_q8_host, linear_q8_rows, linear_simt
from ..quant.bodies import BODIES, LUTS, WIDE_BLOCK
from .common import Env, Limits, between
from .common import key as _key
from .common import shape as _shape
from .layouts import WeightLayout
from .plan import Launch, Plan, When
from .quantized_x import QuantizedX
from .schedules import GemvChoice, Schedules

__all__ = ["between", "matmul_host", "matmul_gpu", "QuantizedX", "gemv_choice", "rows16_weights"]


def _blocks(t: dt.DType, k: int) -> tuple[int, int]:
    """(values, bytes) of the blocks a schedule walks a weight row in: the quantization's blocks, or
    runs of WIDE_BLOCK 16-bit floats where the row divides into them."""
    bs, bb, _ = BODIES[t.name]
    if bs == 1 and k % WIDE_BLOCK == 0:
        return WIDE_BLOCK, WIDE_BLOCK * bb
    return bs, bb


GEMV_ROWS = 4  # weight rows a host GEMV workgroup takes: four chains of additions side by side


def rows16_weights(graph: Graph, plan: Plan) -> frozenset[tuple[int, int]]:
    """The Q8_0 and Q5_0 weights the host's integer products read as 16-row records (``linear_q8_rows``):
    those whose every reader is such a product (x @ w^T) or an embedding gather, which read the
    records too (a head that shares the embedding's table); their layout goes into
    ``plan.layouts``, and their keys are returned for ``matmul_host`` and the gather."""
    users = graph.users()
    out = set()
    for node in graph.nodes:
        v = node.outputs[0] if node.op == "weight" else None
        if v is None or v.rank != 2 or not linear_q8_rows.rows16_applies(v.dtype.name, v.shape[0].value, v.shape[1].value):
            continue
        readers = users.get(node.id, [])
        if readers and all(
            (u.op == "matmul" and u.inputs[1] is v and u.inputs[0] is not v and u.attrs["transpose_b"])
            or (u.op == "gather" and u.inputs[0] is v and u.inputs[1] is not v and u.attrs["axis"] == 0)
            for u in readers
        ):
            out.add(_key(v))
            lay = partial(linear_q8_rows.lay_out_rows16, n=v.shape[0].value, k=v.shape[1].value, qtype=v.dtype.name)
            plan.layouts[node.attrs["name"]] = WeightLayout(linear_q8_rows.layout_name(v.dtype.name), lay)
    return frozenset(out)


def matmul_host(n: Node, shared_bytes: int, qx: QuantizedX | None = None, rows16: frozenset[tuple[int, int]] = frozenset()) -> list[Launch]:
    """x @ w^T against a 2-D weight. Host schedules: for Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K
    weights, x quantized once (``qx``) and summed against the quants in integers (``linear_q8_host``),
    a token a workgroup while few rows come and every token a workgroup beyond; for the other types a lane
    GEMV while few rows come (decode), and a row-block GEMM that dequantizes weight rows once for
    every token (prefill); the generic GPU-style kernels where those do not apply."""
    x, w = n.inputs
    if qx is not None and w.rank == 2 and n.attrs["transpose_b"]:
        kk = w.shape[-1].value
        if (w.dtype.name in linear_q8_host.Q8_TYPES and kk % 32 == 0) or (w.dtype.name in linear_q8_host.Q8K_TYPES and kk % 256 == 0):
            return _matmul_q8_host(n, qx, _key(w) in rows16)
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

    if packed:
        bs, bb = _blocks(w.dtype, kk)
        lut = LUTS.get(w.dtype.name, np.zeros(1, np.float32))
        if w.dtype.name in linear_host.LANE_TYPES and kk % 32 == 0:
            k = linear_host.gemv_lanes.instantiate(QTYPE=w.dtype.name, NR=GEMV_ROWS)
            gemv = Launch(
                n,
                k,
                {"x": xk, "w": wk, "y": ok},
                lambda env: (-(-nn // GEMV_ROWS), rows(env), batch),
                lambda env: {"n": nn, "k": kk, "row_bytes": row_bytes, **strides(env)},
            )
        elif bs % 16 == 0 and kk % bs == 0:
            k = linear_host.gemv_lanes_any.instantiate(QTYPE=w.dtype.name, BS=bs, BB=bb)
            gemv = Launch(
                n,
                k,
                {"x": xk, "w": wk, "lut": lut, "y": ok},
                lambda env: (nn, rows(env), batch),
                lambda env: {"n": nn, "k": kk, "row_bytes": row_bytes, **strides(env)},
            )
        elif batch == 1:
            k = linear.gemv_blocks.instantiate(QTYPE=w.dtype.name, BS=bs, BB=bb, ROWS=4, BLOCK=32)
            gemv = Launch(
                n, k, {"x": xk, "w": wk, "lut": lut, "y": ok}, lambda env: (-(-nn // 4), rows(env)), lambda env: {"n": nn, "k": kk, "row_bytes": row_bytes}
            )
        else:
            gemv = None
        if kk % 16 or kk % bs or (4 * kk + 256) * 4 > shared_bytes:  # gemm_rows holds 4 dequantized rows
            if gemv is None:
                raise Refusal("matmul", "host", f"per-expert {w.dtype} weights with rows of {kk} values have no host schedule")
            return [gemv]
        k = linear_host.gemm_rows.instantiate(QTYPE=w.dtype.name, K=kk, BS=bs, BB=bb, NR=4, TM=4)
        gemm = Launch(
            n,
            k,
            {"a": xk, "w": wk, "lut": lut, "c": ok},
            lambda env: (-(-nn // 4), batch),
            lambda env: {"m": rows(env), "n": nn, "row_bytes": row_bytes, **strides(env)},
            many,
        )
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


def _matmul_q8_host(n: Node, qx: QuantizedX, rows16: bool = False) -> list[Launch]:
    """The integer host schedules of ``linear_q8_host``: x quantized once for every product that
    reads it, then 16 weight rows a workgroup, a token a workgroup for up to two rows of x (decode,
    ``gemv_q8``) and every token, four at a time, beyond (``gemm_q8``, the rows' quants laid out
    once). Both do the same arithmetic for a row. ``rows16``: the weight is laid out as
    ``linear_q8_rows`` says (``rows16_weights``), and read so."""
    x, w = n.inputs
    nn, kk = w.shape[0].value, w.shape[1].value
    bs, bb, _ = BODIES[w.dtype.name]
    rows = lambda env: int(np.prod(_shape(x, env)[:-1]))  # noqa: E731
    xs, pre = qx.host(n, x, kk, rows)
    bufs = {**xs, "w": _key(w), "y": _key(n.outputs[0])}
    sc = lambda env: {"m": rows(env), "n": nn, "k": kk, "row_bytes": kk // bs * bb}  # noqa: E731
    groups = -(-nn // 16)
    sup = 8 if w.dtype.name in linear_q8_host.Q8K_TYPES else 1
    if rows16:
        gemv = linear_q8_rows.gemv_q8_rows16.instantiate(QTYPE=w.dtype.name, PF=linear_q8_rows.RECORD[w.dtype.name])
        gemm = linear_q8_host.gemm_q8.instantiate(QTYPE=w.dtype.name, K=kk, TM=4, ROWS16=True)
    else:
        gemv = linear_q8_host.gemv_q8.instantiate(QTYPE=w.dtype.name, SUPER=sup, PF=linear_q8_host.PREFETCH[w.dtype.name])
        gemm = linear_q8_host.gemm_q8.instantiate(QTYPE=w.dtype.name, K=kk, TM=4, SUPER=sup)
    return [
        *pre,
        Launch(n, gemv, bufs, lambda env: (groups, rows(env)), sc, When("rows <= 2", lambda env: rows(env) <= 2)),
        Launch(n, gemm, bufs, lambda env: (groups,), sc, When("rows > 2", lambda env: rows(env) > 2)),
    ]


def _gemv_rows(qtype: str, k: int, limits: Limits) -> list[tuple[int, int, int]]:
    """The warp GEMV's (rows a workgroup, fewest rows, most rows) for 1 and 2-4 rows of x: the Q4_K
    and Q6_K ones keep their rows of x, quantized, in workgroup memory, so K bounds how many fit."""
    if qtype not in ("q4_k", "q6_k"):
        return [(1, 0, 1), (4, 1, 4)]
    if "i8" not in limits.dtypes:  # its sums are of int8 products: devices that report 8-bit integer arithmetic
        return []
    fits = [mr for mr in (4, 2, 1) if 4 * linear_gpu.q8_shared_words(k, mr) <= limits.shared_bytes]
    return [(1, 0, 1), (fits[0], 1, 4)] if fits else []


def gemv_choice(sched: Schedules | None, qtype: str, k: int, n: int, mr: int) -> GemvChoice:
    """How the device's backend runs a warp GEMV of up to ``mr`` rows (``Schedules.gemv``); the
    generic way without one."""
    return GemvChoice() if sched is None else sched.gemv(qtype, k, n, mr)


def _x_once(
    n: Node, x: Value, k: int, mr: int, rows: Callable[[Env], int], when: When, choice: GemvChoice, qx: QuantizedX | None
) -> tuple[dict[str, Any], list[Launch]]:
    """For a warp GEMV of ``mr`` rows that stages x quantized once (``GemvChoice.staged``): its
    buffers of x quantized and the launch that writes them, if none does yet; else nothing."""
    if qx is None or not choice.staged:
        return {}, []
    return qx.of(n, x, k, rows, when)


def _reading(bufs: dict[str, Any], xs: dict[str, Any]) -> dict[str, Any]:
    """A GEMV's buffers, x's quantized ones (``_x_once``) in place of x where there are any."""
    return {**{k: v for k, v in bufs.items() if k != "x"}, **xs} if xs else bufs


def _warp_gemv_fits(t: dt.DType, k: int, limits: Limits) -> bool:
    """Whether the warp GEMV runs weights of type ``t`` and rows of ``k`` here: on 32-lane subgroups,
    or for bf16 without subgroup operations (the lanes' sums through workgroup memory)."""
    if t.name not in linear_gpu.GEMV_TYPES or k % 256 or not _gemv_rows(t.name, k, limits):
        return False
    return limits.subgroup == 32 or (t == dt.bf16 and limits.max_workgroup >= 256 and 4 * 256 * 8 <= limits.shared_bytes)


def _matmul_fast_gpu(n: Node, limits: Limits, sched: Schedules | None = None, qx: QuantizedX | None = None) -> list[Launch] | None:
    """Schedules that use the chip, where they apply (32-lane subgroups; K a multiple of 256):
    warp-per-feature GEMVs with 16-byte loads for decode (bf16 and Q4_K weights), for more rows the
    backend's own launches (``Schedules.matmul_many_rows``: tensor cores, say), else a
    register-tiled GEMM for bf16."""
    x, w = n.inputs
    nn, kk = w.shape[0].value, w.shape[1].value
    if not _warp_gemv_fits(w.dtype, kk, limits):
        return None
    shared_sums = limits.subgroup != 32
    rows = lambda env: int(np.prod(_shape(x, env)[:-1]))  # noqa: E731
    bufs = {"x": _key(x), "w": _key(w), "y": _key(n.outputs[0])}
    sc = lambda env: {"m": rows(env), "n": nn}  # noqa: E731
    out = []
    few = _gemv_rows(w.dtype.name, kk, limits)
    if not few:
        return None
    for mr, lo, hi in few:
        choice = gemv_choice(sched, w.dtype.name, kk, nn, mr)
        xs, pre = _x_once(n, x, kk, mr, rows, between(lo, hi, rows), choice, qx)
        shape = choice.shape if xs else {}
        make = partial(linear_gpu.gemv_warp, w.dtype.name, kk, mr, shared_sums=shared_sums, wide=choice.wide, staged=bool(xs), **shape)
        k = make()
        out += pre
        f = k.threads // 32 * shape.get("per_warp", 1)  # features a workgroup
        out.append(Launch(n, k, _reading(bufs, xs), lambda env, mr=mr, f=f: (-(-nn // f), -(-rows(env) // mr)), sc, between(lo, hi, rows), variant=make))
    many = sched.matmul_many_rows(n) if sched is not None else None
    if many is not None:
        out += many
    elif w.dtype == dt.bf16 and _simt_step(kk, limits):  # register tiles on CUDA cores, bf16 read as words
        bk, t = _simt_step(kk, limits), linear_simt.SIMT_TILE
        out.append(Launch(n, linear_simt.gemm_simt(kk, bk), bufs, lambda env: (-(-nn // t), -(-rows(env) // t)), sc, between(4, None, rows)))
    else:
        out.extend(l for l in _matmul_gpu_generic(n, limits) if l.when is not None and l.when.doc.startswith("rows >"))
        out[-1].when = between(4, None, rows)
    return out


def matmul_gpu(n: Node, limits: Limits, sched: Schedules | None = None, qx: QuantizedX | None = None) -> list[Launch]:
    """The GPU launches of matmul ``n``; with ``sched``, the device's backend's choices (its own
    launches for many rows, how its GEMVs read x); with ``qx``, one-row GEMVs that stage x read it
    quantized once."""
    x, w = n.inputs
    if n.attrs["transpose_b"] and w.rank == 3:  # per-expert weights: the lane schedules, one thread per workgroup (correct, not yet fast)
        return matmul_host(n, 1 << 20)
    if not n.attrs["transpose_b"] or w.rank != 2:
        raise Refusal("matmul", "gpu", "the GPU planner runs x @ w^T with a 2-D weight, or per expert")
    return _matmul_fast_gpu(n, limits, sched, qx) or _matmul_gpu_generic(n, limits, sched)


def _simt_step(k: int, limits: Limits) -> int:
    """The K step ``gemm_simt`` takes here (32 or 16 values), 0 where it does not fit."""
    if limits.max_workgroup < 256:
        return 0
    return next((bk for bk in (32, 16) if k % bk == 0 and linear_simt.simt_shared_bytes(bk) <= limits.shared_bytes), 0)


def _matmul_gpu_generic(n: Node, limits: Limits, sched: Schedules | None = None) -> list[Launch]:
    """GPU schedules for any weight type: for packed weights a GEMV of a subgroup a feature for up to
    four rows where the device has subgroup operations (else one whose workgroups split K, up to two
    rows); for more, packed weights dequantized once per workgroup into the register-tiled GEMM
    (``gemm_simt``) where it fits, else a 16x16 tiled GEMM dequantizing in registers; beyond four
    rows, the backend's own launches where it has them (``Schedules.matmul_many_rows``)."""
    x, w = n.inputs
    out = n.outputs[0]
    nn, kk = w.shape[0].value, w.shape[1].value
    rows = lambda env: int(np.prod(_shape(x, env)[:-1]))  # noqa: E731
    few = When("rows <= 2", lambda env: rows(env) <= 2)
    many = When("rows > 2", lambda env: rows(env) > 2)
    xk, wk, ok = _key(x), _key(w), _key(out)
    if w.dtype.name in BODIES:
        bs, bb = _blocks(w.dtype, kk)
        row_bytes = kk // bs * bb
        lut = LUTS.get(w.dtype.name, np.zeros(1, np.float32))
        bufs = {"x": xk, "w": wk, "lut": lut, "y": ok}
        lanes = limits.subgroup
        packed = BODIES[w.dtype.name][0] > 1  # (16-bit floats are blocks of one)
        q6 = _gemv_rows("q6_k", kk, limits) if w.dtype.name == "q6_k" and lanes in (8, 16, 32, 64) and kk % max(512, 16 * lanes) == 0 else []
        if q6 and limits.max_workgroup >= 512:
            # Q6_K (Q4_K_M files' head and half their v and down): x as two int8 terms, dp4a; 32
            # values a lane where K takes whole steps of them (fewer loads and scale decodes a value)
            wide = kk % (64 * lanes) == 0
            gemvs = [
                Launch(
                    n,
                    linear_gpu.gemv_warp_q6_k(kk, mr, lanes, wide),
                    {"x": xk, "w": wk, "y": ok},
                    lambda env, mr=mr: (-(-nn // (512 // lanes)), -(-rows(env) // mr)),
                    lambda env: {"m": rows(env), "n": nn, "row_bytes": row_bytes},
                    between(lo, hi, rows),
                )
                for mr, lo, hi in q6
            ]
            cut = 4
        elif lanes in (4, 8, 16, 32, 64) and packed and kk % 8 == 0 and kk % bs == 0 and limits.max_workgroup >= 256:
            # a subgroup a feature (its lanes' loads of a block coalesced), one or up to four rows of x
            gemvs = [
                Launch(
                    n,
                    linear_gpu.gemv_warp_packed(w.dtype.name, kk, mr, lanes),
                    bufs,
                    lambda env, mr=mr: (-(-nn // (256 // lanes)), -(-rows(env) // mr)),
                    lambda env: {"m": rows(env), "n": nn, "row_bytes": row_bytes},
                    between(lo, hi, rows),
                )
                for mr, lo, hi in ((1, 0, 1), (4, 1, 4))
            ]
            cut = 4
        else:  # workgroups splitting K, a thread a block
            gemvs = [
                Launch(
                    n,
                    linear.gemv_blocks.instantiate(QTYPE=w.dtype.name, BS=bs, BB=bb, ROWS=4, BLOCK=64),
                    bufs,
                    lambda env: (-(-nn // 4), rows(env)),
                    lambda env: {"n": nn, "k": kk, "row_bytes": row_bytes},
                    few,
                )
            ]
            cut = 2
        many = sched.matmul_many_rows(n) if sched is not None else None
        tensor = many is not None
        if many is not None and cut == 4:
            return [*gemvs, *many]
        bk = _simt_step(kk, limits)
        more = between(cut, 4 if tensor else None, rows)
        if bk:
            t = linear_simt.SIMT_TILE
            gemm = Launch(
                n,
                linear_simt.gemm_simt(kk, bk, w.dtype.name, words=False),
                bufs,
                lambda env: (-(-nn // t), -(-rows(env) // t)),
                lambda env: {"m": rows(env), "n": nn, "row_bytes": row_bytes},
                more,
            )
        else:
            gemm = Launch(
                n,
                linear.gemm_packed.instantiate(QTYPE=w.dtype.name),
                {"a": xk, "w": wk, "lut": lut, "c": ok},
                lambda env: (-(-nn // 16), -(-rows(env) // 16)),
                lambda env: {"m": rows(env), "n": nn, "k": kk, "row_bytes": row_bytes},
                more,
            )
        return [*gemvs, gemm, *(many or [])]
    if w.dtype != dt.f32:
        raise Refusal("matmul", "gpu", f"weights of type {w.dtype} need a cast first")
    gemv = Launch(n, linear.gemv_f32.instantiate(BLOCK=128), {"x": xk, "w": wk, "y": ok}, lambda env: (nn, rows(env)), lambda env: {"n": nn, "k": kk}, few)
    gemm = Launch(
        n,
        linear.gemm_f32.instantiate(),
        {"a": xk, "w": wk, "c": ok},
        lambda env: (-(-nn // 16), -(-rows(env) // 16)),
        lambda env: {"m": rows(env), "n": nn, "k": kk},
        many,
    )
    return [gemv, gemm]
