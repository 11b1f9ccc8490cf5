"""A thread's place in a tensor-core fragment, shared by the mma.sync kernels."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from poot.backend import kir as K
from poot.kernel.build import F32, I32
from poot.kernel.build import add as _add
from poot.kernel.build import b as _b
from poot.kernel.build import c as _c
from poot.kernel.build import f as _f
from poot.kernel.build import mul as _mul
from poot.kernel.build import r as _r

__all__ = ["mma_lanes", "by_parts", "parts_summed_by_last", "staged_blocks", "warp_tiles_summed"]


def mma_lanes() -> list[K.Stmt]:
    """A thread's place in an mma.sync fragment: ``tid``, ``lane``, ``warp``, and the lane's group
    ``g`` (lane / 4: its rows) and ``t4`` (lane % 4: its pair of columns)."""
    return [
        K.Let("tid", K.Builtin("thread_id", 0)),
        K.Let("lane", _b("rem", _r("tid"), 32)),
        K.Let("warp", _b("div", _r("tid"), 32)),
        K.Let("g", _b("div", _r("lane"), 4)),
        K.Let("t4", _b("rem", _r("lane"), 4)),
    ]


def warp_tiles_summed(flat: list[str], wk: int, threads: int, place: Callable[[K.Expr, K.Expr, K.Expr], tuple[K.Expr, K.Expr]]) -> list[K.Stmt]:
    """The ``wk`` warps' partial tiles (this lane's f32 accumulators ``flat``, four a tile) added
    through workgroup memory ``part`` (``threads`` * len(flat) words) and stored into y [m, n]:
    ``place(ln, q, tile)`` gives the (row, column) of a lane ``ln``'s accumulator ``q`` (0-3) of its
    tile ``tile``; outside y nothing is stored."""
    nacc = len(flat)
    out: list[K.Stmt] = [K.Store("part", _add(_mul(_r("tid"), nacc), e), _r(nm, F32)) for e, nm in enumerate(flat)]
    out.append(K.Barrier())
    part = K.Load("part", _add(_mul(_add(_mul(_r("ww"), 32), _r("ln")), nacc), _r("e")), F32)
    orow, ocol = place(_r("ln"), _b("rem", _r("e"), 4), _b("div", _r("e"), 4))
    each: list[K.Stmt] = [
        K.Let("ln", _b("div", _r("o"), nacc)),
        K.Let("e", _b("rem", _r("o"), nacc)),
        K.Let("sum", _f(0.0)),
        K.For("ww", _c(0), _c(wk), (K.Assign("sum", K.Bin("add", _r("sum", F32), part)),)),
        K.Let("orow", orow),
        K.Let("ocol", ocol),
        K.If(
            K.Bin("and", K.Bin("lt", _r("orow"), _r("m")), K.Bin("lt", _r("ocol"), _r("n"))),
            (K.Store("y", _add(_mul(_r("orow"), _r("n")), _r("ocol")), _r("sum", F32)),),
        ),
    ]
    out.append(K.For("o", _r("tid"), _c(32 * nacc), tuple(each), step=threads))
    return out


def by_parts(
    head: list[K.Stmt],
    core: Callable[[str, str, int | None, int | None], list[K.Stmt]],
    parts: Sequence[int],
    width: int,
    ksplit: int,
    params: tuple[K.Param, ...],
    summed: bool = False,
) -> tuple[list[K.Stmt], tuple[K.Param, ...]]:
    """A staged GEMM's body and parameters for one weight (``parts`` empty: ``core("w", "y", None,
    None)`` after ``head``) or several of one x: ``core(weights, output, first feature, features)``
    for the part holding the workgroup's ``width`` features (a uniform branch), weights ``w0``,
    ``w1``, ... into ``y0``, ``y1``, ... (with K split, all into ``y``). ``params``: the one-weight
    kernel's (x's three buffers, ``w``, ``y``, then scalars). ``summed`` (K split): the kernel adds
    its parts itself (``parts_summed_by_last``): outputs as unsplit, after them the parts' scratch
    ``p`` and the workgroups' arrival counts ``counts``."""
    extra = (K.Buffer("p", F32, readonly=False), K.Buffer("counts", I32, readonly=False)) if summed and ksplit > 1 else ()
    split_into_y = ksplit > 1 and not summed
    if not parts:
        return head + core("w", "y", None, None), (*params[:5], *extra, *params[5:])
    body, first = list(head), 0
    for i, size in enumerate(parts):
        wg0 = _mul(K.Builtin("group_id", 1), width)
        inside = K.Bin("and", K.Bin("ge", wg0, _c(first)), K.Bin("lt", wg0, _c(first + size)))
        body.append(K.If(inside, tuple(core(f"w{i}", "y" if split_into_y else f"y{i}", first, size))))
        first += size
    ws = tuple(K.Buffer(f"w{i}", params[3].dtype) for i in range(len(parts)))
    ys = (K.Buffer("y", F32, readonly=False),) if split_into_y else tuple(K.Buffer(f"y{i}", F32, readonly=False) for i in range(len(parts)))
    return body, (*params[:3], *ws, *ys, *extra, *params[5:])


