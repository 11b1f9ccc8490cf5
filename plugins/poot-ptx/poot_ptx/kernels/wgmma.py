"""Matrix products for many rows (prefill, large batches) on Hopper's warpgroup tensor-core
instructions (``wgmma.mma_async``, sm_90a), built as Kernel IR.

``gemm_wgmma``: a workgroup of two warpgroups computes 128 rows by ``bn`` features (of one
warpgroup, 64 rows: few rows, K split among workgroups). K goes in steps of 32 or 64 through a ring
of workgroup-memory stages (48-192 KiB; past 48 KiB, dynamic workgroup memory): the
threads issue asynchronous copies (``cp.async``, global memory to workgroup memory without
registers) two steps ahead while the tensor cores multiply the current step (the products are
asynchronous too, and the step before may still be running); one barrier a step. The tensor cores
read both operands straight from workgroup memory (no fragment loads through registers, which bound
the mma.sync GEMM: ``linear_mma``). A step's rows lie whole (64 or 128 bytes) with their 16-byte
chunks swizzled, as the instruction reads them without bank conflicts (faster than the same kernel
on 8 x 8 core matrices, each 128 contiguous bytes, which it also takes).

x comes as ``split_bf16x2`` wrote it (``xs``: the hi plane, then the lo plane), bf16 weight rows as
i32 words: the same operands and the same sums as ``linear_mma.gemm_mma`` on x split once (``split``
True: both terms against each weight, ``matmul_precision`` "high"; False: the hi term only,
"medium").

``gemm_wgmma_q4_k``: the one-warpgroup GEMM on Q4_K weight rows, which its threads dequantize step
by step into bf16 tiles in workgroup memory (the tensor cores read bf16 only): Q4_K's 4.5 bits a
weight cross the memory bus instead of a bf16 copy's 16.
"""

from __future__ import annotations

from functools import lru_cache

from poot.backend import kir as K
from poot.backend import verify_kernel
from poot.kernel.build import F32, I32, q4_k_bf16_pairs, q4_k_lane_scales
from poot.kernel.build import add as _add
from poot.kernel.build import b as _b
from poot.kernel.build import c as _c
from poot.kernel.build import f as _f
from poot.kernel.build import mul as _mul
from poot.kernel.build import r as _r

from ..statements import Wgmma, WgmmaSync

__all__ = ["gemm_wgmma", "gemm_wgmma_q4_k", "WGMMA_BM", "WGMMA_SHARED", "Q4_K_WGMMA_BN", "wgmma_bn", "wgmma_config"]

WGMMA_BM = 128  # rows a workgroup: 64 a warpgroup
WGMMA_SHARED = 192 * 1024  # bytes of workgroup memory the planner's warpgroup GEMMs take at most (``wgmma_config``)


def wgmma_config(split: bool) -> tuple[int, int, int, int]:
    """(features a workgroup, stages, values of K a step, swizzle bytes) the planner takes: for x's
    two terms 128 features (the warpgroups' 64 accumulators a thread and the products' operands
    leave no room for more), four stages of 32 values, 64-byte swizzle (96 KiB: two workgroups an
    SM); for x rounded 256 features, four stages of 64 values, 128-byte swizzle (192 KiB). Chosen
    among ``bench/gpu_matmul.py``'s variants on Llama-3-8B's products at 2048 rows."""
    return (128, 4, 32, 64) if split else (256, 4, 64, 128)


def wgmma_bn(split: bool) -> int:
    """Features a workgroup of the planner's warpgroup GEMM (``wgmma_config``)."""
    return wgmma_config(split)[0]


def _x_copies(its: int, planes: tuple[str, ...], stage_at: K.Expr, at: K.Expr, lo_plane: K.Expr) -> list[K.Stmt]:
    """A thread's ``its`` chunks of x for a step: from word ``xa{it}`` + ``at`` of each plane of
    ``xs`` (the lo plane ``lo_plane`` words on) to word ``sw{it}`` of the stage at ``stage_at``."""
    out: list[K.Stmt] = []
    for it in range(its):
        for p in planes:
            src = _add(_r(f"xa{it}"), at)
            out.append(K.CopyAsync(f"A{p}", _add(stage_at, _r(f"sw{it}")), "xs", src if p == "hi" else _add(lo_plane, src)))
    return out


