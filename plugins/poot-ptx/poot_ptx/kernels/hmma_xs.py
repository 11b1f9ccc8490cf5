"""Batched decode on Q4_K weights through the f16 tensor cores with the weights exact:
``gemm_hmma_q4_k_xs``, and x prepared for it once by ``split_f16x2``.

The integer GEMMs (``imma_xs``) scale every 32-value sub-block's sums on their own (the
sub-block's scale multiplies the quants; x's scale changes every 32 values): five instructions an
output a sub-block, several times the tensor cores' share at 32-64 rows. Here a quant q times its
sub-block's 6-bit scale sc is an integer below 1,024, exact in f16, so the tensor cores sum
sc q x over a whole block of 256 values in f32 and each output is scaled once a block, by the
block's d: y += d (sum over the block of sc q x) - sum over its sub-blocks of (dmin m) sum(x).
A lane builds sc q two values an instruction: a nibble pair under the exponent of 1024
(0x6400) is the f16 pair 1024 + q (16 q for a high nibble), and one fused multiply-add of the
pair, (1024 + q) sc - 1024 sc, is sc q exactly.

x comes as two f16 terms (hi, then lo = what is left), each block of 256 values of a row scaled
by a power of two that puts its largest magnitude in [2^14, 2^15): about 22 bits of each value
against 15 for the integer GEMMs' two int8 terms. Beside them, per block, the exact f32 sum of
each 32 values and the block's inverse scale.

Layout of x's terms (``split_f16x2``): a row's values in order, but in every group of four the
middle two swapped, two f16 values a word: word 2G of a group G holds its values (0, 2) and word
2G + 1 its (1, 3). A lane t of a fragment's four then finds the B registers of both 16-value
steps of a sub-block in four consecutive words (one 16-byte load): step h, value pair e takes
words 4 t + 2 h + e, which hold the sub-block's values 8 t + 4 h + e and that + 2; the same lane
reads its quant word 2 t + h of the sub-block's 64-value chunk, whose bytes 8 t + 4 h + (0, 2) and
(1, 3) are those values' nibbles (a permutation of K, the same for both operands)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from poot.backend import dtypes as dt
from poot.backend import kir as K
from poot.backend import verify_kernel
from poot.kernel.build import F32, I32
from poot.kernel.build import add as _add
from poot.kernel.build import b as _b
from poot.kernel.build import c as _c
from poot.kernel.build import f as _f
from poot.kernel.build import mul as _mul
from poot.kernel.build import r as _r
from poot.kernel.build import silu_mul as _silu_mul

from ..statements import Hfma2, Mma, PackF16x2
from ._fragments import by_parts as _by_parts
from ._fragments import mma_lanes as _mma_lanes
from ._fragments import staged_blocks as _staged_blocks

__all__ = ["gemm_hmma_q4_k_xs", "split_f16x2", "f16_pair", "hmma_shared_bytes", "DS_STRIDE", "F16_MAGIC", "PARAMS", "SPLIT_F16_THREADS", "XDS_BLOCK"]

SPLIT_F16_THREADS = 256
XDS_BLOCK = 16  # floats per row and block in ``xds``: the 8 sums, the inverse scale, 7 unused
_HX = 144  # words a staged row of one term of a block: 128 and 16 more, so rows 1 apart sit 16 banks apart
DS_STRIDE = 20  # floats a staged row of (sums, scale): rows 2 apart sit 8 banks apart
F16_MAGIC = 0x64006400  # the f16 pair (1024, 1024)


def hmma_shared_bytes(rows: int) -> int:
    """Workgroup memory ``gemm_hmma_q4_k_xs`` takes for ``rows`` rows of x: two buffers of a block."""
    return 2 * rows * (2 * _HX + DS_STRIDE) * 4


def f16_pair(v: float) -> K.Expr:
    """The i32 word of the f16 pair (v, v)."""
    bits = int(np.array([v], np.float16).view(np.uint16)[0])
    word = bits | (bits << 16)
    return _c(word - (1 << 32) if word >= 1 << 31 else word)


@lru_cache(maxsize=None)
def split_f16x2(k: int, glu: bool = False, order: str = "mma") -> K.Kernel:
    """x [m, k] (f32; with ``glu``, silu(g) * u of g and u [m, k]) as ``gemm_hmma_q4_k_xs`` reads
    it: each block of 256 values of a row times s, the power of two that puts the block's largest
    magnitude in [2^14, 2^15) (f16's range holds it with room), as the nearest f16 (``xh``) and the
    nearest f16 of what is left (``xl``), two values a word in the module's order; and in ``xds``,
    ``XDS_BLOCK`` floats a row and block: the exact f32 sums of its 32-value sub-blocks (of x, not
    scaled) and 1 / s. ``order`` "wgmma": each 32 values in ``wgmma_f16``'s order instead. A warp a
    row's block, a lane 8 values; grid (ceil(m k / 256 / 8),). K a multiple of 256."""
    if k % 256:
        raise ValueError(f"split_f16x2 needs K a multiple of 256, got {k}")
    per_row = k // 256
    warps = SPLIT_F16_THREADS // 32
    body: list[K.Stmt] = [
        K.Let("lane", _b("rem", K.Builtin("thread_id", 0), 32)),
        K.Let("wb", _add(_mul(K.Builtin("group_id", 0), warps), _b("div", K.Builtin("thread_id", 0), 32))),
    ]
    inner: list[K.Stmt] = [
        K.Let("row", _b("div", _r("wb"), per_row)),
        K.Let("blk", _b("rem", _r("wb"), per_row)),
        K.Let("at", _add(_mul(_r("row"), k), _mul(_r("blk"), 256), _mul(_r("lane"), 8))),
    ]
    vals = [f"v{i}" for i in range(8)]
    if glu:
        for h in (0, 4):
            inner += [K.VecLoad(tuple(f"g{i}" for i in range(h, h + 4)), "g", _add(_r("at"), h), F32)]
            inner += [K.VecLoad(tuple(f"u{i}" for i in range(h, h + 4)), "u", _add(_r("at"), h), F32)]
        inner += [K.Let(f"v{i}", _silu_mul(_r(f"g{i}", F32), _r(f"u{i}", F32))) for i in range(8)]
    else:
        inner += [K.VecLoad(tuple(vals[h : h + 4]), "x", _add(_r("at"), h), F32) for h in (0, 4)]
    big: K.Expr = K.Un("abs", _r("v0", F32))
    for v in vals[1:]:
        big = K.Bin("max", big, K.Un("abs", _r(v, F32)))
    inner += [
        K.Let("big", K.SubgroupReduce("max", big)),
        K.Let("eb", _b("and", _b("shr", K.Bitcast(_r("big", F32), I32), 23), 255)),  # its biased exponent
        K.Let("se", K.Bin("min", K.Bin("max", _b("sub", _c(127 + 14 + 127), _r("eb")), _c(1)), _c(254))),
        K.Let("s", K.Bitcast(_b("shl", _r("se"), 23), F32)),
    ]
    inner += [K.Let(f"t{i}", K.Bin("mul", _r(f"v{i}", F32), _r("s", F32))) for i in range(8)]
    hi_words, lo_words = [], []
    for q in (0, 4):  # a group of four: words (0, 2) and (1, 3)
        for e in (0, 1):
            a, b = f"t{q + e}", f"t{q + e + 2}"  # the lane's values 4 h + e and that + 2, h = q / 4
            h, lo = f"h{q + e}", f"l{q + e}"
            inner += [K.Let(h, _c(0)), PackF16x2(h, _r(a, F32), _r(b, F32)), K.Let(lo, _c(0))]
            ha, hb = K.HalfToF32(_r(h)), K.HalfToF32(_b("shr", _r(h), 16))
            inner.append(PackF16x2(lo, K.Bin("sub", _r(a, F32), ha), K.Bin("sub", _r(b, F32), hb)))
            hi_words.append(_r(h))
            lo_words.append(_r(lo))
    if order == "mma":
        word = _add(_mul(_r("row"), k // 2), _mul(_r("blk"), 128), _mul(_r("lane"), 4))
        inner += [K.VecStore("xh", word, tuple(hi_words)), K.VecStore("xl", word, tuple(lo_words))]
    else:  # the sub-block's word 8 h + 4 e + t for lane t of its four (``wgmma_f16``)
        sub = _add(_mul(_r("row"), k // 2), _mul(_r("blk"), 128), _mul(_b("div", _r("lane"), 4), 16), _b("rem", _r("lane"), 4))
        for i, (hw, lw) in enumerate(zip(hi_words, lo_words, strict=True)):
            h, e = divmod(i, 2)
            inner += [K.Store("xh", _add(sub, 8 * h + 4 * e), hw), K.Store("xl", _add(sub, 8 * h + 4 * e), lw)]
    total: K.Expr = _r("v0", F32)
    for v in vals[1:]:
        total = K.Bin("add", total, _r(v, F32))
    inner.append(K.Let("sum", total))
    for x in (1, 2):  # the four lanes of a sub-block
        inner.append(K.Assign("sum", K.Bin("add", _r("sum", F32), K.SubgroupShuffle(_r("sum", F32), _c(x), xor=True))))
    inner += [
        K.Let("mine", K.SubgroupShuffle(_r("sum", F32), _mul(K.Bin("min", _r("lane"), _c(7)), 4))),  # lane j < 8: sub-block j's
        K.Let(
            "val",
            K.Select(K.Bin("lt", _r("lane"), _c(8)), _r("mine", F32), K.Select(K.Bin("eq", _r("lane"), _c(8)), K.Bin("div", _f(1.0), _r("s", F32)), _f(0.0))),
        ),
        K.If(K.Bin("lt", _r("lane"), _c(XDS_BLOCK)), (K.Store("xds", _add(_mul(_r("wb"), XDS_BLOCK), _r("lane")), _r("val", F32)),)),
    ]
    body.append(K.If(K.Bin("lt", _r("wb"), _mul(_r("m"), per_row)), tuple(inner)))  # a warp's lanes all in or all out
    ins = (K.Buffer("g", F32), K.Buffer("u", F32)) if glu else (K.Buffer("x", F32),)
    outs = (K.Buffer("xh", I32, readonly=False), K.Buffer("xl", I32, readonly=False), K.Buffer("xds", F32, readonly=False))
    if order not in ("mma", "wgmma"):
        raise ValueError(f"split_f16x2: order is 'mma' or 'wgmma', got {order!r}")
    kern = K.Kernel(
        f"split_f16x2_K{k}" + ("_glu" if glu else "") + ("_wg" if order == "wgmma" else ""),
        (*ins, *outs, K.ScalarParam("m", I32)),
        tuple(body),
        (SPLIT_F16_THREADS, 1, 1),
        (),
    )
    verify_kernel(kern)
    return kern


PARAMS = (
    K.Buffer("xh", I32),
    K.Buffer("xl", I32),
    K.Buffer("xds", F32),
    K.Buffer("w", I32),
    K.Buffer("y", F32, readonly=False),
    K.ScalarParam("m", I32),
    K.ScalarParam("n", I32),
)


@lru_cache(maxsize=None)
def gemm_hmma_q4_k_xs(
    k: int, ft: int = 2, rt: int = 4, wf: int = 4, wr: int = 2, ksplit: int = 1, pipelined: bool = True, groups: int = 0, parts: tuple[int, ...] = ()
) -> K.Kernel:
    """y = x @ w^T for 5 to 64 rows of x (``split_f16x2``'s buffers) against Q4_K weight rows (i32
    words of 144-byte blocks), on the f16 tensor cores (module docstring). A warp owns ``ft``
    feature tiles (16 features) by ``rt`` row tiles (8 rows); a workgroup ``wf`` by ``wr`` warps,
    so 16 ``ft`` ``wf`` features of 8 ``rt`` ``wr`` rows, whose x all its threads copy into
    workgroup memory a block at a time (two buffers: the next block's copy in flight while this
    one is summed). Each warp streams its features' weights from memory; ``pipelined``: a block's
    weights load during the block before. With ``ksplit`` S > 1, K is split in S parts (grid z):
    part s of the sum goes to ``y`` at s m n for ``sum_parts`` to add. ``parts`` (feature counts,
    each a multiple of a workgroup's): several weights of one x in one launch, ``w0``, ``w1``, ...
    into ``y0``, ``y1``, ... (with K split all into ``y`` at s m n + the part's first feature).
    ``groups``: workgroups an SM should hold (``Kernel.min_groups``). Grid (ceil(m / rows),
    ceil(n / features), S). K / S a multiple of 256."""
    name = "gemm_hmma_q4_k_xs"
    if k % (256 * ksplit):
        raise ValueError(f"{name} needs K a multiple of 256 times its K split ({ksplit}), got {k}")
    threads, rows, width = 32 * wf * wr, 8 * rt * wr, 16 * ft * wf
    if any(size % width for size in parts):
        raise ValueError(f"{name}: every part must be a multiple of a workgroup's {width} features, got {parts}")
    blocks = k // ksplit // 256
    row_words = k // 256 * 36
    term_words, ds_words = rows * _HX, rows * DS_STRIDE
    head: list[K.Stmt] = [
        *_mma_lanes(),
        K.Let("wfi", _b("rem", _r("warp"), wf)),
        K.Let("wri", _b("div", _r("warp"), wf)),
        K.Let("row0", _mul(K.Builtin("group_id", 0), rows)),
        K.Let("wrow", _mul(_r("wri"), 8 * rt)),  # the warp's first row among the workgroup's
        K.Let("col0", _add(_mul(K.Builtin("group_id", 1), width), _mul(_r("wfi"), 16 * ft))),
        K.Let("b0", _mul(K.Builtin("group_id", 2), blocks) if ksplit > 1 else _c(0)),
        K.Let("cr", _b("div", K.Builtin("thread_id", 0), 32)),  # the thread's x copies: first row, piece
        K.Let("cq", _b("rem", K.Builtin("thread_id", 0), 32)),
        K.Let("dq", _b("rem", K.Builtin("thread_id", 0), 4)),
    ]
    last_m = _b("sub", _r("m"), 1)
    if rows * 32 % threads:
        raise ValueError(f"{name}: {threads} threads copy {rows} rows of x in whole turns only")

    def copies(blk: K.Expr, buf: K.Expr) -> list[K.Stmt]:
        """All threads' copies of block ``blk`` of the workgroup's rows of x into buffer ``buf``:
        each term's 32 pieces of 16 bytes a row (a thread the same piece of rows ``threads`` / 32
        apart), then the sums' 4 a row."""
        out: list[K.Stmt] = []
        for u in range(rows * 32 // threads):
            r = _add(_r("cr"), u * threads // 32)
            src = _add(_mul(K.Bin("min", _add(_r("row0"), r), last_m), k // 2), _mul(blk, 128), _mul(_r("cq"), 4))
            for nm in ("xh", "xl"):
                out.append(K.CopyAsync(f"{nm}_s", _add(_mul(buf, term_words), _mul(r, _HX), _mul(_r("cq"), 4)), nm, src))
        for u in range(-(-rows * 4 // threads)):
            r = _add(_b("div", K.Builtin("thread_id", 0), 4), u * threads // 4)
            src = _add(_mul(K.Bin("min", _add(_r("row0"), r), last_m), k // 16), _mul(blk, XDS_BLOCK), _mul(_r("dq"), 4))
            cp = K.CopyAsync("xds_s", _add(_mul(buf, ds_words), _mul(r, DS_STRIDE), _mul(_r("dq"), 4)), "xds", src)
            out.append(cp if (u + 1) * threads <= rows * 4 else K.If(K.Bin("lt", r, _c(rows)), (cp,)))
        return out

    slots = [(j, hf) for j in range(ft) for hf in (0, 8)]  # the lane's features: rows g and g + 8 of each tile
    wnames = [f"w{j}_{hf}{nm}" for j, hf in slots for nm in ("dm", "s0", "s1", "s2", *(f"q{cc}_{q}" for cc in range(4) for q in (0, 1)))]

    def weights(blk: K.Expr, u: str, wb: str) -> list[K.Stmt]:
        out: list[K.Stmt] = []
        for j, hf in slots:
            p = f"w{j}_{hf}"
            base = _add(_mul(_r(f"f{j}_{hf}"), row_words), _mul(blk, 36))
            out.append(K.VecLoad(tuple(f"{p}{nm}{u}" for nm in ("dm", "s0", "s1", "s2")), wb, base, I32))
            for cc in range(4):
                out.append(K.VecLoad((f"{p}q{cc}_0{u}", f"{p}q{cc}_1{u}"), wb, _add(base, 4 + 8 * cc, _mul(_r("t4"), 2)), I32))
        return out

    acc = {(j, i): tuple(f"acc{j}_{i}_{e}" for e in range(4)) for j in range(ft) for i in range(rt)}  # y, over all blocks
    blk_acc = {(j, i): tuple(f"ba{j}_{i}_{e}" for e in range(4)) for j in range(ft) for i in range(rt)}  # this block's sums

    def srow(i: int, e: int) -> K.Expr:
        """The staged row of the lane's output row 2 t4 + e of row tile ``i``."""
        return _add(_r("wrow"), 8 * i + e, _mul(_r("t4"), 2))

    def products(buf: K.Expr) -> list[K.Stmt]:
        out: list[K.Stmt] = []
        for names in blk_acc.values():
            out += [K.Assign(nm, _f(0.0)) for nm in names]
        for j, hf in slots:  # the block's scales and mins, four 6-bit values a word (ggml's get_scale_min_k4)
            p = f"w{j}_{hf}"
            s0, s1, s2 = (_r(f"{p}s{i}") for i in range(3))
            hi2 = lambda v, sh: _b("and", _b("shr", v, sh), 0x30303030)  # noqa: E731  # a byte's top two bits as bits 4-5
            out += [
                K.Let(f"{p}d", K.HalfToF32(_b("and", _r(f"{p}dm"), 0xFFFF))),
                K.Let(f"{p}dmin", K.HalfToF32(_b("shr", _r(f"{p}dm"), 16))),
                K.Let(f"{p}sc0", _b("and", s0, 0x3F3F3F3F)),
                K.Let(f"{p}sc1", _b("or", _b("and", s2, 0x0F0F0F0F), hi2(s0, 2))),
                K.Let(f"{p}mn0", _b("and", s1, 0x3F3F3F3F)),
                K.Let(f"{p}mn1", _b("or", _b("and", _b("shr", s2, 4), 0x0F0F0F0F), hi2(s1, 2))),
            ]
        for cc in range(4):
            for j, hf in slots:
                p = f"w{j}_{hf}"
                for part in ("l", "h"):
                    sb = 2 * cc + (part == "h")
                    byte = lambda w, sb=sb: _b("and", _b("shr", _r(f"{w}{sb // 4}"), 8 * (sb % 4)), 255)  # noqa: E731
                    h2 = f"{p}h2{part}{cc}"  # (sc, sc) as f16: 1024 + sc under the magic, less 1024
                    out += [K.Let(h2, _c(0)), Hfma2(h2, _b("or", _mul(byte(f"{p}sc"), 0x10001), F16_MAGIC), f16_pair(1.0), f16_pair(-1024.0))]
                    mul_, add_ = f"{p}hm{part}{cc}", f"{p}ha{part}{cc}"
                    scale, off = (1.0, -1024.0) if part == "l" else (1.0 / 16, -64.0)  # a high nibble comes as 16 q
                    out += [K.Let(mul_, _c(0)), Hfma2(mul_, _r(h2), f16_pair(scale), f16_pair(0.0))]
                    out += [K.Let(add_, _c(0)), Hfma2(add_, _r(h2), f16_pair(off), f16_pair(0.0))]
                    out.append(K.Let(f"{p}mn{part}{cc}", K.Bin("mul", _r(f"{p}dmin", F32), K.Cast(byte(f"{p}mn"), F32))))
            for sb, part, mask in ((0, "l", 0x000F000F), (1, "h", 0x00F000F0)):
                blk32 = 2 * cc + sb
                for j, hf in slots:  # the lane's sc q pairs of both 16-value steps
                    p = f"w{j}_{hf}"
                    for h in (0, 1):
                        for e in (0, 1):
                            word = _r(f"{p}q{cc}_{h}") if e == 0 else _b("shr", _r(f"{p}q{cc}_{h}"), 8)
                            a = f"{p}a{blk32}{h}{e}"
                            out += [K.Let(a, _c(0)), Hfma2(a, _b("or", _b("and", word, mask), F16_MAGIC), _r(f"{p}hm{part}{cc}"), _r(f"{p}ha{part}{cc}"))]
                for i in range(rt):
                    frag = _add(_mul(_add(_r("wrow"), 8 * i, _r("g")), _HX), 16 * blk32, _mul(_r("t4"), 4))
                    hi, lo = tuple(f"bh{blk32}_{i}_{n}" for n in range(4)), tuple(f"bl{blk32}_{i}_{n}" for n in range(4))
                    out += [K.VecLoad(hi, "xh_s", _add(_mul(buf, term_words), frag), I32), K.VecLoad(lo, "xl_s", _add(_mul(buf, term_words), frag), I32)]
                    for e in (0, 1):  # the sub-block's sums of x for the lane's two output rows
                        out.append(K.Let(f"xs{blk32}_{i}_{e}", K.Load("xds_s", _add(_mul(buf, ds_words), _mul(srow(i, e), DS_STRIDE), blk32), F32)))
                    for j in range(ft):
                        for h in (0, 1):
                            a = tuple(_r(f"w{j}_{hf}a{blk32}{h}{e}") for e in (0, 1) for hf in (0, 8))
                            for bt in (hi, lo):
                                out.append(Mma(blk_acc[j, i], a, (_r(bt[2 * h]), _r(bt[2 * h + 1])), dt.f16))  # type: ignore[arg-type]
                        for e in range(4):  # y -= (dmin m) sum(x): output (feature g + 8 (e / 2), row 2 t4 + e % 2)
                            mn = _r(f"w{j}_{8 * (e // 2)}mn{part}{cc}", F32)
                            out.append(K.Assign(acc[j, i][e], K.Fma(K.Un("neg", mn), _r(f"xs{blk32}_{i}_{e % 2}", F32), _r(acc[j, i][e], F32))))
        for i in range(rt):  # y += d / s (the block's sums)
            for e in (0, 1):
                out.append(K.Let(f"rs{i}_{e}", K.Load("xds_s", _add(_mul(buf, ds_words), _mul(srow(i, e), DS_STRIDE), 8), F32)))
        for j in range(ft):
            for i in range(rt):
                for e in range(4):
                    d = _r(f"w{j}_{8 * (e // 2)}d", F32)
                    out.append(K.Assign(acc[j, i][e], K.Fma(K.Bin("mul", d, _r(f"rs{i}_{e % 2}", F32)), _r(blk_acc[j, i][e], F32), _r(acc[j, i][e], F32))))
        return out

    def core(wbuf: str, ybuf: str, first: int | None, size: int | None) -> list[K.Stmt]:
        col = _r("col0") if first is None else _b("sub", _r("col0"), first)
        bound = _r("n") if size is None else _c(size)
        last_n = _b("sub", bound, 1)
        body: list[K.Stmt] = []
        for j, hf in slots:
            body.append(K.Let(f"f{j}_{hf}", K.Bin("min", _add(col, 16 * j + hf, _r("g")), last_n)))
        for names in (*acc.values(), *blk_acc.values()):
            body += [K.Let(nm, _f(0.0)) for nm in names]
        body += _staged_blocks(blocks, copies, lambda blk, u: weights(blk, u, wbuf), products, wnames, pipelined)
        split = ksplit > 1
        ybase = _mul(_mul(K.Builtin("group_id", 2), _r("m")), _r("n")) if split else _c(0)
        stride = _r("n") if size is None or split else _c(size)
        for j in range(ft):
            for i in range(rt):
                for e in range(4):
                    orow = _add(_r("row0"), srow(i, e % 2))
                    ocol = _add(col, 16 * j, _r("g"), 8 * (e // 2))
                    at = _add(ybase, _mul(orow, stride), _add(ocol, first) if split and first else ocol)
                    st = K.Store(ybuf, at, _r(acc[j, i][e], F32))
                    body.append(K.If(K.Bin("and", K.Bin("lt", orow, _r("m")), K.Bin("lt", ocol, bound)), (st,)))
        return body

    body, params = _by_parts(head, core, parts, width, ksplit, PARAMS)
    shared = (K.Shared("xh_s", I32, 2 * term_words), K.Shared("xl_s", I32, 2 * term_words), K.Shared("xds_s", F32, 2 * ds_words))
    tag = f"_K{k}_{ft}x{rt}_W{wf}x{wr}" + (f"_S{ksplit}" if ksplit > 1 else "") + ("_pipe" if pipelined else "") + (f"_G{groups}" if groups else "")
    tag += "_P" + "_".join(map(str, parts)) if parts else ""
    kern = K.Kernel(name + tag, params, tuple(body), (threads, 1, 1), shared, min_groups=groups)
    verify_kernel(kern)
    return kern
