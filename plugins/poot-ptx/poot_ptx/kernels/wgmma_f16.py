"""Batched decode on Q4_K weights through Hopper's warpgroup tensor cores with the weights exact:
``gemm_wgmma_q4_k_f16`` (sm_90a). The sums of ``hmma_xs.gemm_hmma_q4_k_xs`` (sc q exact in f16,
x as two f16 terms, one scaling a block of 256 values), but the products are ``wgmma`` with the
weights' fragment in registers (64 features a warpgroup) and x read by the tensor cores straight
from workgroup memory: no fragment loads of x through registers, which bound the warp-level
kernel, and x's tile read once a warpgroup instead of once a warp.

x's order (``split_f16x2(order="wgmma")``): in every 32 values of a row, word 8 h + 4 e + t (two
f16 values) holds its values 8 t + 4 h + e and that + 2, so that each 16-value step h of the
sub-block is 16 consecutive values in the order the weights' fragment has them (a lane t of a
quad builds its pairs from its quant word 2 t + h, as in ``hmma_xs``). Workgroup memory holds a
block of x's rows as 16-byte pieces (8 values of a row) by piece then row: the layout of the
products' B operand (8 x 8 core matrices of 128 contiguous bytes) for any 16 consecutive values."""

from __future__ import annotations

from functools import lru_cache

from poot.backend import kir as K
from poot.backend import verify_kernel
from poot.kernel.build import F32, I32
from poot.kernel.build import add as _add
from poot.kernel.build import b as _b
from poot.kernel.build import c as _c
from poot.kernel.build import f as _f
from poot.kernel.build import mul as _mul
from poot.kernel.build import r as _r

from ..statements import Hfma2, WgmmaRegA, WgmmaSync
from ._fragments import by_parts as _by_parts
from ._fragments import mma_lanes as _mma_lanes
from ._fragments import staged_blocks as _staged_blocks
from .hmma_xs import DS_STRIDE, F16_MAGIC, PARAMS, XDS_BLOCK, f16_pair

__all__ = ["gemm_wgmma_q4_k_f16", "wgmma_f16_shared_bytes"]


def wgmma_f16_shared_bytes(rows: int, terms: int = 2, stages: int = 2) -> int:
    """Workgroup memory ``gemm_wgmma_q4_k_f16`` takes for ``rows`` rows: ``stages`` buffers of a block."""
    return stages * rows * (terms * 128 + DS_STRIDE) * 4