def _stores(acc: list[str], first: K.Expr, ksplit: int) -> list[K.Stmt]:
    """A warpgroup's accumulators to ``y`` (its part of K at ``ybase`` with ``ksplit`` > 1), rows
    from ``first`` and columns from ``col0`` within m and n: acc[4 j + c] is row 16 w4 + g (+ 8 for
    c >= 2), column 8 j + 2 t4 (+ 1 for odd c) of the warpgroup's 64 x bn."""
    out: list[K.Stmt] = []
    if ksplit > 1:
        out.append(K.Let("ybase", _mul(_mul(K.Builtin("group_id", 2), _r("m")), _r("n"))))
    for i, nm in enumerate(acc):
        j, c = divmod(i, 4)
        r = _add(first, _mul(_r("w4"), 16), _r("g"), 8 * (c // 2))
        col = _add(_r("col0"), 8 * j + c % 2, _mul(_r("t4"), 2))
        at = _add(_mul(r, _r("n")), col)
        out.append(
            K.If(K.Bin("and", K.Bin("lt", r, _r("m")), K.Bin("lt", col, _r("n"))), (K.Store("y", _add(_r("ybase"), at) if ksplit > 1 else at, _r(nm, F32)),))
        )
    return out


@lru_cache(maxsize=None)
def gemm_wgmma(
    k: int,
    split: bool = True,
    bn: int | None = None,
    stages: int | None = None,
    bk: int | None = None,
    swizzle: int | None = None,
    warpgroups: int = 2,
    ksplit: int = 1,
) -> K.Kernel:
    """y[i, j] = sum_k x[i, k] * w[j, k], x as ``split_bf16x2`` wrote it (buffer ``xs``; two terms
    with ``split``, one without), w bf16 rows as i32 words; grid (ceil(n / bn), ceil(m / (64
    warpgroups)), ksplit). K must be a multiple of ``bk`` (times ``ksplit``). Rows past m and features
    past n read the last one and are not stored. With ``ksplit`` S > 1 (few rows: more workgroups
    than the output's tiles give, each streaming its share of the weights) K is split in S parts and
    part s of the sum goes to ``y`` at s m n: ``linear_mma.sum_parts`` adds them.

    ``stages`` steps of ``bk`` (32 or 64) values of K in workgroup memory (dynamic: past 48 KiB): the
    copies of step s + stages - 2 are issued (``cp.async``, no registers) while step s is on the
    tensor cores and step s - 1 may still be; one barrier a step. A step's rows of 2 bk bytes lie
    swizzled (``swizzle`` 2 bk: each row's 16-byte chunks permuted, so the tensor cores' reads of
    eight rows meet different banks) or, with ``swizzle`` 0, in 8 x 8 core matrices."""
    cbn, cstages, cbk, csw = wgmma_config(split)
    bn, stages, bk = bn or cbn, stages or cstages, bk or cbk
    swizzle = csw if swizzle is None and bk == cbk else (2 * bk if swizzle is None else swizzle)
    if bk not in (32, 64) or swizzle not in (0, 2 * bk):
        raise ValueError(f"gemm_wgmma: steps of 32 or 64 values of K, swizzled by 0 or twice that many bytes; got {bk}, {swizzle}")
    if k % (bk * ksplit):
        raise ValueError(f"gemm_wgmma needs K a multiple of {bk} (times the K split, {ksplit}), got {k}")
    if warpgroups not in (1, 2):
        raise ValueError(f"gemm_wgmma: one or two warpgroups, got {warpgroups}")
    if bn % 64 or not 64 <= bn <= 256:
        raise ValueError(f"gemm_wgmma: bn a multiple of 64 up to 256, got {bn}")
    if not 3 <= stages <= 9:
        raise ValueError(f"gemm_wgmma: 3 to 9 stages, got {stages}")
    threads, steps, ahead, bm = 128 * warpgroups, k // ksplit // bk, stages - 2, 64 * warpgroups
    planes = ("hi", "lo") if split else ("hi",)
    a_words, b_words = bm * bk // 2, bn * bk // 2  # one stage of a plane of x, of the weights
    cpr = bk // 8  # 16-byte chunks a row of a step
    # a step's chunks: chunk e is row (e % 8) + 8 (e // (8 cpr)), eight values at 8 ((e // 8) % cpr);
    # it lies at word 4 e of its stage (core matrices) or at its row's swizzled chunk
    lbo, sbo = (128, cpr * 128) if swizzle == 0 else (16, 8 * swizzle)
    a_its, b_its = bm * cpr // threads, bn * cpr // threads
    nacc = bn // 2
    body: list[K.Stmt] = [
        K.Let("tid", K.Builtin("thread_id", 0)),
        K.Let("lane", _b("rem", _r("tid"), 32)),
        K.Let("wg", _b("div", _r("tid"), 128)),
        K.Let("w4", _b("rem", _b("div", _r("tid"), 32), 4)),
        K.Let("g", _b("div", _r("lane"), 4)),
        K.Let("t4", _b("rem", _r("lane"), 4)),
        K.Let("row0", _mul(K.Builtin("group_id", 1), bm)),
        K.Let("kz", _mul(K.Builtin("group_id", 2), k // ksplit // 2) if ksplit > 1 else _c(0)),  # this workgroup's part of K, in words
        K.Let("col0", _mul(K.Builtin("group_id", 0), bn)),
    ]
    # each of this thread's chunks: the word where its row (clamped) starts, plus its chunk's word
    # within a step
    for it in range(max(a_its, b_its)):
        e = _add(_mul(_c(it), threads), _r("tid")) if it else _r("tid")
        kc = _b("rem", _b("div", e, 8), cpr)
        body += [K.Let(f"er{it}", _add(_b("rem", e, 8), _mul(_b("div", e, 8 * cpr), 8))), K.Let(f"ec{it}", _mul(kc, 4))]
        if swizzle == 0:
            body.append(K.Let(f"sw{it}", _mul(e, 4)))
        else:  # row r's chunk c at chunk c ^ ((r * 2 bk >> 7) % cpr)
            body.append(K.Let(f"sw{it}", _add(_mul(_r(f"er{it}"), bk // 2), _mul(_b("xor", kc, _b("rem", _b("shr", _mul(_r(f"er{it}"), 2 * bk), 7), cpr)), 4))))
    for it in range(a_its):
        body.append(K.Let(f"xa{it}", _add(_mul(K.Bin("min", _add(_r("row0"), _r(f"er{it}")), _b("sub", _r("m"), 1)), k // 2), _r(f"ec{it}"), _r("kz"))))
    for it in range(b_its):
        body.append(K.Let(f"wa{it}", _add(_mul(K.Bin("min", _add(_r("col0"), _r(f"er{it}")), _b("sub", _r("n"), 1)), k // 2), _r(f"ec{it}"), _r("kz"))))
    acc = [f"acc{i}" for i in range(nacc)]
    body += [K.Let(nm, _f(0.0)) for nm in acc]
    lo_plane = _mul(_r("m"), k // 2)

    def copies(step: K.Expr) -> list[K.Stmt]:
        """This thread's chunks of step ``step`` into its stage (step % stages), asynchronously."""
        at = _mul(step, bk // 2)
        stage = _b("rem", step, stages)
        out = _x_copies(a_its, planes, _mul(stage, a_words), at, lo_plane)
        for it in range(b_its):
            out.append(K.CopyAsync("Bw", _add(_mul(stage, b_words), _r(f"sw{it}")), "w", _add(_r(f"wa{it}"), at)))
        return out

    for j in range(min(ahead, steps)):
        body += copies(_c(j)) + [K.CopyAsyncSync("commit")]
    for j in range(steps, ahead):  # (as many groups as the loop's waits count on)
        body.append(K.CopyAsyncSync("commit"))
    loop: list[K.Stmt] = [
        K.CopyAsyncSync("wait", ahead - 1),  # step s is in
        WgmmaSync("proxy"),
        # every thread's copies of step s are in, and every warpgroup's products of step s - 2 are
        # done (each waited for them at the end of its step s - 1): their stage takes step s + ahead
        K.Barrier(),
        K.If(K.Bin("lt", _add(_r("s"), ahead), _c(steps)), tuple(copies(_add(_r("s"), ahead)))),
        K.CopyAsyncSync("commit"),
        K.Let("cur", _b("rem", _r("s"), stages)),
        WgmmaSync("fence"),
    ]
    for kk in range(bk // 16):  # a step's 16-wide slices of K: core matrices 2 kk and 2 kk + 1, or 32 bytes along the rows
        at = 2 * lbo * kk if swizzle == 0 else 32 * kk
        for p in planes:
            loop.append(
                Wgmma(
                    tuple(acc),
                    f"A{p}",
                    _add(_mul(_r("cur"), a_words * 4), _mul(_r("wg"), 64 // 8 * sbo), at),
                    "Bw",
                    _add(_mul(_r("cur"), b_words * 4), at),
                    lbo,
                    sbo,
                    swizzle,
                )
            )
    loop += [WgmmaSync("commit"), WgmmaSync("wait", 1)]  # step s - 1's products are done
    body.append(K.For("s", _c(0), _c(steps), tuple(loop)))
    body.append(WgmmaSync("wait", 0))
    body += _stores(acc, _add(_r("row0"), _mul(_r("wg"), 64)), ksplit)
    shared = [K.Shared(f"A{p}", I32, stages * a_words) for p in planes] + [K.Shared("Bw", I32, stages * b_words)]
    params = (K.Buffer("xs", I32), K.Buffer("w", I32), K.Buffer("y", F32, readonly=False), K.ScalarParam("m", I32), K.ScalarParam("n", I32))
    shape = f"{'' if warpgroups == 2 else 'M64_'}N{bn}_S{stages}_BK{bk}_W{swizzle}" + (f"_P{ksplit}" if ksplit > 1 else "")
    kern = K.Kernel(f"gemm_wgmma_bf16_K{k}_{shape}_{'xs' if split else 'xb'}", params, tuple(body), (threads, 1, 1), tuple(shared))
    verify_kernel(kern)
    return kern


Q4_K_WGMMA_BN = 128  # features a workgroup of ``gemm_wgmma_q4_k``: one a thread


@lru_cache(maxsize=None)
def gemm_wgmma_q4_k(k: int, split: bool = True, ksplit: int = 1, stages: int = 4) -> K.Kernel:
    """``gemm_wgmma`` of one warpgroup (64 rows, 128 features a workgroup) on Q4_K weight rows (i32
    words of 144-byte blocks), dequantized in workgroup memory: the tensor cores read bf16, so each
    step's weights go global -> workgroup memory by ``cp.async`` as they come (a feature's block head
    and 16 bytes of quants: 32 values), then its thread writes them as bf16 (the nearest of each
    value's f32 dequantization, the values ``dequant_gpu.dequantize_bf16`` writes) into one of three
    swizzled tiles the products read. Grid (ceil(n / 128), ceil(m / 64), ksplit), x as
    ``split_bf16x2`` wrote it; with ``ksplit`` > 1 part s of the sum goes to ``y`` at s m n.

    A step is 32 values of K: the 16 quant bytes 16 h.. of a block's 64-value chunk, whose low
    nibbles are values 16 h.. and high nibbles 32 + 16 h.. of the chunk; x's values are copied in
    that order, so a step reads each quant byte once (K summed in a permuted order, the same for both
    operands). Two barriers a step: after the copies land and the tile is written (the tensor cores
    then read both), and the tile ring is three deep so no warp writes a tile another warp's products
    may still read."""
    if k % (64 * ksplit) or k % 256:
        raise ValueError(f"gemm_wgmma_q4_k needs K a multiple of 256 and of 64 times the K split ({ksplit}), got {k}")
    if not 3 <= stages <= 9:
        raise ValueError(f"gemm_wgmma_q4_k: 3 to 9 stages, got {stages}")
    bn, bk, swizzle, threads = Q4_K_WGMMA_BN, 32, 64, 128
    steps, ahead, tiles = k // ksplit // bk, stages - 2, 3
    planes = ("hi", "lo") if split else ("hi",)
    a_words, b_words, r_words = 64 * bk // 2, bn * bk // 2, bn * 8  # a stage of a plane of x, a bf16 tile, a stage of raw Q4_K
    cpr, sbo, row_words = bk // 8, 8 * swizzle, k // 256 * 36
    nacc = bn // 2

    def swizzled(row: K.Expr, chunk: K.Expr) -> K.Expr:  # word of a row's 16-byte chunk in a 64-byte-row tile
        return _add(_mul(row, bk // 2), _mul(_b("xor", chunk, _b("rem", _b("shr", _mul(row, 2 * bk), 7), cpr)), 4))

    body: list[K.Stmt] = [
        K.Let("tid", K.Builtin("thread_id", 0)),
        K.Let("lane", _b("rem", _r("tid"), 32)),
        K.Let("w4", _b("div", _r("tid"), 32)),
        K.Let("g", _b("div", _r("lane"), 4)),
        K.Let("t4", _b("rem", _r("lane"), 4)),
        K.Let("row0", _mul(K.Builtin("group_id", 1), 64)),
        K.Let("ks0", _mul(K.Builtin("group_id", 2), steps) if ksplit > 1 else _c(0)),  # this workgroup's first step of K
        K.Let("col0", _mul(K.Builtin("group_id", 0), bn)),
        # this thread's feature (its raw words and its tile row): the row's first word, clamped
        K.Let("wrow", _mul(K.Bin("min", _add(_r("col0"), _r("tid")), _b("sub", _r("n"), 1)), row_words)),
    ]
    a_its = 64 * cpr // threads
    for it in range(a_its):  # x: chunk kc of a step's row er holds the step's values 8 kc.. in the permuted order
        e = _add(_mul(_c(it), threads), _r("tid")) if it else _r("tid")
        kc = _b("rem", _b("div", e, 8), cpr)
        body += [
            K.Let(f"er{it}", _add(_b("rem", e, 8), _mul(_b("div", e, 8 * cpr), 8))),
            K.Let(f"kc{it}", kc),
            K.Let(f"sw{it}", swizzled(_r(f"er{it}"), _r(f"kc{it}"))),
            # step values 8 kc.. are chunk values 8 (kc % 2) + 16 h (low nibbles: kc < 2) or 32 + that
            K.Let(
                f"xa{it}",
                _add(
                    _mul(K.Bin("min", _add(_r("row0"), _r(f"er{it}")), _b("sub", _r("m"), 1)), k // 2),
                    _mul(_b("rem", _r(f"kc{it}"), 2), 4),
                    _mul(_b("div", _r(f"kc{it}"), 2), 16),
                ),
            ),
        ]
    acc = [f"acc{i}" for i in range(nacc)]
    body += [K.Let(nm, _f(0.0)) for nm in acc]
    lo_plane = _mul(_r("m"), k // 2)

    def copies(step: K.Expr) -> list[K.Stmt]:
        """This thread's copies of step ``step`` into its stage: x's chunks, its feature's block head
        and 16 bytes of quants."""
        gs = _add(_r("ks0"), step)  # the step within the row: chunk gs / 2, half gs % 2
        stage = _b("rem", step, stages)
        chunk = _b("div", gs, 2)
        at = _add(_mul(chunk, 32), _mul(_b("rem", gs, 2), 8))  # words of x: the chunk's, 8 values further for h = 1
        out = _x_copies(a_its, planes, _mul(stage, a_words), at, lo_plane)
        blk = _add(_r("wrow"), _mul(_b("div", chunk, 4), 36))
        mine = _add(_mul(stage, r_words), _mul(_r("tid"), 8))
        out += [K.CopyAsync("Rq", mine, "w", blk), K.CopyAsync("Rq", _add(mine, 4), "w", _add(blk, 4, _mul(_b("rem", chunk, 4), 8), _mul(_b("rem", gs, 2), 4)))]
        return out

    for j in range(min(ahead, steps)):
        body += copies(_c(j)) + [K.CopyAsyncSync("commit")]
    for j in range(steps, ahead):
        body.append(K.CopyAsyncSync("commit"))
    loop: list[K.Stmt] = [
        K.CopyAsyncSync("wait", ahead - 1),  # step s is in (this thread's copies)
        K.Let("cur", _b("rem", _r("s"), stages)),
        K.Let("tile", _b("rem", _r("s"), tiles)),
        K.Let("c", _b("rem", _b("div", _add(_r("ks0"), _r("s")), 2), 4)),
        K.Let("sh", _mul(_b("rem", _r("c"), 2), 16)),
        K.Let("raw", _add(_mul(_r("cur"), r_words), _mul(_r("tid"), 8))),
        K.VecLoad(("dm", "s0", "s1", "s2"), "Rq", _r("raw"), I32),  # the block's head, as q4_k_lane_scales reads it
        K.VecLoad(tuple(f"q{i}" for i in range(4)), "Rq", _add(_r("raw"), 4), I32),
        *q4_k_lane_scales("", ""),
    ]
    words = q4_k_bf16_pairs("", "l", [f"q{i}" for i in range(4)], 0) + q4_k_bf16_pairs("", "h", [f"q{i}" for i in range(4)], 4)
    for j in range(4):  # the step's values 8 j.. of this feature: tile chunk j
        loop.append(K.VecStore("Bw", _add(_mul(_r("tile"), b_words), swizzled(_r("tid"), _c(j))), tuple(words[4 * j : 4 * j + 4])))
    loop += [
        WgmmaSync("proxy"),  # this thread's copies and tile stores, to the tensor cores (after the barrier: everyone's)
        # every thread's copies of step s are in and its tile row written; every warp's products of
        # step s - 2 are done (each waited for them at the end of step s - 1): their stage takes step
        # s + ahead, and tile (s + 1) % 3 (that of step s - 2) is free for the next step
        K.Barrier(),
        K.If(K.Bin("lt", _add(_r("s"), ahead), _c(steps)), tuple(copies(_add(_r("s"), ahead)))),
        K.CopyAsyncSync("commit"),
        WgmmaSync("fence"),
    ]
    for kk in range(bk // 16):
        for p in planes:
            loop.append(
                Wgmma(tuple(acc), f"A{p}", _add(_mul(_r("cur"), a_words * 4), 32 * kk), "Bw", _add(_mul(_r("tile"), b_words * 4), 32 * kk), 16, sbo, swizzle)
            )
    loop += [WgmmaSync("commit"), WgmmaSync("wait", 1)]
    body.append(K.For("s", _c(0), _c(steps), tuple(loop)))
    body.append(WgmmaSync("wait", 0))
    body += _stores(acc, _r("row0"), ksplit)
    shared = [K.Shared(f"A{p}", I32, stages * a_words) for p in planes] + [K.Shared("Bw", I32, tiles * b_words), K.Shared("Rq", I32, stages * r_words)]
    params = (K.Buffer("xs", I32), K.Buffer("w", I32), K.Buffer("y", F32, readonly=False), K.ScalarParam("m", I32), K.ScalarParam("n", I32))
    kern = K.Kernel(
        f"gemm_wgmma_q4_k_K{k}_S{stages}" + (f"_P{ksplit}" if ksplit > 1 else "") + f"_{'xs' if split else 'xb'}",
        params,
        tuple(body),
        (threads, 1, 1),
        tuple(shared),
    )
    verify_kernel(kern)
    return kern