def parts_summed_by_last(rows: int, width: int, ksplit: int, threads: int, out: str, first: int | None, size: int | None) -> list[K.Stmt]:
    """The end of a K-split workgroup that has stored its part of a ``rows`` x ``width`` tile into
    ``p`` (at s m n + row n + feature): the tile's ``ksplit`` workgroups count their arrivals in
    ``counts`` (one word a tile, zero between launches), and the last to arrive adds the parts in
    order of s, as ``sum_parts`` does (the same bits), into ``out`` (with ``first``/``size``: the
    part of ``size`` features from feature ``first``, rows of ``size``; else rows of ``n``), and
    sets the count back to zero. The workgroup's stores meet a barrier, then thread 0 fences (release),
    counts, fences again (acquire) and shares what it found, and a barrier orders that before the
    last workgroup's loads (the pattern of a grid-wide barrier); n a multiple of 4 (the sums four features a load). Shared word
    ``arrived_s``; every thread reaches it."""
    tiles = _b("div", _add(_r("n"), width - 1), width)
    tile = _add(_mul(K.Builtin("group_id", 0), tiles), K.Builtin("group_id", 1))
    body: list[K.Stmt] = [
        K.Barrier(),  # every thread's stores of the part ordered before thread 0's release
        K.If(
            K.Bin("eq", _r("tid"), _c(0)),
            (K.Fence(), K.AtomicAdd("counts", tile, _c(1), old="arrived"), K.Fence(), K.Store("arrived_s", _c(0), _r("arrived"))),
        ),
        K.Barrier(),  # thread 0's acquire ordered before every thread's loads of the parts
    ]
    last: list[K.Stmt] = []
    quads = width // 4  # four features a thread's load
    stride = _r("n") if size is None else _c(size)
    for u in range(-(-rows * quads // threads)):
        v = f"_{u}"
        e = _add(_r("tid"), u * threads) if u else _r("tid")
        orow = _add(_mul(K.Builtin("group_id", 0), rows), _b("div", e, quads))
        ocol = _add(_mul(K.Builtin("group_id", 1), width), _mul(_b("rem", e, quads), 4))
        at = _add(_mul(_r(f"orow{v}"), _r("n")), _r(f"ocol{v}"))
        each: list[K.Stmt] = [K.VecLoad(tuple(f"a{v}_{q}" for q in range(4)), "p", _r(f"at{v}"), F32)]
        for sp in range(1, ksplit):
            each.append(K.VecLoad(tuple(f"b{v}_{sp}_{q}" for q in range(4)), "p", _add(_mul(_mul(_r("m"), _r("n")), sp), _r(f"at{v}")), F32))
            each += [K.Assign(f"a{v}_{q}", K.Bin("add", _r(f"a{v}_{q}", F32), _r(f"b{v}_{sp}_{q}", F32))) for q in range(4)]
        col = _r(f"ocol{v}") if not first else _b("sub", _r(f"ocol{v}"), first)
        each.append(K.VecStore(out, _add(_mul(_r(f"orow{v}"), stride), col), tuple(_r(f"a{v}_{q}", F32) for q in range(4))))
        inside = K.Bin("and", K.Bin("lt", _r(f"orow{v}"), _r("m")), K.Bin("lt", _r(f"ocol{v}"), _r("n")))
        if (u + 1) * threads > rows * quads:
            inside = K.Bin("and", K.Bin("lt", e, _c(rows * quads)), inside)
        last += [K.Let(f"orow{v}", orow), K.Let(f"ocol{v}", ocol), K.Let(f"at{v}", at), K.If(inside, tuple(each))]
    last.append(K.If(K.Bin("eq", _r("tid"), _c(0)), (K.Store("counts", tile, _c(0)),)))
    body.append(K.If(K.Bin("eq", K.Load("arrived_s", _c(0), I32), _c(ksplit - 1)), tuple(last)))
    return body


def staged_blocks(
    blocks: int,
    copies: Callable[[K.Expr, K.Expr], list[K.Stmt]],
    weights: Callable[[K.Expr, str], list[K.Stmt]],
    products: Callable[[K.Expr], list[K.Stmt]],
    names: Sequence[str],
    pipelined: bool,
    visible: Sequence[K.Stmt] = (),
    stages: int = 2,
) -> list[K.Stmt]:
    """The loop of the staged GEMMs over the workgroup's ``blocks`` blocks of K from block ``b0``:
    x's copies of the block ``stages`` - 1 ahead into a ring of ``stages`` buffers
    (``copies(block, buffer)``) in flight while this one is summed (``products(buffer)``), the
    weights' words of a block loaded by ``weights(block, suffix)`` (``pipelined``: the next
    block's, suffixed "n", becoming this block's, ``names``, at the step's end). ``visible``:
    statements between the copies' wait and the barrier (making them visible to the tensor
    cores). Past the last block the last is copied again, unread: every step commits one group."""
    last = _c(blocks - 1)
    out: list[K.Stmt] = []
    for j in range(stages - 1):
        out += [*copies(_add(_r("b0"), K.Bin("min", _c(j), last)) if j else _r("b0"), _c(j)), K.CopyAsyncSync("commit")]
    ahead = _add(_r("b0"), K.Bin("min", _add(_r("s"), stages - 1), last))
    if pipelined:
        out += weights(_r("b0"), "")
    ring = _b("sub", _c(1), _r("cur")) if stages == 2 else _b("rem", _add(_r("s"), stages - 1), stages)
    loop: list[K.Stmt] = [
        K.Let("cur", _b("rem", _r("s"), stages)),
        *copies(ahead, ring),
        K.CopyAsyncSync("commit"),
        *(weights(_add(_r("b0"), K.Bin("min", _add(_r("s"), 1), last)), "n") if pipelined else weights(_add(_r("b0"), _r("s")), "")),
        K.CopyAsyncSync("wait", stages - 1),
        *visible,
        K.Barrier(),
        *products(_r("cur")),
        K.Barrier(),
    ]
    if pipelined:  # the next block's words become this block's
        loop += [K.Assign(nm, _r(f"{nm}n")) for nm in names]
    return [*out, K.For("s", _c(0), _c(blocks), tuple(loop)), K.CopyAsyncSync("wait", 0)]
