"""Prefill attention on NVIDIA tensor cores, built as Kernel IR over paged KV pools
(``attention_mma``: ``mma.sync`` m16n8k16 bf16, FlashAttention-2, arXiv:2307.08691).

A workgroup takes 64 consecutive query tokens of one head, four warps of 16 rows each. Each warp
keeps its rows of q in registers as tensor-core fragments, and walks the sequence's keys 32 at a
time: the key and value tile is read once from the pools through the block table into workgroup
memory (values transposed) for all four warps. Scores S = q k^T and the output's update P v are
tensor-core products; the online softmax runs on the score fragments in registers (a row's max
and sum are shared by the four lanes that hold it), and P is fed back as the A operand of P v
without leaving registers.

Numerics (docs/NUMERICS.md): the pools and q are f32, so both sides of each product are split into
two bf16 terms (hi + lo) and three products are summed (hi hi + hi lo + lo hi): about 16 bits of
every operand, the term that is dropped (lo lo) below 2^-16 of the product; or, for
``matmul_precision`` "medium", each side is rounded to bf16 (one product). Scores, softmax and
the accumulators are f32.

A block of query tokens that holds several sequences takes them one at a time (counted first;
rows of the other sequences are masked). Causal and sliding-window masks, soft-capping and a given scale as in
``attention.attention_blocks``; head widths ``D`` of 64 or 128, keys and values alike, no shared
key part (MLA).
"""

from __future__ import annotations

from functools import lru_cache

from poot.backend import dtypes as dt
from poot.backend import kir as K
from poot.backend import verify_kernel
from poot.kernel.build import add as _add
from poot.kernel.build import b as _b
from poot.kernel.build import bf16_bits as _bf16_bits
from poot.kernel.build import bf16_rest as _bf16_rest
from poot.kernel.build import c as _c
from poot.kernel.build import f as _f
from poot.kernel.build import fmax as _fmax
from poot.kernel.build import mul as _mul
from poot.kernel.build import pair as _pair
from poot.kernel.build import pool_dtype as _pool_dtype
from poot.kernel.build import pool_load as _pool_load
from poot.kernel.build import r as _r

from ..statements import Mma
from ._fragments import mma_lanes as _mma_lanes

__all__ = ["attention_mma", "MMA_QROWS"]

F32, I32 = dt.f32, dt.i32
MMA_QROWS = 64  # query tokens a workgroup (four warps of 16)
_KT = 32  # keys a tile
_PAD = 4  # words of padding a staged row: fragment loads hit 32 banks
_NEG = -3.0e38  # a masked score


def _split(v: K.Expr, name: str) -> list[K.Stmt]:
    """f32 ``v`` as two bf16 bit patterns: ``name``h (nearest) and ``name``l (nearest of the rest)."""
    return [K.Let(f"{name}v", v), K.Let(f"{name}h", _bf16_bits(_r(f"{name}v", F32))), K.Let(f"{name}l", _bf16_rest(_r(f"{name}v", F32), _r(f"{name}h")))]


