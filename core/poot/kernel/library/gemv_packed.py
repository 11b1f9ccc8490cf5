"""Matrix-vector products of the other packed types for GPUs (decode): a subgroup a feature, its
lanes walking the row's blocks (``gemv_warp_packed``: any type through its dequantization body;
``gemv_warp_q6_k``: Q6_K by dp4a against x as two int8 terms). Re-exported by ``linear_gpu``."""

from __future__ import annotations

from functools import lru_cache

from ...graph import dtypes as dt
from ...quant.bodies import BODIES, dequant_in_block
from .. import ir as K
from ..verify import verify_kernel
from ._kir import F32, I32, _add, _b, _c, _f, _fma, _mul, _r
from .q8x import Q8_SPLIT, _quantize_x_q8

__all__ = ["gemv_warp_packed", "gemv_warp_q6_k"]


def _subgroup_features(lanes: int, warps: int, mr: int) -> list[K.Stmt]:
    """A subgroup-a-feature GEMV's first locals: ``lane``, its feature ``jf`` (``warps`` a
    workgroup) and ``m0``, the first of its workgroup's ``mr`` rows of x."""
    return [
        K.Let("lane", _b("rem", K.Builtin("thread_id", 0), lanes)),
        K.Let("jf", _add(_mul(K.Builtin("group_id", 0), warps), _b("div", K.Builtin("thread_id", 0), lanes))),
        K.Let("m0", _mul(K.Builtin("group_id", 1), mr)),
    ]


def _subgroup_stores(mr: int) -> list[K.Stmt]:
    """Each lane's ``acc{r}`` summed over the subgroup and stored by lane 0 as y[m0 + r, jf] (rows
    below m). Every reduction comes before the stores: naga's SPIR-V reader aborted the process on
    a reduction placed after a store's branch."""
    out: list[K.Stmt] = [K.Let(f"s{r}", K.SubgroupReduce("add", _r(f"acc{r}", F32))) for r in range(mr)]
    for r in range(mr):
        cond = K.Bin("and", K.Bin("eq", _r("lane"), _c(0)), K.Bin("lt", _add(_r("m0"), r), _r("m")))
        out.append(K.If(cond, (K.Store("y", _add(_mul(_add(_r("m0"), r), _r("n")), _r("jf")), _r(f"s{r}", F32)),)))
    return out


