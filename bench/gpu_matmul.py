"""The GPU matrix schedules alone on an NVIDIA GPU: each (rows, features, K) of the Llama-3-8B shape
through every schedule that can run it, timed with CUDA events (median of repeats, each the mean of
8 runs queued back to back), as TB/s of weights read and TFLOP/s of useful work. Used to choose the
planner's row thresholds.

    python bench/gpu_matmul.py [--rows 1 16 64 256] [--repeat 20]

Python issues a launch in about 13 us on an H200's host, so a kernel shorter than that is timed at
the host's launch rate; time those under Nsight Compute instead, one launch a timing:
``ncu --metrics gpu__time_duration.sum -k regex:gemv_warp python bench/gpu_matmul.py --rows 1 --repeat 1 --queue 1``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _cuda import median_seconds, open_cuda0

BATCH = 8  # runs a timing (their mean)
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate/up": (14336, 4096), "down": (4096, 14336), "lm_head": (128256, 4096)}


# the integer GEMM with x in workgroup memory: (feature tiles a warp, warps, pipelined[, workgroups an
# SM holds: registers capped for them]) tried by row tiles
XS_SHAPES = {
    1: ((2, 8, False), (1, 8, True), (2, 8, True), (2, 4, True), (2, 4, True, 4)),
    2: ((2, 8, False), (1, 8, True), (2, 8, True), (2, 4, True), (1, 4, True)),
    4: ((1, 8, False), (1, 8, True), (1, 4, True), (1, 8, False, 2)),
    8: ((1, 8, False), (1, 8, True), (1, 4, False)),
}


def _imma_xs_schedules(rows: int, k: int, n: int, qtype: str):  # type: ignore[no-untyped-def]
    """The integer GEMM with x in workgroup memory (``imma_xs``, Q4_K or Q6_K), x quantized first
    ("+q8"), K split to fill about 132, 264 or 528 workgroups (the parts' sum timed with it)."""
    from poot.kernel.build import Q8_THREADS, quantize_q8x2
    from poot_ptx.kernels import imma_xs
    from poot_ptx.kernels import mma as M

    make = imma_xs.gemm_imma_q4_k_xs if qtype == "q4_k" else imma_xs.gemm_imma_q6_k_xs
    per = 256 if qtype == "q4_k" else 512  # K a multiple of this a part
    if k % per:
        return []
    sq = (-(-rows * k // 4 // Q8_THREADS),)
    rt = 1 if rows <= 8 else 2 if rows <= 16 else 4 if rows <= 32 else 8
    # the regime's row tiles, and past 32 rows also half as many in twice the workgroups (each weight
    # read by two of them, from the L2 the second time; fewer registers a lane)
    shapes = [(rt, sh) for sh in XS_SHAPES[rt]] + ([(4, sh) for sh in XS_SHAPES[4] + ((2, 4, True), (2, 8, True))] if rt == 8 else [])
    out, seen = [], set()
    for rt, (ft, wn, pipe, *cap) in shapes:
        if qtype == "q6_k" and ft > 1:
            continue
        tiles = -(-n // (16 * ft * wn)) * -(-rows // (8 * rt))
        for aim in (132, 264, 528):
            parts = next((p for p in (8, 4, 2) if tiles * p <= aim and k // per % p == 0), 1)
            # Q4_K's mins a multiply-add an output a sub-block, or a tf32 product a block ("_tm"); x's
            # two int8 terms, or its first alone ("_T1": matmul precision "medium")
            variants = [{}] + ([dict(tensor_mins=True)] if qtype == "q4_k" else [])
            variants += [dict(kw, terms=1) for kw in variants]
            for kw in variants:
                kern = make(k, ft, rt, wn, parts, pipe, cap[0] if cap else 0, **kw)
                if kern.name in seen:
                    continue
                seen.add(kern.name)
                g = lambda n, ft=ft, wn=wn, parts=parts, rt=rt: (-(-rows // (8 * rt)), -(-n // (16 * ft * wn)), parts)  # noqa: E731
                if parts == 1:
                    out.append((kern.name + "+q8", (quantize_q8x2(k), kern), lambda n, g=g: (sq, g(n))))
                else:
                    add = M.sum_parts(parts)
                    out.append((kern.name + "+q8+sum", (quantize_q8x2(k), kern, add), lambda n, g=g: (sq, g(n), (-(-rows * n // 4 // M.SPLIT_THREADS),))))
    return out


# the f16 tensor-core GEMM on exact Q4_K weights (``hmma_xs``): (feature tiles, row tiles, warps
# along features, warps along rows, pipelined, workgroups an SM holds: registers capped for them)
HMMA_SHAPES = (
    (2, 4, 4, 2, True, 0),
    (2, 4, 4, 1, True, 0),
    (1, 4, 8, 2, True, 1),
    (1, 4, 8, 2, False, 1),
    (2, 2, 4, 4, False, 1),
    (1, 2, 8, 2, True, 1),
    (1, 4, 4, 1, True, 0),
)


def _hmma_schedules(rows: int, k: int, n: int):  # type: ignore[no-untyped-def]
    """``gemm_hmma_q4_k_xs`` with x split into f16 terms first ("+f16"), shapes of a workgroup of
    ``rows`` / 2 to ``rows`` rows, K split to fill about 132 workgroups (264 for 32 rows or fewer a
    workgroup, two of which an SM holds)."""
    from poot_ptx.kernels import hmma_xs as H
    from poot_ptx.kernels import mma as M

    if k % 256:
        return []
    sx = (-(-rows * k // 256 // (H.SPLIT_F16_THREADS // 32)),)
    out, seen = [], set()
    for ft, rt, wf, wr, pipe, groups in HMMA_SHAPES:
        if not rows / 2 <= 8 * rt * wr <= max(rows, 8):
            continue
        tiles = -(-n // (16 * ft * wf)) * -(-rows // (8 * rt * wr))
        for aim in (132 if 8 * rt * wr > 32 else 264,):
            parts = next((p for p in (8, 4, 2) if tiles * p <= aim and k // 256 % p == 0), 1)
            kern = H.gemm_hmma_q4_k_xs(k, ft, rt, wf, wr, parts, pipe, groups)
            if kern.name in seen:
                continue
            seen.add(kern.name)
            g = lambda n, ft=ft, rt=rt, wf=wf, wr=wr, parts=parts: (-(-rows // (8 * rt * wr)), -(-n // (16 * ft * wf)), parts)  # noqa: E731
            if parts == 1:
                out.append((kern.name + "+f16", (H.split_f16x2(k), kern), lambda n, g=g: (sx, g(n))))
            else:
                add = M.sum_parts(parts)
                out.append((kern.name + "+f16+sum", (H.split_f16x2(k), kern, add), lambda n, g=g: (sx, g(n), (-(-rows * n // 4 // M.SPLIT_THREADS),))))
    return out


def _wgmma_f16_schedules(rows: int, k: int, n: int):  # type: ignore[no-untyped-def]
    """Hopper: ``gemm_wgmma_q4_k_f16`` with x split into f16 terms first ("+f16wg"): workgroups of
    ``rows`` rows (and half as many past 32), one or two warpgroups, K split to fill about 132
    workgroups (264 for 32 rows or fewer)."""
    from poot_ptx.kernels import hmma_xs as H
    from poot_ptx.kernels import mma as M
    from poot_ptx.kernels import wgmma_f16 as W

    if k % 256:
        return []
    sx = (-(-rows * k // 256 // (H.SPLIT_F16_THREADS // 32)),)
    out, seen = [], set()
    for r in sorted({max(8, -(-rows // 8) * 8), *((32,) if rows > 32 else ())}):
        for wg, aim in ((2, 132), (1, 132), (2, 264), (1, 264)) if r > 32 else ((2, 264), (1, 264)):
            tiles = -(-n // (64 * wg)) * -(-rows // r)
            parts = next((p for p in (8, 4, 2) if tiles * p <= aim and k // 256 % p == 0), 1)
            if (r, wg, parts) in seen:
                continue
            seen.add((r, wg, parts))
            g = lambda n, r=r, wg=wg, parts=parts: (-(-rows // r), -(-n // (64 * wg)), parts)  # noqa: E731
            for terms, stages in ((2, 2), (2, 3 if r > 32 else 4), (1, 2), (1, 4)):  # terms 1: x's first term only ("medium")
                kern = W.gemm_wgmma_q4_k_f16(k, r, wg, parts, terms=terms, stages=stages)
                if parts == 1:
                    out.append((kern.name + "+f16wg", (H.split_f16x2(k, order="wgmma"), kern), lambda n, g=g: (sx, g(n))))
                else:
                    add = M.sum_parts(parts)
                    out.append(
                        (
                            kern.name + "+f16wg+sum",
                            (H.split_f16x2(k, order="wgmma"), kern, add),
                            lambda n, g=g: (sx, g(n), (-(-rows * n // 4 // M.SPLIT_THREADS),)),
                        )
                    )
    return out


def schedules(rows: int, k: int, qtype: str, wgmma: bool = False, n: int = 4096):  # type: ignore[no-untyped-def]
    """(name, kernel, grid of (features n)) for every schedule that takes ``rows`` rows of a
    product of ``n`` features (the warpgroup GEMMs too with ``wgmma``: a Hopper GPU)."""
    from poot.kernel.library import linear_gpu as G
    from poot_ptx.kernels import mma as M
    from poot_ptx.kernels import wgmma as W

    out = []
    if qtype not in ("bf16", "q4_k"):  # other packed types, few rows: the GEMV splitting K across a workgroup vs a warp a feature
        if rows <= 4:
            from poot.kernel.library import linear as L
            from poot.quant.bodies import BODIES

            bs, bb, _ = BODIES[qtype]
            kern = L.gemv_blocks.instantiate(QTYPE=qtype, BS=bs, BB=bb, ROWS=4, BLOCK=64)
            out.append((kern.name, kern, lambda n: (-(-n // 4), rows)))
            for mr in sorted({1 if rows == 1 else 4}):
                kern = G.gemv_warp_packed(qtype, k, mr)
                out.append((kern.name, kern, lambda n, mr=mr: (-(-n // 8), -(-rows // mr))))
                if qtype == "q6_k":  # x as two int8 terms, dp4a (16 values a lane a block, and 32)
                    for wide in (False, True)[: 2 if k % 2048 == 0 else 1]:
                        kern = G.gemv_warp_q6_k(k, mr, wide=wide)
                        out.append((kern.name, kern, lambda n, mr=mr: (-(-n // 16), -(-rows // mr))))
        elif qtype == "q6_k":  # the streaming tensor-core GEMM dequantizing in registers, against the bf16 copy made first
            from poot.kernel.library.dequant_gpu import dequant_groups, dequantize_bf16

            pre = M.split_bf16x2(k)
            sx = (-(-rows * k // 8 // M.SPLIT_THREADS),)
            for mt, tn, wk in ((1, 4, 8), (2, 4, 8), (1, 4, 16), (2, 4, 16)):
                if 16 * mt > 2 * max(16, rows) or k % (64 * wk) or k % 512:
                    continue
                grid = lambda n, mt=mt, tn=tn: (sx, (-(-rows // (16 * mt)), -(-n // (8 * tn))))  # noqa: E731
                streamed = M.gemm_warp(k, mt, tn, wk, xsplit=True, qtype="q6_k")
                out.append((streamed.name + "+split", (pre, streamed), grid))
                kern = M.gemm_warp(k, mt, tn, wk, xsplit=True)
                deq = dequantize_bf16("q6_k", k)
                out.append(
                    ("dequantize+" + kern.name + "+split", (deq, pre, kern), lambda n, mt=mt, tn=tn: ((dequant_groups("q6_k", n, k),), *grid(n, mt, tn)))
                )
            out += _imma_xs_schedules(rows, k, n, "q6_k")
        return out
    if qtype == "q4_k":
        if rows <= 4:
            mr = 1 if rows == 1 else max(m for m in (1, 2, 4) if 4 * G.q8_shared_words(k, m) <= 48 * 1024)
            # one row: the planner's (lanes of 32 bytes, rows asked for first on Hopper); then other warps, unrolls, several features a warp (fewer
            # workgroups quantizing x)
            if mr == 1:
                kern = G.gemv_warp("q4_k", k, mr, prefetch=wgmma)
                out.append((kern.name, kern, lambda n, kern=kern: (-(-n // (kern.threads // 32)), rows)))
            for warps, unroll, per_warp in ((G.Q4_K_WARPS, 2, 1), (16, 4, 1), (G.Q4_K_WARPS, 2, 2), (16, 4, 2), (8, 4, 1), (32, 4, 1)):
                kern = G.gemv_warp("q4_k", k, mr, warps, unroll=unroll, per_warp=per_warp)
                out.append((kern.name, kern, lambda n, kern=kern, mr=mr, f=per_warp: (-(-n // (kern.threads // 32 * f)), -(-rows // mr))))
            # x quantized once by its own launch (timed with the GEMV: "+q8"), the GEMV without a prologue
            q8 = G.quantize_q8x2(k)
            for pf in (False, True):  # ... or staged in workgroup memory (the GEMV alone, then "+q8"); rows asked for first (pf)
                kern = G.gemv_warp("q4_k", k, mr, prefetch=pf, staged=True)
                staged = lambda n, kern=kern, mr=mr: (-(-n // (kern.threads // 32)), -(-rows // mr))  # noqa: E731
                out += [(kern.name, kern, staged), (kern.name + "+q8", (q8, kern), lambda n, staged=staged: ((-(-rows * k // 4 // G.Q8_THREADS),), staged(n)))]
            for warps, unroll in ((4, 2), (4, 4), (8, 2), (8, 4), (2, 4)):
                kern = G.gemv_warp("q4_k", k, mr, warps, unroll=unroll, xglobal=True)
                out.append(
                    (
                        kern.name + "+q8",
                        (q8, kern),
                        lambda n, kern=kern, mr=mr: ((-(-rows * k // 4 // G.Q8_THREADS),), (-(-n // (kern.threads // 32)), -(-rows // mr))),
                    )
                )
        else:  # the streaming tensor-core GEMM dequantizing in registers, x split once (both terms, or rounded)
            for terms in (True, False):
                pre = M.split_bf16x2(k) if terms else M.split_bf16x2(k, 1)
                for mt, tn, wk in ((1, 4, 8), (2, 4, 8), (2, 2, 8), (4, 2, 8), (4, 4, 8), (2, 8, 8), (4, 1, 16), (2, 4, 16), (2, 2, 16)):
                    if 16 * mt > 2 * max(16, rows) or k % (64 * wk):
                        continue
                    kern = M.gemm_warp(k, mt, tn, wk, split=terms, xsplit=True, qtype="q4_k")
                    out.append(
                        (
                            kern.name + ("+split" if terms else "+round"),
                            (pre, kern),
                            lambda n, mt=mt, tn=tn: ((-(-rows * k // 8 // M.SPLIT_THREADS),), (-(-rows // (16 * mt)), -(-n // (8 * tn)))),
                        )
                    )
                if terms:  # the integer tensor-core GEMMs on x quantized once to two int8 terms
                    from poot.kernel.build import Q8_THREADS, quantize_q8x2
                    from poot_ptx.kernels.imma import gemm_imma_q4_k

                    sq = (-(-rows * k // 4 // Q8_THREADS),)
                    rt = 1 if rows <= 8 else 2 if rows <= 16 else 4
                    for ft, wk, un, pipe in ((2, 8, 2, False), (2, 8, 1, True)):  # warps splitting K, x from memory
                        if k % (64 * wk) == 0 and rows <= 32:
                            kern = gemm_imma_q4_k(k, ft, rt, wk, un, pipe)
                            out.append((kern.name + "+q8", (quantize_q8x2(k), kern), lambda n, ft=ft, rt=rt: (sq, (-(-rows // (8 * rt)), -(-n // (16 * ft))))))
                    out += _imma_xs_schedules(rows, k, n, "q4_k")
                    out += _hmma_schedules(rows, k, n)
                    out += _wgmma_f16_schedules(rows, k, n) if wgmma else []
                for parts in (1, 2, 4, 8) if wgmma else ():  # Hopper: the warpgroup GEMM dequantizing in workgroup memory
                    if k % (64 * parts) == 0:
                        kern = W.gemm_wgmma_q4_k(k, terms, parts)
                        sx = (-(-rows * k // 8 // M.SPLIT_THREADS),)
                        g = lambda n, parts=parts: (-(-n // W.Q4_K_WGMMA_BN), -(-rows // 64), parts)  # noqa: E731
                        if parts == 1:
                            out.append((kern.name + "+x", (pre, kern), lambda n, g=g: (sx, g(n))))
                        else:
                            out.append(
                                (kern.name + "+x+sum", (pre, kern, M.sum_parts(parts)), lambda n, g=g: (sx, g(n), (-(-rows * n // 4 // M.SPLIT_THREADS),)))
                            )
        return out
    if rows <= 4:
        mr = 1 if rows == 1 else 4
        for per_warp in (1, 2):
            kern = G.gemv_warp("bf16", k, mr, per_warp=per_warp)
            out.append((kern.name, kern, lambda n, mr=mr, f=per_warp: (-(-n // (8 * f)), -(-rows // mr))))
    split = M.split_bf16x2(k)
    split_grid = (-(-rows * k // 8 // M.SPLIT_THREADS),)
    if rows > 1:
        for mt in (1, 2):
            if 16 * mt <= 2 * max(16, rows):
                kern = M.gemm_warp(k, mt, 4, 8)
                out.append((kern.name, kern, lambda n, mt=mt: (-(-rows // (16 * mt)), -(-n // 32))))
        # x split into bf16 terms once, by its own launch (timed with the GEMM: "+split"); wider
        # feature tiles read x fewer times
        for mt, tn, wk in ((1, 4, 8), (2, 4, 8), (1, 8, 8), (1, 4, 16)):
            if 16 * mt <= 2 * max(16, rows):
                kern = M.gemm_warp(k, mt, tn, wk, xsplit=True)
                out.append((kern.name + "+split", (split, kern), lambda n, mt=mt, tn=tn: (split_grid, (-(-rows // (16 * mt)), -(-n // (8 * tn))))))
    if 4 < rows <= 64 and wgmma:  # one warpgroup's 64 rows, K split among workgroups (parts added by sum_parts)
        for terms, bn in ((True, 128), (False, 128), (False, 256)):
            for parts in (1, 2, 4, 8):
                if k % (32 * parts) == 0:
                    kern = W.gemm_wgmma(k, terms, bn, 4, 32, 64, warpgroups=1, ksplit=parts)
                    pre = split if terms else M.split_bf16x2(k, 1)
                    if parts == 1:
                        out.append((kern.name + "+x", (pre, kern), lambda n, bn=bn: (split_grid, (-(-n // bn), -(-rows // 64)))))
                    else:
                        add = M.sum_parts(parts)
                        out.append(
                            (
                                kern.name + "+x+sum",
                                (pre, kern, add),
                                lambda n, bn=bn, parts=parts: (split_grid, (-(-n // bn), -(-rows // 64), parts), (-(-rows * n // 4 // M.SPLIT_THREADS),)),
                            )
                        )
    if rows > 4:
        kern = M.gemm_mma(k, 2, 2, 2, 4)
        out.append((kern.name, kern, lambda n: (-(-n // 64), -(-rows // 64))))
        if rows <= 64:  # K split among workgroups (parts added by sum_parts): as many workgroups as 64 x 128 tiles allow
            for parts in (4, 8):
                if k % (32 * parts) == 0:
                    kern = M.gemm_mma(k, 2, 4, 2, 4, xsplit=True, ksplit=parts)
                    add = M.sum_parts(parts)
                    out.append(
                        (
                            kern.name + "+split+sum",
                            (split, kern, add),
                            lambda n, parts=parts: (split_grid, (-(-n // 128), -(-rows // 64), parts), (-(-rows * n // 4 // M.SPLIT_THREADS),)),
                        )
                    )
        for wm, wn, tm, tn in ((2, 2, 2, 4), (2, 4, 4, 4), (2, 2, 4, 4), (2, 2, 4, 8), (2, 4, 4, 8), (4, 2, 2, 8)):
            if rows < 64 and 16 * wm * tm > 64:
                continue
            kern = M.gemm_mma(k, wm, wn, tm, tn, xsplit=True)
            bm, bn = 16 * wm * tm, 8 * wn * tn
            out.append((kern.name + "+split", (split, kern), lambda n, bm=bm, bn=bn: (split_grid, (-(-n // bn), -(-rows // bm)))))
        if wgmma:  # Hopper's warpgroup products (sm_90a), 128 rows a workgroup, stages of workgroup memory in a ring
            for stages, bk, sw in ((4, 32, 0), (4, 32, 64), (3, 64, 128), (4, 64, 128)):
                kern = W.gemm_wgmma(k, True, None, stages, bk, sw)
                out.append((kern.name + "+split", (split, kern), lambda n, bn=W.wgmma_bn(True): (split_grid, (-(-n // bn), -(-rows // W.WGMMA_BM)))))
        if wgmma and rows > 64:  # the planner's configurations with K split among workgroups (parts added by sum_parts)
            for terms in (True, False):
                bn, stages, bk, sw = W.wgmma_config(terms)
                pre = split if terms else M.split_bf16x2(k, 1)
                for parts in (2, 4, 8):
                    if k % (bk * parts) == 0:
                        kern = W.gemm_wgmma(k, terms, bn, stages, bk, sw, ksplit=parts)
                        add = M.sum_parts(parts)
                        out.append(
                            (
                                kern.name + "+x+sum",
                                (pre, kern, add),
                                lambda n, bn=bn, parts=parts: (
                                    split_grid,
                                    (-(-n // bn), -(-rows // W.WGMMA_BM), parts),
                                    (-(-rows * n // 4 // M.SPLIT_THREADS),),
                                ),
                            )
                        )
    # matmul precision "medium": x rounded to bf16 once (split_bf16x1), one product
    round1 = M.split_bf16x2(k, 1)
    if rows > 1:
        for mt, tn, wk in ((1, 4, 8), (2, 4, 8), (1, 4, 16), (2, 8, 8), (4, 4, 8)):
            if 16 * mt <= 2 * max(16, rows):
                kern = M.gemm_warp(k, mt, tn, wk, split=False, xsplit=True)
                out.append((kern.name + "+round", (round1, kern), lambda n, mt=mt, tn=tn: (split_grid, (-(-rows // (16 * mt)), -(-n // (8 * tn))))))
    if rows > 4:
        for wm, wn, tm, tn in ((2, 2, 2, 4), (2, 2, 4, 4), (2, 2, 4, 8), (2, 4, 4, 8), (4, 2, 2, 8), (2, 2, 2, 8)):
            if rows < 64 and 16 * wm * tm > 64:
                continue
            kern = M.gemm_mma(k, wm, wn, tm, tn, split=False, xsplit=True)
            bm, bn = 16 * wm * tm, 8 * wn * tn
            out.append((kern.name + "+round", (round1, kern), lambda n, bm=bm, bn=bn: (split_grid, (-(-n // bn), -(-rows // bm)))))
        if wgmma:
            for bn, stages, bk, sw in ((256, 4, 32, 0), (256, 4, 32, 64), (256, 6, 32, 64), (256, 3, 64, 128), (256, 4, 64, 128), (128, 4, 64, 128)):
                kern = W.gemm_wgmma(k, False, bn, stages, bk, sw)
                out.append((kern.name + "+round", (round1, kern), lambda n, bn=bn: (split_grid, (-(-n // bn), -(-rows // W.WGMMA_BM)))))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 32, 64, 256])
    ap.add_argument("--qtype", choices=["bf16", "q4_k", "q6_k", "q8_0", "q5_k", "q4_0", "q4_1"], default="bf16")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--only", nargs="+", default=[""], help="schedules whose name contains one of these (under a profiler, say)")
    ap.add_argument("--queue", type=int, default=BATCH, help="runs queued a timing (1 under a profiler)")
    args = ap.parse_args()
    from poot.errors import Refusal
    from poot.quant import quantization
    from poot_ptx.runtime import CudaKernel, target_for

    opened = open_cuda0()
    if opened is None:
        return 1
    dev, ctx = opened
    rng = np.random.default_rng(0)
    print("| schedule | rows | shape (n x k) | us | weight TB/s | TFLOP/s |")
    print("|---|---|---|---|---|---|")
    for name, (n, k) in SHAPES.items():
        if name not in args.shapes:
            continue
        if args.qtype != "bf16" and name == "lm_head":
            continue  # (quantizing it takes a minute; its K is o's)
        row_bytes = 0
        if args.qtype != "bf16":
            raw = quantization(args.qtype).quantize(rng.standard_normal((n, k)).astype(np.float32))
            row_bytes = raw.shape[1]
            w = np.ascontiguousarray(raw).view(np.int32) if args.qtype == "q4_k" else np.ascontiguousarray(raw).reshape(-1)
        else:
            w = (rng.standard_normal((n, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.int32)
        wp = ctx.alloc(w.nbytes)
        wd = ctx.alloc(n * k * 2 if args.qtype == "q6_k" else 64)  # a packed weight's bf16 copy
        ctx.upload(wp, w)
        for rows in args.rows:
            x = rng.standard_normal((rows, k)).astype(np.float32)
            xp, yp = ctx.alloc(x.nbytes), ctx.alloc(rows * n * 4)
            xq, xr, xds = ctx.alloc(rows * k), ctx.alloc(rows * k), ctx.alloc(rows * k // 4)  # quantized x: bytes, bytes, f32 per 16 values
            xs = ctx.alloc(rows * k * 4)  # x split into two bf16 terms
            xh, xl = ctx.alloc(rows * k * 2), ctx.alloc(rows * k * 2)  # ... or two f16 terms
            parts = ctx.alloc(8 * rows * n * 4)  # a K-split GEMM's parts
            lut = ctx.alloc(64)  # (the packed types timed here have no lookup table)
            ctx.upload(xp, x)
            for sname, kern, grid in schedules(rows, k, args.qtype, "wgmma" in dev.capabilities.matrix_ops, n):
                if not any(o in sname for o in args.only):
                    continue
                kerns = kern if isinstance(kern, tuple) else (kern,)  # launches timed together
                try:
                    cks = [CudaKernel(ctx, kk, target_for(dev)) for kk in kerns]
                except Refusal as e:  # (more workgroup memory than the target has, say)
                    print(f"| {sname} | {rows} | {name} {n}x{k} | refused: {e.reason} | | |")
                    continue
                grids = grid(n) if isinstance(kern, tuple) else (grid(n),)
                copied = any(kk.name.startswith("dequantize") for kk in kerns)
                ptrs = {
                    "wd": wd,
                    "x": xp,
                    "w": wp,
                    "y": yp,
                    "xq": xq,
                    "xr": xr,
                    "xds": xds,
                    "xq_in": xq,
                    "xr_in": xr,
                    "xds_in": xds,
                    "xs": xs,
                    "lut": lut,
                    "xh": xh,
                    "xl": xl,
                }

                def bufs(ck):  # type: ignore[no-untyped-def]  # a K-split GEMM writes the parts sum_parts reads
                    nm = ck.kernel.name
                    parted = "_P" in nm if nm.startswith("gemm_wgmma") and "_f16" not in nm else "_S" in nm
                    named = {**ptrs, "p": parts, "y": parts} if parted else {**ptrs, "p": parts}
                    if copied and not nm.startswith("dequantize"):  # the tiled GEMM reads the bf16 copy
                        named["w"] = wd
                    return {p.name: named[p.name] for p in ck.kernel.buffers}

                scal = {"m": rows, "n": n, "k": k, "count": rows * n, "row_bytes": row_bytes}
                args_of = [(bufs(ck), {sc.name: scal[sc.name] for sc in ck.kernel.scalars}) for ck in cks]

                def run(cks=cks, grids=grids, args_of=args_of):  # type: ignore[no-untyped-def]
                    for ck, g, (bufs, scal) in zip(cks, grids, args_of):
                        ck.launch(g, bufs, scal)

                t = median_seconds(ctx, run, args.repeat, args.queue, warm=2)
                print(f"| {sname} | {rows} | {name} {n}x{k} | {t * 1e6:.1f} | {w.nbytes / t / 1e12:.2f} | {2 * rows * n * k / t / 1e12:.1f} |", flush=True)
            for ptr in (xp, yp, xq, xr, xds, xs, parts, lut, xh, xl):
                ctx.free(ptr)
        ctx.free(wp)
        ctx.free(wd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
