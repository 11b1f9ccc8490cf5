"""Batched decode on Q4_K weights through the integer tensor cores (``mma.sync`` m16n8k32 s8):
``gemm_imma_q4_k``. x comes quantized once by ``quantize_q8x2`` (two int8 terms per value, a scale
and the exact sum per 32 values); the weights are read as stored and their quants go to the tensor
cores as they are, four nibbles a word masked at once, with no conversion to floating point (the
streaming bf16 GEMM, ``mma.gemm_warp``, turns every nibble into a bf16 value). Each 32-value
sub-block's integer sums are scaled once: y += (d_x / Q8_SPLIT) (d sc) (Q8_SPLIT s1 + s2) - (dmin m) sum(x), where s1 and s2 are the
quants' sums against x's two terms (exact in f32: below 2^24) and sum(x) is the sub-block's exact
f32 sum, as the dp4a GEMVs compute it."""

from __future__ import annotations

from functools import lru_cache

from poot.backend import dtypes as dt
from poot.backend import kir as K
from poot.backend import verify_kernel
from poot.kernel.build import F32, I32, Q8_SPLIT, q4_k_lane_scales, q8_quantize_lane
from poot.kernel.build import add as _add
from poot.kernel.build import b as _b
from poot.kernel.build import c as _c
from poot.kernel.build import f as _f
from poot.kernel.build import mul as _mul
from poot.kernel.build import r as _r
from poot.kernel.build import silu_mul as _silu_mul

from ..statements import Mma
from ._fragments import mma_lanes as _mma_lanes
from ._fragments import warp_tiles_summed as _warp_tiles_summed

__all__ = ["gemm_imma_q4_k", "glu_q8", "sub_block_sums", "GLU_Q8_THREADS", "NIBBLES", "PARAMS"]

NIBBLES = 0x0F0F0F0F
# the integer GEMMs' parameters: x as ``quantize_q8x2`` writes it, the Q4_K weights, y [m, n]
PARAMS = (
    K.Buffer("xq", I32),
    K.Buffer("xr", I32),
    K.Buffer("xds", F32),
    K.Buffer("w", I32),
    K.Buffer("y", F32, readonly=False),
    K.ScalarParam("m", I32),
    K.ScalarParam("n", I32),
)