@lru_cache(maxsize=None)
def attention_mma(d: int = 128, causal: bool = True, split: bool = True, block: int = 0, softcap: bool = True, pt: str = "f32") -> K.Kernel:
    """out[t, h, :] = softmax(scale * q.k) v over each token's visible context, for head widths
    ``d`` (keys and values); the parameters of ``attention.attention_blocks``. Grid
    (ceil(ntok / 64), hq). With ``split`` False each operand is rounded to bf16 instead of split,
    one product each (``matmul_precision`` "medium": what bf16 flash attention computes). A
    ``block`` size of the pools fixed here (not 0) replaces the divisions by the ``bs`` parameter
    in every key's address with constant ones; ``softcap`` False leaves soft-capping out (the
    ``softcap`` parameter must then be 0). Pools of ``pt`` "f32" or "f16" (halves widened as they
    are read: split into two bf16 terms, exactly)."""
    if d not in (64, 128):
        raise ValueError(f"attention_mma: head width 64 or 128, got {d}")
    pool = _pool_dtype("attention_mma", pt)
    terms = 2 if split else 1
    bs: K.Expr = _c(block) if block else _r("bs")
    ksteps, dtiles = d // 16, d // 8
    kstride = d // 2 + _PAD  # words a staged key row (pairs of dims)
    vstride = _KT // 2 + _PAD  # words a staged value column (pairs of keys)
    body: list[K.Stmt] = [
        *_mma_lanes(),
        K.Let("tb", _mul(K.Builtin("group_id", 0), MMA_QROWS)),
        K.Let("h", K.Builtin("group_id", 1)),
        K.Let("kvh", _b("div", _r("h"), _b("div", _r("hq"), _r("hkv")))),
        # the block's rows: sequence, position, done (rows past ntok start done)
        K.If(
            K.Bin("lt", _r("tid"), _c(MMA_QROWS)),
            (
                K.Let("tok", K.Bin("min", _add(_r("tb"), _r("tid")), _b("sub", _r("ntok"), 1))),
                K.Store("rseq", _r("tid"), K.Load("seq_ids", _r("tok"), I32)),
                K.Store("rpos", _r("tid"), K.Load("positions", _r("tok"), I32)),
                K.Store("rdone", _r("tid"), K.Select(K.Bin("lt", _add(_r("tb"), _r("tid")), _r("ntok")), _c(0), _c(1))),
            ),
        ),
    ]
    # this lane's two rows (g and g + 8 of its warp's 16) and q's fragments for them, split
    for half, off in (("a", 0), ("b", 8)):
        body += [
            K.Let(f"row{half}", _add(_mul(_r("warp"), 16), _r("g"), off)),
            K.Let(f"qt{half}", K.Bin("min", _add(_r("tb"), _r(f"row{half}")), _b("sub", _r("ntok"), 1))),
            K.Let(f"qb{half}", _mul(_add(_mul(_r(f"qt{half}"), _r("hq")), _r("h")), d)),
        ]
    for ks in range(ksteps):
        for q, (half, col) in enumerate((("a", 0), ("b", 0), ("a", 8), ("b", 8))):
            at = _add(_r(f"qb{half}"), 16 * ks + col, _mul(_r("t4"), 2))
            body.append(K.VecLoad((f"q{ks}_{q}x", f"q{ks}_{q}y"), "q", at, F32))
            if not split:  # rounded, two values by one conversion
                body.append(K.Let(f"qh{ks}_{q}", K.PackBf16x2(_r(f"q{ks}_{q}x", F32), _r(f"q{ks}_{q}y", F32))))
                continue
            body += _split(_r(f"q{ks}_{q}x", F32), f"q{ks}_{q}x") + _split(_r(f"q{ks}_{q}y", F32), f"q{ks}_{q}y")
            body += [K.Let(f"qh{ks}_{q}", _pair(_r(f"q{ks}_{q}xh"), _r(f"q{ks}_{q}yh"))), K.Let(f"ql{ks}_{q}", _pair(_r(f"q{ks}_{q}xl"), _r(f"q{ks}_{q}yl")))]
    body.append(K.Barrier())
    # how many sequences the block holds (rows that are the first live row of their sequence, summed
    # over the first two warps): the loop below runs that many times, not once per row
    first: list[K.Stmt] = [
        K.Let("myseq", K.Load("rseq", _r("tid"), I32)),
        K.Let("isfirst", K.Select(K.Bin("eq", K.Load("rdone", _r("tid"), I32), _c(0)), _c(1), _c(0))),
        K.For(
            "r3",
            _c(0),
            _r("tid"),
            (
                K.If(
                    K.Bin("and", K.Bin("eq", K.Load("rdone", _r("r3"), I32), _c(0)), K.Bin("eq", K.Load("rseq", _r("r3"), I32), _r("myseq"))),
                    (K.Assign("isfirst", _c(0)),),
                ),
            ),
        ),
        K.Let("wfirst", K.SubgroupReduce("add", _r("isfirst"))),
        K.If(K.Bin("eq", _r("lane"), _c(0)), (K.Store("sinfo", _add(_r("warp"), 4), _r("wfirst")),)),
    ]
    body += [
        K.If(K.Bin("lt", _r("tid"), _c(MMA_QROWS)), tuple(first)),
        K.Barrier(),
        K.Let("nseq", _add(K.Load("sinfo", _c(4), I32), K.Load("sinfo", _c(5), I32))),
    ]

    # -- one sequence of the block: thread 0 finds it and the keys its rows see -------------------
    find: list[K.Stmt] = [
        K.Let("fs", _c(-1)),
        K.Let("kst", _c(2147483647)),
        K.Let("ken", _c(0)),
        K.For(
            "r",
            _c(0),
            _c(MMA_QROWS),
            (
                K.If(
                    K.Bin("and", K.Bin("eq", _r("fs"), _c(-1)), K.Bin("eq", K.Load("rdone", _r("r"), I32), _c(0))),
                    (K.Assign("fs", K.Load("rseq", _r("r"), I32)),),
                ),
            ),
        ),
        K.If(
            K.Bin("ge", _r("fs"), _c(0)),
            (
                K.Let("clen", K.Load("ctx_lens", _r("fs"), I32)),
                K.For(
                    "r2",
                    _c(0),
                    _c(MMA_QROWS),
                    (
                        K.If(
                            K.Bin("and", K.Bin("eq", K.Load("rdone", _r("r2"), I32), _c(0)), K.Bin("eq", K.Load("rseq", _r("r2"), I32), _r("fs"))),
                            (
                                K.Let("rp", K.Load("rpos", _r("r2"), I32)),
                                K.Assign("ken", K.Bin("max", _r("ken"), K.Bin("min", _r("clen"), _add(_r("rp"), 1)) if causal else _r("clen"))),
                                K.Assign(
                                    "kst",
                                    K.Bin(
                                        "min",
                                        _r("kst"),
                                        K.Select(K.Bin("gt", _r("window"), _c(0)), K.Bin("max", _c(0), _add(_b("sub", _r("rp"), _r("window")), 1)), _c(0)),
                                    ),
                                ),
                            ),
                        ),
                    ),
                ),
            ),
        ),
        K.Store("sinfo", _c(0), _r("fs")),
        K.Store("sinfo", _c(1), _r("kst")),
        K.Store("sinfo", _c(2), _r("ken")),
    ]
    seq: list[K.Stmt] = [
        K.If(K.Bin("eq", _r("tid"), _c(0)), tuple(find)),
        K.Barrier(),
        K.Let("s", K.Load("sinfo", _c(0), I32)),
        K.Let("kstart", K.Load("sinfo", _c(1), I32)),
        K.Let("kend", K.Load("sinfo", _c(2), I32)),
    ]
    run: list[K.Stmt] = [K.Let("clen", K.Load("ctx_lens", _r("s"), I32))]
    for half in ("a", "b"):  # this lane's rows: in the sequence? the keys each sees: [lo, hi)
        run += [
            K.Let(
                f"in{half}",
                K.Bin("and", K.Bin("eq", K.Load("rdone", _r(f"row{half}"), I32), _c(0)), K.Bin("eq", K.Load("rseq", _r(f"row{half}"), I32), _r("s"))),
            ),
            K.Let(f"pos{half}", K.Load("rpos", _r(f"row{half}"), I32)),
            K.Let(f"hi{half}", K.Select(_r(f"in{half}", dt.boolean), K.Bin("min", _r("clen"), _add(_r(f"pos{half}"), 1)) if causal else _r("clen"), _c(0))),
            K.Let(f"lo{half}", K.Select(K.Bin("gt", _r("window"), _c(0)), _add(_b("sub", _r(f"pos{half}"), _r("window")), 1), _c(0))),
            K.Let(f"rm{half}", _f(_NEG)),
            K.Let(f"rl{half}", _f(0.0)),
        ]
    run += [K.Let(f"o{j}_{e}", _f(0.0)) for j in range(dtiles) for e in range(4)]

    # -- a tile of 32 keys ------------------------------------------------------------------------
    tile: list[K.Stmt] = [K.Barrier()]  # the last tile's reads are done
    # with the block size fixed and tiles starting at multiples of 32 keys, a tile spans at most
    # four blocks (block sizes 8-32) or lies in one: their table entries are read once a tile
    nblk = (_KT // block if _KT % block == 0 else 1 if block % _KT == 0 else 0) if block >= 8 else 0
    if nblk:
        tile.append(K.Let("jb", _b("div", _r("j0"), block)))
        last = _b("div", _b("sub", _r("kend"), 1), block)
        tile += [K.Let(f"bt{i}", K.Load("block_tables", _add(_mul(_r("s"), _r("mb")), K.Bin("min", _add(_r("jb"), i), last)), I32)) for i in range(nblk)]

    def slot(kj: K.Expr) -> K.Expr:  # key kj's row in the pools
        if not nblk:
            return _add(_mul(K.Load("block_tables", _add(_mul(_r("s"), _r("mb")), _b("div", kj, bs)), I32), bs), _b("rem", kj, bs))
        pick: K.Expr = _r(f"bt{nblk - 1}")
        rel = _b("sub", _b("div", kj, block), _r("jb"))
        for i in range(nblk - 2, -1, -1):
            pick = K.Select(K.Bin("eq", rel, _c(i)), _r(f"bt{i}"), pick)
        return _add(_mul(pick, block), _b("rem", kj, block))

    # keys: 32 rows of d values, a thread four values a step, split into hi/lo words
    for it in range(_KT * d // 4 // 128):
        e = _add(_mul(_c(it), 128), _r("tid"))
        kr, c4 = _b("div", e, d // 4), _b("rem", e, d // 4)
        tile += [
            K.Let(f"kj{it}", K.Bin("min", _add(_r("j0"), kr), _b("sub", _r("kend"), 1))),
            K.Let(f"ksl{it}", slot(_r(f"kj{it}"))),
            *_pool_load(tuple(f"kv{it}_{v}" for v in range(4)), "k_pool", _add(_mul(_add(_mul(_r(f"ksl{it}"), _r("hkv")), _r("kvh")), d), _mul(c4, 4)), pool),
        ]
        at = _add(_mul(kr, kstride), _mul(c4, 2))
        if not split:
            tile.append(K.VecStore("ks_hi", at, tuple(K.PackBf16x2(_r(f"kv{it}_{2 * w}", F32), _r(f"kv{it}_{2 * w + 1}", F32)) for w in range(2))))
            continue
        for v in range(4):
            tile += _split(_r(f"kv{it}_{v}", F32), f"ks{it}_{v}")
        for plane, buf in (("h", "ks_hi"), ("l", "ks_lo")):
            tile.append(K.VecStore(buf, at, (_pair(_r(f"ks{it}_0{plane}"), _r(f"ks{it}_1{plane}")), _pair(_r(f"ks{it}_2{plane}"), _r(f"ks{it}_3{plane}")))))
    # values, transposed: word (dim, key pair); a thread a pair of keys and four dims a step
    for it in range(_KT // 2 * d // 4 // 128):
        e = _add(_mul(_c(it), 128), _r("tid"))
        kp, c4 = _b("rem", e, _KT // 2), _b("div", e, _KT // 2)
        for w in range(2):
            tile += [
                K.Let(f"vj{it}_{w}", K.Bin("min", _add(_r("j0"), _mul(kp, 2), w), _b("sub", _r("kend"), 1))),
                K.Let(f"vsl{it}_{w}", slot(_r(f"vj{it}_{w}"))),
                *_pool_load(
                    tuple(f"vv{it}_{w}_{v}" for v in range(4)), "v_pool", _add(_mul(_add(_mul(_r(f"vsl{it}_{w}"), _r("hkv")), _r("kvh")), d), _mul(c4, 4)), pool
                ),
            ]
            for v in range(4 if split else 0):
                tile += _split(_r(f"vv{it}_{w}_{v}", F32), f"vs{it}_{w}_{v}")
        for v in range(4):
            at = _add(_mul(_add(_mul(c4, 4), v), vstride), kp)
            if not split:
                tile.append(K.Store("vt_hi", at, K.PackBf16x2(_r(f"vv{it}_0_{v}", F32), _r(f"vv{it}_1_{v}", F32))))
                continue
            tile += [
                K.Store("vt_hi", at, _pair(_r(f"vs{it}_0_{v}h"), _r(f"vs{it}_1_{v}h"))),
                K.Store("vt_lo", at, _pair(_r(f"vs{it}_0_{v}l"), _r(f"vs{it}_1_{v}l"))),
            ]
    tile.append(K.Barrier())
    # S = q k^T: four tiles of 8 keys, K in steps of 16; three products of the split terms (or one)
    for nt in range(_KT // 8):
        acc = tuple(f"s{nt}_{e}" for e in range(4))
        tile += [K.Let(nm, _f(0.0)) for nm in acc]
        krow = _mul(_add(_r("g"), 8 * nt), kstride)
        for ks in range(ksteps):
            for plane in ("hi", "lo")[:terms]:
                tile += [K.Let(f"kb{plane}{nt}_{ks}_{q}", K.Load(f"ks_{plane}", _add(krow, 8 * ks + 4 * q, _r("t4")), I32)) for q in range(2)]
            bh = (_r(f"kbhi{nt}_{ks}_0"), _r(f"kbhi{nt}_{ks}_1"))
            qh = tuple(_r(f"qh{ks}_{q}") for q in range(4))
            tile.append(Mma(acc, qh, bh))  # type: ignore[arg-type]
            if split:
                bl = (_r(f"kblo{nt}_{ks}_0"), _r(f"kblo{nt}_{ks}_1"))
                ql = tuple(_r(f"ql{ks}_{q}") for q in range(4))
                tile += [Mma(acc, qh, bl), Mma(acc, ql, bh)]  # type: ignore[arg-type]
    # scale, soft-cap and mask; element e of tile nt: row a (e < 2) or b, key j0 + 8 nt + 2 t4 + e % 2
    for nt in range(_KT // 8):
        for e in range(4):
            half = "a" if e < 2 else "b"
            key = _add(_r("j0"), 8 * nt + e % 2, _mul(_r("t4"), 2))
            sv: K.Expr = K.Bin("mul", _r(f"s{nt}_{e}", F32), _r("scale", F32))
            if softcap:
                sv = K.Select(
                    K.Bin("gt", _r("softcap", F32), _f(0.0)), K.Bin("mul", K.Un("tanh", K.Bin("div", sv, _r("softcap", F32))), _r("softcap", F32)), sv
                )
            vis = K.Bin("and", K.Bin("ge", key, _r(f"lo{half}")), K.Bin("lt", key, _r(f"hi{half}")))
            tile.append(K.Assign(f"s{nt}_{e}", K.Select(vis, sv, _f(_NEG))))
    # online softmax: each row's max over its four lanes; corrections; p
    for half, es in (("a", (0, 1)), ("b", (2, 3))):
        mx: K.Expr = _r(f"s0_{es[0]}", F32)
        for nt in range(_KT // 8):
            for e in es:
                if (nt, e) != (0, es[0]):
                    mx = _fmax(mx, _r(f"s{nt}_{e}", F32))
        tile.append(K.Let(f"mx{half}", mx))
        for lane in (1, 2):
            tile.append(K.Assign(f"mx{half}", _fmax(_r(f"mx{half}", F32), K.SubgroupShuffle(_r(f"mx{half}", F32), _c(lane), xor=True))))
        tile += [
            K.Let(f"mn{half}", _fmax(_r(f"rm{half}", F32), _r(f"mx{half}", F32))),
            K.Let(f"cr{half}", K.Un("exp", K.Bin("sub", _r(f"rm{half}", F32), _r(f"mn{half}", F32)))),
            K.Assign(f"rm{half}", _r(f"mn{half}", F32)),
            K.Assign(f"rl{half}", K.Bin("mul", _r(f"rl{half}", F32), _r(f"cr{half}", F32))),
        ]
        for nt in range(_KT // 8):
            for e in es:
                p = K.Select(K.Bin("gt", _r(f"s{nt}_{e}", F32), _f(-1.0e38)), K.Un("exp", K.Bin("sub", _r(f"s{nt}_{e}", F32), _r(f"mn{half}", F32))), _f(0.0))
                tile += [K.Assign(f"s{nt}_{e}", p), K.Assign(f"rl{half}", K.Bin("add", _r(f"rl{half}", F32), _r(f"s{nt}_{e}", F32)))]
    for j in range(dtiles):
        for e in range(4):
            tile.append(K.Assign(f"o{j}_{e}", K.Bin("mul", _r(f"o{j}_{e}", F32), _r("cra" if e < 2 else "crb", F32))))
    # O += P v: P's fragments are the score tiles' registers (two tiles of 8 keys a step of 16)
    for ks2 in range(_KT // 16):
        lo_t, hi_t = 2 * ks2, 2 * ks2 + 1
        parts = ((lo_t, 0, 1), (lo_t, 2, 3), (hi_t, 0, 1), (hi_t, 2, 3))
        for q, (nt, e0, e1) in enumerate(parts):
            if not split:
                tile.append(K.Let(f"ph{ks2}_{q}", K.PackBf16x2(_r(f"s{nt}_{e0}", F32), _r(f"s{nt}_{e1}", F32))))
                continue
            tile += _split(_r(f"s{nt}_{e0}", F32), f"p{ks2}_{q}x") + _split(_r(f"s{nt}_{e1}", F32), f"p{ks2}_{q}y")
            tile += [
                K.Let(f"ph{ks2}_{q}", _pair(_r(f"p{ks2}_{q}xh"), _r(f"p{ks2}_{q}yh"))),
                K.Let(f"pl{ks2}_{q}", _pair(_r(f"p{ks2}_{q}xl"), _r(f"p{ks2}_{q}yl"))),
            ]
        ph = tuple(_r(f"ph{ks2}_{q}") for q in range(4))
        pl = tuple(_r(f"pl{ks2}_{q}") for q in range(4)) if split else ()
        for j in range(dtiles):
            vrow = _mul(_add(_r("g"), 8 * j), vstride)
            bh = tuple(K.Load("vt_hi", _add(vrow, 8 * ks2 + 4 * q, _r("t4")), I32) for q in range(2))
            tile += [K.Let(f"vb{ks2}_{j}_{q}", bh[q]) for q in range(2)]
            acc = tuple(f"o{j}_{e}" for e in range(4))
            vh = (_r(f"vb{ks2}_{j}_0"), _r(f"vb{ks2}_{j}_1"))
            tile.append(Mma(acc, ph, vh))  # type: ignore[arg-type]
            if split:
                bl = tuple(K.Load("vt_lo", _add(vrow, 8 * ks2 + 4 * q, _r("t4")), I32) for q in range(2))
                tile += [K.Let(f"vl{ks2}_{j}_{q}", bl[q]) for q in range(2)]
                vl = (_r(f"vl{ks2}_{j}_0"), _r(f"vl{ks2}_{j}_1"))
                tile += [Mma(acc, ph, vl), Mma(acc, pl, vh)]  # type: ignore[arg-type]
    # (keys before a row's first are masked: a tile may start up to 31 keys below a window's first,
    # reading them through block-table entries the engine keeps for the whole sequence)
    run.append(K.For("j0", _mul(_b("div", _r("kstart"), _KT), _KT) if nblk else _r("kstart"), _r("kend"), tuple(tile), step=_KT))
    # the rows' sums over their four lanes; out = O / l for this sequence's rows
    for half in ("a", "b"):
        for lane in (1, 2):
            run.append(K.Assign(f"rl{half}", K.Bin("add", _r(f"rl{half}", F32), K.SubgroupShuffle(_r(f"rl{half}", F32), _c(lane), xor=True))))
        run.append(K.Let(f"inv{half}", K.Select(K.Bin("gt", _r(f"rl{half}", F32), _f(0.0)), K.Bin("div", _f(1.0), _r(f"rl{half}", F32)), _f(0.0))))
    for half, es in (("a", (0, 1)), ("b", (2, 3))):
        stores: list[K.Stmt] = []
        for j in range(dtiles):
            at = _add(_r(f"qb{half}"), 8 * j, _mul(_r("t4"), 2))
            stores.append(K.VecStore("out", at, tuple(K.Bin("mul", _r(f"o{j}_{e}", F32), _r(f"inv{half}", F32)) for e in es)))
        run.append(K.If(K.Bin("and", _r(f"in{half}", dt.boolean), K.Bin("lt", _add(_r("tb"), _r(f"row{half}")), _r("ntok"))), tuple(stores)))
    run.append(K.Barrier())  # every warp has read rdone for this sequence
    run.append(
        K.If(K.Bin("lt", _r("tid"), _c(MMA_QROWS)), (K.If(K.Bin("eq", K.Load("rseq", _r("tid"), I32), _r("s")), (K.Store("rdone", _r("tid"), _c(1)),)),))
    )
    seq.append(K.If(K.Bin("ge", _r("s"), _c(0)), tuple(run)))
    seq.append(K.Barrier())
    body.append(K.For("sq", _c(0), _r("nseq"), tuple(seq)))
    params = (
        K.Buffer("q", F32),
        K.Buffer("k_pool", pool),
        K.Buffer("v_pool", pool),
        K.Buffer("ks_pool", pool),
        K.Buffer("positions", I32),
        K.Buffer("seq_ids", I32),
        K.Buffer("ctx_lens", I32),
        K.Buffer("block_tables", I32),
        K.Buffer("out", F32, readonly=False),
        *(K.ScalarParam(nm, I32) for nm in ("ntok", "hq", "hkv", "dk", "dv", "dr", "bs", "mb")),
        K.ScalarParam("scale", F32),
        K.ScalarParam("window", I32),
        K.ScalarParam("softcap", F32),
    )
    planes = ("hi", "lo")[:terms]
    shared = (
        *(K.Shared(f"ks_{p}", I32, _KT * kstride) for p in planes),
        *(K.Shared(f"vt_{p}", I32, d * vstride) for p in planes),
        K.Shared("rseq", I32, MMA_QROWS),
        K.Shared("rpos", I32, MMA_QROWS),
        K.Shared("rdone", I32, MMA_QROWS),
        K.Shared("sinfo", I32, 8),
    )
    tag = ("" if split else "_bf16") + (f"_BS{block}" if block else "") + ("" if softcap else "_nocap") + ("_PTf16" if pt == "f16" else "")
    kern = K.Kernel(f"attention_mma_D{d}{'_causal' if causal else ''}{tag}", params, tuple(body), (128, 1, 1), shared)
    verify_kernel(kern)
    return kern
