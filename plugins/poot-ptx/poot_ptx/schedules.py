"""NVIDIA's choices in a GPU plan (``NvidiaSchedules``, returned by ``poot_plan_schedules`` for
nvptx devices and their null devices): tensor-core GEMMs for many rows (``mma.sync``; on Hopper the
warpgroup GEMMs, ``wgmma``), x split into bf16 terms once for every product that reads it
(``SplitX``), the gated MLP's product written straight as those terms, prefill attention on tensor
cores, decode attention a warp a position, how the Q4_K GEMVs read x on Hopper, and the norm fold
(``norm_fold``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from poot.backend import dtypes as dt
from poot.kernel.build import dequant_groups, dequantize_bf16
from poot.plan.schedules import (
    BODIES,
    LUTS,
    AttentionOperands,
    Env,
    GemvChoice,
    Glu,
    Launch,
    Limits,
    Node,
    Plan,
    PrefillAttention,
    QuantizedX,
    Refusal,
    Schedules,
    Value,
    When,
    between,
    value_key,
    value_shape,
    warp_gemv_fits,
)

from .kernels import attention_mma as attn_mma
from .kernels import imma as linear_imma
from .kernels import imma_xs as linear_imma_xs
from .kernels import mma as linear_mma
from .kernels import wgmma as linear_wgmma
from .norm_fold import FOLD_NORMS, fold_norms

__all__ = [
    "NvidiaSchedules",
    "SplitX",
    "DEQUANT_BYTES",
    "WGMMA_GROUPS",
    "IMMA_ROWS",
    "IMMA_XS",
    "IMMA_Q4_K",
    "IMMA_Q6_K",
    "IMMA_TF32_MINS",
    "IMMA_SMS",
    "MMA_FROM_TOKENS",
]

# prefill steps whose prompts average this many new tokens or more take the tensor-core attention
# (64 query tokens a workgroup, which walks each of its prompts in turn); shorter ones the CUDA-core
# blocks of 16. Chosen by bench/gpu_attention.py --seqs: the two cross between 16 and 32 a prompt
MMA_FROM_TOKENS = 32

_key, _shape, _warp_gemv_fits = value_key, value_shape, warp_gemv_fits


class NvidiaSchedules(Schedules):
    """The plan's choices on an NVIDIA GPU of ``limits`` (its ``matrix`` instructions: mma.sync from
    sm_80, wgmma on sm_90a). Holds the plan's x split once (``split``)."""

    def __init__(self, plan: Plan, limits: Limits) -> None:
        super().__init__(plan, limits)
        self.split = SplitX(plan, 2 if limits.matmul_precision == "high" else 1)
        self.quant = QuantizedX(plan)  # x quantized for the integer tensor-core GEMM (not the one-row GEMVs')
        self.fused: set[int] = set()  # matmuls whose integer GEMM launches with their siblings' (``siblings_many_rows``)

    def gemv(self, qtype: str, k: int, n: int, rows: int) -> GemvChoice:
        """Q4_K lanes of 32 quant bytes (``wide``) for one row of x, where they are faster. On Hopper
        (wgmma), one-row Q4_K GEMVs read x quantized once and stage it in workgroup memory instead
        of each workgroup quantizing x itself: that outweighs the launch it adds for each x (their
        rows are then not asked for into the L2 first, ``prefetch``, which pays only while a
        workgroup quantizes x; nor are the first step's weights loaded before the wait for the launch
        before, ``early``: every waiting workgroup's weight traffic would delay that small launch,
        which is on the path). A single staged product launches with registers capped for two
        512-thread workgroups an SM (``min_groups``: ptxas then keeps more registers than it would
        choose and schedules the loads better; three an SM would leave too few); rows longer than 8192
        (the 14336-long down projection's seven steps a row) pipelined, each step asking for the next
        one's words before it sums (rows of two steps are slower for it); products of more than
        65,536 features (the output head) sixteen features a warp, so a workgroup's staged x serves
        256 features. The first steps' weights are not copied into workgroup memory before the wait
        (``copied``): that gains nothing here."""
        one = rows == 1
        wide = one and "mma.sync.bf16" in self.limits.matrix
        staged = qtype == "q4_k" and one and "wgmma" in self.limits.matrix
        shape = {"min_groups": 2, "pipelined": k > 8192, "per_warp": 16 if n > 65536 else 1} if staged else {}
        return GemvChoice(wide=wide, staged=staged, shape=shape)

    def matmul_many_rows(self, n: Node) -> list[Launch] | None:
        """Beyond four rows, the tensor-core GEMMs where matmul ``n`` takes them (``_on_tensor_cores``)."""
        if not _on_tensor_cores(n, self.limits):
            return None
        return _tensor_core_launches(n, self.limits, self.split, self.quant, n.id in self.fused)

    def siblings_many_rows(self, ns: Sequence[Node]) -> list[Launch]:
        """Products of one x (q, k and v; gate and up) from 5 to ``IMMA_ROWS`` rows as one integer
        GEMM launch a regime where ``_fusable``: a launch and one K split for all of them (their sum
        of features fills the GPU where each alone would be split further or leave SMs idle), one
        ``sum_parts`` dividing the sums among their outputs."""
        if not _fusable(ns, self.limits):
            return []
        x, w = ns[0].inputs
        kk = w.shape[1].value
        total = sum(m.inputs[1].shape[0].value for m in ns)
        rows = lambda env: int(np.prod(value_shape(x, env)[:-1]))  # noqa: E731
        self.fused.update(m.id for m in ns)
        return _imma_launches(ns[0], kk, total, {}, rows, self.quant, self.limits, ns)

    def glu_split(self, glu: Glu, h: Value, users: Sequence[Node]) -> list[Launch]:
        return glu_split_launches(glu, h, users, self.limits, self.split, self.quant)

    def warp_decode(self, a: AttentionOperands) -> bool:
        """A warp a position (coalesced key and value rows): verified on NVIDIA GPUs (sm_80 on)."""
        return "mma.sync.bf16" in self.limits.matrix

    def attention_prefill(self, a: AttentionOperands) -> PrefillAttention | None:
        """Blocks of 64 query tokens on tensor cores (``attention_mma``, FlashAttention-2) where decode
        takes a warp a position (heads of 64 or 128), but at matmul precision "highest" (no tensor
        cores), for steps whose prompts average ``MMA_FROM_TOKENS`` new tokens or more."""
        lim = self.limits
        if lim.matmul_precision == "highest" or "mma.sync.bf16" not in lim.matrix or lim.subgroup != 32:
            return None
        if not (a.dk == a.dv and a.dk in (64, 128) and a.dr == 0 and a.ops["q"].dtype == dt.f32):
            return None
        k = attn_mma.attention_mma(a.dk, a.spec.causal, split=lim.matmul_precision == "high", block=a.bs, softcap=bool(a.spec.softcap), pt=a.pool_type)
        return PrefillAttention(k, attn_mma.MMA_QROWS, MMA_FROM_TOKENS)

    def finish(self) -> None:
        if FOLD_NORMS:
            fold_norms(self.plan)


