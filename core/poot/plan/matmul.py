"""How the planner runs a matrix product on a device: host schedules (lane GEMVs, row-block GEMMs),
GPU schedules that use the chip (warp GEMVs, tensor-core GEMMs) and the generic GPU ones, each for
the row counts it suits; and the products a GPU computes in one launch (a gated MLP's pair, products of
one x)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..errors import Refusal
from ..graph import dtypes as dt
from ..graph.ir import Node, Value
from ..kernel.library import dequant_gpu, linear, linear_gpu, linear_host, linear_mma, linear_simt, linear_wgmma
from ..quant.bodies import BODIES, LUTS, WIDE_BLOCK
from .common import Env, Limits
from .common import key as _key
from .common import shape as _shape
from .plan import Launch, Plan, When

__all__ = ["between", "matmul_host", "matmul_gpu", "SplitX", "QuantizedX"]


def _blocks(t: dt.DType, k: int) -> tuple[int, int]:
    """(values, bytes) of the blocks a schedule walks a weight row in: the quantization's blocks, or
    runs of WIDE_BLOCK 16-bit floats where the row divides into them."""
    bs, bb, _ = BODIES[t.name]
    if bs == 1 and k % WIDE_BLOCK == 0:
        return WIDE_BLOCK, WIDE_BLOCK * bb
    return bs, bb


def matmul_host(n: Node, shared_bytes: int) -> list[Launch]:
    """x @ w^T against a 2-D weight. Host schedules: a lane GEMV while few rows come (decode), and a
    row-block GEMM that dequantizes weight rows once for every token (prefill); the generic
    GPU-style kernels where those do not apply."""
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

    if packed:
        bs, bb = _blocks(w.dtype, kk)
        lut = LUTS.get(w.dtype.name, np.zeros(1, np.float32))
        if w.dtype.name in linear_host.LANE_TYPES and kk % 32 == 0:
            k = linear_host.gemv_lanes.instantiate(QTYPE=w.dtype.name)
            gemv = Launch(
                n, k, {"x": xk, "w": wk, "y": ok}, lambda env: (nn, rows(env), batch), lambda env: {"n": nn, "k": kk, "row_bytes": row_bytes, **strides(env)}
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


def between(lo: int, hi: int | None, rows: Callable[[Env], int]) -> When:
    if hi is None:
        return When(f"rows > {lo}", lambda env: rows(env) > lo)
    if lo == 0:
        return When(f"rows <= {hi}", lambda env: rows(env) <= hi)
    return When(f"{lo} < rows <= {hi}", lambda env: lo < rows(env) <= hi)


def _gemv_rows(qtype: str, k: int, limits: Limits) -> list[tuple[int, int, int]]:
    """The warp GEMV's (rows a workgroup, fewest rows, most rows) for 1 and 2-4 rows of x: the Q4_K
    and Q6_K ones keep their rows of x, quantized, in workgroup memory, so K bounds how many fit."""
    if qtype not in ("q4_k", "q6_k"):
        return [(1, 0, 1), (4, 1, 4)]
    if "i8" not in limits.dtypes:  # its sums are of int8 products: devices that report 8-bit integer arithmetic
        return []
    fits = [mr for mr in (4, 2, 1) if 4 * linear_gpu.q8_shared_words(k, mr) <= limits.shared_bytes]
    return [(1, 0, 1), (fits[0], 1, 4)] if fits else []


def _wide(mr: int, limits: Limits) -> bool:
    """Q4_K GEMV lanes of 32 quant bytes (``gemv_warp``'s ``wide``): for one row of x on CUDA devices,
    where they are faster; other devices keep lanes of 16."""
    return mr == 1 and "mma.sync.bf16" in limits.matrix


def _staged(qtype: str, mr: int, limits: Limits) -> bool:
    """Warp GEMVs that read x quantized once (``QuantizedX``) and stage it in workgroup memory
    instead of each workgroup quantizing x itself: Q4_K for one row of x on Hopper, where that
    outweighs the launch it adds for each x. The GEMV's rows are not asked for into the L2 first
    (``gemv_warp``'s ``prefetch``): that pays only while a workgroup quantizes x."""
    return qtype == "q4_k" and mr == 1 and "wgmma" in limits.matrix


def _one_row_shape(xs: dict[str, Any], k: int, n: int) -> dict[str, Any]:
    """How a one-row Q4_K GEMV that stages x (``_staged``: Hopper) launches: registers capped for
    two 512-thread workgroups an SM (``min_groups``: ptxas then keeps more registers than it would
    choose and schedules the loads better; three an SM would leave too few); rows longer than 8192
    (the 14336-long down projection's seven steps a row) pipelined, each step asking for the next
    one's words before it sums (rows of two steps are slower for it); products of more than 65,536
    features (the output head) sixteen features a warp, so a workgroup's staged x serves 256
    features. The first steps' weights are not copied into workgroup memory before the wait
    (``copied``): that gains nothing here."""
    if not xs:
        return {}
    return {"min_groups": 2, "pipelined": k > 8192, "per_warp": 16 if n > 65536 else 1}


def _early(xs: dict[str, Any]) -> bool:
    """Whether a staged warp GEMV (one product or a gated pair) loads its first step's weights before
    its wait for the launch before (``gemv_warp``'s ``early``), overlapping that launch: no (the weight
    traffic of every waiting workgroup delays the small launch before it, which is on the path)."""
    return False


def _x_once(
    n: Node, x: Value, k: int, mr: int, rows: Callable[[Env], int], when: When, limits: Limits, qx: QuantizedX | None
) -> tuple[dict[str, Any], list[Launch]]:
    """For a warp GEMV of ``mr`` rows that stages x quantized once (``_staged``): its buffers of x
    quantized and the launch that writes them, if none does yet; else nothing."""
    if qx is None or not _staged(n.inputs[1].dtype.name, mr, limits):
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


@dataclass
class SplitX:
    """x split into two bf16 terms (``split_bf16x2``; one, rounded, for ``terms`` 1) once for all the
    tensor-core products that read it (q, k and v; gate and up): a scratch area of the plan's by x,
    written by one launch placed before the first of them."""

    plan: Plan
    terms: int = 2
    areas: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)

    def of(self, n: Node, x: Value, k: int, rows: Callable[[Env], int], when: When) -> tuple[tuple[int, int], list[Launch]]:
        """The scratch area holding x split, and the launch that writes it (none when one already does)."""
        xk = _key(x)
        if xk in self.areas:
            return self.areas[xk], []
        xs = self.area(x, k, rows)
        kern = linear_mma.split_bf16x2(k, self.terms)
        return xs, [
            Launch(
                n,
                kern,
                {"x": xk, "xs": xs},
                lambda env: (-(-rows(env) * k // 8 // linear_mma.SPLIT_THREADS),),
                lambda env: {"m": rows(env)},
                when,
                label="split_x",
            )
        ]

    def area(self, x: Value, k: int, rows: Callable[[Env], int]) -> tuple[int, int]:
        """A new scratch area for x split (its planes: 2 bytes a value each), found by ``of`` after."""
        xs = self.areas[_key(x)] = self.plan.add_scratch(lambda env: rows(env) * k * self.terms // 2)
        return xs


@dataclass
class QuantizedX:
    """x quantized to the Q4_K GEMV's two int8 terms (``quantize_q8x2``) once for all the one-row
    GEMVs that stage it (``_staged``: q, k and v in one launch, gate and up in another, o, down, the
    output head): three scratch areas of the plan's by x, written by one launch placed before the
    first of them."""

    plan: Plan
    areas: dict[tuple[int, int], dict[str, tuple[int, int]]] = field(default_factory=dict)

    def of(self, n: Node, x: Value, k: int, rows: Callable[[Env], int], when: When) -> tuple[dict[str, tuple[int, int]], list[Launch]]:
        """The GEMV's buffers of x quantized (``xq_in``, ``xr_in``, ``xds_in``), and the launch that
        writes them (none when one already does)."""
        xk = _key(x)
        if xk in self.areas:
            return self.areas[xk], []
        add = self.plan.add_scratch
        bufs = self.areas[xk] = {
            "xq_in": add(lambda env: rows(env) * k // 4),
            "xr_in": add(lambda env: rows(env) * k // 4),
            "xds_in": add(lambda env: rows(env) * k // 16),
        }
        kern = linear_gpu.quantize_q8x2(k)
        return bufs, [
            Launch(
                n,
                kern,
                {"x": xk, "xq": bufs["xq_in"], "xr": bufs["xr_in"], "xds": bufs["xds_in"]},
                lambda env: (-(-rows(env) * k // 4 // linear_gpu.Q8_THREADS),),
                lambda env: {"m": rows(env)},
                when,
                label="quantize_x",
            )
        ]


# bytes of bf16 a packed weight dequantized for the tensor cores may take in a step's scratch memory
# (each captured step of more than four rows has its own): Llama-3-8B's layer matrices fit; its
# 128,256-token output head (1 GiB) does not: Q4_K then takes the streaming GEMM at every row count,
# other types the register-tiled GEMM
DEQUANT_BYTES = 1 << 28


def _dequantizes(w: Value) -> bool:
    """Whether packed weight ``w`` may be dequantized to bf16 into scratch memory for the tiled
    tensor-core GEMM: a packed type, rows of whole 256-value blocks, within ``DEQUANT_BYTES``."""
    return (
        w.rank == 2
        and w.dtype.name in BODIES
        and BODIES[w.dtype.name][0] > 1
        and w.shape[1].value % 256 == 0
        and 2 * w.shape[0].value * w.shape[1].value <= DEQUANT_BYTES
    )


def _on_tensor_cores(n: Node, limits: Limits) -> bool:
    """Whether matmul ``n`` takes the tensor-core GEMMs beyond a few rows (``_tensor_core_launches``):
    bf16 weights, Q4_K ones (dequantized in registers) or other packed ones dequantized to bf16
    first; given mma.sync and a matmul precision below "highest"."""
    w = n.inputs[1]
    if not (
        n.op == "matmul"
        and n.attrs["transpose_b"]
        and w.rank == 2
        and limits.subgroup == 32
        and "mma.sync.bf16" in limits.matrix
        and limits.matmul_precision != "highest"
    ):
        return False
    return (w.dtype.name in ("bf16", "q4_k") and _warp_gemv_fits(w.dtype, w.shape[1].value, limits)) or _dequantizes(w)


def _tensor_core_launches(n: Node, limits: Limits, split: SplitX | None) -> list[Launch]:
    """Matmul ``n`` beyond four rows on tensor cores: a GEMM streaming the weights like a GEMV up to 64
    rows, a tiled one beyond, or on Hopper (wgmma) the warpgroup GEMM from 17 rows (``_wgmma_launches``;
    Q4_K weights there stream up to 32 rows and take the warpgroup GEMM that dequantizes in workgroup
    memory from 33 to 64, ``_q4_k_wgmma_launches``); x split into bf16 terms once (by ``split``).
    Packed weights are first dequantized to bf16 into scratch memory (``dequantize_bf16``), but for
    Q4_K up to 64 rows, which those GEMMs dequantize to the same bf16 values (docs/NUMERICS.md)."""
    x, w = n.inputs
    nn, kk = w.shape[0].value, w.shape[1].value
    rows = lambda env: int(np.prod(_shape(x, env)[:-1]))  # noqa: E731
    bufs: dict[str, Any] = {"x": _key(x), "w": _key(w), "y": _key(n.outputs[0])}
    sc = lambda env: {"m": rows(env), "n": nn}  # noqa: E731
    out: list[Launch] = []
    q = w.dtype.name
    wd = bufs["w"]  # the weights the tiled GEMM reads: packed ones dequantized first
    streams_q4_k = q == "q4_k"  # the streaming GEMM dequantizes Q4_K in registers (no scratch)
    tiled = w.dtype == dt.bf16 or _dequantizes(w)  # else (a Q4_K weight past the budget) the streaming GEMM for every row count
    if w.dtype != dt.bf16 and tiled:
        if split is None:
            raise Refusal("matmul", "gpu", "packed weights reach the tensor cores through the plan's scratch memory: plan with a SplitX")
        wd = split.plan.add_scratch(lambda env: nn * kk // 2)
        deq: dict[str, Any] = {"w": bufs["w"], "wd": wd}
        deq_sc: dict[str, int] = {"n": nn}
        if q != "q4_k":
            bs, bb = BODIES[q][0], BODIES[q][1]
            deq["lut"] = LUTS.get(q, np.zeros(1, np.float32))
            deq_sc["row_bytes"] = kk // bs * bb
        out.append(
            Launch(
                n,
                dequant_gpu.dequantize_bf16(q, kk),
                deq,
                lambda env: (dequant_gpu.dequant_groups(q, nn, kk),),
                lambda env: deq_sc,
                between(64 if streams_q4_k else 4, None, rows),
                label="dequantize",
            )
        )
        if not streams_q4_k:
            bufs["w"] = wd
    xsplit = split is not None
    two = limits.matmul_precision == "high"  # x as two bf16 terms, or rounded to one
    if split is not None:
        xs, pre = split.of(n, x, kk, rows, between(4, None, rows))
        out += pre
        bufs = {"xs": xs, "w": bufs["w"], "y": bufs["y"]}
    # weights streamed like a GEMV, tensor cores doing the sums; long rows split K among 16 warps
    # (more warps in flight where n is small); bench/gpu_matmul.py compares the choices
    wk16 = 16 if xsplit and kk >= 8192 and kk % 512 == 0 else 8
    hopper = xsplit and "wgmma" in limits.matrix and limits.dynamic_shared >= linear_wgmma.WGMMA_SHARED
    # Hopper: 17+ rows through the warpgroup GEMM on the bf16 weights (Q4_K: 65+ rows on its bf16 copy)
    wg = _wgmma_launches(n, kk, nn, two, {**bufs, "w": wd}, rows, split, above=64 if streams_q4_k else 16) if hopper and tiled else []
    out += wg
    # Q4_K on Hopper from 33 rows (to 64, or every row count where no bf16 copy is made): the
    # warpgroup GEMM dequantizing in workgroup memory
    q4_wg = _q4_k_wgmma_launches(n, kk, nn, two, bufs, rows, split, 64 if tiled else None) if hopper and streams_q4_k else []
    out += q4_wg
    for mt, wk, lo, hi in ((1, wk16, 4, 16), (2, 8, 16, 32 if q4_wg else 64 if tiled else None))[: 1 if wg and not streams_q4_k else 2]:
        if streams_q4_k:  # K / wk a multiple of 64: a warp's K is whole chunks of Q4_K blocks
            wk = next(v for v in (wk, 8, 4, 2, 1) if kk % (64 * v) == 0)
        k = linear_mma.gemm_warp(kk, mt, 4, wk, split=two, xsplit=xsplit, qtype="q4_k" if streams_q4_k else "bf16")
        out.append(Launch(n, k, bufs, lambda env, mt=mt: (-(-rows(env) // (16 * mt)), -(-nn // 32)), sc, between(lo, hi, rows)))
    # tiles staged through workgroup memory: 128 x 128, four warps of 64 x 64 (the fewest bytes
    # of workgroup memory read a tensor-core product: what bounds this schedule); 128 x 256
    # (eight warps) for products of 8192+ features (the wider tile pays only where there are
    # features enough to fill it, as in a gated MLP's gate/up products)
    wm, wn, tm, tn = ((2, 4, 4, 8) if nn >= 8192 else (2, 2, 4, 8)) if xsplit else (2, 2, 2, 4)
    if tiled and not wg:
        k = linear_mma.gemm_mma(kk, wm, wn, tm, tn, split=two, xsplit=xsplit)
        bm, bn = 16 * wm * tm, 8 * wn * tn
        out.append(Launch(n, k, {**bufs, "w": wd}, lambda env: (-(-nn // bn), -(-rows(env) // bm)), sc, between(64, None, rows)))
    return out


# workgroups a K-split warpgroup GEMM aims at: about as many as Hopper's 132 SMs hold at once, two
# each for kernels of up to 96 KiB of workgroup memory, one for more (the 192 KiB of x rounded), so
# that K is split only as far as it takes to fill the GPU (e.g. at 64 rows 2 parts for 14336
# features, 8 for 4096)
WGMMA_GROUPS = 256
# (rows above, up to, warpgroups a workgroup) of the warpgroup GEMM's regimes: one warpgroup's 64
# rows for 17-64 rows, two (128 rows) beyond; K split while the output's tiles are too few
_WGMMA_REGIMES = ((16, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2), (512, None, 2))


def _wgmma_launches(
    n: Node, kk: int, nn: int, two: bool, bufs: dict[str, Any], rows: Callable[[Env], int], split: SplitX | None, above: int = 16
) -> list[Launch]:
    """Products of more than ``above`` rows on Hopper (bf16 weights or a dequantized copy in ``bufs``), by regimes of
    rows: the warpgroup GEMM with K split in as many parts (up to 8) as keep about ``WGMMA_GROUPS``
    workgroups busy for the regime's most rows, the parts added by ``sum_parts`` from a scratch area
    of the plan's; none where K does not divide into steps, or without x split once (the caller keeps
    mma.sync)."""
    out: list[Launch] = []
    if split is None:
        return out
    for lo, hi, groups in _WGMMA_REGIMES:
        if lo < above:
            continue
        bn, stages, bk, sw = (128, 4, 32, 64) if groups == 1 else linear_wgmma.wgmma_config(two)
        if kk % bk:
            return []
        bm = 64 * groups
        whole = linear_wgmma.gemm_wgmma(kk, two, bn, stages, bk, sw, warpgroups=groups)
        aim = WGMMA_GROUPS if sum(4 * sh.size for sh in whole.shared) <= 96 * 1024 else WGMMA_GROUPS // 2
        tiles = -(-nn // bn) * (-(-hi // bm) if hi else aim)
        parts = next((p for p in (8, 4, 2) if tiles * p <= aim and kk % (bk * p) == 0 and nn % 4 == 0), 1)
        k = linear_wgmma.gemm_wgmma(kk, two, bn, stages, bk, sw, warpgroups=groups, ksplit=parts)
        when = between(lo, hi, rows)
        sc = lambda env: {"m": rows(env), "n": nn}  # noqa: E731
        grid = lambda env, bn=bn, bm=bm, parts=parts: (-(-nn // bn), -(-rows(env) // bm), parts)  # noqa: E731
        if parts == 1:
            out.append(Launch(n, k, bufs, grid, sc, when))
            continue
        area = split.plan.add_scratch(lambda env, parts=parts: parts * rows(env) * nn)
        add = linear_mma.sum_parts(parts)
        out += [
            Launch(n, k, {**bufs, "y": area}, grid, sc, when),
            Launch(
                n,
                add,
                {"p": area, "y": bufs["y"]},
                lambda env: (-(-rows(env) * nn // 4 // linear_mma.SPLIT_THREADS),),
                lambda env: {"count": rows(env) * nn},
                when,
                label="sum_parts",
            ),
        ]
    return out


def _q4_k_wgmma_launches(n: Node, kk: int, nn: int, two: bool, bufs: dict[str, Any], rows: Callable[[Env], int], split: SplitX, hi: int | None) -> list[Launch]:
    """Q4_K products of 33 to ``hi`` rows on Hopper: ``gemm_wgmma_q4_k`` (64 rows a workgroup, the
    weights dequantized in workgroup memory), K split in as many parts (up to 8) as keep about
    ``WGMMA_GROUPS`` workgroups busy, the parts added by ``sum_parts``; none where K is not whole
    blocks. It is faster than the streaming ``gemm_warp`` at 64 rows and slower at few, where its
    64-row tiles are mostly empty, so up to 32 rows stream (``bench/gpu_matmul.py`` compares them)."""
    if kk % 256:
        return []
    bn = linear_wgmma.Q4_K_WGMMA_BN
    tiles = -(-nn // bn)
    parts = next((p for p in (8, 4, 2) if tiles * p <= WGMMA_GROUPS and kk % (64 * p) == 0 and nn % 4 == 0), 1)
    k = linear_wgmma.gemm_wgmma_q4_k(kk, two, parts)
    when = between(32, hi, rows)
    sc = lambda env: {"m": rows(env), "n": nn}  # noqa: E731
    grid = lambda env: (tiles, -(-rows(env) // 64), parts)  # noqa: E731
    if parts == 1:
        return [Launch(n, k, bufs, grid, sc, when)]
    area = split.plan.add_scratch(lambda env: parts * rows(env) * nn)
    add = linear_mma.sum_parts(parts)
    return [
        Launch(n, k, {**bufs, "y": area}, grid, sc, when),
        Launch(
            n,
            add,
            {"p": area, "y": bufs["y"]},
            lambda env: (-(-rows(env) * nn // 4 // linear_mma.SPLIT_THREADS),),
            lambda env: {"count": rows(env) * nn},
            when,
            label="sum_parts",
        ),
    ]


def _matmul_fast_gpu(n: Node, limits: Limits, split: SplitX | None = None, qx: QuantizedX | None = None) -> list[Launch] | None:
    """Schedules that use the chip, where they apply (32-lane subgroups; K a multiple of 256):
    warp-per-feature GEMVs with 16-byte loads for decode (bf16 and Q4_K weights), tensor-core
    GEMMs for more rows (bf16 weights, or Q4_K dequantized to bf16 given ``split``; given mma.sync and
    a matmul precision below "highest"; x split into bf16 terms once, by ``split``), else a
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
        xs, pre = _x_once(n, x, kk, mr, rows, between(lo, hi, rows), limits, qx)
        shape = _one_row_shape(xs, kk, nn)
        make = partial(linear_gpu.gemv_warp, w.dtype.name, kk, mr, shared_sums=shared_sums, wide=_wide(mr, limits), staged=bool(xs), early=_early(xs), **shape)
        k = make()
        out += pre
        f = k.threads // 32 * shape.get("per_warp", 1)  # features a workgroup
        out.append(Launch(n, k, _reading(bufs, xs), lambda env, mr=mr, f=f: (-(-nn // f), -(-rows(env) // mr)), sc, between(lo, hi, rows), variant=make))
    if _on_tensor_cores(n, limits) and (w.dtype == dt.bf16 or split is not None):
        out += _tensor_core_launches(n, limits, split)
    elif w.dtype == dt.bf16 and _simt_step(kk, limits):  # register tiles on CUDA cores, bf16 read as words
        bk, t = _simt_step(kk, limits), linear_simt.SIMT_TILE
        out.append(Launch(n, linear_simt.gemm_simt(kk, bk), bufs, lambda env: (-(-nn // t), -(-rows(env) // t)), sc, between(4, None, rows)))
    else:
        out.extend(l for l in _matmul_gpu_generic(n, limits) if l.when is not None and l.when.doc.startswith("rows >"))
        out[-1].when = between(4, None, rows)
    return out


def matmul_gpu(n: Node, limits: Limits, split: SplitX | None = None, qx: QuantizedX | None = None) -> list[Launch]:
    """The GPU launches of matmul ``n``; with ``split``, tensor-core products read x split once;
    with ``qx``, one-row GEMVs that stage x read it quantized once."""
    x, w = n.inputs
    if n.attrs["transpose_b"] and w.rank == 3:  # per-expert weights: the lane schedules, one thread per workgroup (correct, not yet fast)
        return matmul_host(n, 1 << 20)
    if not n.attrs["transpose_b"] or w.rank != 2:
        raise Refusal("matmul", "gpu", "the GPU planner runs x @ w^T with a 2-D weight, or per expert")
    return _matmul_fast_gpu(n, limits, split, qx) or _matmul_gpu_generic(n, limits, split)


def _simt_step(k: int, limits: Limits) -> int:
    """The K step ``gemm_simt`` takes here (32 or 16 values), 0 where it does not fit."""
    if limits.max_workgroup < 256:
        return 0
    return next((bk for bk in (32, 16) if k % bk == 0 and linear_simt.simt_shared_bytes(bk) <= limits.shared_bytes), 0)


def _matmul_gpu_generic(n: Node, limits: Limits, split: SplitX | None = None) -> list[Launch]:
    """GPU schedules for any weight type: for packed weights a GEMV of a subgroup a feature for up to
    four rows where the device has subgroup operations (else one whose workgroups split K, up to two
    rows); for more, packed weights dequantized once per workgroup into the register-tiled GEMM
    (``gemm_simt``) where it fits, else a 16x16 tiled GEMM dequantizing in registers; beyond four
    rows, where the tensor cores take them, packed weights dequantized to bf16 for those."""
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
            # Q6_K (Q4_K_M files' head and half their v and down): x as two int8 terms, dp4a
            gemvs = [
                Launch(
                    n,
                    linear_gpu.gemv_warp_q6_k(kk, mr, lanes),
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
        tensor = split is not None and _on_tensor_cores(n, limits)
        if tensor and cut == 4:
            return [*gemvs, *_tensor_core_launches(n, limits, split)]
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
        return [*gemvs, gemm, *(_tensor_core_launches(n, limits, split) if tensor else [])]
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
