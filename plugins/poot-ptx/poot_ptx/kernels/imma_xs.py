"""Batched decode on packed weights through the integer tensor cores with x staged in workgroup
memory: ``gemm_imma_q4_k_xs`` (Q4_K) and ``gemm_imma_q6_k_xs`` (Q6_K). The warps of a workgroup own
different features and share one copy of the workgroup's rows of x, which all threads copy into
workgroup memory a block (256 values) at a time (``CopyAsync``, two buffers: the next block's copy
is in flight while this one is summed); each warp streams its own features' weights from memory and
hands their quants to ``mma.sync`` m16n8k32 s8 against x's two int8 terms (``quantize_q8x2``'s
buffers). A warp owns ``ft`` feature tiles (16 features each) by ``rt`` row tiles (8 rows each); a
workgroup ``wn`` warps, so 16 ``ft`` ``wn`` features. With ``ksplit`` S > 1, K is split in S parts
(grid z): part s of the sum goes to ``y`` at s m n for ``sum_parts`` to add, or with ``summed``
to ``p``, where the last of the tile's workgroups to finish adds the parts itself. ``pipelined``: each
block's weights are loaded during the block before (twice the weight registers). Grid (ceil(m /
(8 rt)), ceil(n / (16 ft wn)), S). ``groups``: workgroups an SM should hold at once (registers
capped for them, ``Kernel.min_groups``; 0: as many as ptxas's allocation allows). ``terms`` 1: x's
first int8 term alone (about 8 bits a value, as llama.cpp's q8_1; matmul precision "medium"): one
product a sub-block instead of two, and the second term neither copied nor read ("_T1").

A lane's eight values of K for a 32-value product are eight consecutive ones where the fragment's
layout puts 4 and 4 sixteen apart: a permutation of K, the same for both operands."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from poot.backend import dtypes as dt
from poot.backend import kir as K
from poot.backend import verify_kernel
from poot.kernel.build import F32, I32, Q8_SPLIT, q4_k_lane_scales
from poot.kernel.build import add as _add
from poot.kernel.build import b as _b
from poot.kernel.build import c as _c
from poot.kernel.build import f as _f
from poot.kernel.build import mul as _mul
from poot.kernel.build import r as _r

from ..statements import Mma
from ._fragments import by_parts as _by_parts
from ._fragments import mma_lanes as _mma_lanes
from ._fragments import parts_summed_by_last as _parts_summed_by_last
from ._fragments import staged_blocks as _staged_blocks
from ._q6_k import joined as _joined
from .imma import NIBBLES, PARAMS, sub_block_sums

__all__ = ["gemm_imma_q4_k_xs", "gemm_imma_q6_k_xs", "xs_shared_bytes", "XS_PAD"]

XS_PAD = 8  # words of padding per staged row of x: a half-warp's 8-byte fragment loads hit 32 banks
_XDS_STRIDE = 20  # floats per staged row of (d, sum) pairs (16 for a block) padded: rows 2 apart 8 banks apart
_SW = 64 + XS_PAD  # words a staged row of one term


def xs_shared_bytes(rt: int) -> int:
    """Workgroup memory the staged integer GEMMs take for ``rt`` row tiles: two buffers of a block
    of x's rows, both terms and the (d, sum) pairs."""
    return 2 * 8 * rt * (2 * _SW + _XDS_STRIDE) * 4