@lru_cache(maxsize=None)
def gemv_warp_packed(qtype: str, k: int, mr: int, lanes: int = 32) -> K.Kernel:
    """y[m, j] = sum_k x[m, k] * w[j, k] for any packed type of ``quant.bodies``, a subgroup of
    ``lanes`` (the device's width) per output feature: each lane takes eight consecutive values of
    the row a step of 8 ``lanes`` values (so a subgroup's byte loads of a block are coalesced and a
    block's scales are decoded once for the eight), dequantizes them with the type's body and
    multiplies them with x read 16 bytes at a time, for up to ``mr`` rows of x; sums finished by a
    subgroup reduction. Weights are bound as bytes with ``lut`` and ``row_bytes``; K a multiple of 8
    and of the type's block (the last step may be partial). 256 threads a workgroup: grid
    (ceil(n / (256 / lanes)), ceil(m / mr)); rows past ``m`` read row ``m - 1``."""
    if qtype not in BODIES or BODIES[qtype][0] == 1:
        raise ValueError(f"gemv_warp_packed: '{qtype}' is not a packed type")
    bs, bb, _ = BODIES[qtype]
    if k % 8 or k % bs:
        raise ValueError(f"gemv_warp_packed {qtype} needs K a multiple of 8 and of {bs}, got {k}")
    if lanes not in (4, 8, 16, 32, 64):
        raise ValueError(f"gemv_warp_packed: subgroups of 4 to 64 lanes, got {lanes}")
    threads, width = 256, 8 * lanes  # values a step
    body = _subgroup_features(lanes, threads // lanes, mr)
    for r in range(mr):
        body.append(K.Let(f"xr{r}", _mul(K.Bin("min", _add(_r("m0"), r), _b("sub", _r("m"), 1)), k)))
    step: list[K.Stmt] = [
        K.Let("v0", _add(_mul(_r("it"), width), _mul(_r("lane"), 8))),
        K.Let("blk", _add(_r("row"), _mul(_b("div", _r("v0"), bs), bb))),
        K.Let("jj", _b("rem", _r("v0"), bs)),
    ]
    step += [K.Let(f"w{e}", dequant_in_block(qtype, "w", _r("blk"), _add(_r("jj"), e))) for e in range(8)]
    for r in range(mr):
        xi = _add(_r(f"xr{r}"), _r("v0"))
        step += [K.VecLoad(tuple(f"x{r}_{e}" for e in range(4)), "x", xi, F32), K.VecLoad(tuple(f"x{r}_{e}" for e in range(4, 8)), "x", _add(xi, 4), F32)]
        acc: K.Expr = _r(f"acc{r}", F32)
        for e in range(8):
            acc = _fma(acc, _r(f"x{r}_{e}", F32), _r(f"w{e}", F32))
        step.append(K.Assign(f"acc{r}", acc))
    if k % width:  # the last step's lanes past K add nothing
        step = [K.If(K.Bin("lt", _add(_mul(_r("it"), width), _mul(_r("lane"), 8)), _c(k)), tuple(step))]
    feature: list[K.Stmt] = [
        K.Let("row", _mul(_r("jf"), _r("row_bytes"))),
        *(K.Let(f"acc{r}", _f(0.0)) for r in range(mr)),
        K.For("it", _c(0), _c(-(-k // width)), tuple(step)),
    ]
    feature += _subgroup_stores(mr)
    body.append(K.If(K.Bin("lt", _r("jf"), _r("n")), tuple(feature)))
    params = (
        K.Buffer("x", F32),
        K.Buffer("w", dt.u8),
        K.Buffer("lut", F32),
        K.Buffer("y", F32, readonly=False),
        K.ScalarParam("m", I32),
        K.ScalarParam("n", I32),
        K.ScalarParam("row_bytes", I32),
    )
    kern = K.Kernel(f"gemv_warp_packed_{qtype}_K{k}_MR{mr}" + (f"_L{lanes}" if lanes != 32 else ""), params, tuple(body), (threads, 1, 1), ())
    verify_kernel(kern)
    return kern


Q6_K_UNIT = 16  # values a lane takes a step: four of each of a half-block's four 32-value groups


def _q6_k_signed(qa: K.Expr, qb: K.Expr, qh: K.Expr) -> list[K.Expr]:
    """Four Q6_K bytes of each of a half-block's four 32-value groups g, as the signed bytes q - 32
    a word: low nibbles from ``qa`` (groups 0 and 2) and ``qb`` (1 and 3), the same four bytes of
    the high bit pairs ``qh`` (bits 2g, 2g + 1)."""
    lo4, hi2, sign = 0x0F0F0F0F, 0x30303030, _c(0x80808080 - (1 << 32))
    groups = [
        _b("or", _b("and", qa, lo4), _b("and", _b("shl", qh, 4), hi2)),
        _b("or", _b("and", qb, lo4), _b("and", _b("shl", qh, 2), hi2)),
        _b("or", _b("and", _b("shr", qa, 4), lo4), _b("and", qh, hi2)),
        _b("or", _b("and", _b("shr", qb, 4), lo4), _b("and", _b("shr", qh, 2), hi2)),
    ]
    # q - 32 in each byte without borrows: (q | 0x80) - 0x20 stays in its byte, ^ 0x80 makes it q - 32
    return [_b("xor", _b("sub", _b("or", g, sign), 0x20202020), sign) for g in groups]


def _q6_k_unit(mr: int) -> list[K.Stmt]:
    """Lane unit ``u`` of the row at byte ``rowb``: block b = u / 16, half n = (u / 8) % 2, word w = u % 8:
    the low nibbles (``A``: ql bytes 64n + 4w.., ``B``: 64n + 32 + 4w..) and high bits (``H``: qh
    bytes 32n + 4w..) of values 128n + 32g + 4w + (0..3) of its four groups g, as signed bytes
    q - 32 a word each, dotted with x's two int8 terms (dp4a) and scaled by d, the group's int8
    scale (value j's is byte j / 16) and x's per-32 d. A block is 210 bytes, so an odd block's
    words straddle two (rows of an even number of blocks start 4-byte aligned)."""
    out: list[K.Stmt] = [
        K.Let("blk", _b("div", _r("u"), 16)),
        K.Let("hn", _b("rem", _b("div", _r("u"), 8), 2)),
        K.Let("qw", _b("rem", _r("u"), 8)),
        K.Let("ob", _add(_r("rowb"), _mul(_r("blk"), 210))),
        K.Let("oshift", _mul(_b("and", _r("ob"), 2), 8)),  # 16 for an odd block (2 bytes past a word), else 0
        K.Let("omask", K.Select(K.Bin("ne", _b("and", _r("ob"), 2), _c(0)), _c(-65536), _c(0))),
    ]

    def word(name: str, at: K.Expr) -> list[K.Stmt]:  # the 4 bytes at byte ``at`` (2-byte aligned)
        # (lo >> 16) | (hi << 16) for an odd block, lo else (>> is arithmetic: masked): written with a
        # variable shift and masks, which LLVM does not turn into a funnel shift (its SPIR-V target
        # cannot lower one)
        lo, hi = K.Load("w", _b("shr", at, 2), I32), K.Load("w", _add(_b("shr", at, 2), 1), I32)
        return [K.Let(name, _b("or", _b("and", _b("shr", lo, _r("oshift")), K.Un("not", _r("omask"))), _b("and", _b("shl", hi, 16), _r("omask"))))]

    out += word("qa", _add(_r("ob"), _mul(_r("hn"), 64), _mul(_r("qw"), 4)))
    out += word("qb", _add(_r("ob"), _mul(_r("hn"), 64), 32, _mul(_r("qw"), 4)))
    out += word("qh", _add(_r("ob"), 128, _mul(_r("hn"), 32), _mul(_r("qw"), 4)))
    dat = _add(_r("ob"), 208)  # d: an f16 in the half of its word that (ob + 208) & 2 says
    out.append(K.Let("dd", K.HalfToF32(_b("and", _b("shr", K.Load("w", _b("shr", dat, 2), I32), _mul(_b("and", dat, 2), 8)), 0xFFFF))))
    signed = _q6_k_signed(_r("qa"), _r("qb"), _r("qh"))
    for g in range(4):
        out.append(K.Let(f"qs{g}", signed[g]))
        sat = _add(_r("ob"), 192, _mul(_r("hn"), 8), _b("div", _r("qw"), 4), 2 * g)  # the group's scale byte
        sb = _b("and", _b("shr", K.Load("w", _b("shr", sat, 2), I32), _mul(_b("and", sat, 3), 8)), 255)
        out.append(K.Let(f"sc{g}", K.Bin("mul", _r("dd", F32), K.Cast(_b("sub", _b("xor", sb, 128), 128), F32))))
    for r in range(mr):
        for g in range(4):
            sub = _add(_mul(_r("hn"), 4), g)  # the group's 32-value sub-block in the block: 4n + g
            slot = _add(_mul(_r("blk"), 64), _mul(_b("shr", sub, 1), 8), _mul(_b("and", sub, 1), 32), _r("qw"))
            i1 = K.Dot4I8(_r(f"qs{g}"), K.Load("xq", _add(_r(f"xo{r}"), slot), I32), _c(0))
            i2 = K.Dot4I8(_r(f"qs{g}"), K.Load("xr", _add(_r(f"xo{r}"), slot), I32), _c(0))
            dx = K.Load("xds", _mul(_add(_r(f"xs{r}"), _mul(_r("blk"), 8), sub), 2), F32)
            both = K.Bin("add", K.Cast(i1, F32), K.Bin("mul", K.Cast(i2, F32), _f(1.0 / Q8_SPLIT)))
            out.append(K.Assign(f"acc{r}", K.Bin("add", _r(f"acc{r}", F32), K.Bin("mul", K.Bin("mul", _r(f"sc{g}", F32), dx), both))))
    return out


def _q6_k_wide_unit(mr: int, odd: bool) -> list[K.Stmt]:
    """A wide lane's 32 values of the row at byte ``rowb``: block ``blk`` (even or ``odd``: a
    Q6_K row of an even number of 210-byte blocks starts on a word, so an odd block starts two bytes
    into one, an even one on one), half n = (lane / 4) % 2, chunk c = lane % 4: the 8 bytes of low
    nibbles at ql bytes 64n + 8c (``qa``: groups 0 and 2) and 64n + 32 + 8c (``qb``: 1 and 3), the
    high bit pairs at qh 32n + 8c, so values 128n + 32g + 8c + (0..7) of the half's four groups g,
    as signed bytes q - 32. The four group scales (int8 scales 8n + 2g + c / 2) times d / Q8_SPLIT
    and x's per-32 d multiply an integer sum, Q8_SPLIT s1 + s2, of both of x's terms. Locals are
    suffixed by the block's parity: the loop body holds an even block's unit and an odd one's."""
    t = "o" if odd else "e"
    out: list[K.Stmt] = [K.Let(f"ob{t}", _add(_r("rowb"), _mul(_r(f"blk{t}"), 210)))]
    if odd:
        out.append(K.Let("osh", _mul(_b("and", _r(f"ob{t}"), 2), 8)))  # 16

    def two_words(name: str, rel: K.Expr | int) -> list[K.Stmt]:  # the 8 bytes at ob + rel as {name}0, {name}1
        w0 = _b("shr", _add(_r(f"ob{t}"), rel), 2)
        if not odd:
            return [K.Let(f"{name}{t}{i}", K.Load("w", _add(w0, i) if i else w0, I32)) for i in range(2)]
        raw = [K.Let(f"{name}{t}r{i}", K.Load("w", _add(w0, i) if i else w0, I32)) for i in range(3)]
        # (lo >> 16) | (hi << 16), the 16 a local (``osh``): LLVM would make a constant one a funnel
        # shift, which its SPIR-V target cannot lower
        join = lambda i: _b("or", _b("and", _b("shr", _r(f"{name}{t}r{i}"), _r("osh")), 0xFFFF), _b("shl", _r(f"{name}{t}r{i + 1}"), 16))  # noqa: E731
        return raw + [K.Let(f"{name}{t}{i}", join(i)) for i in range(2)]

    out += two_words("qa", _add(_mul(_r("hn"), 64), _mul(_r("c8"), 8)))
    out += two_words("qb", _add(_mul(_r("hn"), 64), 32, _mul(_r("c8"), 8)))
    out += two_words("qh", _add(128, _mul(_r("hn"), 32), _mul(_r("c8"), 8)))
    out += two_words("sc", _add(192, _mul(_r("hn"), 8)))
    dw = K.Load("w", _b("shr", _add(_r(f"ob{t}"), 208), 2), I32)
    half = _b("and", _b("shr", dw, 16), 0xFFFF) if odd else _b("and", dw, 0xFFFF)
    out.append(K.Let(f"dq{t}", K.Bin("mul", K.HalfToF32(half), _f(1.0 / Q8_SPLIT))))
    for i in range(2):
        signed = _q6_k_signed(*(_r(f"{nm}{t}{i}") for nm in ("qa", "qb", "qh")))
        out += [K.Let(f"qs{t}{g}_{i}", signed[g]) for g in range(4)]
    for g in range(4):  # scale 8n + 2g + c / 2: byte c / 2 + 2 (g % 2) of word g / 2 of the 8 scale bytes, sign-extended
        shift = _b("sub", _c(24), _mul(_add(_b("shr", _r("c8"), 1), 2 * (g % 2)), 8))
        sb = _b("shr", _b("shl", _r(f"sc{t}{g // 2}"), shift), 24)
        out.append(K.Let(f"sg{t}{g}", K.Bin("mul", _r(f"dq{t}", F32), K.Cast(sb, F32))))
    for r in range(mr):
        for g in range(4):
            sub = _add(_mul(_r("hn"), 4), g)  # the group's 32-value sub-block in the block: 4n + g
            slot = _add(_mul(_r(f"blk{t}"), 64), _mul(_b("shr", sub, 1), 8), 32 * (g % 2), _mul(_r("c8"), 2))
            xq, xr = (f"x{nm}{t}{r}_{g}" for nm in ("q", "r"))
            out += [K.VecLoad((f"{xq}a", f"{xq}b"), "xq", _add(_r(f"xo{r}"), slot), I32), K.VecLoad((f"{xr}a", f"{xr}b"), "xr", _add(_r(f"xo{r}"), slot), I32)]
            i1 = K.Dot4I8(_r(f"qs{t}{g}_1"), _r(f"{xq}b"), K.Dot4I8(_r(f"qs{t}{g}_0"), _r(f"{xq}a"), _c(0)))
            i2 = K.Dot4I8(_r(f"qs{t}{g}_1"), _r(f"{xr}b"), K.Dot4I8(_r(f"qs{t}{g}_0"), _r(f"{xr}a"), _c(0)))
            dx = K.Load("xds", _mul(_add(_r(f"xs{r}"), _mul(_r(f"blk{t}"), 8), sub), 2), F32)
            both = K.Cast(_add(_mul(i1, Q8_SPLIT), i2), F32)  # |s1|, |s2| <= 8 * 32 * 127: the sum below 2^24, exact in f32
            out.append(K.Assign(f"acc{r}", K.Bin("add", _r(f"acc{r}", F32), K.Bin("mul", K.Bin("mul", _r(f"sg{t}{g}", F32), dx), both))))
    return out


@lru_cache(maxsize=None)
def gemv_warp_q6_k(k: int, mr: int, lanes: int = 32, wide: bool = False) -> K.Kernel:
    """y[m, j] = sum_k x[m, k] * w[j, k] for Q6_K weights (the output head and half the layers' v and
    down projections of a Q4_K_M file): a subgroup of ``lanes`` a feature, x quantized in workgroup
    memory to two int8 terms as for Q4_K (``_quantize_x_q8``: about 15 bits of each value) and the
    6-bit quants summed against them by dp4a, 16 values a lane a step (``_q6_k_unit``); up to ``mr``
    rows of x. Weights bound as i32 words with ``row_bytes``; K a multiple of 512 (whole pairs of
    blocks: rows start word-aligned) and of a step's 16 ``lanes`` values. With ``wide`` a lane
    takes 32 values a block (``_q6_k_wide_unit``: fewer loads and scale decodes a value, and one
    integer sum of x's two terms a group), a step an even block and then an odd one for each eight
    lanes, so no lane joins words but an odd block's, all of them alike; K then a multiple of 64
    ``lanes``. 512 threads: grid (ceil(n / (512 / lanes)), ceil(m / mr))."""
    if lanes not in (8, 16, 32, 64):
        raise ValueError(f"gemv_warp_q6_k: subgroups of 8 to 64 lanes, got {lanes}")
    if k % 512 or k % (Q6_K_UNIT * lanes):
        raise ValueError(f"gemv_warp_q6_k needs K a multiple of 512 and of {Q6_K_UNIT * lanes} (a step of {lanes} lanes), got {k}")
    if wide and k % (64 * lanes):
        raise ValueError(f"gemv_warp_q6_k (wide) needs K a multiple of {64 * lanes} (a step of {lanes} lanes: two blocks each eight), got {k}")
    threads = 512
    body = [*_subgroup_features(lanes, threads // lanes, mr), *_quantize_x_q8(k, mr, threads)]
    for r in range(mr):  # row r of x in workgroup memory: its words and its per-32 (d, sum) pairs
        body += [K.Let(f"xo{r}", _c(r * k // 4)), K.Let(f"xs{r}", _c(r * k // 32))]
    feature: list[K.Stmt] = [K.Let("rowb", _mul(_r("jf"), _r("row_bytes"))), *(K.Let(f"acc{r}", _f(0.0)) for r in range(mr))]
    if wide:
        feature += [K.Let("hn", _b("and", _b("shr", _r("lane"), 2), 1)), K.Let("c8", _b("and", _r("lane"), 3))]
        first = _mul(_add(_mul(_r("it"), lanes // 8), _b("shr", _r("lane"), 3)), 2)  # the lane's even block this step
        step = [K.Let("blke", first), *_q6_k_wide_unit(mr, False), K.Let("blko", _add(_r("blke"), 1)), *_q6_k_wide_unit(mr, True)]
        feature.append(K.For("it", _c(0), _c(k // 64 // lanes), tuple(step)))
    else:
        step = [K.Let("u", _add(_mul(_r("it"), lanes), _r("lane"))), *_q6_k_unit(mr)]
        feature.append(K.For("it", _c(0), _c(k // Q6_K_UNIT // lanes), tuple(step)))
    feature += _subgroup_stores(mr)
    body.append(K.If(K.Bin("lt", _r("jf"), _r("n")), tuple(feature)))
    shared = (K.Shared("xq", I32, mr * k // 4), K.Shared("xr", I32, mr * k // 4), K.Shared("xds", F32, mr * k // 16))
    params = (
        K.Buffer("x", F32),
        K.Buffer("w", I32),
        K.Buffer("y", F32, readonly=False),
        K.ScalarParam("m", I32),
        K.ScalarParam("n", I32),
        K.ScalarParam("row_bytes", I32),
    )
    kern = K.Kernel(
        f"gemv_warp_q6_k_K{k}_MR{mr}" + (f"_L{lanes}" if lanes != 32 else "") + ("_wide" if wide else ""), params, tuple(body), (threads, 1, 1), shared
    )
    verify_kernel(kern)
    return kern
