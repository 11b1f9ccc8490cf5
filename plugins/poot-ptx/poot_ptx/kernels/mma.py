"""Matrix products for many rows (prefill, batched decode) on NVIDIA tensor cores (``mma.sync``
m16n8k16 bf16), built as Kernel IR.

- ``gemm_mma``: tiles of x and of the weights staged through workgroup memory (rows padded to avoid
  bank conflicts), each step's tiles loaded into registers during the step before; each warp keeps
  its accumulators in registers for the whole K loop. K may be split among workgroups
  (``sum_parts`` adds the parts).
- ``gemm_warp``: few rows, the weights streamed like a GEMV (warps split K, no staging).

x is split into two bf16 terms (hi + lo), so a product keeps about 16 bits of each activation's
mantissa against bf16 weights (which are exact) instead of rounding activations to bf16; plans
split each x once (``split_bf16x2``) for every product that reads it. With ``split`` False only the
first term is multiplied: x rounded to bf16, half the tensor-core work (``matmul_precision``
"medium", what bf16 frameworks compute). Weight rows are bound as i32 words (pairs of bf16 values).
"""

from __future__ import annotations

from functools import lru_cache

from poot.backend import kir as K
from poot.backend import verify_kernel
from poot.kernel.build import F32, I32, q4_k_bf16_pairs, q4_k_lane_scales
from poot.kernel.build import add as _add
from poot.kernel.build import b as _b
from poot.kernel.build import bf16_bits as _bf16_bits
from poot.kernel.build import bf16_rest as _bf16_rest
from poot.kernel.build import c as _c
from poot.kernel.build import f as _f
from poot.kernel.build import mul as _mul
from poot.kernel.build import pair as _pair
from poot.kernel.build import r as _r
from poot.kernel.build import silu_mul as _silu_mul

from ..statements import Mma
from ._fragments import mma_lanes as _mma_lanes
from ._fragments import warp_tiles_summed as _warp_tiles_summed
from ._q6_k import Q6_K_BYTES, Q6_K_WORDS, q6_k_bf16_pairs, q6_k_lane_loads, q6_k_lane_words

__all__ = ["gemm_mma", "gemm_warp", "glu_split", "split_bf16x2", "sum_parts", "MMA_PAD", "SPLIT_THREADS", "WARP_PACKED"]

# packed types ``gemm_warp`` reads as stored, and what K must be a multiple of for them
WARP_PACKED = {"q4_k": 256, "q6_k": 512}

MMA_PAD = 4  # words of padding per staged row: eight rows of a fragment load hit 32 different banks


SPLIT_THREADS = 256