class _Staged:
    """Where a lane finds a staged block of x: its fragments of row tile ``i`` for the 32 values
    from ``at`` (a multiple of 8 within the block), and a row's (d, sum) of a 32-value block."""

    def __init__(self, rt: int, terms: int = 2) -> None:
        self.term_words, self.ds_words, self.terms = 8 * rt * _SW, 8 * rt * _XDS_STRIDE, terms

    def fragments(self, buf: K.Expr, i: int, at: int, name: str) -> list[K.Stmt]:
        """Locals ``{name}h0, h1`` (first term) and ``{name}l0, l1`` (second; not with one term) of
        row 8 i + g."""
        word = _add(_mul(buf, self.term_words), _mul(_add(8 * i, _r("g")), _SW), at // 4, _mul(_r("t4"), 2))
        out = [K.VecLoad((f"{name}h0", f"{name}h1"), "xq_s", word, I32)]
        return out + ([K.VecLoad((f"{name}l0", f"{name}l1"), "xr_s", word, I32)] if self.terms == 2 else [])

    def b(self, name: str) -> tuple[K.Expr, ...]:
        """A product's B registers from ``fragments``' locals: both terms, or the first alone."""
        return tuple(_r(f"{name}{t}") for t in ("h0", "h1", "l0", "l1")[: 2 * self.terms])

    def scale(self, buf: K.Expr, i: int, e: int, block32: int, names: tuple[str, ...]) -> K.Stmt:
        """Locals ``names``: (d, sum) of 32-value block ``block32`` of the lane's output row 8 i + 2 t4 + e,
        or with four names, of blocks ``block32`` (even) and the next in one load."""
        at = _add(_mul(buf, self.ds_words), _mul(_add(8 * i + e, _mul(_r("t4"), 2)), _XDS_STRIDE), 2 * block32)
        return K.VecLoad(names, "xds_s", at, F32)

    def sums(self, buf: K.Expr, i: int, name: str) -> list[K.Stmt]:
        """Locals ``{name}{h}{s}``: row 8 i + g's sums of the block's 32-value blocks t4 (s 0) and
        t4 + 4 (s 1) as two tf32 terms, the first the value's top 19 bits (h 0), the second the rest
        (h 1): a tf32 product's B fragment (``_block_mins``)."""
        at = _add(_mul(buf, self.ds_words), _mul(_add(8 * i, _r("g")), _XDS_STRIDE), _mul(_r("t4"), 2), 1)
        out: list[K.Stmt] = []
        for s in (0, 1):
            v = f"{name}v{s}"
            out += [
                K.Let(v, K.Load("xds_s", _add(at, 8) if s else at, F32)),
                K.Let(f"{name}0{s}", _b("and", K.Bitcast(_r(v, F32), I32), _TF32)),
                K.Let(f"{name}1{s}", K.Bitcast(K.Bin("sub", _r(v, F32), K.Bitcast(_r(f"{name}0{s}"), F32)), I32)),
            ]
        return out


_TF32 = K.Const(-8192, dt.i32)  # 0xFFFFE000: an f32's sign, exponent and the 10 mantissa bits tf32 keeps
_TWO23 = 0x4B000000  # the bits of 2^23: or-ed with an integer below 2^23, the float 2^23 + it


def _block_mins(
    staged: _Staged, buf: K.Expr, ft: int, rt: int, acc: dict[tuple[int, int], tuple[str, ...]], s1: str, s2: str, dmin: Callable[[str], K.Expr]
) -> list[K.Stmt]:
    """y -= dmin sum_j m_j sum(x_j) over a Q4_K block's eight 32-value sub-blocks, for every tile of
    the warp, as two tf32 products a tile (K = the 8 sub-blocks) of the mins m (exact) against x's
    sub-block sums, one for each of their two tf32 terms (``_Staged.sums``), in place of eight
    multiply-adds an output.
    A lane's A fragment holds m of its features g and g + 8 for sub-blocks t4 and t4 + 4 (ggml's
    get_scale_min_k4: byte 4 + j of the scales for j < 4, else the high nibble of byte 4 + j under
    the top two bits of byte j), from the block's scale words ``s1``, ``s2`` (suffixes of each
    feature's prefix); ``dmin(p)`` is feature ``p``'s dmin (f32)."""
    out: list[K.Stmt] = [K.Let("msh", _mul(_r("t4"), 8))]

    def tf32(m: K.Expr) -> K.Expr:  # a small integer's float bits, without a conversion
        return K.Bitcast(K.Bin("sub", K.Bitcast(_b("or", m, _TWO23), F32), _f(8388608.0)), I32)

    for p in _features(ft):
        u, v = _b("shr", _r(f"{p}{s1}"), _r("msh")), _b("shr", _r(f"{p}{s2}"), _r("msh"))
        out += [
            K.Let(f"{p}ma", tf32(_b("and", u, 63))),
            K.Let(f"{p}mb", tf32(_b("or", _b("and", _b("shr", v, 4), 15), _b("and", _b("shr", u, 2), 48)))),
        ]
    for i in range(rt):
        xs = f"xm{i}_"
        out += staged.sums(buf, i, xs)
        for j in range(ft):
            lo, hi = f"w{j}_0", f"w{j}_8"
            a = (_r(f"{lo}ma"), _r(f"{hi}ma"), _r(f"{lo}mb"), _r(f"{hi}mb"))
            mm = tuple(f"mm{j}_{i}_{e}" for e in range(4))
            out += [K.Let(nm, _f(0.0)) for nm in mm]
            out += [Mma(mm, a, (_r(f"{xs}{h}0"), _r(f"{xs}{h}1")), dt.f32) for h in (0, 1)]  # type: ignore[arg-type]
            for e in range(4):  # output (feature g + 8 (e / 2), row 2 t4 + e % 2)
                nm = acc[j, i][e]
                out.append(K.Assign(nm, K.Fma(K.Un("neg", dmin(f"w{j}_{8 * (e // 2)}")), _r(mm[e], F32), _r(nm, F32))))
    return out


def _staged_kernel(
    name: str,
    k: int,
    ft: int,
    rt: int,
    wn: int,
    ksplit: int,
    pipelined: bool,
    weights: Callable[[K.Expr, str, str], list[K.Stmt]],
    weight_names: list[str],
    products: Callable[[K.Expr, _Staged, dict[tuple[int, int], tuple[str, ...]]], list[K.Stmt]],
    groups: int = 0,
    parts: tuple[int, ...] = (),
    tag: str = "",
    terms: int = 2,
    summed: bool = False,
) -> K.Kernel:
    """The frame both staged GEMMs share: lanes, the workgroup's rows and features, x's copies, the
    loop over the workgroup's blocks of K (``weights(blk, suffix, buffer)`` loads the lane's words
    of a block, ``products(buf, staged, acc)`` sums it against buffer ``buf``), and the stores.
    With ``parts`` (feature counts, each a multiple of a workgroup's features), several products
    of one x in one launch: weights ``w0``, ``w1``, ..., the features numbered through them in
    turn (n their sum); a workgroup's features lie in one part, so the branch that picks it is
    uniform. Unsplit, part i goes to ``y{i}``; with K split, every part to ``y`` at s m n + its
    first feature, for ``sum_parts(S, parts)`` to add and divide. ``tag`` ends the kernel's name
    (the caller's variant); ``terms`` 1: x's second term neither copied nor read ("_T1");
    ``summed`` (K split): the parts go to ``p`` and the last of a tile's workgroups adds them into
    the outputs as unsplit (``parts_summed_by_last``, "_R"; n a multiple of 4), no ``sum_parts``."""
    if terms not in (1, 2):
        raise ValueError(f"{name}: x's terms are 1 or 2, got {terms}")
    if k % (256 * ksplit):
        raise ValueError(f"{name} needs K a multiple of 256 times its K split ({ksplit}), got {k}")
    threads, rows = 32 * wn, 8 * rt
    width = 16 * ft * wn  # a workgroup's features
    if any(size % width for size in parts):
        raise ValueError(f"{name}: every part must be a multiple of a workgroup's {width} features, got {parts}")
    blocks = k // ksplit // 256  # a workgroup's blocks of K
    staged = _Staged(rt, terms)
    head: list[K.Stmt] = [
        *_mma_lanes(),
        K.Let("row0", _mul(K.Builtin("group_id", 0), rows)),
        K.Let("col0", _add(_mul(K.Builtin("group_id", 1), width), _mul(_r("warp"), 16 * ft))),
        K.Let("b0", _mul(K.Builtin("group_id", 2), blocks) if ksplit > 1 else _c(0)),  # this workgroup's first block
    ]
    last_m = _b("sub", _r("m"), 1)

    def copies(blk: K.Expr, buf: K.Expr, tag: str) -> list[K.Stmt]:
        """All threads' copies of block ``blk`` of the workgroup's rows of x into buffer ``buf``: a
        thread's piece of each term (16 sixteen-byte pieces a row, the same offsets in both) and of
        the (d, sum) pairs (4 a row), consecutive threads along a row."""
        out: list[K.Stmt] = []
        for count, per, parts_ in (
            (16 * rows, 16, (("xq", staged.term_words, _SW, k // 4, 64), ("xr", staged.term_words, _SW, k // 4, 64))[:terms]),
            (4 * rows, 4, (("xds", staged.ds_words, _XDS_STRIDE, k // 16, 16),)),
        ):
            for u in range(-(-count // threads)):
                pc = f"pc{tag}{per}_{u}"
                out.append(K.Let(pc, _add(K.Builtin("thread_id", 0), u * threads)))
                r, piece = _b("div", _r(pc), per), _mul(_b("rem", _r(pc), per), 4)
                src = K.Bin("min", _add(_r("row0"), r), last_m)
                cps = tuple(
                    K.CopyAsync(f"{nm}_s", _add(_mul(buf, size), _mul(r, stride), piece), nm, _add(_mul(src, row), _mul(blk, step), piece))
                    for nm, size, stride, row, step in parts_
                )
                out += cps if (u + 1) * threads <= count else [K.If(K.Bin("lt", _r(pc), _c(count)), cps)]
        return out

    def core(wbuf: str, ybuf: str, first: int | None, size: int | None) -> list[K.Stmt]:
        """The product of the weights in ``wbuf`` (the part of ``size`` features from feature
        ``first``; None: the whole of n) into ``ybuf``."""
        col = _r("col0") if first is None else _b("sub", _r("col0"), first)  # the warp's first feature in its weights
        bound = _r("n") if size is None else _c(size)  # features in ``wbuf``
        last_n = _b("sub", bound, 1)
        body: list[K.Stmt] = [K.Let("c", _c(0)), K.Let("sh", _c(0))]
        for j in range(ft):  # the lane's features: rows g and g + 8 of each feature tile
            for h in (0, 8):
                body.append(K.Let(f"f{j}_{h}", K.Bin("min", _add(col, 16 * j + h, _r("g")), last_n)))
        acc = {(j, i): tuple(f"acc{j}_{i}_{e}" for e in range(4)) for j in range(ft) for i in range(rt)}
        for names in acc.values():
            body += [K.Let(nm, _f(0.0)) for nm in names]
        tags = iter(["a", "b", *(f"c{i}" for i in range(2, 16))])  # one a block copied ahead (the names of two stages as before)
        body += _staged_blocks(
            blocks,
            lambda blk, buf: copies(blk, buf, next(tags)),
            lambda blk, u: weights(blk, u, wbuf),
            lambda buf: products(buf, staged, acc),
            weight_names,
            pipelined,
        )
        split = ksplit > 1
        ybase = _mul(_mul(K.Builtin("group_id", 2), _r("m")), _r("n")) if split else _c(0)
        stride = _r("n") if size is None or split else _c(size)  # a row of the output written
        for j in range(ft):
            for i in range(rt):
                for e in range(4):  # output (feature g + 8 (e / 2), row 2 t4 + e % 2)
                    orow = _add(_r("row0"), 8 * i, _mul(_r("t4"), 2), e % 2)
                    ocol = _add(col, 16 * j, _r("g"), 8 * (e // 2))
                    at = _add(ybase, _mul(orow, stride), _add(ocol, first) if split and first else ocol)
                    st = K.Store("p" if split and summed else ybuf, at, _r(acc[j, i][e], F32))
                    body.append(K.If(K.Bin("and", K.Bin("lt", orow, _r("m")), K.Bin("lt", ocol, bound)), (st,)))
        if split and summed:
            body += _parts_summed_by_last(rows, width, ksplit, threads, ybuf, first, size)
        return body

    summed = summed and ksplit > 1
    body, params = _by_parts(head, core, parts, width, ksplit, PARAMS, summed)
    xr_s = (K.Shared("xr_s", I32, 2 * staged.term_words),) if terms == 2 else ()
    shared = (K.Shared("xq_s", I32, 2 * staged.term_words), *xr_s, K.Shared("xds_s", F32, 2 * staged.ds_words))
    shared += (K.Shared("arrived_s", I32, 1),) if summed else ()
    variant, tag = tag, f"_K{k}_{ft}x{rt}_W{wn}" + (f"_S{ksplit}" if ksplit > 1 else "") + ("_pipe" if pipelined else "") + (f"_G{groups}" if groups else "")
    tag += "_P" + "_".join(map(str, parts)) if parts else ""
    tag += variant + ("_T1" if terms == 1 else "") + ("_R" if summed else "")
    kern = K.Kernel(name + tag, params, tuple(body), (threads, 1, 1), shared, min_groups=groups)
    verify_kernel(kern)
    return kern


def _features(ft: int) -> list[str]:
    return [f"w{j}_{h}" for j in range(ft) for h in (0, 8)]


@lru_cache(maxsize=None)
def gemm_imma_q4_k_xs(
    k: int,
    ft: int = 2,
    rt: int = 2,
    wn: int = 8,
    ksplit: int = 1,
    pipelined: bool = False,
    groups: int = 0,
    parts: tuple[int, ...] = (),
    tensor_mins: bool = False,
    terms: int = 2,
    summed: bool = False,
) -> K.Kernel:
    """y = x @ w^T for 5 to 64 rows of x against Q4_K weight rows (i32 words of 144-byte blocks):
    what ``imma.gemm_imma_q4_k`` computes, in the staged frame (module docstring). A lane loads a
    block's head once and 8 bytes of quants a 64-value chunk (the chunk's low nibbles its first
    32 values, the high ones its second). K / S a multiple of 256. ``tensor_mins``: the block's
    mins as tf32 products, two a tile (``_block_mins``, "_tm"), else a multiply-add an output a
    sub-block. ``terms``: x's int8 terms; ``summed``: K split's parts added in the kernel (module
    docstring)."""
    row_words = k // 256 * 36
    names = ("dm", "s0", "s1", "s2", *(f"q{cc}_{q}" for cc in range(4) for q in (0, 1)))

    def weights(blk: K.Expr, u: str, wb: str) -> list[K.Stmt]:
        out: list[K.Stmt] = []
        for j in range(ft):
            for h in (0, 8):
                p = f"w{j}_{h}"
                base = _add(_mul(_r(f"f{j}_{h}"), row_words), _mul(blk, 36))
                out.append(K.VecLoad(tuple(f"{p}{nm}{u}" for nm in ("dm", "s0", "s1", "s2")), wb, base, I32))
                for cc in range(4):
                    out.append(K.VecLoad((f"{p}q{cc}_0{u}", f"{p}q{cc}_1{u}"), wb, _add(base, 4 + 8 * cc, _mul(_r("t4"), 2)), I32))
        return out

    def products(buf: K.Expr, staged: _Staged, acc: dict[tuple[int, int], tuple[str, ...]]) -> list[K.Stmt]:
        out: list[K.Stmt] = []
        for cc in range(4):
            out += [K.Assign("c", _c(cc)), K.Assign("sh", _c(16 * (cc % 2)))]
            for p in _features(ft):
                out += [K.Let(f"{p}{nm}{cc}", _r(f"{p}{nm}")) for nm in ("dm", "s0", "s1", "s2")]
                out += q4_k_lane_scales(p, cc)
                for part in ("l", "h"):  # d sc / Q8_SPLIT: x's terms are summed as Q8_SPLIT s1 + s2 (one term: d sc)
                    sd = K.Bin("mul", _r(f"{p}sc{part}{cc}", F32), _f(1.0 / Q8_SPLIT)) if terms == 2 else _r(f"{p}sc{part}{cc}", F32)
                    out.append(K.Let(f"{p}sd{part}{cc}", sd))
            for sb, part in ((0, "l"), (1, "h")):
                for i in range(rt):
                    xv = f"xb{cc}_{sb}_{i}"
                    out += staged.fragments(buf, i, 64 * cc + 32 * sb, xv)
                    if sb == 0:  # both sub-blocks' (d, sum) asked for in one 16-byte load
                        both = lambda e, i=i: tuple(f"xb{cc}_{h}_{i}{nm}{e}" for h in (0, 1) for nm in ("d", "s"))  # noqa: E731
                        out += [staged.scale(buf, i, e, 2 * cc, both(e)) for e in range(2)]
                    for j in range(ft):
                        words = [_r(f"w{j}_{h}q{cc}_{q}") for q in (0, 1) for h in (0, 8)]
                        out += sub_block_sums(
                            f"_{cc}_{sb}_{j}_{i}",
                            acc[j, i],
                            tuple(_b("and", w if sb == 0 else _b("shr", w, 4), NIBBLES) for w in words),
                            staged.b(xv),
                            tuple((_r(f"{xv}d{e}", F32), _r(f"{xv}s{e}", F32)) for e in range(2)),
                            tuple((_r(f"w{j}_{h}sd{part}{cc}", F32), _r(f"w{j}_{h}mn{part}{cc}", F32)) for h in (0, 8)),
                            mins=not tensor_mins,
                        )
        if tensor_mins:
            out += _block_mins(staged, buf, ft, rt, acc, "s1", "s2", lambda p: _r(f"{p}dmin0", F32))
        return out

    return _staged_kernel(
        "gemm_imma_q4_k_xs",
        k,
        ft,
        rt,
        wn,
        ksplit,
        pipelined,
        weights,
        [p + nm for p in _features(ft) for nm in names],
        products,
        groups,
        parts,
        "_tm" if tensor_mins else "",
        terms,
        summed,
    )


_SIGN = K.Const(-2139062144, dt.i32)  # 0x80808080: each byte's top bit
_BIAS = 0x20202020  # 32 in each byte


@lru_cache(maxsize=None)
def gemm_imma_q6_k_xs(
    k: int,
    ft: int = 1,
    rt: int = 2,
    wn: int = 8,
    ksplit: int = 1,
    pipelined: bool = False,
    groups: int = 0,
    parts: tuple[int, ...] = (),
    terms: int = 2,
    summed: bool = False,
) -> K.Kernel:
    """y = x @ w^T for 5 to 64 rows of x against Q6_K weight rows (i32 words of 210-byte blocks; K a
    multiple of 512, so rows start on a word) in the staged frame (module docstring). A block is
    two halves of four 32-value quarters (``_q6_k``'s layout); a lane loads, a block, the 8 bytes of
    low nibbles of each half's two nibble groups, each half's 8 bytes of high bit pairs, the 16
    scales and d, each 4 bytes as two words joined where an odd block straddles them. A quarter's
    6-bit quants q become the signed bytes q - 32 (four a word, no carry between them) and meet x's
    two terms in integer products; its two 16-value halves have their own scales, so each is one
    product with the other lanes' quants zeroed (lanes 0-1 of a group hold the first 16 values,
    2-3 the second): y += d_x d / Q8_SPLIT (sc_a (Q8_SPLIT s1_a + s2_a) + sc_b (Q8_SPLIT s1_b +
    s2_b)), or with one of x's terms (``terms`` 1, module docstring) y += d_x d (sc_a s1_a + sc_b
    s1_b). K / S a multiple of 512; ``summed``: as ``gemm_imma_q4_k_xs``'s."""
    if k % (512 * ksplit):
        raise ValueError(f"gemm_imma_q6_k_xs needs K a multiple of 512 times its K split ({ksplit}), got {k}")
    row_words = k // 512 * 105  # 2 blocks of 210 bytes
    pieces = {f"l{h}{p}": 64 * h + 32 * p for h in (0, 1) for p in (0, 1)} | {f"h{h}": 128 + 32 * h for h in (0, 1)}
    names = ["o", *(f"{pc}{i}" for pc in pieces for i in range(3)), *(f"s{i}" for i in range(5)), "d"]

    def weights(blk: K.Expr, u: str, wb: str) -> list[K.Stmt]:
        out: list[K.Stmt] = []
        for j in range(ft):
            for h in (0, 8):
                p = f"w{j}_{h}"
                ob = _add(_mul(_r(f"f{j}_{h}"), 4 * row_words), _mul(blk, 210))  # the block's first byte
                out.append(K.Let(f"{p}o{u}", _mul(_b("and", blk, 1), 16)))  # 16: an odd block starts 2 bytes into a word
                for pc, rel in pieces.items():
                    w0 = _b("shr", _add(ob, rel, _mul(_r("t4"), 8)), 2)
                    out += [K.Let(f"{p}{pc}{i}{u}", K.Load(wb, _add(w0, i) if i else w0, I32)) for i in range(3)]
                sw = _b("shr", _add(ob, 192), 2)
                out += [K.Let(f"{p}s{i}{u}", K.Load(wb, _add(sw, i) if i else sw, I32)) for i in range(5)]
                out.append(K.Let(f"{p}d{u}", K.Load(wb, _b("shr", _add(ob, 208), 2), I32)))
        return out

    def products(buf: K.Expr, staged: _Staged, acc: dict[tuple[int, int], tuple[str, ...]]) -> list[K.Stmt]:
        out: list[K.Stmt] = []
        first = K.Bin("lt", _r("t4"), _c(2))  # the lane holds values of the quarter's first 16
        for p in _features(ft):  # the block's words joined, d / Q8_SPLIT
            odd = K.Bin("ne", _r(f"{p}o"), _c(0))
            for pc in pieces:
                out += [K.Let(f"{p}{pc}j{i}", _joined(_r(f"{p}{pc}{i}"), _r(f"{p}{pc}{i + 1}"), odd)) for i in range(2)]
            out += [K.Let(f"{p}sj{i}", _joined(_r(f"{p}s{i}"), _r(f"{p}s{i + 1}"), odd)) for i in range(4)]
            d = K.HalfToF32(_b("and", _b("shr", _r(f"{p}d"), _r(f"{p}o")), 0xFFFF))
            out.append(K.Let(f"{p}dq", K.Bin("mul", d, _f(1.0 / Q8_SPLIT)) if terms == 2 else d))
        for h in (0, 1):
            for q in range(4):
                tag = f"{h}{q}"
                for p in _features(ft):
                    for i in range(2):  # the lane's eight quants, q - 32 as signed bytes
                        nib = _b("and", _b("shr", _r(f"{p}l{h}{q % 2}j{i}"), 4 * (q // 2)), NIBBLES)
                        top = _b("shl", _b("and", _b("shr", _r(f"{p}h{h}j{i}"), 2 * q), 0x03030303), 4)
                        out.append(K.Let(f"{p}v{tag}_{i}", _b("xor", _b("sub", _b("or", _b("or", nib, top), _SIGN), _BIAS), _SIGN)))
                    for half in (0, 1):  # the two 16-value scales (int8) times d / Q8_SPLIT
                        byte = 8 * h + 2 * q + half
                        sc = _b("and", _b("shr", _r(f"{p}sj{byte // 4}"), 8 * (byte % 4)), 255)
                        out.append(K.Let(f"{p}sc{tag}{half}", K.Bin("mul", _r(f"{p}dq", F32), K.Cast(_b("sub", _b("xor", sc, 128), 128), F32))))
                for i in range(rt):
                    xv = f"xb{tag}_{i}"
                    out += staged.fragments(buf, i, 128 * h + 32 * q, xv)
                    out += [staged.scale(buf, i, e, 4 * h + q, (f"{xv}d{e}", f"{xv}s{e}")) for e in range(2)]
                    xb = staged.b(xv)
                    for j in range(ft):
                        a = tuple(_r(f"w{j}_{hh}v{tag}_{w}") for w in (0, 1) for hh in (0, 8))
                        sums = []
                        for half, keep in ((0, first), (1, K.Bin("ge", _r("t4"), _c(2)))):
                            s1, s2 = (tuple(f"{t}{tag}_{half}_{j}_{i}_{e}" for e in range(4)) for t in ("s1", "s2"))
                            ah = tuple(K.Select(keep, x, _c(0)) for x in a)
                            out += [K.Let(nm, _c(0)) for nm in (s1 + s2 if terms == 2 else s1)]
                            out += [Mma(s1, ah, xb[:2], dt.i8)] + ([Mma(s2, ah, xb[2:], dt.i8)] if terms == 2 else [])  # type: ignore[arg-type,list-item]
                            sums.append((s1, s2))
                        for e in range(4):  # output (feature g + 8 (e / 2), row 2 t4 + e % 2)
                            p = f"w{j}_{8 * (e // 2)}"
                            whole = [K.Cast(_add(_mul(_r(s1[e]), Q8_SPLIT), _r(s2[e])) if terms == 2 else _r(s1[e]), F32) for s1, s2 in sums]
                            t = K.Fma(_r(f"{p}sc{tag}1", F32), whole[1], K.Bin("mul", _r(f"{p}sc{tag}0", F32), whole[0]))
                            nm = acc[j, i][e]
                            out.append(K.Assign(nm, K.Fma(_r(f"{xv}d{e % 2}", F32), t, _r(nm, F32))))
        return out

    return _staged_kernel(
        "gemm_imma_q6_k_xs",
        k,
        ft,
        rt,
        wn,
        ksplit,
        pipelined,
        weights,
        [p + nm for p in _features(ft) for nm in names],
        products,
        groups,
        parts,
        "",
        terms,
        summed,
    )