@dataclass
class SplitX:
    """x split into two bf16 terms (``split_bf16x2``; one, rounded, for ``terms`` 1) once for all the
    tensor-core products that read it (q, k and v; gate and up): a scratch area of the plan's by x,
    written by one launch placed before the first of them."""

    plan: Plan
    terms: int = 2
    areas: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    launches: dict[tuple[int, int], Launch] = field(default_factory=dict)

    def of(self, n: Node, x: Value, k: int, rows: Callable[[Env], int], when: When) -> tuple[tuple[int, int], list[Launch]]:
        """The scratch area holding x split, and the launch that writes it (none when one already
        does: that one then runs wherever either product needs it)."""
        xk = _key(x)
        if xk in self.areas:
            old = self.launches.get(xk)
            if old is not None and old.when is not None and old.when.doc != when.doc:
                a, b = old.when, when
                old.when = When(f"({a.doc}) or ({b.doc})", lambda env: a(env) or b(env))
            return self.areas[xk], []
        xs = self.area(x, k, rows)
        kern = linear_mma.split_bf16x2(k, self.terms)
        launch = self.launches[xk] = Launch(
            n,
            kern,
            {"x": xk, "xs": xs},
            lambda env: (-(-rows(env) * k // 8 // linear_mma.SPLIT_THREADS),),
            lambda env: {"m": rows(env)},
            when,
            label="split_x",
        )
        return xs, [launch]

    def area(self, x: Value, k: int, rows: Callable[[Env], int]) -> tuple[int, int]:
        """A new scratch area for x split (its planes: 2 bytes a value each), found by ``of`` after."""
        xs = self.areas[_key(x)] = self.plan.add_scratch(lambda env: rows(env) * k * self.terms // 2)
        return xs


# the integer tensor-core GEMMs (``gemm_imma_q4_k_xs``, ``gemm_imma_q6_k_xs``) take products of 5
# to IMMA_ROWS rows (4: off) of the types in IMMA_XS; by the row tiles of 8 a regime of rows needs:
# feature tiles a warp, warps a workgroup, whether the next block's weights load during this one's
# products, and the workgroups an SM is given: K is split while the output's tiles give fewer than
# that many for each SM (132 SMs: an H100's or H200's). That is how many an SM holds at once (by
# their registers), or at 33-64 rows twice that: there Q4_K's mins are tf32 products
# (IMMA_TF32_MINS, by row tiles), which frees the registers for two workgroups an SM, so long as
# the next block's weights are not loaded ahead (that doubles the weight registers), and two waves
# of them were the fastest (docs/PERFORMANCE-LOG.md).
# Chosen by bench/gpu_matmul.py on Llama-3-8B's shapes (remove a type from IMMA_XS to compare:
# its products then take the streaming and warpgroup GEMMs)
IMMA_ROWS = 64
IMMA_Q4_K = {1: (2, 4, True, 2), 2: (1, 8, True, 2), 4: (1, 8, True, 1), 8: (1, 8, False, 4)}
IMMA_Q6_K = {1: (1, 8, True, 2), 2: (1, 4, True, 2), 4: (1, 8, True, 1), 8: (1, 8, True, 1)}
IMMA_XS = {"q4_k": IMMA_Q4_K, "q6_k": IMMA_Q6_K}
IMMA_TF32_MINS = (8,)
IMMA_SMS = 132
# K split's parts added by the last of a tile's workgroups (``summed``) instead of a ``sum_parts``
# launch: the same bits (tested through the interpreter); off until it is timed and its cases run
# on a GPU (bench/gpu_llama8b.py --set poot_ptx.schedules.IMMA_SUMMED=True measures both)
IMMA_SUMMED = False
_IMMA_BLOCKS = {"q4_k": 256, "q6_k": 512}  # what K must be a multiple of


def _quantized(areas: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """``QuantizedX``'s areas under the names the integer GEMM and ``glu_q8`` give them."""
    return {nm: areas[f"{nm}_in"] for nm in ("xq", "xr", "xds")}


def _imma(n: Node, limits: Limits) -> bool:
    """Whether matmul ``n`` takes the integer tensor-core GEMM from 5 to ``IMMA_ROWS`` rows: weights
    of a type in ``IMMA_XS``, rows of whole blocks (Q6_K: pairs of them), on tensor cores
    (``_on_tensor_cores``), x split for them (not at matmul precision "highest"; at "medium" its
    first term alone)."""
    q, kk = n.inputs[1].dtype.name, n.inputs[1].shape[1].value
    return IMMA_ROWS > 4 and q in IMMA_XS and kk % _IMMA_BLOCKS[q] == 0 and limits.matmul_precision != "highest" and _on_tensor_cores(n, limits)


def _imma_launches(
    n: Node, kk: int, nn: int, bufs: dict[str, Any], rows: Callable[[Env], int], quant: QuantizedX, limits: Limits, siblings: Sequence[Node] = ()
) -> list[Launch]:
    """Matmul ``n`` of 5 to ``IMMA_ROWS`` rows on the integer tensor cores: x quantized once
    (``quant``), then the weight type's staged GEMM in regimes of 1, 2, 4 and 8 row tiles (fewer, in
    more workgroups, where x's rows would not fit the device's workgroup memory), K split in parts
    where the output's tiles are too few to fill the GPU, added by ``sum_parts`` (with
    ``IMMA_SUMMED``, by the last of a tile's workgroups: ``summed``, its arrival counts a zeroed
    array of the launch's own). With
    ``siblings`` (``n`` first among them: products of one x by weights of one type and K), all of
    them in one launch a regime (``parts``; ``_fusable`` says when), ``nn`` their features."""
    q = n.inputs[1].dtype.name
    make = linear_imma_xs.gemm_imma_q4_k_xs if q == "q4_k" else linear_imma_xs.gemm_imma_q6_k_xs
    areas, out = quant.of(n, n.inputs[0], kk, rows, between(4, IMMA_ROWS, rows))
    xq = _quantized(areas)
    sizes = tuple(m.inputs[1].shape[0].value for m in siblings)
    if siblings:
        ws = {f"w{i}": value_key(m.inputs[1]) for i, m in enumerate(siblings)}
        ys = {f"y{i}": value_key(m.outputs[0]) for i, m in enumerate(siblings)}
    else:
        ws, ys = {"w": bufs["w"]}, {"y": bufs["y"]}
    sc = lambda env: {"m": rows(env), "n": nn}  # noqa: E731
    for rt, lo, hi in _imma_regimes(limits):
        ft, wn, pipe, per_sm = IMMA_XS[q][rt]
        tiles = -(-nn // (16 * ft * wn))
        parts = next((p for p in (8, 4, 2) if tiles * p <= IMMA_SMS * per_sm and kk // _IMMA_BLOCKS[q] % p == 0 and nn % 4 == 0), 1)
        # at matmul precision "medium" x's first int8 term alone (about 8 bits a value, as llama.cpp's)
        terms = 1 if limits.matmul_precision == "medium" else 2
        # K split: with IMMA_SUMMED the last of a tile's workgroups adds the parts, else sum_parts
        mins = {"tensor_mins": True} if q == "q4_k" and rt in IMMA_TF32_MINS else {}
        summed = parts > 1 and IMMA_SUMMED
        k = make(kk, ft, rt, wn, parts, pipe, parts=sizes, terms=terms, summed=summed, **mins)
        grid = lambda env, rt=rt, tiles=tiles, parts=parts: (-(-rows(env) // (8 * rt)), tiles, parts)  # noqa: E731
        top = IMMA_ROWS if hi is None or hi > IMMA_ROWS else hi
        when = between(lo, top, rows)
        label = f"{len(siblings)} matmuls" if siblings else ""
        if parts == 1:
            out.append(Launch(n, k, {**xq, **ws, **ys}, grid, sc, when, label=label))
            continue
        area = quant.plan.add_scratch(lambda env, parts=parts: parts * rows(env) * nn)
        if summed:
            counts = np.zeros(-(-top // (8 * rt)) * tiles, np.int32)  # a tile's arrivals: zero between launches
            out.append(Launch(n, k, {**xq, **ws, **ys, "p": area, "counts": counts}, grid, sc, when, label=label))
            continue
        out += [
            Launch(n, k, {**xq, **ws, "y": area}, grid, sc, when, label=label),
            _sum_parts(n, parts, area, ys if sizes else bufs["y"], rows, nn, when, sizes),
        ]
    return out


def _imma_regimes(limits: Limits) -> list[tuple[int, int, int | None]]:
    """The integer GEMM's regimes up to ``IMMA_ROWS`` rows: (row tiles, rows above, rows up to; None:
    no bound), row tiles halved where x's rows would not fit the device's workgroup memory."""
    room = max(limits.shared_bytes, limits.dynamic_shared)
    out = []
    for rt, lo, hi in ((1, 4, 8), (2, 8, 16), (4, 16, 32), (8, 32, None)):
        if lo >= IMMA_ROWS:
            break
        while rt > 1 and linear_imma_xs.xs_shared_bytes(rt) > room:
            rt //= 2
        out.append((rt, lo, hi))
    return out


def _fusable(ns: Sequence[Node], limits: Limits) -> bool:
    """Whether products of one x (``find_siblings``'s) take one integer GEMM launch a regime: each
    takes the integer GEMM (``_imma``), all of one weight type and K, and every one's features a
    multiple of a workgroup's in every regime (a workgroup's features lie in one weight)."""
    if len(ns) < 2 or not all(_imma(m, limits) for m in ns):
        return False
    w0 = ns[0].inputs[1]
    if any(m.inputs[1].dtype != w0.dtype or m.inputs[1].shape[1] != w0.shape[1] for m in ns):
        return False
    widths = {16 * IMMA_XS[w0.dtype.name][rt][0] * IMMA_XS[w0.dtype.name][rt][1] for rt, _, _ in _imma_regimes(limits)}
    return all(m.inputs[1].shape[0].value % wd == 0 for m in ns for wd in widths)


def _sum_parts(n: Node, parts: int, area: tuple[int, int], y: Any, rows: Callable[[Env], int], nn: int, when: When, sizes: tuple[int, ...] = ()) -> Launch:
    """The launch adding a K-split GEMM's ``parts`` (scratch ``area``) into ``y`` (with ``sizes``, a
    dictionary of outputs ``y0``, ``y1``, ... that many features each, ``nn`` their sum)."""
    return Launch(
        n,
        linear_mma.sum_parts(parts, sizes),
        {"p": area, **y} if sizes else {"p": area, "y": y},
        lambda env: (-(-rows(env) * nn // 4 // linear_mma.SPLIT_THREADS),),
        lambda env: {"count": rows(env) * nn},
        when,
        label="sum_parts",
    )


# bytes of bf16 a packed weight dequantized for the tensor cores may take in a step's scratch memory
# (each captured step of more than four rows has its own): Llama-3-8B's layer matrices fit; its
# 128,256-token output head (1 GiB) does not: Q4_K and Q6_K then take the streaming GEMM at every
# row count, other types the register-tiled GEMM
DEQUANT_BYTES = 1 << 28


# Q6_K read as stored by the streaming GEMM (off: its bf16 copy, made every step, as before; kept as a
# switch to compare the two)
STREAM_Q6_K = True


def _streams(q: str, kk: int) -> bool:
    """Whether the streaming GEMM reads a ``q`` weight of rows of ``kk`` values as stored."""
    packed = linear_mma.WARP_PACKED
    return q in packed and kk % packed[q] == 0 and (q != "q6_k" or STREAM_Q6_K)


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
    bf16 weights, Q4_K and Q6_K ones (dequantized in registers) or other packed ones dequantized to
    bf16 first; given mma.sync and a matmul precision below "highest"."""
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
    q, kk = w.dtype.name, w.shape[1].value
    return (q in ("bf16", "q4_k") and _warp_gemv_fits(w.dtype, kk, limits)) or (q == "q6_k" and _streams(q, kk)) or _dequantizes(w)


def _tensor_core_launches(n: Node, limits: Limits, split: SplitX | None, quant: QuantizedX | None = None, fused: bool = False) -> list[Launch]:
    """Matmul ``n`` beyond four rows on tensor cores: a GEMM streaming the weights like a GEMV up to 64
    rows, a tiled one beyond, or on Hopper (wgmma) the warpgroup GEMM from 17 rows (``_wgmma_launches``;
    Q4_K and Q6_K weights there stream up to 64 rows, Q4_K up to 32 and then the warpgroup GEMM that
    dequantizes in workgroup memory, ``_q4_k_wgmma_launches``); x split into bf16 terms once (by
    ``split``). Packed weights are first dequantized to bf16 into scratch memory (``dequantize_bf16``),
    but for those streamed up to 64 rows, which those GEMMs dequantize to the same bf16 values
    (docs/NUMERICS.md). Products of 5 to ``IMMA_ROWS`` rows of a type in ``IMMA_XS`` take the
    integer tensor cores instead, on x quantized once (``quant``, ``_imma_launches``), or, ``fused``,
    in a launch with products of the same x (``NvidiaSchedules.siblings_many_rows``)."""
    x, w = n.inputs
    nn, kk = w.shape[0].value, w.shape[1].value
    rows = lambda env: int(np.prod(_shape(x, env)[:-1]))  # noqa: E731
    bufs: dict[str, Any] = {"x": _key(x), "w": _key(w), "y": _key(n.outputs[0])}
    sc = lambda env: {"m": rows(env), "n": nn}  # noqa: E731
    out: list[Launch] = []
    q = w.dtype.name
    wd = bufs["w"]  # the weights the tiled GEMM reads: packed ones dequantized first
    streams = _streams(q, kk)  # the streaming GEMM dequantizes Q4_K and Q6_K in registers
    tiled = w.dtype == dt.bf16 or _dequantizes(w)  # else (a Q4_K weight past the budget) the streaming GEMM for every row count
    xsplit = split is not None
    imma = quant is not None and xsplit and _imma(n, limits)
    above = IMMA_ROWS if imma else 4  # fewer rows take the integer GEMM
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
                dequantize_bf16(q, kk),
                deq,
                lambda env: (dequant_groups(q, nn, kk),),
                lambda env: deq_sc,
                between(max(64 if streams else 4, above), None, rows),
                label="dequantize",
            )
        )
        if not streams:
            bufs["w"] = wd
    two = limits.matmul_precision == "high"  # x as two bf16 terms, or rounded to one
    if imma and not fused:
        out += _imma_launches(n, kk, nn, bufs, rows, quant, limits)  # type: ignore[arg-type]
    if split is not None:
        xs, pre = split.of(n, x, kk, rows, between(IMMA_ROWS if imma else 4, None, rows))
        out += pre
        bufs = {"xs": xs, "w": bufs["w"], "y": bufs["y"]}
    # weights streamed like a GEMV, tensor cores doing the sums; long rows split K among 16 warps
    # (more warps in flight where n is small); bench/gpu_matmul.py compares the choices
    wk16 = 16 if xsplit and kk >= 8192 and kk % 512 == 0 else 8
    hopper = xsplit and "wgmma" in limits.matrix and limits.dynamic_shared >= linear_wgmma.WGMMA_SHARED
    # Hopper: 17+ rows through the warpgroup GEMM on the bf16 weights (Q4_K: 65+ rows on its bf16 copy)
    wg = _wgmma_launches(n, kk, nn, two, {**bufs, "w": wd}, rows, split, above=64 if streams else 16) if hopper and tiled else []
    out += wg
    # Q4_K on Hopper from 33 rows (to 64, or every row count where no bf16 copy is made): the
    # warpgroup GEMM dequantizing in workgroup memory
    q4_wg = _q4_k_wgmma_launches(n, kk, nn, two, bufs, rows, split, 64 if tiled else None, max(32, above)) if hopper and q == "q4_k" else []
    out += q4_wg
    for mt, wk, lo, hi in ((1, wk16, 4, 16), (2, 8, 16, 32 if q4_wg else 64 if tiled else None))[: 1 if wg and not streams else 2]:
        lo = max(lo, above)
        if hi is not None and hi <= lo:
            continue
        if streams:  # K / wk a multiple of 64: a warp's K is whole 64-value chunks of blocks
            # (Q6_K at 16 warps takes 134-171 registers, past the 128 that 512 threads may have)
            wk = next(v for v in (wk, 8, 4, 2, 1) if kk % (64 * v) == 0 and (q != "q6_k" or v <= 8))
        k = linear_mma.gemm_warp(kk, mt, 4, wk, split=two, xsplit=xsplit, qtype=q if streams else "bf16")
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
        out += [Launch(n, k, {**bufs, "y": area}, grid, sc, when), _sum_parts(n, parts, area, bufs["y"], rows, nn, when)]
    return out


def _q4_k_wgmma_launches(
    n: Node, kk: int, nn: int, two: bool, bufs: dict[str, Any], rows: Callable[[Env], int], split: SplitX, hi: int | None, lo: int = 32
) -> list[Launch]:
    """Q4_K products of ``lo`` + 1 (33) to ``hi`` rows on Hopper: ``gemm_wgmma_q4_k`` (64 rows a workgroup, the
    weights dequantized in workgroup memory), K split in as many parts (up to 8) as keep about
    ``WGMMA_GROUPS`` workgroups busy, the parts added by ``sum_parts``; none where K is not whole
    blocks. It is faster than the streaming ``gemm_warp`` at 64 rows and slower at few, where its
    64-row tiles are mostly empty, so up to 32 rows stream (``bench/gpu_matmul.py`` compares them)."""
    if kk % 256 or (hi is not None and hi <= lo):
        return []
    bn = linear_wgmma.Q4_K_WGMMA_BN
    tiles = -(-nn // bn)
    parts = next((p for p in (8, 4, 2) if tiles * p <= WGMMA_GROUPS and kk % (64 * p) == 0 and nn % 4 == 0), 1)
    k = linear_wgmma.gemm_wgmma_q4_k(kk, two, parts)
    when = between(lo, hi, rows)
    sc = lambda env: {"m": rows(env), "n": nn}  # noqa: E731
    grid = lambda env: (tiles, -(-rows(env) // 64), parts)  # noqa: E731
    if parts == 1:
        return [Launch(n, k, bufs, grid, sc, when)]
    area = split.plan.add_scratch(lambda env: parts * rows(env) * nn)
    return [Launch(n, k, {**bufs, "y": area}, grid, sc, when), _sum_parts(n, parts, area, bufs["y"], rows, nn, when)]


def glu_split_launches(glu: Glu, h: Value, users: Sequence[Node], limits: Limits, split: SplitX, quant: QuantizedX | None = None) -> list[Launch]:
    """Beyond a few rows, silu(g) * u (the value ``h``) written straight as its bf16 terms for the
    products that read it (``glu_split``), instead of the elementwise kernel then ``split_bf16x2``;
    none where those products do not all take the tensor-core GEMMs (the caller keeps the
    elementwise kernel then). Where they all take the integer tensor cores up to ``IMMA_ROWS``
    rows, it is written quantized for them there instead (``glu_q8``)."""
    nn = h.shape[-1].value
    if not users or nn % 8 or any(u.op != "matmul" or _key(u.inputs[0]) != _key(h) or not _on_tensor_cores(u, limits) for u in users):
        return []
    x = glu.gate.inputs[0]
    rows = lambda env: int(np.prod(_shape(x, env)[:-1]))  # noqa: E731
    xs = split.area(h, nn, rows)
    kern = linear_mma.glu_split(nn, split.terms)
    gu = {"g": _key(glu.gate.outputs[0]), "u": _key(glu.up.outputs[0])}
    out: list[Launch] = []
    imma = quant is not None and nn % 32 == 0 and all(_imma(u, limits) for u in users)
    if imma:
        xq = _quantized(quant.area(h, nn, rows))  # type: ignore[union-attr]
        out.append(
            Launch(
                glu.up,
                linear_imma.glu_q8(nn),
                {**gu, **xq},
                lambda env: (-(-rows(env) * nn // linear_imma.GLU_Q8_THREADS),),
                lambda env: {"m": rows(env)},
                between(4, IMMA_ROWS, rows),
                label="glu_q8",
            )
        )
    out.append(
        Launch(
            glu.up,
            kern,
            {**gu, "xs": xs},
            lambda env: (-(-rows(env) * nn // 8 // linear_mma.SPLIT_THREADS),),
            lambda env: {"m": rows(env)},
            between(IMMA_ROWS if imma else 4, None, rows),
            label="glu_split",
        )
    )
    return out