@lru_cache(maxsize=None)
def split_bf16x2(k: int, terms: int = 2) -> K.Kernel:
    """x [m, k] as the tensor-core GEMMs read it (``xs``): the nearest bf16 of each value (hi) and the
    nearest bf16 of what is left (lo), two values a word, the low half first: the hi plane
    (m k / 2 words) then the lo plane. With ``terms`` 1 only the hi plane (x rounded to bf16: the
    products of ``matmul_precision`` "medium"). Once per x, so no GEMM workgroup converts it again.
    A thread eight values; grid (ceil(m k / 8 / SPLIT_THREADS),). K a multiple of 8."""
    if k % 8:
        raise ValueError(f"split_bf16x2 needs K a multiple of 8, got {k}")
    if terms not in (1, 2):
        raise ValueError(f"split_bf16x2: x as 1 or 2 bf16 terms, got {terms}")
    body: list[K.Stmt] = [K.Let("t", _add(_mul(K.Builtin("group_id", 0), SPLIT_THREADS), K.Builtin("thread_id", 0)))]
    inner: list[K.Stmt] = [
        K.VecLoad(tuple(f"v{i}" for i in range(4)), "x", _mul(_r("t"), 8), F32),
        K.VecLoad(tuple(f"v{i}" for i in range(4, 8)), "x", _add(_mul(_r("t"), 8), 4), F32),
    ]
    inner += _store_terms(terms, _mul(_r("m"), k // 2))
    body.append(K.If(K.Bin("lt", _r("t"), _mul(_r("m"), k // 8)), tuple(inner)))
    params = (K.Buffer("x", F32), K.Buffer("xs", I32, readonly=False), K.ScalarParam("m", I32))
    kern = K.Kernel(f"split_bf16x{terms}_K{k}", params, tuple(body), (SPLIT_THREADS, 1, 1), ())
    verify_kernel(kern)
    return kern


def _store_terms(terms: int, lo_plane: K.Expr) -> list[K.Stmt]:
    """Thread ``t``'s eight f32 values ``v0..v7`` into ``xs`` as bf16 terms: the hi words (one
    conversion a pair where only they are kept), then the lo words at ``lo_plane`` for two terms."""
    if terms == 1:
        return [K.VecStore("xs", _mul(_r("t"), 4), tuple(K.PackBf16x2(_r(f"v{2 * q}", F32), _r(f"v{2 * q + 1}", F32)) for q in range(4)))]
    out: list[K.Stmt] = [K.Let(f"h{i}", _bf16_bits(_r(f"v{i}", F32))) for i in range(8)]
    out += [K.Let(f"l{i}", _bf16_rest(_r(f"v{i}", F32), _r(f"h{i}"))) for i in range(8)]
    out += [
        K.VecStore("xs", _mul(_r("t"), 4), tuple(_pair(_r(f"h{2 * q}"), _r(f"h{2 * q + 1}")) for q in range(4))),
        K.VecStore("xs", _add(lo_plane, _mul(_r("t"), 4)), tuple(_pair(_r(f"l{2 * q}"), _r(f"l{2 * q + 1}")) for q in range(4))),
    ]
    return out


@lru_cache(maxsize=None)
def glu_split(n: int, terms: int = 2) -> K.Kernel:
    """A gated MLP's silu(g) * u (g and u [m, n] f32, the operations of the fused elementwise kernel)
    written as the tensor-core GEMMs read their x (``split_bf16x2``'s planes, ``terms`` of them)
    instead of as f32: the product and its split in one pass, for the down projection. A thread eight
    values; grid (ceil(m n / 8 / SPLIT_THREADS),). n a multiple of 8."""
    if n % 8:
        raise ValueError(f"glu_split needs n a multiple of 8, got {n}")
    if terms not in (1, 2):
        raise ValueError(f"glu_split: 1 or 2 bf16 terms, got {terms}")
    body: list[K.Stmt] = [K.Let("t", _add(_mul(K.Builtin("group_id", 0), SPLIT_THREADS), K.Builtin("thread_id", 0)))]
    inner: list[K.Stmt] = []
    for name in ("g", "u"):
        inner += [
            K.VecLoad(tuple(f"{name}{i}" for i in range(4)), name, _mul(_r("t"), 8), F32),
            K.VecLoad(tuple(f"{name}{i}" for i in range(4, 8)), name, _add(_mul(_r("t"), 8), 4), F32),
        ]
    inner += [K.Let(f"v{i}", _silu_mul(_r(f"g{i}", F32), _r(f"u{i}", F32))) for i in range(8)]
    inner += _store_terms(terms, _mul(_r("m"), n // 2))
    body.append(K.If(K.Bin("lt", _r("t"), _mul(_r("m"), n // 8)), tuple(inner)))
    params = (K.Buffer("g", F32), K.Buffer("u", F32), K.Buffer("xs", I32, readonly=False), K.ScalarParam("m", I32))
    kern = K.Kernel(f"glu_split_bf16x{terms}_N{n}", params, tuple(body), (SPLIT_THREADS, 1, 1), ())
    verify_kernel(kern)
    return kern


@lru_cache(maxsize=None)
def sum_parts(parts: int, sizes: tuple[int, ...] = ()) -> K.Kernel:
    """y[i] = sum over s < ``parts`` of p[s count + i], i < count, in order of s (a K-split GEMM's parts
    added): a thread four elements (count a multiple of 4); grid (ceil(count / 4 / SPLIT_THREADS),).
    With ``sizes`` (feature counts, multiples of 4, ``n`` their sum) the sums of rows of n are
    divided among outputs ``y0``, ``y1``, ...: feature c of part j to row r of ``y{j}`` (several
    products of one x computed as one)."""
    if any(sz % 4 for sz in sizes):
        raise ValueError(f"sum_parts: every size must be a multiple of 4, got {sizes}")
    body: list[K.Stmt] = [K.Let("i", _mul(_add(_mul(K.Builtin("group_id", 0), SPLIT_THREADS), K.Builtin("thread_id", 0)), 4))]
    inner: list[K.Stmt] = [K.VecLoad(tuple(f"a{v}" for v in range(4)), "p", _r("i"), F32)]
    for s in range(1, parts):
        inner.append(K.VecLoad(tuple(f"b{s}_{v}" for v in range(4)), "p", _add(_mul(_r("count"), s), _r("i")), F32))
        inner += [K.Assign(f"a{v}", K.Bin("add", _r(f"a{v}", F32), _r(f"b{s}_{v}", F32))) for v in range(4)]
    sums = tuple(_r(f"a{v}", F32) for v in range(4))
    if not sizes:
        inner.append(K.VecStore("y", _r("i"), sums))
        outs: tuple[K.Param, ...] = (K.Buffer("y", F32, readonly=False),)
    else:
        total = sum(sizes)
        inner += [K.Let("row", K.Bin("div", _r("i"), _c(total))), K.Let("col", K.Bin("rem", _r("i"), _c(total)))]
        first = 0
        for j, sz in enumerate(sizes):
            mine = K.Bin("and", K.Bin("ge", _r("col"), _c(first)), K.Bin("lt", _r("col"), _c(first + sz)))
            inner.append(K.If(mine, (K.VecStore(f"y{j}", _add(_mul(_r("row"), sz), _b("sub", _r("col"), first)), sums),)))
            first += sz
        outs = tuple(K.Buffer(f"y{j}", F32, readonly=False) for j in range(len(sizes)))
    body.append(K.If(K.Bin("lt", _r("i"), _r("count")), tuple(inner)))
    params = (K.Buffer("p", F32), *outs, K.ScalarParam("count", I32))
    kern = K.Kernel(f"sum_parts_{parts}" + ("_into_" + "_".join(map(str, sizes)) if sizes else ""), params, tuple(body), (SPLIT_THREADS, 1, 1), ())
    verify_kernel(kern)
    return kern


def _tag(split: bool, xsplit: bool) -> str:
    """A GEMM's name for how it takes x: as ``split_bf16x2`` wrote it, two terms (``_xs``) or one
    (``_xb``); f32, split in the kernel (``_split``) or rounded there (no tag)."""
    if xsplit:
        return "_xs" if split else "_xb"
    return "_split" if split else ""


@lru_cache(maxsize=None)
def gemm_mma(k: int, wm: int = 2, wn: int = 2, tm: int = 2, tn: int = 4, split: bool = True, xsplit: bool = False, ksplit: int = 1) -> K.Kernel:
    """y[i, j] = sum_k x[i, k] * w[j, k] with bf16 weights on tensor cores. Warps are arranged
    ``wm x wn``; each owns ``tm`` 16-row by ``tn`` 8-column tiles, so a workgroup computes
    (16 wm tm) x (8 wn tn) outputs; grid (ceil(n / BN), ceil(m / BM)). K must be a multiple of 32.
    Each step's tiles are loaded from memory into registers during the step before (one workgroup
    memory stage, two barriers a step). With ``xsplit`` x comes as ``split_bf16x2`` wrote it (buffer
    ``xs``): staged as it is, no conversion in the loop. With ``ksplit`` S > 1 (few rows: more
    workgroups than the output's tiles give) K is split in S parts, grid (..., ..., S), and part s of
    the sum goes to ``y`` at s m n: ``sum_parts`` adds them."""
    if k % (32 * ksplit):
        raise ValueError(f"gemm_mma needs K a multiple of 32 (times the K split, {ksplit}), got {k}")
    threads = 32 * wm * wn
    bm, bn = 16 * wm * tm, 8 * wn * tn
    stride = 16 + MMA_PAD  # words per staged row of 32 bf16
    xloads = bm * (4 if xsplit else 8)  # 16-byte loads of a step's x (threads past them repeat the last)
    if (xloads % threads and xloads > threads) or (bn * 4) % threads:
        raise ValueError(f"gemm_mma: a {bm}x{bn} tile does not divide among {threads} threads")
    halves = ("hi", "lo") if split else ("hi",)
    body: list[K.Stmt] = [
        *_mma_lanes(),
        K.Let("wr", _mul(_b("rem", _r("warp"), wm), 16 * tm)),
        K.Let("wc", _mul(_b("div", _r("warp"), wm), 8 * tn)),
        K.Let("row0", _mul(K.Builtin("group_id", 1), bm)),
        K.Let("col0", _mul(K.Builtin("group_id", 0), bn)),
        K.Let("kz", _mul(K.Builtin("group_id", 2), k // ksplit) if ksplit > 1 else _c(0)),  # this workgroup's part of K
    ]
    steps = k // ksplit // 32
    acc = {(i, j): tuple(f"acc{i}_{j}_{e}" for e in range(4)) for i in range(tm) for j in range(tn)}
    for names in acc.values():
        body += [K.Let(nm, _f(0.0)) for nm in names]
    xits, wits = -(-xloads // threads), bn * 4 // threads
    lo_plane = _mul(_r("m"), k // 2)

    def where(it: int, per_row: int, count: int) -> tuple[K.Expr, K.Expr]:  # (row, 16-byte column) of this thread's load ``it`` of ``count``
        e = _add(_mul(_c(it), threads), _r("tid")) if it else _r("tid")
        if count < threads:
            e = K.Bin("min", e, _c(count - 1))
        return _b("div", e, per_row), _b("rem", e, per_row)

    def loads(k0: K.Expr, pre: str) -> list[K.Stmt]:
        """This thread's share of the step at ``k0``: into registers named ``pre``..."""
        out: list[K.Stmt] = []
        for it in range(xits):
            rr, cc = where(it, 4 if xsplit else 8, xloads)
            row = K.Bin("min", _add(_r("row0"), rr), _b("sub", _r("m"), 1))
            if xsplit:
                at = _add(_b("div", _add(_mul(row, k), k0), 2), _mul(cc, 4))
                out.append(K.VecLoad(tuple(f"{pre}ah{it}_{v}" for v in range(4)), "xs", at, I32))
                if split:
                    out.append(K.VecLoad(tuple(f"{pre}al{it}_{v}" for v in range(4)), "xs", _add(lo_plane, at), I32))
            else:
                out.append(K.VecLoad(tuple(f"{pre}a{it}_{v}" for v in range(4)), "x", _add(_mul(row, k), k0, _mul(cc, 4)), F32))
        for it in range(wits):
            rr, cc = where(it, 4, bn * 4)
            at = _add(_b("div", _add(_mul(K.Bin("min", _add(_r("col0"), rr), _b("sub", _r("n"), 1)), k), k0), 2), _mul(cc, 4))
            out.append(K.VecLoad(tuple(f"{pre}b{it}_{v}" for v in range(4)), "w", at, I32))
        return out

    def names(pre: str) -> list[str]:
        out = []
        for it in range(xits):
            if xsplit:
                out += [f"{pre}ah{it}_{v}" for v in range(4)] + ([f"{pre}al{it}_{v}" for v in range(4)] if split else [])
            else:
                out += [f"{pre}a{it}_{v}" for v in range(4)]
        return out + [f"{pre}b{it}_{v}" for it in range(wits) for v in range(4)]

    def stores(pre: str) -> list[K.Stmt]:
        """The registers ``pre``... into workgroup memory (x as bf16 hi/lo pairs)."""
        out: list[K.Stmt] = []
        for it in range(xits):
            rr, cc = where(it, 4 if xsplit else 8, xloads)
            if xsplit:
                at = _add(_mul(rr, stride), _mul(cc, 4))
                out.append(K.VecStore("As_hi", at, tuple(_r(f"{pre}ah{it}_{v}") for v in range(4))))
                if split:
                    out.append(K.VecStore("As_lo", at, tuple(_r(f"{pre}al{it}_{v}") for v in range(4))))
                continue
            hi = [f"{pre}a{it}_h{v}" for v in range(4)]
            out += [K.Let(hi[v], _bf16_bits(_r(f"{pre}a{it}_{v}", F32))) for v in range(4)]
            at = _add(_mul(rr, stride), _mul(cc, 2))
            out.append(K.VecStore("As_hi", at, (_pair(_r(hi[0]), _r(hi[1])), _pair(_r(hi[2]), _r(hi[3])))))
            if split:
                lo = [_bf16_rest(_r(f"{pre}a{it}_{v}", F32), _r(hi[v])) for v in range(4)]
                out.append(K.VecStore("As_lo", at, (_pair(lo[0], lo[1]), _pair(lo[2], lo[3]))))
        for it in range(wits):
            rr, cc = where(it, 4, bn * 4)
            out.append(K.VecStore("Bs", _add(_mul(rr, stride), _mul(cc, 4)), tuple(_r(f"{pre}b{it}_{v}") for v in range(4))))
        return out

    body += loads(_r("kz"), "p")
    loop: list[K.Stmt] = [*stores("p"), K.Barrier(), *loads(_add(_r("kz"), _mul(K.Bin("min", _add(_r("kt"), 1), _c(steps - 1)), 32)), "n")]
    for ks in range(2):
        kk = 8 * ks
        for i in range(tm):
            ar = _add(_r("wr"), 16 * i, _r("g"))
            for h in halves:
                rows = (ar, _add(ar, 8), ar, _add(ar, 8))
                cols = (0, 0, 4, 4)
                for q in range(4):
                    loop.append(K.Let(f"fa{h}{ks}_{i}_{q}", K.Load(f"As_{h}", _add(_mul(rows[q], stride), kk + cols[q], _r("t4")), I32)))
        for j in range(tn):
            bnr = _add(_r("wc"), 8 * j, _r("g"))
            for q in range(2):
                loop.append(K.Let(f"fb{ks}_{j}_{q}", K.Load("Bs", _add(_mul(bnr, stride), kk + 4 * q, _r("t4")), I32)))
        for i in range(tm):
            for j in range(tn):
                for h in halves:
                    loop.append(
                        Mma(
                            acc[i, j],
                            tuple(_r(f"fa{h}{ks}_{i}_{q}") for q in range(4)),  # type: ignore[arg-type]
                            (_r(f"fb{ks}_{j}_0"), _r(f"fb{ks}_{j}_1")),
                        )
                    )
    loop += [K.Assign(p, _r(nx, F32 if nx.startswith("na") and not xsplit else I32)) for p, nx in zip(names("p"), names("n"))]
    loop.append(K.Barrier())
    body.append(K.For("kt", _c(0), _c(steps), tuple(loop)))
    if ksplit > 1:
        body.append(K.Let("ybase", _mul(_mul(K.Builtin("group_id", 2), _r("m")), _r("n"))))
    for i in range(tm):
        for j in range(tn):
            r = _add(_r("row0"), _r("wr"), 16 * i, _r("g"))
            col = _add(_r("col0"), _r("wc"), 8 * j, _mul(_r("t4"), 2))
            for e, (dr, dc) in enumerate(((0, 0), (0, 1), (8, 0), (8, 1))):
                rr, cc = _add(r, dr), _add(col, dc)
                at = _add(_mul(rr, _r("n")), cc)
                body.append(
                    K.If(
                        K.Bin("and", K.Bin("lt", rr, _r("m")), K.Bin("lt", cc, _r("n"))),
                        (K.Store("y", _add(_r("ybase"), at) if ksplit > 1 else at, _r(acc[i, j][e], F32)),),
                    )
                )
    shared = [K.Shared("As_hi", I32, bm * stride), K.Shared("Bs", I32, bn * stride)]
    if split:
        shared.append(K.Shared("As_lo", I32, bm * stride))
    xs: K.Param = K.Buffer("xs", I32) if xsplit else K.Buffer("x", F32)
    params = (xs, K.Buffer("w", I32), K.Buffer("y", F32, readonly=False), K.ScalarParam("m", I32), K.ScalarParam("n", I32))
    tag = _tag(split, xsplit) + (f"_S{ksplit}" if ksplit > 1 else "")
    kern = K.Kernel(f"gemm_mma_bf16_K{k}_{wm}x{wn}_{tm}x{tn}{tag}", params, tuple(body), (threads, 1, 1), tuple(shared))
    verify_kernel(kern)
    return kern


@lru_cache(maxsize=None)
def gemm_warp(k: int, mt: int = 1, tn: int = 4, wk: int = 8, split: bool = True, xsplit: bool = False, qtype: str = "bf16") -> K.Kernel:
    """y = x @ w^T for few rows on tensor cores, streaming the weights like a GEMV: no staging
    through workgroup memory and no barrier in the loop. The ``wk`` warps of a workgroup split K and
    add their tiles at the end; each warp owns ``mt`` 16-row by ``tn`` 8-feature tiles. A lane loads
    16 contiguous bytes of a weight row (eight values) per 32-wide step of K and feeds them to two
    m16n8k16 products: K is summed in a permuted order (the same for x and the weights), which is
    what lets every load be 16 bytes. Grid (ceil(m / (16 mt)), ceil(n / (8 tn))). With ``xsplit`` x
    comes as ``split_bf16x2`` wrote it (buffer ``xs``): its words are the fragments, no conversion.

    ``qtype`` "q4_k": Q4_K weight rows (i32 words of 144-byte blocks), dequantized in registers to
    the nearest bf16 of each value (the values ``dequant_gpu.dequantize_bf16`` writes): two steps of
    32 are a 64-value chunk of a block, whose 32 bytes hold the first step's values in their low
    nibbles and the second's in their high ones, so a lane loads 8 bytes of quants (its eight values
    of both steps) and the block's 16-byte head a chunk; K / wk a multiple of 64.

    ``qtype`` "q6_k": Q6_K weight rows (210-byte blocks, read as stored), dequantized in registers
    the same way (``_q6_k``): two steps are two quarters of a block's half, a lane's 8 bytes of
    low nibbles for each, 8 of high bits and two scales a chunk, its words joined where an odd
    block straddles them; K a multiple of 512 (rows start word-aligned), K / wk of 64."""
    if qtype not in ("bf16", "q4_k", "q6_k"):
        raise ValueError(f"gemm_warp: weights of type bf16, q4_k or q6_k, got {qtype}")
    packed = WARP_PACKED.get(qtype)
    if k % (32 * wk) or (packed and (k % packed or (k // wk) % 64)):
        raise ValueError(f"gemm_warp needs K a multiple of {32 * wk}{f' and {packed}, with K / wk a multiple of 64' if packed else ''}, got {k}")
    threads, steps = 32 * wk, k // (32 * wk)
    un = 2 if steps % 2 == 0 else 1
    q4k, q6k = qtype == "q4_k", qtype == "q6_k"
    halves = ("hi", "lo") if split else ("hi",)
    nacc = mt * tn * 4
    body: list[K.Stmt] = [
        *_mma_lanes(),
        K.Let("row0", _mul(K.Builtin("group_id", 0), 16 * mt)),
        K.Let("col0", _mul(K.Builtin("group_id", 1), 8 * tn)),
        K.Let("kw", _add(_mul(_r("warp"), k // wk), _mul(_r("t4"), 8))),  # this lane's first value of K
    ]
    last_m, last_n = _b("sub", _r("m"), 1), _b("sub", _r("n"), 1)
    for i in range(mt):
        for h in (0, 8):
            body.append(K.Let(f"xr{i}_{h}", _mul(K.Bin("min", _add(_r("row0"), 16 * i + h, _r("g")), last_m), k)))
    row_words = k // 256 * 36  # a Q4_K row's words
    for j in range(tn):  # the lane's weight row j: where it starts, in words (Q6_K: in bytes)
        per_row = row_words if q4k else k // 256 * Q6_K_BYTES if q6k else k
        body.append(K.Let(f"wr{j}", _mul(K.Bin("min", _add(_r("col0"), 8 * j, _r("g")), last_n), per_row)))
    acc = {(i, j): tuple(f"acc{i}_{j}_{e}" for e in range(4)) for i in range(mt) for j in range(tn)}
    for names in acc.values():
        body += [K.Let(nm, _f(0.0)) for nm in names]
    # with x split, the next step's loads are issued before this step's products (its registers
    # named "n...", this step's "c..."): twice the bytes in flight a warp
    cur = "c" if xsplit else ""

    def loads(sx: K.Expr, pre: str) -> tuple[list[K.Stmt], list[str]]:
        out: list[K.Stmt] = []
        names: list[str] = []
        if q4k:  # the step pair's 64-value chunk: its block's head and the lane's 8 bytes of quants
            out += [K.Let(f"{pre}ch", _add(_mul(_r("warp"), k // wk // 64), sx)), K.Let(f"{pre}cc", _b("rem", _r(f"{pre}ch"), 4))]
            names.append(f"{pre}cc")
            for j in range(tn):
                base = _add(_r(f"wr{j}"), _mul(_b("div", _r(f"{pre}ch"), 4), 36))
                head, quants = [f"{pre}w{j}{nm}" for nm in ("dm", "s0", "s1", "s2")], [f"{pre}w{j}q{i}" for i in range(2)]
                names += head + quants
                out += [K.VecLoad(tuple(head), "w", base, I32), K.VecLoad(tuple(quants), "w", _add(base, 4, _mul(_r(f"{pre}cc"), 8), _mul(_r("t4"), 2)), I32)]
        if q6k:  # the step pair's 64-value chunk: the words as loaded (joined by ``prep``)
            out += [K.Let(f"{pre}ch", _add(_mul(_r("warp"), k // wk // 64), sx)), K.Let(f"{pre}pp", _b("rem", _r(f"{pre}ch"), 2))]
            names.append(f"{pre}pp")
            hn = _b("rem", _b("div", _r(f"{pre}ch"), 2), 2)
            for j in range(tn):
                out += q6_k_lane_loads(pre, j, _add(_r(f"wr{j}"), _mul(_b("div", _r(f"{pre}ch"), 4), Q6_K_BYTES)), hn, _r(f"{pre}pp"))
                names += [f"{pre}w{j}{nm}" for nm in Q6_K_WORDS]
        for u in range(un):  # every load of the unrolled steps first, then the products
            out.append(K.Let(f"{pre}k{u}", _add(_r("kw"), _mul(sx, 32 * un), 32 * u)))
            for j in range(0 if q4k or q6k else tn):
                names += [f"{pre}p{u}_{j}_{q}" for q in range(4)]
                out.append(K.VecLoad(tuple(names[-4:]), "w", _b("div", _add(_r(f"wr{j}"), _r(f"{pre}k{u}")), 2), I32))
            for i in range(mt):
                for h in (0, 8):
                    xi = _add(_r(f"xr{i}_{h}"), _r(f"{pre}k{u}"))
                    if xsplit:  # the eight values' hi words, then their lo words
                        hw, lw = [f"{pre}hw{u}_{i}_{h}_{q}" for q in range(4)], [f"{pre}lw{u}_{i}_{h}_{q}" for q in range(4)]
                        names += hw + (lw if split else [])
                        out.append(K.VecLoad(tuple(hw), "xs", _b("div", xi, 2), I32))
                        if split:
                            out.append(K.VecLoad(tuple(lw), "xs", _add(_mul(_r("m"), k // 2), _b("div", xi, 2)), I32))
                        continue
                    out += [
                        K.VecLoad(tuple(f"x{u}_{i}_{h}_{v}" for v in range(4)), "x", xi, F32),
                        K.VecLoad(tuple(f"x{u}_{i}_{h}_{v}" for v in range(4, 8)), "x", _add(xi, 4), F32),
                    ]
        return out, names

    def prep(pre: str) -> list[K.Stmt]:  # Q6_K: the loaded words joined, the scales found
        return [st for j in range(tn) for st in q6_k_lane_words(pre, pre, j)] if q6k else []

    loop: list[K.Stmt] = []
    if xsplit:
        first, cnames = loads(_c(0), cur)
        body += first + prep(cur)
        nxt, nnames = loads(K.Bin("min", _add(_r("s"), 1), _c(steps // un - 1)), "n")
        loop += nxt
    else:
        loop += loads(_r("s"), cur)[0] + prep(cur)
    if q4k:  # the chunk's values as bf16 pairs: low nibbles for the first step, high for the second
        loop += [K.Let("c", _r(f"{cur}cc")), K.Let("sh", _mul(_b("rem", _r("c"), 2), 16))]
        for j in range(tn):
            loop += q4_k_lane_scales(f"{cur}w{j}", "")
            for u, (part, shift) in enumerate((("l", 0), ("h", 4))):
                pairs = q4_k_bf16_pairs(f"{cur}w{j}", part, [f"{cur}w{j}q{i}" for i in range(2)], shift)
                loop += [K.Let(f"{cur}p{u}_{j}_{q}", pairs[q]) for q in range(4)]
    if q6k:  # the chunk's two quarters as bf16 pairs
        for j in range(tn):
            for u in range(2):
                loop += q6_k_bf16_pairs(f"{cur}w{j}", u, _r(f"{cur}pp"), [f"{cur}p{u}_{j}_{q}" for q in range(4)])
    for u in range(un):
        for i in range(mt):
            for h in (0, 8):
                for v in range(8 if not xsplit else 0):
                    xv = _r(f"x{u}_{i}_{h}_{v}", F32)
                    loop.append(K.Let(f"h{u}_{i}_{h}_{v}", _bf16_bits(xv)))
                    if split:
                        loop.append(K.Let(f"l{u}_{i}_{h}_{v}", _bf16_rest(xv, _r(f"h{u}_{i}_{h}_{v}"))))
        for half in (0, 1):  # values 0-3 of the lane's eight, then 4-7
            for i in range(mt):
                for hl, pre in (("hi", "h"), ("lo", "l"))[: len(halves)]:
                    if xsplit:
                        pr = lambda rr, q: _r(f"{cur}{pre}w{u}_{i}_{rr}_{q}")  # noqa: E731
                    else:
                        pr = lambda rr, q: _pair(_r(f"{pre}{u}_{i}_{rr}_{2 * q}"), _r(f"{pre}{u}_{i}_{rr}_{2 * q + 1}"))  # noqa: E731
                    a = (pr(0, 2 * half), pr(8, 2 * half), pr(0, 2 * half + 1), pr(8, 2 * half + 1))
                    for q in range(4):
                        loop.append(K.Let(f"fa{hl}{u}{half}_{i}_{q}", a[q]))
            for i in range(mt):
                for j in range(tn):
                    for hl in halves:
                        loop.append(
                            Mma(
                                acc[i, j],
                                tuple(_r(f"fa{hl}{u}{half}_{i}_{q}") for q in range(4)),  # type: ignore[arg-type]
                                (_r(f"{cur}p{u}_{j}_{2 * half}"), _r(f"{cur}p{u}_{j}_{2 * half + 1}")),
                            )
                        )
    if xsplit:
        floats = ("sc0", "sc1") if q6k else ()  # the carried Q6_K scales are f32 (``Q6_K_WORDS``)
        loop += prep("n") + [K.Assign(c, _r(nx, F32 if nx.endswith(floats) else I32)) for c, nx in zip(cnames, nnames)]
    body.append(K.For("s", _c(0), _c(steps // un), tuple(loop)))
    # the warps' partial tiles through workgroup memory, then summed and stored; accumulator c of
    # tile (i, j) = (tile / tn, tile % tn) is row g or g + 8 and column 2 t4 or 2 t4 + 1
    flat = [nm for i in range(mt) for j in range(tn) for nm in acc[i, j]]
    body += _warp_tiles_summed(
        flat,
        wk,
        threads,
        lambda ln, c, tile: (
            _add(_r("row0"), _mul(_b("div", tile, tn), 16), _b("div", ln, 4), _mul(_b("div", c, 2), 8)),
            _add(_r("col0"), _mul(_b("rem", tile, tn), 8), _mul(_b("rem", ln, 4), 2), _b("rem", c, 2)),
        ),
    )
    xs: K.Param = K.Buffer("xs", I32) if xsplit else K.Buffer("x", F32)
    params = (xs, K.Buffer("w", I32), K.Buffer("y", F32, readonly=False), K.ScalarParam("m", I32), K.ScalarParam("n", I32))
    tag = _tag(split, xsplit)
    kern = K.Kernel(f"gemm_warp_{qtype}_K{k}_{mt}x{tn}_W{wk}{tag}", params, tuple(body), (threads, 1, 1), (K.Shared("part", F32, threads * nacc),))
    verify_kernel(kern)
    return kern