@lru_cache(maxsize=None)
def gemm_wgmma_q4_k_f16(
    k: int, rows: int = 64, wg: int = 2, ksplit: int = 1, pipelined: bool = True, parts: tuple[int, ...] = (), terms: int = 2, stages: int = 2
) -> K.Kernel:
    """y = x @ w^T for up to ``rows`` (8-256, a multiple of 8) rows of x a workgroup
    (``split_f16x2(order="wgmma")``'s buffers) against Q4_K weight rows (i32 words of 144-byte
    blocks): ``wg`` warpgroups of 64 features each. Every thread copies x a block at a time into
    workgroup memory (two buffers); each warp streams its 16 features' weights (``pipelined``: a
    block's during the block before) and builds their fragments, four products of 64 features by
    ``rows`` by 16 a sub-block (two steps, two terms of x) in flight while it builds the next
    sub-block's; y += d / s (the block's sums) - (dmin m) sum(x) as ``hmma_xs``. ``ksplit``,
    ``parts``: as ``hmma_xs.gemm_hmma_q4_k_xs``. ``terms`` 1: x's first term only (``xl`` neither
    copied nor multiplied; matmul precision "medium": 11 bits of each value). ``stages``: buffers of
    x in the ring (the copies run ``stages`` - 1 blocks ahead). Grid (ceil(m / rows),
    ceil(n / (64 wg)), S). K / S a multiple of 256."""
    name = "gemm_wgmma_q4_k_f16"
    if k % (256 * ksplit):
        raise ValueError(f"{name} needs K a multiple of 256 times its K split ({ksplit}), got {k}")
    if rows % 8 or not 8 <= rows <= 256:
        raise ValueError(f"{name}: rows a multiple of 8 from 8 to 256, got {rows}")
    threads, width = 128 * wg, 64 * wg
    if any(size % width for size in parts):
        raise ValueError(f"{name}: every part must be a multiple of a workgroup's {width} features, got {parts}")
    if 32 * rows % threads:
        raise ValueError(f"{name}: {threads} threads copy {rows} rows of x in whole turns only")
    blocks = k // ksplit // 256
    row_words = k // 256 * 36
    term_words, ds_words = 128 * rows, DS_STRIDE * rows  # a buffer of one term: 32 pieces of each row
    nacc = rows // 2  # accumulators a thread: features g and g + 8 by the rows 8 j + 2 t4 (+1)
    head: list[K.Stmt] = [
        *_mma_lanes(),
        K.Let("row0", _mul(K.Builtin("group_id", 0), rows)),
        K.Let("col0", _add(_mul(K.Builtin("group_id", 1), width), _mul(_r("warp"), 16))),
        K.Let("b0", _mul(K.Builtin("group_id", 2), blocks) if ksplit > 1 else _c(0)),
        K.Let("dq", _b("rem", K.Builtin("thread_id", 0), 4)),
    ]
    last_m = _b("sub", _r("m"), 1)

    if terms not in (1, 2):
        raise ValueError(f"{name}: x in 1 or 2 terms, got {terms}")
    planes = ("xh", "xl")[:terms]
    ru = 16 if rows % 16 == 0 else 8  # a warp's turn of copies: ``ru`` rows by 32 / ``ru`` consecutive pieces

    def copies(blk: K.Expr, buf: K.Expr) -> list[K.Stmt]:
        """All threads' copies of block ``blk`` of the workgroup's rows into buffer ``buf`` (piece c of
        row r to word 4 (c ``rows`` + r)): a warp's turn takes ``ru`` rows by 32 / ``ru`` pieces,
        lanes along rows first (eight lanes' 16-byte stores fill 128 contiguous bytes: no bank
        conflicts) and each row's pieces consecutive (whole 32-byte sectors read); then the sums' 4
        pieces a row."""
        out: list[K.Stmt] = []
        for u in range(rows * 32 // threads):
            q = _add(_r("warp"), u * threads // 32)  # the turn's unit of ``ru`` rows by 32 / ``ru`` pieces
            r = _add(_mul(_b("rem", q, rows // ru), ru), _b("rem", _r("lane"), ru))
            c = _add(_mul(_b("div", q, rows // ru), 32 // ru), _b("div", _r("lane"), ru))
            src = _add(_mul(K.Bin("min", _add(_r("row0"), r), last_m), k // 2), _mul(blk, 128), _mul(c, 4))
            dst = _add(_mul(buf, term_words), _mul(_add(_mul(c, rows), r), 4))
            out += [K.CopyAsync(f"{nm}_s", dst, nm, src) for nm in planes]
        for u in range(-(-rows * 4 // threads)):
            r = _add(_b("div", K.Builtin("thread_id", 0), 4), u * threads // 4)
            src = _add(_mul(K.Bin("min", _add(_r("row0"), r), last_m), k // 16), _mul(blk, XDS_BLOCK), _mul(_r("dq"), 4))
            cp = K.CopyAsync("xds_s", _add(_mul(buf, ds_words), _mul(r, DS_STRIDE), _mul(_r("dq"), 4)), "xds", src)
            out.append(cp if (u + 1) * threads <= rows * 4 else K.If(K.Bin("lt", r, _c(rows)), (cp,)))
        return out

    slots = (0, 8)  # the lane's features g and g + 8
    wnames = [f"w{hf}{nm}" for hf in slots for nm in ("dm", "s0", "s1", "s2", *(f"q{cc}_{q}" for cc in range(4) for q in (0, 1)))]

    def weights(blk: K.Expr, u: str, wb: str) -> list[K.Stmt]:
        out: list[K.Stmt] = []
        for hf in slots:
            base = _add(_mul(_r(f"f{hf}"), row_words), _mul(blk, 36))
            out.append(K.VecLoad(tuple(f"w{hf}{nm}{u}" for nm in ("dm", "s0", "s1", "s2")), wb, base, I32))
            for cc in range(4):
                out.append(K.VecLoad((f"w{hf}q{cc}_0{u}", f"w{hf}q{cc}_1{u}"), wb, _add(base, 4 + 8 * cc, _mul(_r("t4"), 2)), I32))
        return out

    y = [f"acc{i}" for i in range(nacc)]  # over all blocks
    ba = tuple(f"ba{i}" for i in range(nacc))  # this block's sums, the products' accumulators

    def xrow(j: int, e: int) -> K.Expr:
        """The workgroup's row of the lane's accumulators 4 j + e, 4 j + e + 2."""
        return _add(8 * j + e, _mul(_r("t4"), 2))

    def products(buf: K.Expr) -> list[K.Stmt]:
        out: list[K.Stmt] = []
        for hf in slots:  # the block's scales and mins, four 6-bit values a word (ggml's get_scale_min_k4)
            p = f"w{hf}"
            s0, s1, s2 = (_r(f"{p}s{i}") for i in range(3))
            hi2 = lambda v: _b("and", _b("shr", v, 2), 0x30303030)  # noqa: E731  # a byte's top two bits as bits 4-5
            out += [
                K.Let(f"{p}d", K.HalfToF32(_b("and", _r(f"{p}dm"), 0xFFFF))),
                K.Let(f"{p}dmin", K.HalfToF32(_b("shr", _r(f"{p}dm"), 16))),
                K.Let(f"{p}sc0", _b("and", s0, 0x3F3F3F3F)),
                K.Let(f"{p}sc1", _b("or", _b("and", s2, 0x0F0F0F0F), hi2(s0))),
                K.Let(f"{p}mn0", _b("and", s1, 0x3F3F3F3F)),
                K.Let(f"{p}mn1", _b("or", _b("and", _b("shr", s2, 4), 0x0F0F0F0F), hi2(s1))),
            ]
        for sb in range(8):
            cc, part = divmod(sb, 2)
            mask = 0x00F000F0 if part else 0x000F000F
            if sb >= 2:  # the fragment registers of two sub-blocks back are read no more
                out.append(WgmmaSync("wait", 1))
            for hf in slots:
                p = f"w{hf}"
                byte = lambda w, p=p: _b("and", _b("shr", _r(f"{p}{w}{sb // 4}"), 8 * (sb % 4)), 255)  # noqa: E731
                h2, mul_, add_ = f"{p}h2_{sb}", f"{p}hm{sb}", f"{p}ha{sb}"
                scale, off = (1.0 / 16, -64.0) if part else (1.0, -1024.0)  # a high nibble comes as 16 q
                out += [
                    K.Let(h2, _c(0)),
                    Hfma2(h2, _b("or", _mul(byte("sc"), 0x10001), F16_MAGIC), f16_pair(1.0), f16_pair(-1024.0)),  # (sc, sc): 1024 + sc less 1024
                    K.Let(mul_, _c(0)),
                    Hfma2(mul_, _r(h2), f16_pair(scale), f16_pair(0.0)),
                    K.Let(add_, _c(0)),
                    Hfma2(add_, _r(h2), f16_pair(off), f16_pair(0.0)),
                    K.Let(f"{p}mn_{sb}", K.Bin("mul", _r(f"{p}dmin", F32), K.Cast(byte("mn"), F32))),
                ]
                for h in (0, 1):
                    for e in (0, 1):
                        word = _r(f"{p}q{cc}_{h}") if e == 0 else _b("shr", _r(f"{p}q{cc}_{h}"), 8)
                        a = f"{p}a{sb % 2}{h}{e}"  # two sets: this sub-block's, the last one's (in flight)
                        out += [K.Assign(a, _c(0)), Hfma2(a, _b("or", _b("and", word, mask), F16_MAGIC), _r(mul_), _r(add_))]
            out.append(WgmmaSync("fence"))
            for h in (0, 1):
                frag = tuple(_r(f"w{hf}a{sb % 2}{h}{e}") for e in (0, 1) for hf in slots)
                at = _mul(_mul(_add(_mul(buf, 32), 4 * sb + 2 * h), rows), 16)  # the step's first piece, in bytes
                for t, nm in enumerate(f"{p}_s" for p in planes):
                    out.append(WgmmaRegA(ba, frag, nm, at, 16 * rows, 128, accumulate=bool(sb or h or t)))  # type: ignore[arg-type]
            out.append(WgmmaSync("commit"))
            for j in range(rows // 8):  # y -= (dmin m) sum(x) while the products run
                for e in (0, 1):
                    if part == 0:  # the sums of this sub-block and the next, for the lane's row
                        names = (f"xs{sb}_{j}_{e}", f"xs{sb + 1}_{j}_{e}")
                        out.append(K.VecLoad(names, "xds_s", _add(_mul(buf, ds_words), _mul(xrow(j, e), DS_STRIDE), sb), F32))
                    for hi in (0, 1):
                        nm = y[4 * j + 2 * hi + e]
                        mn = _r(f"w{8 * hi}mn_{sb}", F32)
                        out.append(K.Assign(nm, K.Fma(K.Un("neg", mn), _r(f"xs{sb}_{j}_{e}", F32), _r(nm, F32))))
        out.append(WgmmaSync("wait", 0))
        for j in range(rows // 8):  # y += d / s (the block's sums)
            for e in (0, 1):
                out.append(K.Let(f"rs{j}_{e}", K.Load("xds_s", _add(_mul(buf, ds_words), _mul(xrow(j, e), DS_STRIDE), 8), F32)))
                for hi in (0, 1):
                    i = 4 * j + 2 * hi + e
                    d = _r(f"w{8 * hi}d", F32)
                    out.append(K.Assign(y[i], K.Fma(K.Bin("mul", d, _r(f"rs{j}_{e}", F32)), _r(ba[i], F32), _r(y[i], F32))))
        return out

    def core(wbuf: str, ybuf: str, first: int | None, size: int | None) -> list[K.Stmt]:
        col = _r("col0") if first is None else _b("sub", _r("col0"), first)
        bound = _r("n") if size is None else _c(size)
        last_n = _b("sub", bound, 1)
        body: list[K.Stmt] = [K.Let(f"f{hf}", K.Bin("min", _add(col, hf, _r("g")), last_n)) for hf in slots]
        body += [K.Let(nm, _f(0.0)) for nm in (*y, *ba)]
        body += [K.Let(f"w{hf}a{s}{h}{e}", _c(0)) for hf in slots for s in (0, 1) for h in (0, 1) for e in (0, 1)]
        # (after the copies' wait, this thread's copies made visible to the tensor cores; after the barrier, everyone's)
        body += _staged_blocks(blocks, copies, lambda blk, u: weights(blk, u, wbuf), products, wnames, pipelined, (WgmmaSync("proxy"),), stages)
        split = ksplit > 1
        ybase = _mul(_mul(K.Builtin("group_id", 2), _r("m")), _r("n")) if split else _c(0)
        stride = _r("n") if size is None or split else _c(size)
        for j in range(rows // 8):
            for hi in (0, 1):
                for e in (0, 1):
                    orow = _add(_r("row0"), xrow(j, e))
                    ocol = _add(col, 8 * hi, _r("g"))
                    at = _add(ybase, _mul(orow, stride), _add(ocol, first) if split and first else ocol)
                    st = K.Store(ybuf, at, _r(y[4 * j + 2 * hi + e], F32))
                    body.append(K.If(K.Bin("and", K.Bin("lt", orow, _r("m")), K.Bin("lt", ocol, bound)), (st,)))
        return body

    body, params = _by_parts(head, core, parts, width, ksplit, PARAMS)
    shared = (*(K.Shared(f"{p}_s", I32, stages * term_words) for p in planes), K.Shared("xds_s", F32, stages * ds_words))
    if terms == 1:
        params = tuple(p for p in params if p.name != "xl")
    tag = (
        f"_K{k}_R{rows}_G{wg}"
        + (f"_S{ksplit}" if ksplit > 1 else "")
        + ("_pipe" if pipelined else "")
        + ("_T1" if terms == 1 else "")
        + (f"_X{stages}" if stages != 2 else "")
    )
    tag += "_P" + "_".join(map(str, parts)) if parts else ""
    kern = K.Kernel(name + tag, params, tuple(body), (threads, 1, 1), shared)
    verify_kernel(kern)
    return kern