def sub_block_sums(
    tag: str,
    acc: tuple[str, ...],
    a: tuple[K.Expr, ...],
    b: tuple[K.Expr, ...],
    rows: tuple[tuple[K.Expr, K.Expr], ...],
    feats: tuple[tuple[K.Expr, K.Expr], ...],
    mins: bool = True,
) -> list[K.Stmt]:
    """One 16-feature by 8-row tile's sums over a 32-value sub-block added to its f32
    accumulators ``acc``: the quants ``a`` (A's four registers) against x's two terms ``b`` (B's
    registers of the first term, then the second's) in two integer products, then y += (d_x
    d sc / Q8_SPLIT) (Q8_SPLIT s1 + s2) - (dmin m) sum(x). ``rows``: (d, sum) of x's sub-block for
    the lane's two rows (2 t4, 2 t4 + 1); ``feats``: (d sc / Q8_SPLIT, dmin m) for its two features
    (g, g + 8). ``mins`` False: the - (dmin m) sum(x) term left to the caller. With ``b`` of x's
    first term alone (two registers), one product and y += (d_x d sc) s1: ``feats`` then carry
    d sc. Locals suffixed ``tag``."""
    one = len(b) == 2
    s1, s2 = tuple(f"s1{tag}_{e}" for e in range(4)), tuple(f"s2{tag}_{e}" for e in range(4))
    out: list[K.Stmt] = [K.Let(nm, _c(0)) for nm in (s1 if one else s1 + s2)]
    out += [Mma(s1, a, b[:2], dt.i8)] if one else [Mma(s1, a, b[:2], dt.i8), Mma(s2, a, b[2:], dt.i8)]  # type: ignore[arg-type]
    for e in range(4):  # output (feature g + 8 (e / 2), row 2 t4 + e % 2)
        (d, xsum), (sd, mn) = rows[e % 2], feats[e // 2]
        whole = K.Cast(_r(s1[e]) if one else _add(_mul(_r(s1[e]), Q8_SPLIT), _r(s2[e])), F32)
        # fused multiply-adds (two with the mins): the GPU rounds mul and add apart otherwise (PTX's
        # .rn forbids fusing them), and this sum is most of the instructions a sub-block at 32-64 rows
        got = K.Fma(K.Bin("mul", d, sd), whole, _r(acc[e], F32))
        out.append(K.Assign(acc[e], K.Fma(K.Un("neg", mn), xsum, got) if mins else got))
    return out


@lru_cache(maxsize=None)
def gemm_imma_q4_k(k: int, ft: int = 2, rt: int = 2, wk: int = 8, un: int = 2, pipelined: bool = False) -> K.Kernel:
    """y = x @ w^T for a few rows of x against Q4_K weight rows (i32 words of 144-byte blocks) on
    the integer tensor cores. The weights are the products' A operand (16 features a tile), x their
    B operand (8 rows a tile): a warp owns ``ft`` feature tiles by ``rt`` row tiles, and the ``wk``
    warps of a workgroup split K in whole 64-value chunks of blocks, adding their tiles at the end.
    A lane loads, a chunk, the block head (16 bytes) and 8 bytes of quants of each of its two
    features a tile, and 8 bytes of each x term of its row of each row tile for each of the chunk's
    two sub-blocks: the 8 bytes are 8 consecutive values of K where the fragment's layout puts 4
    and 4 sixteen apart, a permutation of K the same for both operands. The chunk's low nibbles are
    its first sub-block, the high ones its second, as Q4_K stores them. ``un`` chunks' loads are
    issued before their products; ``pipelined``: each chunk's loads issued before the products of the
    chunk before (``un`` 1). Buffers ``xq``, ``xr`` (m k / 4 words), ``xds`` (m k / 16 floats:
    d, sum a sub-block) as ``quantize_q8x2`` writes them. Grid (ceil(m / (8 rt)), ceil(n / (16 ft)));
    K a multiple of 64 wk."""
    if k % 256 or k % (64 * wk):
        raise ValueError(f"gemm_imma_q4_k needs K a multiple of 256 and of {64 * wk}, got {k}")
    chunks = k // 64 // wk  # a warp's 64-value chunks
    un = 1 if pipelined or chunks % un else un
    threads = 32 * wk
    row_words = k // 256 * 36
    body: list[K.Stmt] = [
        *_mma_lanes(),
        K.Let("row0", _mul(K.Builtin("group_id", 0), 8 * rt)),
        K.Let("col0", _mul(K.Builtin("group_id", 1), 16 * ft)),
        K.Let("c", _c(0)),  # the chunk's place in its block, and the scales' shift (``q4_k_lane_scales``)
        K.Let("sh", _c(0)),
    ]
    last_m, last_n = _b("sub", _r("m"), 1), _b("sub", _r("n"), 1)
    for j in range(ft):  # the lane's features: rows g and g + 8 of each feature tile
        for h in (0, 8):
            body.append(K.Let(f"wr{j}_{h}", _mul(K.Bin("min", _add(_r("col0"), 16 * j + h, _r("g")), last_n), row_words)))
    for i in range(rt):  # the lane's row of x in each row tile (B's column g), and the rows of its outputs (2 t4, 2 t4 + 1)
        body.append(K.Let(f"xw{i}", _mul(K.Bin("min", _add(_r("row0"), 8 * i, _r("g")), last_m), k // 4)))
        for e in range(2):
            body.append(K.Let(f"xo{i}_{e}", _mul(K.Bin("min", _add(_r("row0"), 8 * i + e, _mul(_r("t4"), 2)), last_m), k // 16)))
    acc = {(j, i): tuple(f"acc{j}_{i}_{e}" for e in range(4)) for j in range(ft) for i in range(rt)}
    for names in acc.values():
        body += [K.Let(nm, _f(0.0)) for nm in names]

    def loads(u: str, first: K.Expr) -> tuple[list[K.Stmt], list[str]]:
        """Chunk ``first``'s loads into locals suffixed ``u``, and their names."""
        ch = f"ch{u}"
        out: list[K.Stmt] = [K.Let(ch, first), K.Let(f"cc{u}", _b("rem", _r(ch), 4))]
        names = [f"cc{u}"]
        blk = _mul(_b("div", _r(ch), 4), 36)
        for j in range(ft):
            for h in (0, 8):
                p = f"w{u}_{j}_{h}"
                base = _add(_r(f"wr{j}_{h}"), blk)
                head, quants = tuple(f"{p}{nm}" for nm in ("dm", "s0", "s1", "s2")), (f"{p}q0", f"{p}q1")
                names += [*head, *quants]
                out += [K.VecLoad(head, "w", base, I32), K.VecLoad(quants, "w", _add(base, 4, _mul(_r(f"cc{u}"), 8), _mul(_r("t4"), 2)), I32)]
        for i in range(rt):
            for sb in range(2):  # the sub-block's 8 values of K this lane holds, both terms
                at = _add(_r(f"xw{i}"), _mul(_r(ch), 16), 8 * sb, _mul(_r("t4"), 2))
                hi, lo = (f"x{u}_{i}_{sb}h0", f"x{u}_{i}_{sb}h1"), (f"x{u}_{i}_{sb}l0", f"x{u}_{i}_{sb}l1")
                names += [*hi, *lo]
                out += [K.VecLoad(hi, "xq", at, I32), K.VecLoad(lo, "xr", at, I32)]
            for e in range(2):  # d and sum of both sub-blocks, for the lane's two output rows
                ds = tuple(f"xd{u}_{i}_{e}_{nm}" for nm in ("d0", "s0", "d1", "s1"))
                names += list(ds)
                out.append(K.VecLoad(ds, "xds", _add(_r(f"xo{i}_{e}"), _mul(_r(ch), 4)), F32))
        return out, names

    def products(u: str) -> list[K.Stmt]:
        """The products of the chunk loaded into locals suffixed ``u``, added to the accumulators."""
        out: list[K.Stmt] = [K.Assign("c", _r(f"cc{u}")), K.Assign("sh", _mul(_b("rem", _r("c"), 2), 16))]
        for j in range(ft):
            for h in (0, 8):
                p = f"w{u}_{j}_{h}"
                out += q4_k_lane_scales(p, "")
                for part in ("l", "h"):  # d sc / Q8_SPLIT: x's terms are summed as Q8_SPLIT s1 + s2
                    out.append(K.Let(f"{p}sd{part}", K.Bin("mul", _r(f"{p}sc{part}", F32), _f(1.0 / Q8_SPLIT))))
        for sb, part in ((0, "l"), (1, "h")):
            for j in range(ft):
                # (row g, K 0-3), (row g + 8, K 0-3), (row g, K 4-7), (row g + 8, K 4-7) of the lane's 8
                words = [_r(f"w{u}_{j}_{h}q{q}") for q in (0, 1) for h in (0, 8)]
                a = tuple(_b("and", w if sb == 0 else _b("shr", w, 4), NIBBLES) for w in words)
                for i in range(rt):
                    xv, xd = f"x{u}_{i}_{sb}", (f"xd{u}_{i}_0_", f"xd{u}_{i}_1_")
                    out += sub_block_sums(
                        f"{u}_{sb}_{j}_{i}",
                        acc[j, i],
                        a,
                        (_r(f"{xv}h0"), _r(f"{xv}h1"), _r(f"{xv}l0"), _r(f"{xv}l1")),
                        tuple((_r(f"{nm}d{sb}", F32), _r(f"{nm}s{sb}", F32)) for nm in xd),
                        tuple((_r(f"w{u}_{j}_{h}sd{part}", F32), _r(f"w{u}_{j}_{h}mn{part}", F32)) for h in (0, 8)),
                    )
        return out

    first = _mul(_r("warp"), chunks)
    if pipelined:  # the next chunk's loads issued before this chunk's products
        now, now_names = loads("c", first)
        body += now
        nxt, nxt_names = loads("n", _add(first, K.Bin("min", _add(_r("s"), 1), _c(chunks - 1))))
        ints = lambda nm: I32 if nm.startswith(("cc", "w", "x")) and not nm.startswith("xd") else F32  # noqa: E731
        loop = nxt + products("c") + [K.Assign(c, _r(n, ints(c))) for c, n in zip(now_names, nxt_names)]
        body.append(K.For("s", _c(0), _c(chunks), tuple(loop)))
    else:
        loop = []
        for u in range(un):  # every load of the unrolled chunks first
            loop += loads(str(u), _add(first, _mul(_r("s"), un), u))[0]
        for u in range(un):
            loop += products(str(u))
        body.append(K.For("s", _c(0), _c(chunks // un), tuple(loop)))

    # the warps' partial tiles through workgroup memory, then summed and stored; accumulator q of
    # tile (j, i) = (tile / rt, tile % rt) is feature g or g + 8 and row 2 t4 or 2 t4 + 1
    nacc = ft * rt * 4
    flat = [nm for j in range(ft) for i in range(rt) for nm in acc[j, i]]
    body += _warp_tiles_summed(
        flat,
        wk,
        threads,
        lambda ln, q, tile: (
            _add(_r("row0"), _mul(_b("rem", tile, rt), 8), _mul(_b("rem", ln, 4), 2), _b("rem", q, 2)),
            _add(_r("col0"), _mul(_b("div", tile, rt), 16), _b("div", ln, 4), _mul(_b("div", q, 2), 8)),
        ),
    )
    kern = K.Kernel(
        f"gemm_imma_q4_k_K{k}_{ft}x{rt}_W{wk}_U{un}{'_pipe' if pipelined else ''}",
        PARAMS,
        tuple(body),
        (threads, 1, 1),
        (K.Shared("part", F32, threads * nacc),),
    )
    verify_kernel(kern)
    return kern


GLU_Q8_THREADS = 256


@lru_cache(maxsize=None)
def glu_q8(n: int) -> K.Kernel:
    """A gated MLP's silu(g) * u (g and u [m, n] f32) written as the integer products read their x
    (``quantize_q8x2``'s buffers ``xq``, ``xr``, ``xds``) instead of as f32: the product and its
    quantization in one pass, for the down projection. A warp a block of 32 values, a lane a value;
    grid (ceil(m n / 32 / (GLU_Q8_THREADS / 32)),). n a multiple of 32."""
    if n % 32:
        raise ValueError(f"glu_q8 needs n a multiple of 32, got {n}")
    warps = GLU_Q8_THREADS // 32
    body: list[K.Stmt] = [
        K.Let("lane", _b("rem", K.Builtin("thread_id", 0), 32)),
        K.Let("blk", _add(_mul(K.Builtin("group_id", 0), warps), _b("div", K.Builtin("thread_id", 0), 32))),
    ]
    at = _add(_mul(_r("blk"), 32), _r("lane"))
    inner: list[K.Stmt] = [
        *q8_quantize_lane(_silu_mul(K.Load("g", at, F32), K.Load("u", at, F32)), _add(_mul(_r("blk"), 8), _b("div", _r("lane"), 4)), _r("lane"))
    ]
    body.append(K.If(K.Bin("lt", _r("blk"), _mul(_r("m"), n // 32)), tuple(inner)))  # a warp's lanes all in or all out
    params = (
        K.Buffer("g", F32),
        K.Buffer("u", F32),
        K.Buffer("xq", I32, readonly=False),
        K.Buffer("xr", I32, readonly=False),
        K.Buffer("xds", F32, readonly=False),
        K.ScalarParam("m", I32),
    )
    kern = K.Kernel(f"glu_q8_N{n}", params, tuple(body), (GLU_Q8_THREADS, 1, 1), ())
    verify_kernel(kern)
    return kern
